"""Per-key ordering on a replicated queue across real server processes (docs/queues.md,
"Per-key ordering", its "Replicated queues" point; docs/replication.md, "Replicated
queues"): A and B replicate a queue with ``OrderingKey`` and ``MaxInFlightPerKey`` 1 both
ways; every message is published on A; workers on both instances drain it. For each key,
"at most N messages are leased across all instances, always its oldest unfinished ones":
its messages are processed one at a time, in publish order, wherever they are processed,
while the other keys flow, and B gets messages by transfer requests. The fixtures and
helpers are those of test_replicated_queues.py.

Every worker is a thread of this process, so one clock (``time.monotonic``) times them
all; a worker records a message's end before it acknowledges it, and the next message of
its key cannot be delivered before that acknowledgement reached the instance delivering
it, so one key's intervals must not overlap at all.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict

from conveyor import Client
from tests.integration.instances import instances  # noqa: F401
from tests.integration.test_replicated_queues import pair

QUEUE_KEYED = ("<Queue><Name>WorkQ</Name><MessageType>json</MessageType><UnderlyingTopic>Work</UnderlyingTopic>"
               "<LeasePeriod>30s</LeasePeriod><OrderingKey>/k</OrderingKey><MaxInFlightPerKey>1</MaxInFlightPerKey>"
               "</Queue>")
KEYS = [f"key-{n}" for n in range(6)]
PER_KEY = 10
TOTAL = len(KEYS) * PER_KEY
SEED = 36  # the interleaving of the keys and the processing times


class KeyedWorker(threading.Thread):
    """Takes messages from WorkQ on one instance; "processes" each for ``low``..``high``
    seconds, records (key, i, instance, worker, start, end), then acknowledges it."""

    def __init__(self, uri: str, instance: str, name: str, done: list, lock: threading.Lock, *,
                 backlog: int, low: float, high: float, seed: int) -> None:
        super().__init__(daemon=True)
        self.uri, self.instance, self.name, self.done, self.lock = uri, instance, name, done, lock
        self.backlog, self.low, self.high = backlog, low, high
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Client(self.name).connect(self.uri) as client:
                sub = client.subscribe("WorkQ", max_backlog=self.backlog)
                while not self.stop.is_set():
                    msg = sub.get(timeout=0.1)
                    if msg is None:
                        continue
                    start = time.monotonic()
                    data = msg.json()
                    time.sleep(self.rng.uniform(self.low, self.high))
                    end = time.monotonic()
                    with self.lock:
                        self.done.append((data["k"], data["i"], self.instance, self.name, start, end))
                    msg.ack()
                client.flush()
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            self.error = exc


def publish_keyed(uri: str) -> list[tuple[str, int]]:
    """TOTAL messages over KEYS, interleaved (seeded), ``i`` increasing in publish order."""
    keys = KEYS * PER_KEY
    random.Random(SEED).shuffle(keys)
    sent = [(k, i) for i, k in enumerate(keys)]
    with Client("publisher").connect(uri) as client:
        for k, i in sent:
            client.publish("Work", {"k": k, "i": i})
        client.flush()
    return sent


def queue_empty(uri: str, timeout: float = 10.0) -> int:
    """Until a sow of WorkQ shows nothing; returns what it last showed."""
    deadline = time.monotonic() + timeout
    with Client(f"viewer-{time.monotonic_ns()}").connect(uri) as client:
        while (left := len(client.sow("WorkQ"))) and time.monotonic() < deadline:
            time.sleep(0.1)
    return left


def test_a_key_published_on_a_is_processed_one_at_a_time_in_order_across_both_instances(instances):
    """Each message processed once; per key, never two in flight (on either instance) and
    in publish order; both instances process some (B by transfers from A)."""
    a, b = pair(instances, queues=QUEUE_KEYED)
    sent = publish_keyed(a.uri)
    b.wait_for_queue(TOTAL)  # B has every message (owned by A) before anyone works

    done: list = []
    lock = threading.Lock()
    # A has one slow worker with room for one message; B two quick ones with room for two.
    # B's first requests go once A's first acknowledgement reached it (the wait is then
    # that one sample); A grants what its worker has no room for, B takes the heads of
    # the keys not leased on A and grants the rest back when A asks (held behind their
    # keys: offered to nobody). B asks for those again only after the request retry
    # (2 x WAIT_DEFAULT_S, 4 s): A's worker is slow enough to be still busy then, so B
    # takes a share of the rest and the keys move between the instances both ways. With
    # A's worker as quick as B's, A processes all but B's first few in under 2 s.
    workers = [KeyedWorker(a.uri, "A", "a0", done, lock, backlog=1, low=0.10, high=0.15, seed=SEED)]
    workers += [KeyedWorker(b.uri, "B", f"b{n}", done, lock, backlog=2, low=0.005, high=0.03, seed=SEED + 1 + n)
                for n in range(2)]
    began = time.monotonic()
    for w in workers:
        w.start()
    deadline = began + 30
    while len(done) < TOTAL and time.monotonic() < deadline and all(w.is_alive() for w in workers):
        time.sleep(0.05)
    time.sleep(0.5)  # a duplicate delivery would come in now
    for w in workers:
        w.stop.set()
    for w in workers:
        w.join(30)
    took = time.monotonic() - began
    errors = [(w.name, w.error) for w in workers if w.error is not None]
    assert not errors, errors

    table = "\n".join(f"{k} i={i:2} {inst} {name} {s - began:7.3f}..{e - began:7.3f}"
                      for k, i, inst, name, s, e in sorted(done, key=lambda r: r[4]))
    # every message processed exactly once
    counts = Counter((k, i) for k, i, *_ in done)
    twice = sorted(m for m, n in counts.items() if n > 1)
    missing = sorted(set(sent) - set(counts))
    assert not twice and not missing, f"twice: {twice}, missing: {missing} after {took:.1f}s\n{table}"
    assert set(counts) == set(sent)

    by_key: dict[str, list] = defaultdict(list)
    for k, i, inst, name, s, e in sorted(done, key=lambda r: r[4]):
        by_key[k].append((i, inst, name, s, e))
    for k, rows in by_key.items():
        # one at a time: the next one starts after the previous one ended (acked after)
        for before, after in zip(rows, rows[1:]):
            assert after[3] >= before[4], f"{k}: overlap {before} / {after}\n{table}"
        # in publish order
        assert [r[0] for r in rows] == [i for kk, i in sent if kk == k], f"{k}: order {rows}\n{table}"

    per_instance = Counter(inst for _, _, inst, *_ in done)
    moves = Counter(f"{x[1]}->{y[1]}" for rows in by_key.values() for x, y in zip(rows, rows[1:]) if x[1] != y[1])
    print(f"\nprocessed in {took:.2f}s: {dict(per_instance)}; per worker "
          f"{dict(Counter(name for *_, name, _, _ in done))}; a key's next message on the other instance: "
          f"{dict(moves)}")
    # B's workers had room while A's had none: B asked and A granted
    assert per_instance["A"] > 0 and per_instance["B"] > 0, f"{dict(per_instance)}\n{table}"
    # and a key's line went on on the other instance (its next message waited there for
    # the acknowledgement of its previous one to arrive)
    assert moves, f"no key moved between the instances\n{table}"
    # the removals reached both instances: nothing left in the queue anywhere
    assert queue_empty(a.uri) == 0 and queue_empty(b.uri) == 0
