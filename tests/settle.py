"""Proofs that nothing more comes from the server, made with events, never with an
idle wait. They take any client with ``flush()``, ``publish()`` and subscriptions with
``get(timeout)``: the blocking Client, or a face of tests/client/faces.py.

- :func:`barrier`: a round trip on the connection. The server answers a ``flush`` once
  it has processed every command sent before it (and persisted what they wrote), and
  writes each connection's output in order, so once the answer is here, so is every
  message the server sent before it. Two flushes, because the durability step that
  releases the first answer dispatches queue messages (newly persisted or freed by an
  acknowledgement) right after it; the second answer comes after those. The server
  dispatches after every command and every durability step, so without new input (or
  a lease running out) it sends nothing more.
- :func:`take_all`: a queue subscription's messages, acknowledged as they come, until a
  barrier finds nothing new.
- :func:`until_sentinel`: a bookmark replay's messages. Replays are sent in steps of
  their own, after a flush's answer, so a flush proves nothing there; instead a
  sentinel is published now and the replay is read up to it: a replay delivers in log
  order, then live, so anything else would come before it.
"""

from __future__ import annotations

import itertools

from conveyor.client import Message

SENTINEL_SECONDS_MAX = 10.0  # a sentinel that takes longer than this is a failure, not a wait
_sentinels = itertools.count(1)


def barrier(client) -> None:
    """Every message the server sent ``client`` so far is in its buffers (see above).
    Also sends the acknowledgements batched so far (a flush does)."""
    client.flush()
    client.flush()


def buffered(sub, ack: bool = False) -> list[Message]:
    """What ``sub`` holds now, without waiting (``get(0)``)."""
    out = []
    while (msg := sub.get(0)) is not None:
        out.append(msg)
        if ack:
            msg.ack()
    return out


def take_all(client, sub, ack: bool = True) -> list[Message]:
    """Every message the server has for ``sub`` now, acknowledging each (so that the
    backlog lets the next ones come), until a barrier brings nothing new."""
    out: list[Message] = []
    while True:
        barrier(client)
        got = buffered(sub, ack)
        if not got:
            return out
        out.extend(got)


def until_sentinel(client, sub, topic: str) -> list[Message]:
    """The messages bookmark subscription ``sub`` of ``topic`` delivers before a
    sentinel published now (sentinels of earlier calls are skipped)."""
    marker = next(_sentinels)
    client.publish(topic, {"sentinel": marker})
    client.flush()
    out = []
    while True:
        msg = sub.get(SENTINEL_SECONDS_MAX)
        assert msg is not None, f"sentinel {marker} of {topic!r} did not come"
        body = msg.json()
        if isinstance(body, dict) and "sentinel" in body:
            if body["sentinel"] == marker:
                return out
            continue
        out.append(msg)
