"""The compact message store, against a sorted dict (with tiny chunks,
``chunk_slots=4``, to reach the split and compaction paths); its snapshot images."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.engine.queue.store import ChunkImage, MessageStore

TINY = 4


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
    st.tuples(st.sampled_from(["append", "discard", "restore", "discard_head", "take_head", "extend"]),
              st.integers(0, 10_000)),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops)
def test_store_matches_a_sorted_dict(ops):
    store, model, gone, nxt = MessageStore(chunk_slots=TINY), {}, {}, 0
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
        elif op == "extend":
            run = [nxt + 1 + k * (1 + r % 3) for k in range(r % 11)]  # 0-10 messages, across chunks
            store.extend(run, [float(q) for q in run])
            model.update((q, float(q)) for q in run)
            nxt = run[-1] if run else nxt
        elif op == "take_head":
            # up to n of the oldest, below upto (drawn around the live positions)
            n, upto = r % 7, (sorted(model)[r % len(model)] + r % 2 if model else r)
            taken = sorted(q for q in model if q < upto)[:n]
            assert store.take_head(n, upto) == (taken, [model[q] for q in taken])
            for q in taken:
                gone[q] = model.pop(q)
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


def test_store_compacts_and_drops_chunks():
    store = MessageStore(chunk_slots=TINY)
    for p in range(40):
        store.append(p, 0.0)
    for p in range(0, 40, 2):
        store.discard(p)
    assert all(len(image.positions) <= TINY for image in store.export_chunks())
    for p in range(1, 40, 2):
        store.discard(p)
    assert store.export_chunks() == [] and store.head() is None


def test_store_splits_an_overfull_chunk():
    store = MessageStore(chunk_slots=TINY)
    for p in range(0, 40, 10):
        store.append(p, 0.0)
    for p in range(0, 40, 10):
        store.discard(p)
    for p in range(0, 40, 10):
        store.restore(p, 1.0)
    for p in range(1, 10):
        store.restore(p, 2.0)
    assert all(len(image.positions) <= 2 * TINY for image in store.export_chunks())
    assert [p for p, _ in store.items()] == sorted(list(range(0, 40, 10)) + list(range(1, 10)))


def test_exported_chunks_are_adopted_by_an_empty_store():
    """A snapshot sees the store only as ChunkImages; adopting them gives the same store
    (and a store that does not page refuses paged-out images)."""
    store = MessageStore(chunk_slots=TINY)
    for p in range(30):
        store.append(p, float(p))
    for p in (0, 1, 7, 12, 13):
        store.discard(p)
    images = store.export_chunks()
    other = MessageStore(chunk_slots=TINY)
    other.adopt(images)
    assert list(other.items()) == list(store.items()) and len(other) == len(store)
    with pytest.raises(ValueError):
        other.adopt(images)  # only an empty store
    with pytest.raises(ValueError):
        MessageStore().adopt([ChunkImage(0, None, None, (0, 3, 0))])


def test_store_restores_a_run_above_its_newest_as_appends():
    """A grant's run, oldest first, into a queue that holds only older messages (or
    none): each goes after the newest, filling the tail chunk to its size and then
    new ones, as appends do; a later search, removal and revival still find them."""
    store = MessageStore(chunk_slots=TINY)
    for p in range(0, 30, 10):
        store.append(p, 0.0)
    store.discard(20)  # the tail's newest is a tombstone: 25 still goes after it
    run = [25, 31, 32, 33, 34, 35, 36, 37, 38, 39]
    for p in run:
        store.restore(p, float(p))
    assert [p for p, _ in store.items()] == [0, 10, *run]
    assert all(len(image.positions) <= TINY for image in store.export_chunks())
    assert store.time_of(33) == 33.0 and store.discard(33) == 33.0 and 33 not in store
    store.restore(33, 1.0)  # below the newest again: back in its slot
    store.restore(20, 2.0)  # the tombstone revived
    assert [p for p, _ in store.items()] == [0, 10, 20, *run]
    assert store.take_head(3, 40.0) == ([0, 10, 20], [0.0, 0.0, 2.0])


def test_store_restores_into_an_empty_store():
    store = MessageStore(chunk_slots=TINY)
    for p in (5, 6, 7, 8, 9):
        store.restore(p, float(p))
    assert [p for p, _ in store.items()] == [5, 6, 7, 8, 9] and store.head() == 5
