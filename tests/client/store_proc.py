"""A publisher process with a file-backed publish store, for test_store.py.

usage: python -m tests.client.store_proc URI NAME STORE FIRST COUNT MODE

MODE ``hang``: publish FIRST..FIRST+COUNT-1 and flush; print "half"; wait for a line on
stdin; publish COUNT more; try a short flush (the test has paused the server, so it
times out); print "stored"; then wait to be killed.
MODE ``resume``: connect (the store is republished at logon), publish FIRST..
FIRST+COUNT-1, flush; print "done".
"""

from __future__ import annotations

import sys
import time

from conveyor import errors
from conveyor.client import Client, FilePublishStore


def main() -> None:
    uri, name, path, first, count, mode = sys.argv[1:7]
    first, count = int(first), int(count)
    client = Client(name, publish_store=FilePublishStore(path), reconnect=False).connect(uri)
    for n in range(first, first + count):
        client.publish("orders", {"n": n})
    client.flush(timeout=30)
    if mode == "resume":
        print("done", client.statistics().unpersisted, flush=True)
        client.disconnect()
        return
    print("half", flush=True)
    sys.stdin.readline()
    for n in range(first + count, first + 2 * count):
        client.publish("orders", {"n": n})
    try:
        # Every publish is in the store file once this returns, even timed out (the
        # server is paused): the loop stores and syncs them before the timer can fire.
        client.flush(timeout=0.01)
    except errors.TimedOut:
        pass
    print("stored", client.statistics().unpersisted, flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
