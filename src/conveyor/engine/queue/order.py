"""The available messages of one queue, in delivery order: the store, the priority order
of each barrier epoch, and the pending barriers (spec 000, "Message Flow for Queues",
steps 3 and 4; "Priority Queues"; "Synchronizing Work with Barrier Messages").

A part of :class:`conveyor.engine.queue.Queue`, which moves messages through the
transition table and tells this part what happened; it knows no message state, no
consumer and no time. Rules:

1. ``store`` (:mod:`conveyor.engine.queue.store`) holds every available message by
   position, with its publish time; others read it, only this part changes it. A FIFO
   queue delivers in store order, and an order key is the position.
2. A priority queue adds one :class:`PriorityIndex` per **epoch** (the messages between
   two pending barriers), over order keys (:mod:`conveyor.engine.queue.priority`); only
   the first epoch is deliverable. A barrier is in no epoch.
3. Pending barriers are available positions, ascending. FIFO: nothing at or after the
   first one is deliverable (:meth:`head` stops there). The first barrier goes when it
   is the store's head (:meth:`barrier_due`) and nothing is leased or awaiting an ack
   (the queue's half of the rule).
4. A message leaves by a delivery (:meth:`take`: exact removal from its epoch) or
   otherwise (:meth:`remove`: acknowledged, expired, barrier released, replayed
   removal: lazy in the priority index, queue/priority.py rule 4). A barrier that leaves
   joins the epochs on either side; when that gives the first epoch new messages,
   ``on_first_epoch_grew`` is called (the filtered cursors must be rebuilt).
5. A message that comes back (:meth:`put_back`: a lease ended) returns to its place in
   the store and to the first epoch (a leased message was in the first epoch: nothing
   is leased from a later one, and epochs only ever join).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Callable, Iterator

from conveyor.engine.queue.budget import PagingBudget
from conveyor.engine.queue.paging import PagedMessageStore, PageFile, PageSpace
from conveyor.engine.queue.priority import POSITION_MASK, EpochImage, PriorityIndex, priority_of_key
from conveyor.engine.queue.store import ChunkImage, MessageStore


class DeliveryOrder:
    """Rules 1-5; ``priority``: the queue has a Priority."""

    __slots__ = ("store", "barriers", "_priority", "_epochs", "_on_first_epoch_grew", "_space")

    def __init__(
        self, *, priority: bool, chunk_slots: int | None, on_first_epoch_grew: Callable[[], None]
    ) -> None:
        self.store: MessageStore = MessageStore(chunk_slots=chunk_slots)
        self.barriers: list[int] = []  # pending barrier positions, ascending (read-only)
        self._priority = priority
        self._epochs: list[PriorityIndex] = [PriorityIndex(self.store.__contains__)] if priority else []
        self._on_first_epoch_grew = on_first_epoch_grew
        self._space: PageSpace | None = None  # FileBackedMetadata

    def page_to(self, file: PageFile, budget: PagingBudget | None) -> None:
        """Page the store, and a priority queue's epochs, to ``file`` under ``budget``
        (FileBackedMetadata); only while the queue is empty."""
        if __debug__:
            assert not self.store and all(not index for index in self._epochs)
        space = self._space = PageSpace(file, budget)
        space.hold(self._index_chunks)
        self.store = PagedMessageStore(space, chunk_slots=self.store.chunk_slots)
        if self._priority:
            for index in self._epochs:
                index.close()
            self._epochs = [PriorityIndex(self.store.__contains__, space)]

    def _index(self) -> PriorityIndex:
        """A new epoch's index (paged with the store, if it is)."""
        return PriorityIndex(self.store.__contains__, self._space)

    def _index_chunks(self) -> Iterator[Any]:
        for index in self._epochs:
            yield from index.chunks()

    # --- reading -----------------------------------------------------------------------------

    def head(self) -> int | None:
        """The key of the first deliverable message (rules 2-3)."""
        if self._priority:
            return self._epochs[0].head()
        head = self.store.head()
        barriers = self.barriers
        if barriers and head is not None and head >= barriers[0]:
            return None
        return head

    def deliverable(self) -> PriorityIndex | MessageStore:
        """What a filtered consumer scans, by key (``scan(key)``): the first epoch, or
        the store (the caller stops at the first barrier)."""
        return self._epochs[0] if self._priority else self.store

    def gate(self) -> int | None:
        """FIFO: the first pending barrier (no key at or after it is deliverable)."""
        return self.barriers[0] if self.barriers and not self._priority else None

    def barrier_due(self) -> int | None:
        """The first pending barrier if it is the oldest available message (rule 3)."""
        barriers = self.barriers
        if barriers and self.store.head() == barriers[0]:
            return barriers[0]
        return None

    def is_barrier(self, p: int) -> bool:
        barriers = self.barriers
        if not barriers or p < barriers[0]:
            return False
        i = bisect_left(barriers, p)
        return i < len(barriers) and barriers[i] == p

    def __iter__(self) -> Iterator[int]:
        """Available positions in delivery order (each pending barrier after the messages
        before it). Read-only; a change while iterating raises RuntimeError."""
        store = self.store
        if not self._priority:
            for p, _ in store.items():
                yield p
            return
        version = store.version
        barriers = self.barriers
        for e, index in enumerate(self._epochs):
            for k in index:
                yield k & POSITION_MASK
                if store.version != version:
                    raise RuntimeError("queue changed during iteration")
            if e < len(barriers):
                yield barriers[e]
                if store.version != version:
                    raise RuntimeError("queue changed during iteration")

    def leasable(self, n: int | None, upto: float) -> list[int]:
        """Up to ``n`` (None: every) deliverable keys in order, positions below ``upto``
        (a named consumer's lease: never a barrier, never past the first)."""
        keys: list[int] = []
        if self._priority:
            for k in self._epochs[0]:
                if n is not None and len(keys) >= n:
                    break
                if k & POSITION_MASK < upto:
                    keys.append(k)
            return keys
        if self.barriers:
            upto = min(upto, self.barriers[0])
        for p in self.store.scan(-1):
            if p >= upto or (n is not None and len(keys) >= n):
                break
            keys.append(p)
        return keys

    def priorities(self) -> dict[int, int]:
        """Position -> priority of every available message of a priority queue."""
        return {k & POSITION_MASK: priority_of_key(k) for index in self._epochs for k in index}

    # --- changing ----------------------------------------------------------------------------

    def append(self, p: int, t: float, key: int, barrier: bool) -> bool:
        """A new message. True when a priority queue put it in the first epoch (it may
        sort before a filtered consumer's cursor)."""
        self.store.append(p, t)
        if barrier:
            self.barriers.append(p)
            if self._priority:
                self._epochs.append(self._index())
            return False
        if self._priority:
            self._epochs[-1].add(key)
            return len(self._epochs) == 1
        return False

    def take_head(self, n: int | None, upto: float) -> tuple[list[int], list[float]]:
        """FIFO: :meth:`leasable` and :meth:`take` of each, in one pass over the head
        (a named consumer's lease of a batch): (positions, publish times)."""
        assert not self._priority, "a priority queue takes key by key"
        if self.barriers:
            upto = min(upto, self.barriers[0])
        return self.store.take_head(len(self.store) if n is None else n, upto)

    def append_run(self, positions: list[int], times: list[float]) -> None:
        """FIFO: :meth:`append` of each of ``positions`` (none a barrier), in one pass."""
        assert not self._priority, "a priority queue orders key by key"
        self.store.extend(positions, times)

    def take(self, key: int) -> float:
        """Rule 4: the message of ``key`` is delivered (exact removal); its publish time.
        It must be available (AssertionError, before anything changes, under
        ``__debug__``)."""
        if not self._priority:
            t = self.store.discard(key)
            assert t is not None, f"position {key} taken but not available"
            return t
        p = key & POSITION_MASK
        t = self.store.discard(p)
        assert t is not None, f"position {p} taken but not available"
        barriers = self.barriers
        self._epochs[bisect_left(barriers, p) if barriers else 0].remove(key)
        return t

    def remove(self, p: int) -> float:
        """Rule 4: available ``p`` leaves other than by a delivery; its publish time. It
        must be available (AssertionError, before anything changes, under
        ``__debug__``)."""
        t = self.store.discard(p)
        assert t is not None, f"position {p} removed but not available"
        barriers = self.barriers
        if barriers and p >= barriers[0]:
            i = bisect_left(barriers, p)
            if i < len(barriers) and barriers[i] == p:
                self._drop_barrier(i)
                return t
        if self._priority:
            self._epochs[bisect_left(barriers, p)].forget()  # lazily (queue/priority.py rule 4)
        return t

    def _drop_barrier(self, i: int) -> None:
        """Pending barrier ``i`` is gone: the epochs on either side of it are one."""
        del self.barriers[i]
        if not self._priority:
            return  # FIFO: the gate is the first barrier, the cursors stay valid
        epochs = self._epochs
        left, right = epochs[i], epochs[i + 1]
        if not left:
            left.close()
            del epochs[i]
        elif right:
            left.merge(right)  # closes right
            del epochs[i + 1]
        else:
            right.close()
            del epochs[i + 1]
            return
        if i == 0:
            self._on_first_epoch_grew()

    def key_of(self, p: int) -> int:
        """The order key of available message ``p`` (O(epoch) in a priority queue)."""
        if not self._priority:
            return p
        for index in self._epochs:
            for k in index:
                if k & POSITION_MASK == p:
                    return k
        raise KeyError(p)

    def put_back(self, p: int, t: float, key: int) -> None:
        """Rule 5: a leased message is available again."""
        self.store.restore(p, t)
        if self._priority:
            self._epochs[0].add(key)

    def insert(self, p: int, t: float, key: int) -> bool:
        """A message that was not available here becomes available in its place (its
        ownership was transferred here); True when it is in the first epoch."""
        self.store.restore(p, t)
        if not self._priority:
            return False
        i = bisect_left(self.barriers, p) if self.barriers else 0
        self._epochs[i].add(key)
        return i == 0

    def paged_chunks(self) -> int:
        """Chunks paged out to the page file (FileBackedMetadata): the store's and, in a
        priority queue, the epochs' index chunks."""
        store = self.store
        if isinstance(store, PagedMessageStore):
            return store.paged_chunks + sum(index.paged_chunks for index in self._epochs)
        return 0

    # --- snapshots ----------------------------------------------------------------------------

    def export(self) -> tuple[list[ChunkImage], list[int], list[EpochImage]]:
        """The store's chunks, the pending barriers and (priority queue) each epoch's
        index, as a snapshot keeps them."""
        return self.store.export_chunks(), list(self.barriers), [index.export() for index in self._epochs]

    def adopt(self, chunks: list[ChunkImage], barriers: list[int], epochs: list[EpochImage]) -> None:
        """Take over an exported state (this order is new); a priority queue's epochs
        must be one more than its barriers (ValueError)."""
        if __debug__:
            assert not self.store
        if len(epochs) != (len(barriers) + 1 if self._priority else 0):
            raise ValueError(f"{len(epochs)} priority epochs for {len(barriers)} barriers")
        self.store.adopt(chunks)
        self.barriers = list(barriers)
        if self._priority:
            for index in self._epochs:
                index.close()
            self._epochs = [self._index() for _ in epochs]
            for index, image in zip(self._epochs, epochs):
                index.load(image)
