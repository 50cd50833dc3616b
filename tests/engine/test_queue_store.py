"""The compact message store, against a sorted dict (with tiny chunks to reach the
split and compaction paths)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor.engine import queue_store
from conveyor.engine.queue_store import MessageStore


@pytest.fixture
def tiny_chunks(monkeypatch):
    monkeypatch.setattr(queue_store, "CHUNK_SLOTS", 4)
    monkeypatch.setattr(queue_store, "_COMPACT_MIN_SLOTS", 2)


def check(store: MessageStore, model: dict[int, float]) -> None:
    assert len(store) == len(model)
    assert list(store.items()) == sorted(model.items())
    if model:
        first = min(model)
        assert (store.head(), store.head_time()) == (first, model[first])
    else:
        assert store.head() is None and store.head_time() is None
    for p in list(model)[:5]:
        assert p in store and store.time_of(p) == model[p]
        assert list(store.scan(p)) == sorted(q for q in model if q >= p)
    assert list(store.scan(-1)) == sorted(model)


ops = st.lists(
    st.tuples(st.sampled_from(["append", "discard", "restore", "discard_head"]),
              st.integers(0, 10_000)),
    max_size=200,
)


# The fixture only patches constants; it is the same for every example.
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops)
def test_store_matches_a_sorted_dict(tiny_chunks, ops):
    store, model, gone, nxt = MessageStore(), {}, {}, 0
    for op, r in ops:
        if op == "append":
            nxt += 1 + r % 3
            store.append(nxt, float(nxt))
            model[nxt] = float(nxt)
        elif op == "discard" and model:
            p = sorted(model)[r % len(model)]
            assert store.discard(p) == model.pop(p)
            gone[p] = float(p)
            assert store.discard(p) is None
        elif op == "discard_head" and model:
            p = min(model)
            assert store.discard(p) == model.pop(p)
            gone[p] = float(p)
        elif op == "restore" and gone:
            p = sorted(gone)[r % len(gone)]
            store.restore(p, gone.pop(p))
            model[p] = float(p)
        check(store, model)


def test_store_restore_of_an_available_position_is_refused():
    store = MessageStore()
    store.append(1, 0.0)
    with pytest.raises(ValueError):
        store.restore(1, 0.0)


def test_store_compacts_and_drops_chunks(tiny_chunks):
    store = MessageStore()
    for p in range(40):
        store.append(p, 0.0)
    for p in range(0, 40, 2):
        store.discard(p)
    assert all(len(ch.positions) <= 4 for ch in store._chunks)
    for p in range(1, 40, 2):
        store.discard(p)
    assert store._chunks == [] and store.head() is None


def test_store_splits_an_overfull_chunk(tiny_chunks):
    store = MessageStore()
    for p in range(0, 40, 10):
        store.append(p, 0.0)
    for p in range(0, 40, 10):
        store.discard(p)
    for p in range(0, 40, 10):
        store.restore(p, 1.0)
    for p in range(1, 10):
        store.restore(p, 2.0)
    assert all(len(ch.positions) <= 8 for ch in store._chunks)
    assert [p for p, _ in store.items()] == sorted(list(range(0, 40, 10)) + list(range(1, 10)))
