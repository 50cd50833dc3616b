"""Stale acknowledgements in the sans-I/O core (client/core.py rule 3, message.py rule 4):
a numbered delivery's ack names its delivery in the batch's ``sow_delete``, and a refusal
names the refused bookmarks for flush() and the listeners."""

from __future__ import annotations

from conveyor import errors
from conveyor.client.core import ClientCore
from conveyor.client.message import AckVerb, split_deliveries, with_delivery
from conveyor.client.subscription import SubState
from conveyor.protocol import messages as m
from tests.client.test_core import answer, logged_on, sent


def test_a_batch_names_the_deliveries_it_settles_and_none_without_them():
    assert split_deliveries(["1|1|10", "1|2|20"]) == ("1|1|10,1|2|20", None)
    assert split_deliveries([with_delivery("1|1|10", 2), "1|2|20"]) == ("1|1|10,1|2|20", "deliveries=[2,0]")
    core = ClientCore(client_name="c")
    logged_on(core)
    core.ack("Q", with_delivery("1|1|10", 3), AckVerb.CANCEL)
    core.ack("Q", "1|2|20")
    core.flush_acks()
    out = sent(core)
    assert [(c.bookmark, c.options) for c in out] == [("1|1|10", "cancel,deliveries=[3]"), ("1|2|20", None)]


def test_a_message_with_a_delivery_count_acks_it_and_a_refusal_is_reported():
    core = ClientCore(client_name="c")
    logged_on(core)
    sub = SubState("s", "Q")
    core.add_subscription(sub)
    sent(core)
    sub.acker = sub.wrap_acker(lambda queue, bookmark, verb: core.ack(queue, bookmark, verb, "s"))
    sub_received: list = []
    sub.sink = sub_received.append
    answer(core, m.Message(topic="Q", data=b"{}", sub_id="s", bookmark="7|2|20", queue="Q", delivery=1))
    (msg,) = sub_received
    assert msg.delivery == 1
    msg.ack()
    core.flush_acks()
    (cmd,) = sent(core)
    assert (cmd.bookmark, cmd.options) == ("7|2|20", "deliveries=[1]")
    assert not sub.accept(msg, core.epoch)  # acknowledged: a redelivery is dropped (rule 3)...
    heard = []
    core.ack_refused_listeners.append(lambda queue, bookmarks, error: heard.append((queue, bookmarks, error)))
    answer(core, m.Ack(ack_type="processed", cid=cmd.cid, status="failure", code="not_lease_holder", reason="stale",
                       details={"refused": "7|2|20", "stale": "7|2|20", "records_deleted": 0}))
    ((queue, bookmarks, error),) = heard
    assert (queue, bookmarks) == ("Q", ["7|2|20"]) and isinstance(error, errors.NotLeaseHolder)
    assert core.ack_errors == [error] and error.details["refused"] == "7|2|20"
    assert core.acks_unconfirmed == {} and core.acks_refused == 1
    assert sub.accept(msg, core.epoch)  # ...unless refused: the message may come back


def test_a_refusal_without_bookmarks_names_the_whole_batch():
    core = ClientCore(client_name="c")
    logged_on(core)
    core.ack("Q", "b1")
    core.ack("Q", "b2")
    core.flush_acks()
    (cmd,) = sent(core)
    answer(core, m.Ack(ack_type="processed", cid=cmd.cid, status="failure", code="not_lease_holder", reason="no"))
    (error,) = core.ack_errors
    assert error.details["refused"] == "b1,b2" and error.details["queue"] == "Q"
