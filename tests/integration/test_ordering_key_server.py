"""Per-key ordering on a real server (docs/queues.md, "Per-key ordering"): two worker
threads, each its own connection with room for several messages, drain a queue with
``OrderingKey``; each key's messages are processed one at a time, in publish order,
while the keys spread over both workers."""

from __future__ import annotations

import threading
import time

from conveyor import Client
from tests.integration.test_admin import get
from tests.serverproc import ServerProcess, write_config

QUEUES = """
<Queue><Name>K</Name><MessageType>json</MessageType><UnderlyingTopic>orders</UnderlyingTopic>
  <LeasePeriod>60s</LeasePeriod><OrderingKey>/customer</OrderingKey><MaxInFlightPerKey>1</MaxInFlightPerKey></Queue>
"""

KEYS = ("ann", "bob", "cy", "dee")
PER_KEY = 12


def test_two_workers_process_each_key_in_publish_order_one_at_a_time(tmp_path):
    server = ServerProcess(write_config(tmp_path, queues=QUEUES, admin=True)).start()
    log: list[tuple[str, str, int, str]] = []  # (event, customer, n, worker)
    lock = threading.Lock()
    total = len(KEYS) * PER_KEY
    try:
        publisher = Client("publisher").connect(server.uri)
        for n in range(PER_KEY):
            for c in KEYS:
                publisher.publish("orders", {"customer": c, "n": n})
        publisher.flush()
        stats = get(server.admin_url + "/amps/instance/queues/K")[1]
        assert (stats["available"], stats["held_by_key"]) == (total, total - len(KEYS))  # all but each key's first

        def work(name: str) -> None:
            client = Client(name).connect(server.uri)
            sub = client.subscribe("K", max_backlog=3)
            try:
                while True:
                    with lock:
                        if sum(1 for e in log if e[0] == "end") >= total:
                            return
                    msg = sub.get(timeout=0.5)
                    if msg is None:
                        continue
                    data = msg.json()
                    with lock:
                        log.append(("start", data["customer"], data["n"], name))
                    time.sleep(0.005)
                    with lock:
                        log.append(("end", data["customer"], data["n"], name))
                    msg.ack()
            finally:
                client.disconnect()

        workers = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(2)]
        for t in workers:
            t.start()
        for t in workers:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in workers)
        publisher.disconnect()
    finally:
        server.stop()
    for c in KEYS:
        events = [(e, n) for e, k, n, _ in log if k == c]
        # one at a time (each start followed by its end), in publish order
        assert events == [(e, n) for n in range(PER_KEY) for e in ("start", "end")], (c, events)
    assert {w for _, _, _, w in log} == {"w0", "w1"}  # the keys flowed to both workers
