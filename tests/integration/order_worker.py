"""An order worker process for tests/integration/test_live_aggregate.py, driven on stdin.

Commands (one per line), each answered on stdout:

- ``run``: subscribe to the queue and work: each message is acknowledged, cancelled
  (it comes back) or forgotten (never settled: its lease runs out and it comes back),
  at random (seeded). Answers ``running``.
- ``pause``: stop working, send every acknowledgement, unsubscribe (the leases of the
  forgotten messages break: they come back). Answers ``paused <json>``: the ``msg``
  numbers of the messages acknowledged since the previous pause.
- ``quit``: disconnect and exit.

The client reconnects by itself when the server is killed and restarted: its
unconfirmed acknowledgements are sent again, its subscription is made again.

usage: python -m tests.integration.order_worker URI QUEUE NAME SEED
"""

from __future__ import annotations

import json
import random
import sys
import threading

from conveyor import Client

ACK, CANCEL, FORGET = 0.85, 0.10, 0.05  # how a message is settled (the rest of 1 is FORGET)


def main() -> None:
    uri, queue, name, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    rng = random.Random(seed)
    acked: list[int] = []
    stop = threading.Event()
    worker: threading.Thread | None = None
    with Client(name).connect(uri) as client:
        sub = None

        def work() -> None:
            while not stop.is_set():
                msg = sub.get(0.05)
                if msg is None:
                    continue
                r = rng.random()
                if r < ACK:
                    msg.ack()
                    acked.append(msg.json()["msg"])
                elif r < ACK + CANCEL:
                    msg.cancel()
                # else forgotten: the lease runs out

        for line in sys.stdin:
            command = line.strip()
            if command == "run":
                stop.clear()
                sub = client.subscribe(queue, max_backlog=20, sub_id="work")
                worker = threading.Thread(target=work, daemon=True)
                worker.start()
                print("running", flush=True)
            elif command == "pause":
                stop.set()
                if worker is not None:
                    worker.join()
                client.unsubscribe("work")  # sends the batched acknowledgements first
                client.flush()
                print("paused " + json.dumps(acked), flush=True)
                acked.clear()
            elif command == "quit":
                break


if __name__ == "__main__":
    main()
