"""The journal records' hand-built encodings agree with the Structs they stand for."""

from __future__ import annotations

import gc

import msgspec
import pytest

from conveyor import records


def _replica(rec: records.PublishRec, origin: str, group: str, path: list[str]) -> records.PublishRec:
    return msgspec.structs.replace(rec, origin=origin, origin_group=group, path=path, expired_queue=None,
                                   expired_position=-1, expired_reasons="")


@pytest.mark.parametrize("correlation_id", [None, "", "c-1", "é" * 40])
@pytest.mark.parametrize("data", [b"", b"{}", b'{"n": 1}' * 200, bytes(range(256)) * 300])
def test_a_plain_publish_arrives_with_its_bytes_and_origin(data, correlation_id):
    """A replica journals a plain publish as its source's bytes with the origin fields
    appended; it decodes to the record with those fields set."""
    payload = records.encode_publish("orders/eu" * 5, 2**63 + 5, 2**40, 1764000000.125, data, correlation_id)
    rec = records.decode(payload)
    arrival = records.Arrival("A", "east", ["A"])
    out = arrival.encode(payload, rec)
    assert out.startswith(b"\xdc\x00\x10") and payload[1:] in out  # the fast path was taken
    assert records.decode(out) == _replica(rec, "A", "east", ["A"])


@pytest.mark.parametrize("rec", [
    records.PublishRec("t", 7, 1, 2.0, b"x", None, expired_queue="Q", expired_position=12, expired_reasons="expired"),
    records.PublishRec("t", 7, 2, 2.0, b"x", "c", txn_index=0, txn_total=2, fingerprint=99),
    records.PublishRec("t", 7, 3, 2.0, b"x", None, origin="Z", origin_group="west", path=["Z", "Y"]),
    records.PublishRec("t", 7, 4, 2.0, b"x", None, expiration=5.0, sow_key="k1"),
])
def test_any_other_publish_arrives_through_its_struct(rec):
    payload = records.encode(rec)
    out = records.Arrival("Y", "west", ["Z", "Y"]).encode(payload, rec)
    assert records.decode(out) == _replica(rec, "Y", "west", ["Z", "Y"])
    # The SOW layout is not the plain one either.
    sow = records.encode_sow_publish("t", 7, 5, 2.0, b"x", None, 9.0, "k")
    assert records.decode(records.Arrival("Y", "w", ["Y"]).encode(sow, records.decode(sow))) == _replica(
        records.decode(sow), "Y", "w", ["Y"])


def test_encode_many_is_encode_of_each():
    """A run mixes plain publishes with any other layout; each comes out as encode() makes it."""
    payloads = [
        records.encode_publish("orders", 7, 1, 2.0, b"{}", None),
        records.encode(records.PublishRec("t", 7, 2, 2.0, b"x", None, expiration=5.0, sow_key="k1")),
        records.encode_publish("orders", 7, 3, 2.0, b'{"n": 3}', "c"),
        records.encode_sow_publish("t", 7, 4, 2.0, b"x", None, 9.0, "k"),
    ]
    recs = [records.decode(p) for p in payloads]
    arrival = records.Arrival("A", "east", ["A"])
    assert records.Arrival("A", "east", ["A"]).encode_many(payloads, recs) == [
        arrival.encode(p, r) for p, r in zip(payloads, recs)]
    assert arrival.encode_many([], []) == []


@pytest.mark.parametrize("topic", ["", "t", "x" * 31, "y" * 32, "é" * 100, "z" * 255, "w" * 256, "v" * 70_000])
def test_a_plain_publish_topic_key_is_its_encoded_topic(topic):
    payload = records.encode_publish(topic, 7, 1, 2.0, b"{}", None)
    key = records.plain_publish_topic_key(payload)
    assert key == msgspec.msgpack.encode(topic) and records.topic_of_key(key) == topic


def test_only_a_plain_publish_has_a_topic_key():
    for rec in (records.PublishRec("t", 7, 1, 2.0, b"x", None, txn_index=0, txn_total=2),
                records.PublishRec("t", 7, 1, 2.0, b"x", None, origin="Z", origin_group="g", path=["Z"])):
        assert records.plain_publish_topic_key(records.encode(rec)) is None
    assert records.plain_publish_topic_key(records.encode_sow_publish("t", 7, 1, 2.0, b"x", None, 9.0, "k")) is None
    assert records.plain_publish_topic_key(records.encode(records.ReceivedRec("A", "j", 5))) is None


def test_a_plain_publish_prefix_matches_that_topic_only():
    prefix = records.plain_publish_prefix(records.plain_publish_topic_key(records.encode_publish("ab", 1, 1, 2.0, b"", None)))
    assert records.encode_publish("ab", 9, 5, 3.0, b"{}", "c").startswith(prefix)
    for other in (records.encode_publish("a", 1, 1, 2.0, b"", None), records.encode_publish("abc", 1, 1, 2.0, b"", None),
                  records.encode_publish("ab" * 20, 1, 1, 2.0, b"", None),
                  records.encode(records.PublishRec("ab", 1, 1, 2.0, b"", None, txn_index=0, txn_total=1)),
                  records.encode_sow_publish("ab", 1, 1, 2.0, b"", None, 0.0, "k")):
        assert not other.startswith(prefix)


@pytest.mark.parametrize("correlation_id", [None, "c-1"])
def test_a_plain_publish_decodes_light_and_reads_like_its_record(correlation_id):
    """decode_plain reads every field of a PublishRec, the defaults included, and the
    result is not tracked by the garbage collector."""
    payload = records.encode_publish("t", 2**63 + 5, 9, 2.5, b'{"a": 1}', correlation_id)
    assert payload.startswith(records.PLAIN_PUBLISH_HEAD)
    light, full = records.decode_plain(payload), records.decode(payload)
    for name in records.PublishRec.__struct_fields__:
        assert getattr(light, name) == getattr(full, name) or (name == "path" and list(light.path) == full.path), name
    assert not gc.is_tracked(light)


def test_only_a_plain_publish_starts_with_the_plain_head():
    """The head is what tells a plain publish: decode_plain would read the first fields
    of a publish of another layout (MessagePack arrays may grow), so only the head
    decides. Another kind of record is refused by its tag."""
    for payload in (records.encode(records.PublishRec("t", 7, 1, 2.0, b"x", None)),
                    records.encode(records.PublishRec("t", 7, 1, 2.0, b"x", None, txn_index=0, txn_total=2)),
                    records.encode_sow_publish("t", 7, 1, 2.0, b"x", None, 9.0, "k"),
                    records.encode(records.ReceivedRec("A", "j", 5))):
        assert not payload.startswith(records.PLAIN_PUBLISH_HEAD)
    with pytest.raises(msgspec.ValidationError):
        records.decode_plain(records.encode(records.ReceivedRec("A", "j", 5)))


@pytest.mark.parametrize("index,total", [(0, 1), (3, 9), (2**20, 2**20 + 1)])
def test_a_txn_row_is_encoded_as_its_publish_record(index, total):
    """The transaction commit's tuple encoder writes exactly the PublishRec it stands for."""
    payload = records.encode_txn_publish("results", 2**63 + 1, 12, 1764000000.5, b'{"a": 1}', index, total)
    rec = records.PublishRec("results", 2**63 + 1, 12, 1764000000.5, b'{"a": 1}', None, txn_index=index,
                             txn_total=total)
    assert payload == records.encode(rec)
    assert records.decode(payload) == rec
