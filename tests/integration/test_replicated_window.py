"""TargetQueueDepth on a replicated queue across real server processes
(engine/queue/bindings.py rule 7, engine/replication/ownership.py rule 11): A and B
replicate WorkQ both ways; on each instance only the first ``WINDOW`` unacknowledged
messages are active (those owned by the other instance count), the rest inactive. As
messages are acknowledged anywhere the window moves on both; workers on the instance
that does not own the messages get them by transfer; each message is processed once.
The fixtures and helpers are those of test_replicated_queues.py.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request

from tests.integration.instances import Instance, instances  # noqa: F401
from tests.integration.test_replicated_queues import Worker, assert_once, pair, publish_n, run_workers

WINDOW = 1000  # TargetQueueDepth: any positive integer is accepted; small against N, large enough to matter
N = 5000
WINDOWED = ("<Queue><Name>WorkQ</Name><MessageType>json</MessageType><UnderlyingTopic>Work</UnderlyingTopic>"
            f"<LeasePeriod>30s</LeasePeriod><TargetQueueDepth>{WINDOW}</TargetQueueDepth></Queue>")


def stats(inst: Instance) -> dict:
    url = f"http://127.0.0.1:{inst.admin_port}/amps/instance/queues/WorkQ"
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.load(reply)


def window(inst: Instance) -> tuple[int, int]:
    st = stats(inst)
    return st["queue_depth"], st["inactive_message_count"]


def wait_for_window(inst: Instance, expected: tuple[int, int], timeout: float = 30.0) -> dict:
    """Until ``inst`` shows (queue_depth, inactive_message_count) == ``expected``; its statistics."""
    deadline = time.monotonic() + timeout
    while True:
        st = stats(inst)
        if (st["queue_depth"], st["inactive_message_count"]) == expected or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (st["queue_depth"], st["inactive_message_count"]) == expected, \
        f"{inst.name}: {st}\n{inst.proc.log[-3000:]}"
    return st


class Watch(threading.Thread):
    """Samples both instances' windows while workers drain: the largest active part seen."""

    def __init__(self, insts: list[Instance]) -> None:
        super().__init__(daemon=True)
        self.insts = insts
        self.stop = threading.Event()
        self.max_depth = {i.name: 0 for i in insts}
        self.samples = 0

    def run(self) -> None:
        while not self.stop.is_set():
            for inst in self.insts:
                depth, _ = window(inst)
                self.max_depth[inst.name] = max(self.max_depth[inst.name], depth)
            self.samples += 1
            time.sleep(0.05)


def published_and_held(instances) -> tuple[Instance, Instance]:
    """A and B with ``N`` messages published on A (A owns them), each holding ``WINDOW``
    active and the rest inactive: A's window owned by A, B's owned elsewhere (by A)."""
    a, b = pair(instances, queues=WINDOWED, admin=True)
    publish_n(a.uri, N)
    on_a = wait_for_window(a, (WINDOW, N - WINDOW))
    on_b = wait_for_window(b, (WINDOW, N - WINDOW))
    assert (on_a["owned"], on_a["elsewhere"]) == (WINDOW, 0), on_a
    assert (on_b["owned"], on_b["elsewhere"]) == (0, WINDOW), on_b
    assert on_a["target_queue_depth"] == on_b["target_queue_depth"] == WINDOW
    return a, b


def drain(a: Instance, b: Instance, workers: list[Worker], processed: list) -> float:
    """Runs ``workers`` until ``N`` are processed, the windows watched; the drain's seconds."""
    watch = Watch([a, b])
    watch.start()
    began = time.monotonic()
    try:
        run_workers(workers, processed, N, timeout=45)
    finally:
        took = time.monotonic() - began
        watch.stop.set()
        watch.join(10)
    print(f"\ndrained {len(processed)} in {took:.2f}s ({len(processed) / took:.0f} msg/s); "
          f"largest active part seen {watch.max_depth} over {watch.samples} samples")
    # the window held on both instances all the way down
    assert all(d <= WINDOW for d in watch.max_depth.values()), watch.max_depth
    return took


def test_a_replicated_window_holds_on_both_instances_and_drains_on_the_other_once(instances):
    """Rule 7: with 5,000 messages published on A, both A and B hold 1,000 active and
    4,000 inactive. Workers on B only get every message once, by transfers from A, the
    window moving on both instances as acknowledgements travel; at the end neither
    instance holds anything, active or inactive."""
    a, b = published_and_held(instances)
    processed: list = []
    drain(a, b, [Worker(b.uri, f"b{i}", processed) for i in range(3)], processed)
    assert_once(processed, N)
    assert {who for who, _ in processed} <= {"b0", "b1", "b2"}
    wait_for_window(a, (0, 0))
    wait_for_window(b, (0, 0))
    assert stats(b)["transferred_in"] >= N, stats(b)


def test_a_replicated_window_drains_once_with_workers_on_both_instances(instances):
    """The same, with workers on A (the owner) and on B: each message once, wherever it
    was processed, and both windows empty at the end."""
    a, b = published_and_held(instances)
    processed: list = []
    workers = [Worker(a.uri, "a0", processed), Worker(b.uri, "b0", processed), Worker(b.uri, "b1", processed)]
    drain(a, b, workers, processed)
    assert_once(processed, N)
    print("processed per worker:", {w.name: sum(1 for who, _ in processed if who == w.name) for w in workers})
    wait_for_window(a, (0, 0))
    wait_for_window(b, (0, 0))
