"""Failed logons per address: after too many within a window, the address is refused
without a password check until the window has passed (time is an argument).

Only failures count: a client that logs on correctly is never slowed down, and an
attacker pays one argon2 verification per attempt up to the limit, then none.
"""

from __future__ import annotations

from collections import deque

ADDRESSES_TRACKED_MAX = 100_000  # distinct addresses remembered (oldest forgotten first)


class FailedLogons:
    def __init__(self, failures_max: int, window_s: float) -> None:
        self.failures_max = failures_max
        self.window_s = window_s
        self._failures: dict[str, deque[float]] = {}

    def _recent(self, address: str, now: float) -> deque[float] | None:
        times = self._failures.get(address)
        if times is None:
            return None
        while times and now - times[0] >= self.window_s:
            times.popleft()
        if not times:
            del self._failures[address]
            return None
        return times

    def blocked_for(self, address: str, now: float) -> float:
        """Seconds until ``address`` may try again (0: it may now)."""
        times = self._recent(address, now)
        if times is None or len(times) < self.failures_max:
            return 0.0
        return max(0.0, times[-self.failures_max] + self.window_s - now)

    def failed(self, address: str, now: float) -> None:
        times = self._recent(address, now)
        if times is None:
            if len(self._failures) >= ADDRESSES_TRACKED_MAX:
                self._failures.pop(next(iter(self._failures)))
            times = self._failures[address] = deque(maxlen=self.failures_max)
        times.append(now)
