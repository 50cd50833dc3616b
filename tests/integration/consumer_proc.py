"""A queue worker process for integration tests: prints each message's n, then acks it.
A message ``{"stop": true}`` is acknowledged and ends the worker (no idle timeout: the
test publishes one per worker after the work, and a FIFO queue hands it out last).

usage: python -m tests.integration.consumer_proc URI QUEUE NAME BACKLOG [DELAY]
"""

import sys
import time

from conveyor import Client


def main() -> None:
    uri, queue, name, backlog = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    delay = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
    with Client(name).connect(uri) as client:
        sub = client.subscribe(queue, max_backlog=backlog)
        print("ready", flush=True)
        for msg in sub:
            body = msg.json()
            if body.get("stop"):
                msg.ack()
                break
            print(body["n"], flush=True)
            if delay:
                time.sleep(delay)
            msg.ack()
        client.flush()


if __name__ == "__main__":
    main()
