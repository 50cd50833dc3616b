"""The server-wide memory budget of FileBackedMetadata queues (``<Limits>
<QueueMetadataMemory>``): queue state is paged out only as necessary.

One :class:`PagingBudget` is shared by every paged structure of every FileBackedMetadata
queue: the message stores (:class:`~conveyor.engine.queue.paging.PagedMessageStore`) and
the priority indexes of priority queues (:mod:`conveyor.engine.queue.priority`). Rules:

1. **Resident bytes are counted.** A structure *admits* a chunk when it becomes resident
   (created, or paged in) and *forgets* it when it leaves memory (paged out, or emptied
   and dropped). A chunk costs its two 8-byte columns (16 bytes a slot), measured when
   it is admitted and again when it is *touched* (used by a lookup), so the count
   follows the chunks as they grow and shrink. A tail that is being appended to is
   measured again when the next chunk starts.
2. **Nothing is paged out under the budget.** While the total is at most ``limit``
   every chunk stays resident, whatever the depth of the queues.
3. **Over the budget, the least recently used chunks go first**, across every queue: the
   chunks are in one list, the most recently admitted or touched at its end; the oldest
   is asked to page out until the total is back under the limit. A chunk its owner
   must keep (a store's head and tail, an index's head, the chunk an operation is using)
   refuses and moves to the recent end: it is in use. Resident memory is then at most
   the limit plus the chunks that cannot go (two or three per queue).
4. No clock, no I/O: "recent" is the order of admissions and touches, and paging out is
   the owner's business (its :class:`~conveyor.engine.queue.paging.PageSpace`, whose file
   the shell provides).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

#: The engine's budget when it is given none (``Queue.page_to`` without ``budget``): the
#: default of ``<Limits><QueueMetadataMemory>`` (config/model.py).
DEFAULT_LIMIT = 1024 * 1024 * 1024


class ChunkOwner(Protocol):
    """What holds chunks under a budget (a paged store, a priority index's run)."""

    def release(self, chunk: object) -> bool:
        """Page ``chunk`` out, asked by the budget (rule 3); False if it must stay
        resident (it is then left as it is)."""
        ...


class PagingBudget:
    """Rules 1-3: resident bytes of every paged structure, least recently used first."""

    __slots__ = ("limit", "resident", "page_ins", "page_outs", "_lru")

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        if limit <= 0:
            raise ValueError(f"a paging budget must be positive, not {limit}")
        self.limit = limit
        self.resident = 0  # bytes of the resident chunks (rule 1)
        self.page_ins = 0  # chunks paged in since the start (statistics)
        self.page_outs = 0  # chunks paged out since the start
        self._lru: OrderedDict[object, tuple[ChunkOwner, int]] = OrderedDict()  # chunk -> (owner, bytes), oldest first

    def __len__(self) -> int:
        """Resident chunks."""
        return len(self._lru)

    def __contains__(self, chunk: object) -> bool:
        return chunk in self._lru

    def admit(self, owner: ChunkOwner, chunk: object, nbytes: int, *, paged_in: bool = False) -> None:
        """``chunk`` is resident now (new, or ``paged_in``): the most recent; then keep
        the budget (rule 3), never paging out ``chunk`` itself."""
        lru = self._lru
        old = lru.pop(chunk, None)
        if old is not None:
            self.resident -= old[1]
        lru[chunk] = (owner, nbytes)
        self.resident += nbytes
        if paged_in:
            self.page_ins += 1
        if self.resident > self.limit:
            self.enforce(keep=chunk)

    def touch(self, chunk: object, nbytes: int) -> None:
        """``chunk`` was used (rule 1): the most recent, measured again (no page-out
        here: a touch does not grow memory by more than it measured)."""
        lru = self._lru
        entry = lru.get(chunk)
        if entry is None:
            return
        lru.move_to_end(chunk)
        if entry[1] != nbytes:
            lru[chunk] = (entry[0], nbytes)
            self.resident += nbytes - entry[1]

    def forget(self, chunk: object) -> None:
        """``chunk`` left memory (its owner paged it out or dropped it)."""
        entry = self._lru.pop(chunk, None)
        if entry is not None:
            self.resident -= entry[1]

    def clear(self) -> None:
        """Forget every chunk (a new engine starts: the structures of an earlier one in
        this process are gone, and must never be asked to page out)."""
        self._lru.clear()
        self.resident = 0

    def enforce(self, keep: object = None) -> None:
        """Rule 3: page out the least recently used chunks until the total is under the
        limit, or until every resident chunk has refused once."""
        lru = self._lru
        tries = len(lru)
        while self.resident > self.limit and tries > 0:
            tries -= 1
            chunk, (owner, nbytes) = lru.popitem(last=False)
            if chunk is keep:
                lru[chunk] = (owner, nbytes)
                continue
            self.resident -= nbytes  # before release: a release may page in (a head) and admit
            if owner.release(chunk):
                self.page_outs += 1
            else:
                lru[chunk] = (owner, nbytes)  # in use: to the recent end
                self.resident += nbytes
