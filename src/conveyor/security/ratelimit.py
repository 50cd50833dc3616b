"""The failed-logon limit: wrong credentials counted per address and per user name
within a window, and the backoff of the wrong answers over the limit (time is an
argument). docs/security.md ("Failed logons") says what it limits and why.

Rules:

1. **Only wrong credentials count**: a password checked and found wrong for a known
   user, or any password for an unknown user. A logon or admin request that carries
   no credentials is refused without a check and counts nowhere (a browser's first
   request to the dashboard, a probe, a client that forgot its password).
2. **Two keys**: the client's host and the user name it tried. A key is *over the
   limit* when it holds at least its maximum of failures within the window
   (``MaxFailedLogonsPerAddress``, ``MaxFailedLogonsPerUser``, ``FailedLogonWindow``).
3. **Backoff, never a lockout**: a correct credential is admitted whatever the counts.
   A wrong one from a key over the limit is answered late: :data:`BACKOFF_MIN_S`,
   doubling with each further failure, at most :data:`BACKOFF_MAX_S`. So a guesser
   waits for each answer, and an address or a user name under attack (a NAT, a proxy,
   loopback) keeps logging on with the right password.
4. **Bounded memory**: at most :data:`KEYS_TRACKED_MAX` keys per table (the oldest
   forgotten first), each holding at most its maximum plus :data:`BACKOFF_STEPS`
   times; user names are cut to :data:`KEY_CHARS_MAX` characters.
"""

from __future__ import annotations

from collections import deque

KEYS_TRACKED_MAX = 100_000  # distinct addresses (or user names) remembered per table
KEY_CHARS_MAX = 256  # a user name longer than any valid one is counted by its beginning
BACKOFF_MIN_S = 0.5  # the delay of the first wrong answer over the limit
BACKOFF_MAX_S = 8.0  # the longest delay (below the default LogonTimeout of 10 s)
BACKOFF_STEPS = 5  # doublings from BACKOFF_MIN_S to BACKOFF_MAX_S: the times kept beyond the maximum


class FailedLogons:
    """Failure times per key within a window (one table of rule 2)."""

    def __init__(self, failures_max: int, window_s: float) -> None:
        self.failures_max = failures_max
        self.window_s = window_s
        self._failures: dict[str, deque[float]] = {}

    def _recent(self, key: str, now: float) -> deque[float] | None:
        times = self._failures.get(key)
        if times is None:
            return None
        while times and now - times[0] >= self.window_s:
            times.popleft()
        if not times:
            del self._failures[key]
            return None
        return times

    def recent(self, key: str, now: float) -> int:
        """Failures of ``key`` within the window (at most the maximum plus BACKOFF_STEPS)."""
        times = self._recent(key[:KEY_CHARS_MAX], now)
        return len(times) if times is not None else 0

    def over(self, key: str, now: float) -> int:
        """0 while ``key`` is under its limit; else 1 + the failures beyond the maximum."""
        n = self.recent(key, now)
        return n - self.failures_max + 1 if n >= self.failures_max else 0

    def failed(self, key: str, now: float) -> None:
        key = key[:KEY_CHARS_MAX]
        times = self._recent(key, now)
        if times is None:
            if len(self._failures) >= KEYS_TRACKED_MAX:
                self._failures.pop(next(iter(self._failures)))
            times = self._failures[key] = deque(maxlen=self.failures_max + BACKOFF_STEPS)
        times.append(now)

    def __len__(self) -> int:
        return len(self._failures)


def backoff_s(over: int) -> float:
    """How late a wrong answer is given for a key ``over`` its limit (rule 3); 0 under it."""
    if over <= 0:
        return 0.0
    return min(BACKOFF_MAX_S, BACKOFF_MIN_S * float(2 ** min(over - 1, BACKOFF_STEPS)))


class LogonLimit:
    """Both tables of rule 2, for one kind of connection (clients and the admin
    interface share one; replication links have their own)."""

    def __init__(self, per_address_max: int, per_user_max: int, window_s: float) -> None:
        self.addresses = FailedLogons(per_address_max, window_s)
        self.users = FailedLogons(per_user_max, window_s)

    def limited(self, address: str, user: str | None, now: float) -> str:
        """Why ``address`` or ``user`` is over its limit ("" when neither is)."""
        why = []
        if self.addresses.over(address, now):
            why.append(f"address {address} is over MaxFailedLogonsPerAddress")
        if user and self.users.over(user, now):
            why.append(f"user {user[:KEY_CHARS_MAX]!r} is over MaxFailedLogonsPerUser")
        return " and ".join(why)

    def delay_s(self, address: str, user: str | None, now: float) -> float:
        """How late to answer a wrong credential from ``address`` for ``user`` (rule 3)."""
        over = self.addresses.over(address, now)
        if user:
            over = max(over, self.users.over(user, now))
        return backoff_s(over)

    def failed(self, address: str, user: str | None, now: float) -> None:
        self.addresses.failed(address, now)
        if user:
            self.users.failed(user, now)
