"""Group-commit statistics, for the admin interface (``/metrics``, the statistics tree,
the dashboard's commit card)."""

from __future__ import annotations


class CommitStats:
    """Group commits, for the admin interface: how long each write + fsync took (seconds;
    ``buckets[i]`` counts the commits whose time fell in ``COMMIT_SECONDS_BUCKETS[i]``
    and no lower bucket) and how big each group was. A few additions per group, off the
    per-message path."""

    __slots__ = ("count", "seconds_sum", "seconds_max", "last_seconds", "bytes_sum", "records_sum",
                 "bytes_max", "records_max", "buckets")

    def __init__(self) -> None:
        self.count = 0
        self.seconds_sum = self.seconds_max = self.last_seconds = 0.0
        self.bytes_sum = self.records_sum = self.bytes_max = self.records_max = 0
        self.buckets = [0] * len(COMMIT_SECONDS_BUCKETS)

    def add(self, seconds: float, size: int, records: int) -> None:
        self.count += 1
        self.last_seconds = seconds
        self.seconds_sum += seconds
        if seconds > self.seconds_max:
            self.seconds_max = seconds
        self.bytes_sum += size
        self.records_sum += records
        if size > self.bytes_max:
            self.bytes_max = size
        if records > self.records_max:
            self.records_max = records
        for i, bound in enumerate(COMMIT_SECONDS_BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1
                break


#: Upper bounds (seconds) of the group-commit latency histogram.
COMMIT_SECONDS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, float("inf"))
