"""Dead-letter handling with actions (spec 000, "Handling Unprocessed Messages";
reference.md C): the Jobs/FailedJobs example verbatim, every expiry reason, Reason
filters, and exactly one dead letter per expiry across crashes."""

from pathlib import Path

import msgspec
import pytest

from tests.engine.engine_harness import Harness

EXAMPLE = (Path(__file__).resolve().parent.parent / "config" / "examples" / "jobs_actions.xml").read_text()


def jobs(**replace) -> Harness:
    text = EXAMPLE
    for old, new in replace.items():
        text = text.replace(old, new)
    return Harness(text)


def dead_letters(h: Harness) -> list[dict]:
    return h.published("FailedJobs")


def take_one(h: Harness, conn: int) -> "object":
    (msg,) = h.messages(conn)
    return msg


def test_jobs_example_third_cancel_lands_in_failed_jobs_with_the_original_and_the_reason():
    """"AMPS will automatically expire a message from Jobs on the 3rd time it receives a
    sow_delete with the cancel operation" and "any expired message from Jobs will result in
    a message automatically published to FailedJobs containing the original message inside
    the message element, and an AMPS-supplied reason code in the reason field"."""
    h = jobs()
    pub = h.connect("pub")
    w = h.connect("worker")
    h.subscribe(w, "Jobs")
    h.publish(pub, "Jobs", {"job": 42, "cmd": "render"})
    h.commit()
    for _ in range(3):
        msg = take_one(h, w)
        h.ack(w, "Jobs", msg, options="cancel")
        h.commit()
    assert h.messages(w) == []
    assert dead_letters(h) == [{"message": {"job": 42, "cmd": "render"}, "reason": "max_cancels"}]
    reader = h.connect("reader")
    h.subscribe(reader, "FailedJobs", sub_id="f")
    got = take_one(h, reader)
    assert msgspec.json.decode(got.data)["message"]["job"] == 42


def test_expire_acknowledgement_gives_reason_forced_expire():
    """Acknowledging Messages: expire "triggers any configured
    amps-action-on-sow-expire-message actions"; reference.md C.1 reason forced_expire."""
    h = jobs()
    pub, w = h.connect("pub"), h.connect("w")
    h.subscribe(w, "Jobs")
    h.publish(pub, "Jobs", {"job": 1})
    h.commit()
    h.ack(w, "Jobs", take_one(h, w), options="expire")
    h.commit()
    assert dead_letters(h) == [{"message": {"job": 1}, "reason": "forced_expire"}]


def test_max_deliveries_gives_reason_max_deliveries():
    """Handling Unprocessed Messages: "or after the 10th unsuccessful delivery"."""
    h = jobs(**{"<MaxDeliveries>10</MaxDeliveries>": "<MaxDeliveries>2</MaxDeliveries><LeasePeriod>1s</LeasePeriod>"})
    pub, w = h.connect("pub"), h.connect("w")
    h.subscribe(w, "Jobs")
    h.publish(pub, "Jobs", {"job": 7})
    h.commit()
    for _ in range(2):
        take_one(h, w)
        h.advance(1.5)  # the lease runs out
        h.commit()
    assert h.messages(w) == []
    assert dead_letters(h) == [{"message": {"job": 7}, "reason": "max_deliveries"}]


def test_time_limit_and_reason_filter():
    """reference.md C.1: Reason limits the action to the listed reasons; Expiration gives
    time_limit."""
    text = EXAMPLE.replace("<MaxCancels>3</MaxCancels>", "<MaxCancels>3</MaxCancels><Expiration>10s</Expiration>")
    text = text.replace("<MessageType>json</MessageType>\n                </Options>\n            </On>",
                        "<MessageType>json</MessageType>\n                    <Reason>time_limit</Reason>\n                </Options>\n            </On>")
    assert "<Reason>time_limit</Reason>" in text
    h = Harness(text)
    pub, w = h.connect("pub"), h.connect("w")
    h.publish(pub, "Jobs", {"job": "old"})
    h.publish(pub, "Jobs", {"job": "forced"})
    h.commit()
    h.advance(11)  # "old" and "forced" both expire by time: nobody subscribed
    h.commit()
    assert sorted(d["message"]["job"] for d in dead_letters(h)) == ["forced", "old"]
    assert {d["reason"] for d in dead_letters(h)} == {"time_limit"}
    h.publish(pub, "Jobs", {"job": "expired-by-ack"})
    h.commit()
    h.subscribe(w, "Jobs")
    h.ack(w, "Jobs", take_one(h, w), options="expire")
    h.commit()
    assert len(dead_letters(h)) == 2  # forced_expire is not in Reason: no action


@pytest.mark.parametrize("crash_after_commit", [False, True])
def test_exactly_one_dead_letter_per_expiry_across_a_crash(crash_after_commit):
    """Issue 5.4: the dead-letter publish is journaled in the same record as the expiry:
    a crash loses both (the message is redelivered and can expire again) or keeps both."""
    h = jobs()
    pub, w = h.connect("pub"), h.connect("w")
    h.subscribe(w, "Jobs")
    h.publish(pub, "Jobs", {"job": 9})
    h.commit()
    for i in range(3):
        msg = take_one(h, w)
        h.ack(w, "Jobs", msg, options="cancel")
        if i < 2:
            h.commit()
    if crash_after_commit:
        h.commit()
    h.crash()
    if crash_after_commit:
        assert dead_letters(h) == [{"message": {"job": 9}, "reason": "max_cancels"}]
        assert h.stats("Jobs").queue_depth == 0
        w = h.connect("w2")
        h.subscribe(w, "Jobs")
        assert h.messages(w) == []
    else:
        assert dead_letters(h) == []
        w = h.connect("w2")
        h.subscribe(w, "Jobs")
        h.ack(w, "Jobs", take_one(h, w), options="cancel")  # the 3rd cancel, again
        h.commit()
        assert dead_letters(h) == [{"message": {"job": 9}, "reason": "max_cancels"}]
    h.crash()
    assert len(dead_letters(h)) == 1
    assert h.stats("FailedJobs").queue_depth == 1
