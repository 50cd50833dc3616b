"""Which dead letters a listing or a re-drive selects (engine/dead_letters.py): the
application's failure reason read back from the action's template, selection by
system reason, application reason, content filter, time and source queue, limits."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from conveyor import records
from conveyor.config.model import Action, DoPublish, OnSowExpire
from conveyor.engine.dead_letters import Failure, Listing, Selection, TemplateFields, dead_letter
from conveyor.engine.filters import compile_filter
from tests.engine.engine_harness import Harness

EXAMPLE = (Path(__file__).resolve().parent.parent / "config" / "examples" / "jobs_actions.xml").read_text()
TEMPLATE = ('{ "message": {{AMPS_DATA}}, "reason": "{{AMPS_REASON}}", "why": "{{CONVEYOR_FAILURE_REASON}}", '
            '"n": {{CONVEYOR_DELIVERIES}}, "who": "{{CONVEYOR_LAST_CONSUMER}}" }')


def fields(template: str = TEMPLATE) -> TemplateFields:
    do = DoPublish(topic="FailedJobs", message_type="json", data=template)
    return TemplateFields(tuple(Action(on=OnSowExpire(topic=q, message_type="json"), do=(do,)) for q in ("Jobs", "Other")))


@pytest.mark.parametrize("why", ["db timeout", 'bad "schema", "reason": "x"', "", "naïve\nline"])
def test_the_failure_reason_is_read_back_from_the_template(why):
    from conveyor.engine.actions import Failure as Rendered, render

    do = DoPublish(topic="FailedJobs", message_type="json", data=TEMPLATE)
    body = render(do, "Jobs", ("max_cancels",), b'{"a": 1, "why": "zz", "reason": "q"}', None, "1|2|3",
                  Rendered(why, 3, "w/s1", 0.0))
    assert fields().failure("Jobs", "FailedJobs", body) == Failure(reason=why, deliveries=3, consumer="w/s1")


def test_no_template_or_another_body_means_no_reason():
    assert fields('{"message": {{AMPS_DATA}}}').failure("Jobs", "FailedJobs", b'{"message": {}}') == Failure()
    assert fields().failure("Jobs", "FailedJobs", b"written by hand") == Failure()
    assert fields().failure("Unwatched", "FailedJobs", b"{}") == Failure()


def record(pos_data: dict, *, queue: str | None = "Jobs", reasons: str = "max_cancels", t: float = 100.0,
           topic: str = "FailedJobs", origin: str = "") -> records.PublishRec:
    body = ('{ "message": %s, "reason": "%s", "why": "%s", "n": 1, "who": "" }'
            % (msgspec.json.encode(pos_data).decode(), reasons, pos_data.get("why", "")))
    return records.PublishRec(topic, 7, 1, t, body.encode(), None, expired_queue=queue, expired_position=10,
                              expired_reasons=reasons if queue else "", origin=origin)


def test_only_this_instances_dead_letters_are_dead_letters():
    f = fields()
    assert dead_letter(50, record({"id": 1}), f) is not None
    assert dead_letter(50, record({"id": 1}, queue=None), f) is None  # an ordinary publish
    assert dead_letter(50, record({"id": 1}, origin="other"), f) is None  # replicated (no expiry here)


def listing(sel: Selection, recs: list[records.PublishRec], limit: int | None = None) -> list[int]:
    out = Listing(sel, fields(), now=1000.0, limit=limit)
    for i, rec in enumerate(recs):
        if not out.feed(100 + i, records.encode(rec)):
            break
    return [msgspec.json.decode(d.data)["message"]["id"] for d in out.letters]


RECS = [
    record({"id": 0, "why": "db timeout"}, t=10.0),
    record({"id": 1, "why": "bad input"}, reasons="max_deliveries", t=20.0),
    record({"id": 2, "why": ""}, reasons="time_limit", t=30.0),
    record({"id": 3, "why": "DB Timeout again"}, reasons="forced_expire", t=40.0, queue="Other"),
    record({"id": 9}, topic="Elsewhere"),
    record({"id": 8}, queue=None),
]


@pytest.mark.parametrize(("sel", "ids"), [
    (Selection("FailedJobs"), [0, 1, 2, 3]),
    (Selection("FailedJobs", reasons=("max_deliveries", "time_limit")), [1, 2]),
    (Selection("FailedJobs", reasons=("timeout",)), [0, 3]),  # text of the application's reason
    (Selection("FailedJobs", app_reason="TIMEOUT"), [0, 3]),
    (Selection("FailedJobs", app_reason="max_deliveries"), []),  # the application's reason only
    (Selection("FailedJobs", filter=compile_filter("/message/id >= 2")), [2, 3]),
    (Selection("FailedJobs", filter=compile_filter("/reason = 'time_limit'")), [2]),
    (Selection("FailedJobs", since=20.0, until=40.0), [1, 2]),
    (Selection("FailedJobs", queue="Other"), [3]),
    (Selection("Elsewhere"), [9]),
    (Selection("Nothing"), []),
])
def test_selection(sel, ids):
    assert listing(sel, RECS) == ids


def test_limit_stops_the_scan_and_says_truncated():
    out = Listing(Selection("FailedJobs"), fields(), now=0.0, limit=2)
    fed = [out.feed(100 + i, records.encode(r)) for i, r in enumerate(RECS[:3])]
    assert fed == [True, True, False] and out.truncated and len(out.letters) == 2


def test_a_filter_that_fails_on_a_body_does_not_match_it():
    rec = records.PublishRec("FailedJobs", 7, 1, 1.0, b"not json", None, expired_queue="Jobs", expired_position=3,
                             expired_reasons="max_cancels")
    out = Listing(Selection("FailedJobs", filter=compile_filter("/x = 1")), fields(), now=0.0)
    out.feed(10, records.encode(rec))
    assert out.letters == []


def test_the_engines_own_dead_letters_with_reasons():
    """Through the engine: cancels with reasons expire into FailedJobs; the listing reads
    the journal and finds them with their system and application reasons."""
    text = EXAMPLE.replace("<MaxCancels>3</MaxCancels>", "<MaxCancels>1</MaxCancels>").replace(
        '"reason": "{{AMPS_REASON}}"', '"reason": "{{AMPS_REASON}}", "why": "{{CONVEYOR_FAILURE_REASON}}"')
    h = Harness(text)
    pub, w = h.connect("pub"), h.connect("w")
    h.subscribe(w, "Jobs")
    for i in range(3):
        h.publish(pub, "Jobs", {"job": i})
    h.commit()
    for _ in range(3):
        (msg,) = h.messages(w)
        job = msgspec.json.decode(msg.data)["job"]
        h.ack(w, "Jobs", msg, options=f'cancel,reason="oops {job}"')
        h.commit()
    out = Listing(Selection("FailedJobs", reasons=("oops 1", "oops 2")), TemplateFields(h.engine.config.actions),
                  now=h.now)
    for pos, payload in h.journal.scan():
        out.feed(pos, payload)
    assert [(d.reasons, d.failure.reason, d.queue) for d in out.letters] == [
        (("max_cancels",), "oops 1", "Jobs"), (("max_cancels",), "oops 2", "Jobs")]
    original = records.decode(h.journal.read(out.letters[0].original_position))
    assert isinstance(original, records.PublishRec) and msgspec.json.decode(original.data) == {"job": 1}
