"""Fingerprints of recent publishes: a duplicate that is not the same message is loud.

The direct-mode Spark sink (SPARK.md 3.1) numbers rows ``batchId << 32 | rowIndex``; a
replay that puts a different row at an index already used would be dropped as a
duplicate and lost. With a fingerprint (a hash of the payload) on each publish, such a
duplicate fails with ``duplicate_conflict`` instead. Rules:

1. ``Publish.fingerprint`` is journaled in ``PublishRec.fingerprint`` (0: none) and
   remembered here for the last :data:`WINDOW_PER_PUBLISHER` sequences of each
   publisher, for at most :data:`PUBLISHERS_MAX` publishers (least recently used out).
   Outside the window a duplicate is an ordinary duplicate.
2. Recovery rebuilds the window from the records it scans (from the checkpoint on: the
   window after a restart may lack what is older than the last checkpoint).
3. Publishes without a fingerprint cost one attribute test on the hot path.
"""

from __future__ import annotations

from collections import OrderedDict

WINDOW_PER_PUBLISHER = 65_536  # about one micro-batch of one partition, and more
PUBLISHERS_MAX = 4_096


class FingerprintWindow:
    def __init__(self, per_publisher: int = WINDOW_PER_PUBLISHER, publishers: int = PUBLISHERS_MAX) -> None:
        self._per_publisher = per_publisher
        self._publishers_max = publishers
        self._by_publisher: OrderedDict[int, OrderedDict[int, int]] = OrderedDict()

    def note(self, publisher: int, seq: int, fingerprint: int) -> None:
        window = self._by_publisher.get(publisher)
        if window is None:
            window = self._by_publisher[publisher] = OrderedDict()
            if len(self._by_publisher) > self._publishers_max:
                self._by_publisher.popitem(last=False)
        else:
            self._by_publisher.move_to_end(publisher)
        window[seq] = fingerprint
        if len(window) > self._per_publisher:
            window.popitem(last=False)

    def get(self, publisher: int, seq: int) -> int | None:
        window = self._by_publisher.get(publisher)
        return None if window is None else window.get(seq)

    def __len__(self) -> int:
        return sum(len(w) for w in self._by_publisher.values())
