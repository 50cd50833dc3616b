"""A delayed retry on a replicated queue across real server processes (docs/replication.md,
engine/replication/ownership.py rule 10): a cancel with a delay and a reason on the
owning instance reaches the other one, which, taking the message over by proxied
transfer once the owner is SIGKILLed, holds it until the owner would have offered it,
and keeps the reason. The fixtures and helpers are those of test_replicated_queues.py.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from datetime import datetime

from conveyor import Client
from tests.integration.instances import Instance, instances  # noqa: F401
from tests.integration.test_replicated_queues import explained, pair, publish_n

DELAY_S = 10.0  # long enough to see B hold it after the takeover, short enough for a quick test
REASON = "db down"


def details(inst: Instance) -> list[dict]:
    url = f"http://127.0.0.1:{inst.admin_port}/amps/instance/queues/WorkQ/details"
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.load(reply)["messages"]


def held_until(explanation: dict) -> float:
    """The time of a ``delayed_retry`` verdict (its summary: "offered again from ISO (...)")."""
    found = re.search(r"offered again from (\S+) \(", explanation["summary"])
    assert found, explanation
    return datetime.fromisoformat(found.group(1)).timestamp()


def test_a_delayed_retry_and_its_reason_survive_the_owners_sigkill(instances):
    """A's worker cancels one of three messages with a delay and a reason and acknowledges
    the others; once B has applied all of it, A is SIGKILLed and an operator enables
    proxied transfer on B. B takes the message over but holds it until A's time (its
    explain says so, with A's time), then delivers it once, with A's reason kept."""
    a, b = pair(instances, admin=True)
    publish_n(a.uri, 3)
    b.wait_for_queue(3)

    seen: set[int] = set()
    cancelled = None
    with Client("a0").connect(a.uri) as client:
        sub = client.subscribe("WorkQ", max_backlog=1)
        deadline = time.monotonic() + 20
        while len(seen) < 3 and time.monotonic() < deadline:
            msg = sub.get(timeout=0.2)
            if msg is None:
                continue
            seen.add(msg.json()["i"])
            if cancelled is None:
                cancelled = msg
                sent_from = time.time()
                msg.cancel(delay=DELAY_S, reason=REASON)
                client.flush()
                sent_by = time.time()
            else:
                msg.ack()
                client.flush()
    assert seen == {0, 1, 2} and cancelled is not None, seen
    bookmark = cancelled.bookmark

    # B applies A's records in order: once the acknowledgements (sent after the cancel)
    # removed the two others there, B has the cancel too
    deadline = time.monotonic() + 20
    while (rows := details(b)) and len(rows) > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [(r["bookmark"], r["state"], r["owner"]) for r in rows] == [(bookmark, "elsewhere", "A")], rows
    # B's copy keeps A's time and reason (the admin details show both on the elsewhere row)
    (row,) = rows
    assert row["reason"] == REASON and sent_from + DELAY_S - 1 <= row["not_before"] <= sent_by + DELAY_S + 1, row

    a.kill()
    url = f"http://127.0.0.1:{b.admin_port}/amps/administrator/queues/WorkQ/enable_proxied_transfer"
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert json.loads(reply.read())["done"] is True

    with Client("b0").connect(b.uri) as client:
        sub = client.subscribe("WorkQ")
        not_before = taken_at = None  # A's time, as B's explain gives it; when B showed it held
        received = None
        deadline = time.time() + DELAY_S + 20
        while received is None and time.time() < deadline:
            msg = sub.get(timeout=0.2)
            if msg is not None:
                received = (time.time(), msg)
            elif not_before is None:
                e = explained(b, bookmark)
                if e["verdict"] == "delayed_retry":
                    not_before, taken_at = held_until(e), time.time()
                    row = next(r for r in details(b) if r["bookmark"] == bookmark)
                    assert (row["state"], row["owner"], row["reason"]) == ("available", "B", REASON), row
        assert received is not None, f"B never delivered it:\n{b.proc.log[-3000:]}"
        received_at, msg = received
        assert not_before is not None, "B never showed the message held for A's delayed retry"
        # A's time (when A got the cancel, plus the delay), not one of B's own
        assert sent_from + DELAY_S - 1 <= not_before <= sent_by + DELAY_S + 1, (sent_from, not_before, sent_by)
        assert taken_at < not_before - 2, "B took it over too late for its hold to be seen"
        assert msg.bookmark == bookmark and msg.json() == cancelled.json()
        assert not_before - 1 <= received_at <= not_before + 10, (not_before, received_at)
        # the reason stayed with B's copy: it is the last failure reason of its delivery here
        e = explained(b, bookmark)
        assert e["verdict"] == "leased" and f"last failure reason: {REASON!r}" in " ".join(e["reasons"]), e
        msg.ack()
        client.flush()
        assert sub.get(timeout=2) is None  # once
    deadline = time.monotonic() + 10
    while details(b) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert details(b) == []
