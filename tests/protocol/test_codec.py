"""The frame codec: batches, partial reads, oversized and malformed frames."""

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor import errors
from conveyor.protocol import CommandDecoder, MessageDecoder, Rejected, encode_frame, encode_frames, parse_options
from conveyor.protocol import messages as m


def frame(obj) -> bytes:
    body = msgspec.msgpack.encode(obj)
    return len(body).to_bytes(4, "big") + body


def test_batch_round_trip_in_one_frame():
    cmds = [m.Publish(topic="Work", data=b"x" * 10, seq=i) for i in range(1, 101)]
    data = encode_frame(cmds)
    dec = CommandDecoder()
    dec.receive_data(data)
    assert dec.next_items() == cmds


def test_partial_reads_byte_by_byte():
    cmds = [m.Logon(client_name="a"), m.Subscribe(topic="t", options="max_backlog=3")]
    data = encode_frame(cmds) + encode_frame(cmds[:1])
    dec = CommandDecoder()
    got = []
    for i in range(len(data)):
        dec.receive_data(data[i : i + 1])
        got.extend(dec.next_items())
    assert got == cmds + cmds[:1]


def test_oversized_frame_is_refused_before_buffering_and_connection_continues():
    dec = CommandDecoder(frame_bytes_max=100)
    big = encode_frame([m.Publish(topic="t", data=b"x" * 1000)])
    small = encode_frame([m.Publish(topic="t", data=b"ok")])
    dec.receive_data(big[:50])
    items = dec.next_items()
    assert len(items) == 1 and isinstance(items[0].error, errors.FrameTooLarge)
    # the rest of the big frame is skipped, never buffered
    dec.receive_data(big[50:])
    assert len(dec._buf) == 0
    dec.receive_data(small)
    assert dec.next_items() == [m.Publish(topic="t", data=b"ok")]


def test_unknown_command_and_missing_field_are_reported_alone():
    dec = CommandDecoder()
    dec.receive_data(frame([{"c": "publish", "t": "a", "d": b""}, {"c": "explode", "cid": "9"}, {"c": "publish", "d": b""}]))
    items = dec.next_items()
    assert items[0] == m.Publish(topic="a", data=b"")
    assert isinstance(items[1], Rejected) and isinstance(items[1].error, errors.UnknownCommand) and items[1].cid == "9"
    assert isinstance(items[2], Rejected) and isinstance(items[2].error, errors.ProtocolError)


def test_garbage_frame_is_a_protocol_error():
    dec = CommandDecoder()
    dec.receive_data(b"\x00\x00\x00\x03\xc1\xc1\xc1")
    (item,) = dec.next_items()
    assert isinstance(item.error, errors.ProtocolError)


@pytest.mark.parametrize("depth", [1_000, 100_000])
@pytest.mark.parametrize(
    "where",
    [
        pytest.param(b"", id="the frame itself"),
        pytest.param(b"\x91\x81\xa1c", id="a command name"),
        pytest.param(b"\x91\x82\xa1c\xa7publish\xa1d", id="a publish body"),
    ],
)
def test_deep_nesting_is_a_protocol_error_not_a_crash(where, depth):
    """A thousand nested arrays used to raise RecursionError out of the decoder (and the
    server aborted the connection with a traceback): it is a malformed frame."""
    body = where + b"\x91" * depth + b"\xc0"
    dec = CommandDecoder(frame_bytes_max=1 << 20)
    dec.receive_data(len(body).to_bytes(4, "big") + body + encode_frame([m.Flush(cid="after")]))
    bad, after = dec.next_items()
    assert isinstance(bad, Rejected) and bad.error.code == "protocol_error"
    assert "nested" in str(bad.error)
    assert after == m.Flush(cid="after")


def test_unknown_keys_are_ignored_for_forward_compatibility():
    dec = CommandDecoder()
    dec.receive_data(frame([{"c": "flush", "cid": "1", "future_key": 3}]))
    assert dec.next_items() == [m.Flush(cid="1")]


def test_server_messages_round_trip():
    msgs = [m.Ack(ack_type="processed", cid="1"), m.Message(topic="q", data=b"{}", bookmark="1|2|3", lease_deadline=5.0, queue="q")]
    dec = MessageDecoder()
    dec.receive_data(encode_frame(msgs))
    assert dec.next_items() == msgs


def test_encode_frames_splits_under_the_limit():
    msgs = [m.Message(topic="t", data=b"x" * 100) for _ in range(100)]
    frames = encode_frames(msgs, frame_bytes_max=2000)
    assert len(frames) > 1 and all(len(f) <= 2004 for f in frames)
    dec = MessageDecoder()
    for f in frames:
        dec.receive_data(f)
    assert dec.next_items() == msgs


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise(data):
    dec = CommandDecoder(frame_bytes_max=1000)
    dec.receive_data(data)
    for item in dec.next_items():
        assert isinstance(item, (Rejected, *m.COMMAND_TYPES))


def test_options():
    opts = parse_options("subscribe", "max_backlog=10,replace")
    assert opts.get("max_backlog") == 10 and opts.has("replace")
    assert parse_options("heartbeat", "start,5").get("start") == 5
    with pytest.raises(errors.UnknownOption, match="supported: fenced_acks, max_backlog, pause, replace, resume, timestamp"):
        parse_options("subscribe", "max_backlg=3")
    with pytest.raises(errors.InvalidOption):
        parse_options("subscribe", "max_backlog=ten")
    with pytest.raises(errors.InvalidOption):
        parse_options("sow_delete", "cancel=1")


def test_error_codes_map_back_to_the_same_class():
    for code, cls in errors.ERROR_CLASSES.items():
        if cls is errors.ConfigError:
            continue
        assert type(errors.error_for_code(code, "x")) is cls
    assert type(errors.error_for_code("no_such_code")) is errors.ServerError
