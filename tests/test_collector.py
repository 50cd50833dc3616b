"""The serving process's garbage-collection policy (server/collector.py): what recovery
built is frozen out of every later collection, and the thresholds are the module's."""

from __future__ import annotations

import gc

from conveyor.server.collector import GC_THRESHOLDS, settle_after_recovery


def test_settle_after_recovery_freezes_what_exists_and_sets_the_thresholds():
    kept = [[i] for i in range(1000)]  # long-lived objects, as recovery builds them
    before = gc.get_threshold()
    try:
        settle_after_recovery()
        assert gc.get_freeze_count() >= len(kept)
        assert gc.get_threshold() == GC_THRESHOLDS
        first = kept[0]
        assert gc.is_tracked(first)
        # permanent: in no generation, so no collection walks it
        assert all(o is not first for g in range(3) for o in gc.get_objects(generation=g))
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
