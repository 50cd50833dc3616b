"""Catching up after a restart (docs/replication.md, "After a restart: catching up").

An instance that starts may own messages of its replicated queues that a peer
acknowledged while it was down (after a proxied transfer, or a copy both recorded as
their own after a publisher failover): the peer's acknowledgements are in the peer's
journal, and reach this instance only once the peer's link to it has streamed them. So
a starting instance holds the deliveries of its replicated queues until every peer it
waits for has caught it up. :class:`CatchUp` keeps the rules:

1. **Whom it waits for.** Each ``sync`` ``Destination`` that replicates one of this
   instance's replicated queues (its ``Topic`` matches the queue's name): the handshake
   rules make such a peer replicate the queue back. ``async`` peers are never waited
   for, as their acknowledgements of publishes are not. No such peer, or
   ``RecoveryCatchUpTimeout`` 0: nothing to wait for, the instance delivers at once.
2. **Caught up.** A peer's ``Hello`` says where its durable journal ended when it said
   hello (``journal_end``); the peer has caught this instance up once its stream has
   brought this instance that far (every record it needed below that position has been
   applied here). A link that resumes at or past that position has caught up at once.
   A peer whose ``Hello`` does not say (an older version) counts as caught up at once,
   and that is logged. A link that drops before it caught up counts for nothing: the
   next one says hello with a new end.
3. **The limit.** ``RecoveryCatchUpTimeout`` after the start (the first moment the
   engine is given), the wait ends whoever has not caught up, with a warning naming
   those peers (not heard from, or how far behind). An operator may end it sooner (the
   admin interface's ``replication/catch_up/end``).
4. The wait happens once per start: once ended (caught up, timed out or ended by an
   operator) it never starts again in this process, whatever the links do later.

What it holds, and how cheaply, is :mod:`.held_delivery`'s business (one flag per
dispatch); the server's ``--no-clients-until-replicated`` reads :attr:`CatchUp.done`.
"""

from __future__ import annotations

import logging

import msgspec

from conveyor.config.model import Config, topic_matcher

log = logging.getLogger("conveyor.replication")


class PeerCatchUp(msgspec.Struct, frozen=True):
    peer: str
    # "not_heard_from" (no link since the start), "catching_up", "caught_up",
    # "no_journal_end" (an older peer: counted as caught up)
    state: str
    journal_end: int | None  # the peer's journal end at the last handshake
    received_through: int | None  # how far its stream has brought this instance since


class CatchUpStats(msgspec.Struct, frozen=True):
    waiting: bool  # deliveries of replicated queues are held now
    # None while waiting; "caught_up", "timed_out", "ended" (by an operator),
    # "nothing_to_wait_for"
    outcome: str | None
    timeout_s: float
    waited_s: float | None  # since the start (until the end once ended)
    peers: tuple[PeerCatchUp, ...]


class _Peer:
    __slots__ = ("name", "state", "journal_end", "received")

    def __init__(self, name: str) -> None:
        self.name = name
        self.state = "not_heard_from"
        self.journal_end: int | None = None
        self.received: int | None = None

    def stats(self) -> PeerCatchUp:
        return PeerCatchUp(self.name, self.state, self.journal_end, self.received)


class CatchUp:
    """Rules 1-4 for this instance: whom it waits for, and whether it still does."""

    def __init__(self, config: Config) -> None:
        repl = config.replication
        self.timeout_s = repl.recovery_catch_up_timeout_s if repl is not None else 0.0
        replicated = repl.replicated_queues(config.queues) if repl is not None else frozenset()
        names = []
        for dest in repl.destinations if repl is not None else ():
            matchers = [topic_matcher(t.name) for t in dest.topics]
            if dest.sync_type == "sync" and any(m(q) for m in matchers for q in replicated):
                names.append(dest.name)
        self._peers = {name: _Peer(name) for name in names}
        #: The one flag: False while the deliveries of the replicated queues are held.
        self.done = not self._peers or self.timeout_s <= 0
        self.outcome: str | None = "nothing_to_wait_for" if self.done else None
        self.started: float | None = None
        self.ended: float | None = None

    @property
    def peers(self) -> tuple[str, ...]:
        return tuple(self._peers)

    @property
    def deadline(self) -> float | None:
        """When the wait ends at the latest (None: it is over, or has not started)."""
        if self.done or self.started is None:
            return None
        return self.started + self.timeout_s

    def start(self, now: float) -> None:
        """The start (rule 3): the first moment the engine is given."""
        if self.started is not None:
            return
        self.started = now
        if self.done:
            self.ended = now
            return
        log.info("catching up: the replicated queues deliver nothing until %s ha%s sent this instance its "
                    "journal up to where it ended at the handshake (what it acknowledged while this instance was "
                    "down), or for at most %g s (RecoveryCatchUpTimeout)", _names(self._peers),
                    "s" if len(self._peers) == 1 else "ve", self.timeout_s)

    def settle(self, now: float) -> bool:
        """Whether the wait is over at ``now`` (rule 3 ends it here)."""
        if self.done:
            return True
        self.start(now)
        assert self.started is not None  # start() set it
        if now >= self.started + self.timeout_s:
            behind = [p for p in self._peers.values() if p.state != "caught_up"]
            log.warning("catching up: RecoveryCatchUpTimeout (%g s) passed without hearing everything from %s: the "
                        "replicated queues deliver now; a message one of them processed while this instance was down "
                        "may be processed again", self.timeout_s, _describe(behind))
            self._end(now, "timed_out")
        return self.done

    def link_up(self, peer: str, journal_end: int | None, have: int, now: float) -> bool:
        """A peer said hello (rule 2): ``journal_end`` from its ``Hello``, ``have`` where
        its stream resumes. True while this instance still waits for it (the sink then
        reports the stream's progress to :meth:`progress`)."""
        state = self._peers.get(peer)
        if self.done or state is None or state.state in ("caught_up", "no_journal_end"):
            return False
        self.start(now)
        state.journal_end, state.received = journal_end, have
        if journal_end is None:
            state.state = "no_journal_end"
            log.warning("catching up: %s does not say where its journal ends (an older version): counted as caught "
                        "up at once", peer)
            self._caught_up(state, now)
            return False
        if have >= journal_end:
            self._caught_up(state, now)
            return False
        state.state = "catching_up"
        log.info("catching up: %s sends its journal from %d to %d", peer, have, journal_end)
        return True

    def progress(self, peer: str, through: int, now: float) -> bool:
        """The stream from ``peer`` has been applied below ``through``; True once it has
        caught this instance up (nothing more to report)."""
        state = self._peers.get(peer)
        if state is None or state.state != "catching_up":
            return True
        state.received = through
        if state.journal_end is not None and through >= state.journal_end:
            self._caught_up(state, now)
            return True
        return self.done

    def end(self, now: float, by: str) -> bool:
        """An operator ends the wait (rule 3); False when it was over already."""
        if self.done:
            return False
        self.start(now)
        behind = [p for p in self._peers.values() if p.state != "caught_up"]
        log.warning("catching up: ended by %s before %s caught up: the replicated queues deliver now", by,
                    _describe(behind))
        self._end(now, "ended")
        return True

    def _caught_up(self, state: _Peer, now: float) -> None:
        if state.state != "no_journal_end":
            state.state = "caught_up"
        log.info("catching up: %s has caught this instance up", state.name)
        if all(p.state in ("caught_up", "no_journal_end") for p in self._peers.values()):
            waited = now - self.started if self.started is not None else 0.0
            log.info("catching up: done in %.1f s (%s): the replicated queues deliver", waited,
                        _names(self._peers))
            self._end(now, "caught_up")

    def _end(self, now: float, outcome: str) -> None:
        self.done = True
        self.outcome = outcome
        self.ended = now

    def statistics(self, now: float) -> CatchUpStats:
        waited = None
        if self.started is not None:
            waited = (self.ended if self.ended is not None else now) - self.started
        return CatchUpStats(not self.done, self.outcome, self.timeout_s, waited,
                            tuple(p.stats() for p in self._peers.values()))


def _names(peers: dict[str, _Peer]) -> str:
    return ", ".join(peers)


def _describe(peers: list[_Peer]) -> str:
    parts = []
    for p in peers:
        if p.state == "not_heard_from":
            parts.append(f"{p.name} (not heard from)")
        else:
            parts.append(f"{p.name} (at {p.received} of {p.journal_end})")
    return ", ".join(parts) or "nobody"
