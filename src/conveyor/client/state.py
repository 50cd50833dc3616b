"""The client's connection state machine and its reconnection policy.

Rules kept here (STYLE 3: an enum and a table of transitions, in one module):

1. A client is in exactly one :class:`ConnectionState`. Only
   :meth:`ConnectionMachine.move` changes it, and a pair that is not in ``TRANSITIONS``
   raises :class:`~conveyor.errors.ClientStateError` before anything changes.
2. A lost connection is always reported as ``DISCONNECTED`` first; then, if the policy
   allows, ``RECONNECTING`` until the client is ``CONNECTED`` again or gives up
   (``FAILED``). ``CLOSED`` is where ``disconnect()`` leads, from any state.
3. Listeners (``on_state``) are called after the state has changed, in registration
   order; one that raises is logged and does not stop the others or the client.
4. Time is an argument: :meth:`ReconnectPolicy.delay` takes the attempt number and a
   random draw, :meth:`ReconnectPolicy.exhausted` the elapsed seconds. The faces own
   the clock and the random generator; tests pass their own.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, replace
from typing import Callable

from conveyor import errors

log = logging.getLogger("conveyor.client")


class ConnectionState(str, enum.Enum):
    """Where a client's connection stands (a ``str``: ``state == "connected"`` works)."""

    DISCONNECTED = "disconnected"  # never connected, or lost with no reconnection (yet)
    CONNECTED = "connected"  # logged on; subscriptions and publishes flow
    RECONNECTING = "reconnecting"  # lost; trying the servers with backoff
    FAILED = "failed"  # gave up reconnecting (attempts or time exhausted)
    CLOSED = "closed"  # disconnect() was called

    def __str__(self) -> str:
        return self.value


S = ConnectionState

#: Every legal move. CLOSED -> CONNECTED and FAILED -> CONNECTED are an explicit
#: ``connect()`` again; DISCONNECTED -> DISCONNECTED is a failed first connect.
TRANSITIONS: dict[ConnectionState, frozenset[ConnectionState]] = {
    S.DISCONNECTED: frozenset({S.CONNECTED, S.RECONNECTING, S.CLOSED}),
    S.CONNECTED: frozenset({S.DISCONNECTED, S.CLOSED}),
    S.RECONNECTING: frozenset({S.CONNECTED, S.FAILED, S.CLOSED}),
    S.FAILED: frozenset({S.CONNECTED, S.CLOSED}),
    S.CLOSED: frozenset({S.CONNECTED, S.CLOSED}),
}


@dataclass(frozen=True, slots=True)
class StateChange:
    """What an ``on_state`` listener receives."""

    state: ConnectionState
    previous: ConnectionState
    uri: str | None = None  # the server connected to, or being tried
    reason: str | None = None  # why the connection was lost, or why the client gave up
    attempt: int = 0  # reconnection attempts made so far in this outage


StateListener = Callable[[StateChange], None]


class ConnectionMachine:
    """The current state plus its listeners."""

    def __init__(self) -> None:
        self.state = ConnectionState.DISCONNECTED
        self.listeners: list[StateListener] = []

    def move(self, state: ConnectionState, *, uri: str | None = None, reason: str | None = None, attempt: int = 0) -> None:
        previous = self.state
        if state not in TRANSITIONS[previous]:
            raise errors.ClientStateError(f"connection state {previous} cannot become {state}")
        self.state = state
        if state is previous:
            return
        change = StateChange(state, previous, uri, reason, attempt)
        for listener in list(self.listeners):
            try:
                listener(change)
            except Exception:  # a listener's bug must not break the connection
                log.exception("on_state listener %r raised", listener)


@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """How a client reconnects after losing its connection.

    Attempt ``k`` (from 1) waits ``min(delay_max_seconds, delay_seconds *
    multiplier ** (k - 1))``, less up to ``jitter`` of it at random (so a crowd of
    clients does not reconnect in step). The first attempt after a loss is at once.
    The client gives up (state ``FAILED``) after ``max_attempts`` attempts or
    ``timeout_seconds`` of trying, whichever comes first; ``None`` means no limit, and
    both ``None`` retries for ever.
    """

    enabled: bool = True
    delay_seconds: float = 0.05  # the first backoff: a restarting server is often back this soon
    delay_max_seconds: float = 2.0  # cap: a server that comes back is found within 2 s
    multiplier: float = 2.0
    jitter: float = 0.5  # fraction of each delay drawn at random
    max_attempts: int | None = None
    timeout_seconds: float | None = 60.0  # then FAILED: callers see errors instead of waiting for ever

    def __post_init__(self) -> None:
        if self.delay_seconds < 0 or self.delay_max_seconds < 0 or self.multiplier < 1:
            raise ValueError("delays must be >= 0 and the multiplier >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter is a fraction between 0 and 1")

    def delay(self, attempt: int, draw: float) -> float:
        """Seconds to wait before attempt number ``attempt`` (0-based); ``draw`` in [0, 1)."""
        if attempt <= 0:
            return 0.0
        base = min(self.delay_max_seconds, self.delay_seconds * self.multiplier ** (attempt - 1))
        return base * (1.0 - self.jitter * draw)

    def exhausted(self, attempts: int, elapsed_seconds: float) -> bool:
        """True when ``attempts`` made over ``elapsed_seconds`` are all this policy allows."""
        if not self.enabled:
            return True
        if self.max_attempts is not None and attempts >= self.max_attempts:
            return True
        return self.timeout_seconds is not None and elapsed_seconds >= self.timeout_seconds

    def describe_exhaustion(self, attempts: int, elapsed_seconds: float) -> str:
        return f"gave up reconnecting after {attempts} attempt(s) in {elapsed_seconds:.1f} s"


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


UNSET: object = _Unset()


def make_policy(
    reconnect: "bool | ReconnectPolicy",
    max_reconnect_attempts: object = UNSET,
    reconnect_timeout: object = UNSET,
) -> ReconnectPolicy:
    """The policy the client constructors' ``reconnect``, ``max_reconnect_attempts`` and
    ``reconnect_timeout`` arguments describe (the two shortcuts override the policy)."""
    if isinstance(reconnect, ReconnectPolicy):
        policy = reconnect
    else:
        policy = ReconnectPolicy(enabled=bool(reconnect))
    changes: dict = {}
    if max_reconnect_attempts is not UNSET:
        changes["max_attempts"] = max_reconnect_attempts
    if reconnect_timeout is not UNSET:
        changes["timeout_seconds"] = reconnect_timeout
    if changes:
        policy = replace(policy, **changes)
    return policy
