"""Against a real server process: a client's topic pattern runs on RE2, so a pattern that
backtracks exponentially in Python's ``re`` (``(a+)+$`` against ``aaa...a!``) cannot
stall the event loop that serves every client; a pattern only ``re`` runs is refused
with one line naming why, the connection kept (config/model.py, client_topic_matcher;
docs/security.md).

With ``re`` the evil publish below would hold the server's only thread for longer than
pytest's timeout, and the third client's message would not come within the bound."""

from __future__ import annotations

import json
import time

from conveyor.protocol import encode_frame
from conveyor.protocol import messages as m
from tests.integration.test_bad_input import Raw

EVIL_TOPIC = "a" * 49 + "!"  # no pattern below matches it; re would backtrack on it for ages
EVIL_PATTERNS = ["(a+)+$", "(a|aa)+$", "(.*a){20}$"]
PROMPT_SECONDS = 10.0  # the ordinary message comes in well under a second


def read_until(raw: Raw, done, what: str, seconds: float = PROMPT_SECONDS) -> list:
    """Everything ``raw`` receives until ``done(received)`` holds, within ``seconds``."""
    received: list = []
    deadline = time.monotonic() + seconds
    while not done(received):
        left = deadline - time.monotonic()
        assert left > 0, f"still waiting for {what} after {seconds} s; received {received[-5:]}"
        raw.sock.settimeout(left)
        try:
            data = raw.sock.recv(65536)
        except TimeoutError:
            raise AssertionError(f"still waiting for {what} after {seconds} s (the server stalled?); "
                                 f"received {received[-5:]}") from None
        assert data, f"the server closed the connection while we waited for {what}"
        raw.decoder.receive_data(data)
        received.extend(raw.decoder.next_items())
    return received


def messages(items: list) -> list:
    return [x for x in items if isinstance(x, m.Message)]


def connected(port: int, name: str, *commands) -> tuple[Raw, list]:
    """A logged-on connection, and the replies to ``commands`` (each with ack processed)."""
    raw = Raw(port)
    raw.send(encode_frame([m.Logon(client_name=name, cid="logon", ack_type="processed"), *commands]))
    replies = read_until(raw, lambda got: sum(isinstance(x, m.Ack) for x in got) >= 1 + len(commands),
                         "the logon and command acks")
    return raw, replies[1:]


def test_an_evil_pattern_stalls_nobody_and_a_backreference_is_refused(server_factory):
    server = server_factory()
    subs = [m.Subscribe(topic=p, sub_id=f"e{i}", cid=f"e{i}", ack_type="processed")
            for i, p in enumerate(EVIL_PATTERNS)]
    evil, acks = connected(server.port, "evil", *subs)
    assert [a.status for a in acks] == ["success"] * len(EVIL_PATTERNS), acks
    plain, acks = connected(server.port, "plain", m.Subscribe(topic="other", sub_id="s", cid="s",
                                                              ack_type="processed"))
    assert [a.status for a in acks] == ["success"]
    pub, _ = connected(server.port, "pub")

    pub.send(encode_frame([m.Publish(topic=EVIL_TOPIC, data=b'{"n": 0}', cid="evil", ack_type="processed"),
                           m.Publish(topic="other", data=b'{"n": 1}', cid="other", ack_type="processed")]))
    acks = read_until(pub, lambda got: len(got) >= 2, "both publish acks")
    assert [(a.cid, a.status) for a in acks] == [("evil", "success"), ("other", "success")]
    got = read_until(plain, lambda got: len(messages(got)) >= 1, "the ordinary message")
    assert [json.loads(x.data) for x in messages(got)] == [{"n": 1}]

    # The patterns still match what they match: a topic of a's alone.
    pub.send(encode_frame([m.Publish(topic="aaaa", data=b'{"n": 2}', ack_type="none")]))
    got = read_until(evil, lambda got: len(messages(got)) >= 2, "aaaa on (a+)+$ and (a|aa)+$")
    assert sorted(x.sub_id for x in messages(got)) == ["e0", "e1"]  # never the evil topic
    assert all(x.topic == "aaaa" for x in messages(got))

    # A backreference: refused with the reason, and the connection goes on.
    evil.send(encode_frame([m.Subscribe(topic=r"(a)\1", sub_id="b", cid="bad"),
                            m.Flush(cid="after", ack_type="processed")]))
    refusal, after = read_until(evil, lambda got: sum(isinstance(x, m.Ack) for x in got) >= 2,
                                "the refusal and the flush ack")
    assert (refusal.cid, refusal.status, refusal.code) == ("bad", "failure", "bad_topic")
    assert refusal.reason == ("topic '(a)\\\\1' uses a regular expression feature conveyor does not run for "
                              "clients (backreferences): client patterns run in linear time (RE2)")
    assert (after.cid, after.status) == ("after", "success")
    assert "Traceback" not in server.log
