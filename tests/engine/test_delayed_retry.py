"""Delayed retry and failure reasons (docs/queues.md, "Delayed retry", "Failure reasons";
engine/queue/returns.py): a cancel with ``delay=N`` (or the queue's RetryBackoff) holds
the message from every subscriber until its time while the others flow past it; the
delay survives a restart (journal replay and snapshot); ``reason="..."`` on a cancel or
an expire is kept with the message and lands on its dead letter. Virtual time
(tests/engine/engine_harness.py)."""

from __future__ import annotations

import pytest

from conveyor.config import load_text
from conveyor.errors import ConfigError

from .engine_harness import Harness, config_xml, decode, queue_xml

DEAD = """
<Actions><Action>
  <On><Module>amps-action-on-sow-expire-message</Module><Options><Topic>Q</Topic><MessageType>json</MessageType></Options></On>
  <Do><Module>amps-action-do-publish-message</Module><Options><Topic>Dead</Topic><MessageType>json</MessageType>
  <Data>{ "message": {{AMPS_DATA}}, "reason": "{{AMPS_REASON}}", "why": "{{CONVEYOR_FAILURE_REASON}}", "deliveries": {{CONVEYOR_DELIVERIES}}, "by": "{{CONVEYOR_LAST_CONSUMER}}", "at": "{{CONVEYOR_EXPIRED_AT}}" }</Data>
  </Options></Do>
</Action></Actions>
"""


def harness(**elements) -> Harness:
    text = config_xml(queue_xml("Q", **elements), topics=("Work", "Dead"))
    return Harness(text.replace("</AMPSConfig>", DEAD + "</AMPSConfig>"))


def setup(n: int = 2, **elements) -> tuple[Harness, int, int]:
    """Queue Q over Work with ``n`` messages {"i": 0..n-1}, worker ``w`` (backlog 1)."""
    h = harness(**elements)
    pub = h.connect("pub")
    w = h.connect("w")
    h.subscribe(w, "Q", "s", options="max_backlog=1")
    for i in range(n):
        h.publish(pub, "Work", {"i": i})
    h.commit()
    return h, pub, w


def got(h: Harness, conn: int) -> list[int]:
    return [decode(msg)["i"] for msg in h.messages(conn, "Q")]


def dead_letters(h: Harness) -> list[dict]:
    return h.published("Dead")


def cancel_first(h: Harness, w: int, options: str) -> None:
    (msg,) = h.messages(w, "Q")
    h.ack(w, "Q", msg, options=options)
    h.commit()


def test_a_delayed_cancel_holds_the_message_while_the_others_flow_past_it():
    h, _, w = setup(3)
    (first,) = h.messages(w, "Q")
    assert decode(first)["i"] == 0
    h.ack(w, "Q", first, options="cancel,delay=5")
    h.commit()
    seen = []
    for _ in range(2):  # the two others, in order, while 0 waits
        (msg,) = h.messages(w, "Q")
        seen.append(decode(msg)["i"])
        h.ack(w, "Q", msg)
        h.commit()
    assert seen == [1, 2] and h.messages(w, "Q") == []
    assert h.queue("Q").state_of(first_position(first)).value == "available"
    h.advance(4.9)
    assert h.messages(w, "Q") == []
    h.advance(0.2)
    assert got(h, w) == [0]
    assert h.stats("Q").cancelled == 1


def first_position(msg) -> int:
    return int(msg.bookmark.split("|")[-1].rstrip("|")) if "|" in msg.bookmark else int(msg.bookmark)


def test_fifo_is_kept_among_available_messages_when_the_delay_ends():
    h, pub, w = setup(1)
    cancel_first(h, w, "cancel,delay=2")
    h.advance(3)  # 0 is back before anything newer arrives
    h.publish(pub, "Work", {"i": 1})
    h.commit()
    assert got(h, w) == [0]


def test_retry_backoff_by_cancel_count_the_last_value_repeats():
    h, _, w = setup(1, RetryBackoff="1s,5s")
    waits = []
    for _ in range(3):
        cancel_first(h, w, "cancel")
        waited = 0.0
        while not (msgs := h.messages(w, "Q")):
            h.advance(0.5)
            waited += 0.5
        h.inbox[w][:0] = msgs  # put it back for cancel_first
        waits.append(waited)
    assert waits == [1.0, 5.0, 5.0]


def test_an_asked_delay_wins_over_the_backoff_and_zero_means_at_once():
    h, _, w = setup(1, RetryBackoff="30s")
    cancel_first(h, w, "cancel,delay=0")
    assert got(h, w) == [0]


def test_max_cancels_still_expires_with_delays_and_the_dead_letter_has_the_reason():
    h, _, w = setup(1, MaxCancels=2, RetryBackoff="10s")
    cancel_first(h, w, 'cancel,reason="db timeout"')
    assert h.messages(w, "Q") == []
    h.advance(10)
    cancel_first(h, w, "cancel")  # the second: MaxCancels, no wait; the last reason stays
    assert h.stats("Q").expired == 1
    (letter,) = dead_letters(h)
    assert letter["message"] == {"i": 0} and letter["reason"] == "max_cancels"
    assert letter["why"] == "db timeout" and letter["deliveries"] == 2
    assert letter["by"] == "w/s" and letter["at"].endswith("+00:00")


def test_expire_with_a_reason_lands_on_the_dead_letter_escaped():
    h, _, w = setup(1)
    cancel_first(h, w, 'expire,reason="bad \\"schema\\""')
    (letter,) = dead_letters(h)
    assert letter["reason"] == "forced_expire" and letter["why"] == 'bad "schema"'
    assert letter["deliveries"] == 1 and letter["by"] == "w/s"


def test_an_expire_or_ack_of_a_held_message_removes_it():
    h, _, w = setup(1)
    (msg,) = h.messages(w, "Q")
    h.ack(w, "Q", msg, options="cancel,delay=100")
    h.commit()
    h.ack(w, "Q", msg, options='expire,reason="gave up"')
    h.commit()
    assert h.stats("Q").queue_depth == 0
    assert [d["why"] for d in dead_letters(h)] == ["gave up"]
    h.advance(200)
    assert h.messages(w, "Q") == []


@pytest.mark.parametrize("checkpoint", [False, True], ids=["journal", "snapshot"])
def test_the_delay_and_the_reason_survive_a_restart(checkpoint):
    h, _, w = setup(2, MaxCancels=2)
    cancel_first(h, w, 'cancel,delay=30,reason="later"')
    (msg,) = h.messages(w, "Q")
    h.ack(w, "Q", msg)  # 1 flows meanwhile
    h.commit()
    if checkpoint:
        h.checkpoint()
        h.commit()
    h.advance(10)
    h.crash(checkpoint=checkpoint)
    facts = h.queue("Q").explain(h.queue("Q").recovery_point(), h.now)
    assert facts.not_before is not None and facts.reason == "later"
    w = h.connect("w")
    h.subscribe(w, "Q", "s", options="max_backlog=1")
    h.advance(19)
    assert h.messages(w, "Q") == []
    h.advance(1.5)
    (msg,) = h.messages(w, "Q")
    assert decode(msg) == {"i": 0}
    h.ack(w, "Q", msg, options="cancel")  # the second cancel: MaxCancels
    h.commit()
    assert [d["why"] for d in dead_letters(h)] == ["later"]


def test_a_reason_over_256_bytes_is_refused_and_changes_nothing():
    h, _, w = setup(1)
    (msg,) = h.messages(w, "Q")
    h.ack(w, "Q", msg, options=f'cancel,reason="{"é" * 129}"', ack_type="processed")
    [ack] = h.failures(w)
    assert "longer than 256 bytes" in ack.reason
    h.ack(w, "Q", msg, options=f'cancel,reason="{"é" * 128}"', ack_type="processed")
    assert h.failures(w) == [] and h.stats("Q").cancelled == 1


def test_delay_and_reason_go_with_the_right_verbs():
    h, _, w = setup(1)
    (msg,) = h.messages(w, "Q")
    for options, words in (("delay=5", "cancel only"), ("expire,delay=5", "cancel only"),
                           ('reason="x"', "cancel or expire"), ("touch,delay=5", "touch cannot")):
        h.ack(w, "Q", msg, options=options, ack_type="processed")
        [ack] = h.failures(w)
        assert words in ack.reason, (options, ack.reason)
    assert h.stats("Q").cancelled == 0


def test_explain_says_delayed_retry():
    h, _, w = setup(1)
    (msg,) = h.messages(w, "Q")
    h.ack(w, "Q", msg, options='cancel,delay=5,reason="db timeout"')
    h.commit()
    from conveyor.engine.explain import explain_message

    verdict = explain_message(h.engine, "Q", msg.bookmark, h.now)
    assert verdict.verdict == "delayed_retry" and "5.0 s left" in verdict.summary
    assert any("db timeout" in r for r in verdict.reasons)
    details = h.queue("Q").details()
    assert [(d.not_before is not None, d.reason) for d in details.messages] == [(True, "db timeout")]


def test_retry_backoff_is_read_with_an_element_path_on_error():
    text = config_xml(queue_xml("Q", RetryBackoff="1s, 5s,30s"), topics=("Work",))
    assert load_text(text).queues[0].retry_backoff_s == (1.0, 5.0, 30.0)
    with pytest.raises(ConfigError) as err:
        load_text(config_xml(queue_xml("Q", RetryBackoff="1s,soon"), topics=("Work",)))
    assert "RetryBackoff" in str(err.value) and "item 2" in str(err.value)
    assert "RetryBackoff" in (err.value.path or "")
