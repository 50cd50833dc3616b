"""The garbage-collection policy of a serving process (``conveyor serve``).

CPython's cyclic collector walks every tracked object of the generations it collects,
while the program waits. A server holds a large, long-lived heap (queue state, the
publish log, indexes) and allocates short-lived objects for every frame; with the
default policy a full collection walks all of it every few seconds (bench_latency,
200,000 messages queued: 45 ms of CPU, two in 15 s; the latency maxima of issue 16).
Rules:

1. After recovery (:func:`settle_after_recovery`): ``gc.freeze()``: what recovery built
   moves to the permanent generation, which no collection walks again. It is freed by
   reference counting as usual when it dies (a message acknowledged); only garbage in
   reference cycles among frozen objects would stay until exit. Recovery leaves none (a
   full collection right after it finds 0 unreachable objects with 100,000 or 200,000
   messages recovered), so there is no collection first: it would cost 50-200 ms before
   the first delivery and find nothing. A debug line says how many objects were frozen.
2. Thresholds (``GC_THRESHOLDS``): the young generation is collected every
   ``GC_THRESHOLDS[0]`` net allocations instead of 700. Most per-message objects die by
   reference counting before a collection sees them; a collection costs in proportion to
   what is still alive, so fewer, larger young collections cost less in all and promote
   less to the older generations. Measured at 5,000 msg/s (bench_latency): 10,000 gives
   young collections of at most 2-3.4 ms of CPU and no middle or full one in 15 s;
   2,000 gives 0.4 ms young ones but a 5.2 ms middle one every ~5 s, at twice the CPU.

Process-wide: the command that owns the process applies it (``conveyor serve``), never
:class:`~conveyor.server.server.Server`, which tests run several at a time in one process.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger("conveyor.server")

#: (young, middle, old): gc.set_threshold's three values. 700, 10, 10 by default.
GC_THRESHOLDS = (10_000, 10, 10)


def settle_after_recovery() -> None:
    """Rules 1 and 2, once, after the server has recovered and before it serves much."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    # Debug: an internal, not something an operator acts on (a plain start logs what they need).
    log.debug("collector: %d objects frozen after recovery; thresholds %s", gc.get_freeze_count(), GC_THRESHOLDS)
