"""The sans-I/O core, without sockets or sleeps (STYLE 13): commands out, bytes in."""

from __future__ import annotations

import pytest

from conveyor import errors
from conveyor.client.core import ClientCore, parse_uri
from conveyor.client.core import CommandKind
from conveyor.client.message import AckVerb, Message
from conveyor.client.state import ConnectionMachine, ConnectionState, ReconnectPolicy, make_policy
from conveyor.client.subscription import DeliveryMode, SubState
from conveyor.protocol import messages as m
from conveyor.protocol.codec import CommandDecoder, encode_frame

S = ConnectionState


def sent(core: ClientCore) -> list:
    """Decode what the core would send now (as the server would)."""
    decoder = CommandDecoder()
    for frame in core.take_frames():
        decoder.receive_data(frame)
    return decoder.next_items()


def answer(core: ClientCore, *items) -> list:
    return core.receive_data(encode_frame(list(items)))


def logged_on(core: ClientCore, seq: int = 0) -> None:
    pending = core.logon()
    logon = sent(core)[0]
    answer(core, m.Ack(ack_type="processed", cid=logon.cid, seq=seq))
    assert pending.done
    core.logged_on(pending.result)


def delivery(sub_id: str, n: int, queue: str | None = "Q") -> m.Message:
    return m.Message(topic=queue or "t", data=b'{"n": %d}' % n, sub_id=sub_id, bookmark=f"7|{n}|{n * 10}", queue=queue)


def test_publishes_are_stored_until_persisted_conflated_and_duplicates():
    core = ClientCore(client_name="c")
    logged_on(core)
    for n in range(5):
        assert core.publish("t", {"n": n}) == n + 1
    assert [c.seq for c in sent(core)] == [1, 2, 3, 4, 5]
    answer(core, m.Ack(ack_type="persisted", seq=3))
    assert [e[0] for e in core.store.unpersisted()] == [4, 5]
    answer(core, m.Ack(ack_type="persisted", seq=5, status="duplicate"))
    assert [e[0] for e in core.store.unpersisted()] == [4]
    assert core.persisted_seq == 3


def test_offline_publishes_wait_in_the_store_and_logon_resumes_in_order():
    """acks first (so a resubscription is not sent what was acknowledged), then the
    publishes the server does not have, then every subscription."""
    core = ClientCore(client_name="c")
    logged_on(core)
    queue_sub = SubState("q1", "Jobs", max_backlog=10)
    replay_sub = SubState("r1", "t", bookmark="0", filter="/n > 1")
    for sub in (queue_sub, replay_sub):
        core.add_subscription(sub)
    for n in range(3):
        core.publish("t", {"n": n})
    sent(core)
    core.ack("Jobs", "7|1|10", AckVerb.ACK, "q1")
    replay_sub.last_bookmark = "7|2|20"  # handed to the application

    core.connection_lost(errors.ConnectionLost("gone"))
    assert core.epoch == 1 and not core.online
    core.publish("t", {"n": 3})  # offline: stored, not queued
    core.ack("Jobs", "7|2|20", AckVerb.ACK, "q1")
    assert core.outgoing == []

    logged_on(core, seq=2)  # the server has sequences 1 and 2
    out = sent(core)
    kinds = [type(c).__name__ for c in out]
    assert kinds == ["SowDelete", "Publish", "Publish", "Subscribe", "Subscribe"]
    assert out[0].bookmark == "7|1|10,7|2|20" and out[0].ack_type == "persisted"
    assert [c.seq for c in out[1:3]] == [3, 4]
    assert (out[3].sub_id, out[3].options, out[3].bookmark) == ("q1", "max_backlog=10", None)
    assert (out[4].sub_id, out[4].bookmark, out[4].filter) == ("r1", "7|2|20", "/n > 1")
    assert core.publish("t", {"n": 4}) == 5


def test_numbering_continues_above_the_server_and_the_store():
    core = ClientCore(client_name="c")
    logged_on(core, seq=41)
    assert core.publish("t", 1) == 42


def test_ack_batches_stay_unconfirmed_until_persisted_and_are_resent():
    core = ClientCore(client_name="c", ack_batch_size=3)
    logged_on(core)
    assert core.ack("Q", "b1") is False
    assert core.ack("Q", "b2", AckVerb.CANCEL) is False
    assert core.ack("Q", "b3") is True  # the batch is full
    core.flush_acks()
    out = sent(core)
    assert [(c.options, c.bookmark) for c in out] == [(None, "b1,b3"), ("cancel", "b2")]
    answer(core, m.Ack(ack_type="persisted", cid=out[0].cid))
    assert list(core.acks_unconfirmed) == [out[1].cid]
    core.connection_lost(errors.ConnectionLost("gone"))
    logged_on(core)
    assert [c.cid for c in sent(core)] == [out[1].cid]
    answer(core, m.Ack(ack_type="processed", cid=out[1].cid, status="failure", code="not_lease_holder", reason="no"))
    assert core.acks_unconfirmed == {} and core.acks_refused == 1


def test_ack_batch_follows_the_backlog_and_the_outstanding_leases():
    core = ClientCore(client_name="c", ack_batch_size=100)
    logged_on(core)
    sub = SubState("s", "Q", max_backlog=10)
    core.add_subscription(sub)
    answer(core, *[delivery("s", n) for n in range(10)])
    assert sub.outstanding == 10
    assert [core.ack("Q", f"b{n}", AckVerb.ACK, "s") for n in range(5)] == [False] * 4 + [True]  # backlog // 2
    core.flush_acks()
    assert sub.outstanding == 5
    small = SubState("t", "Q", max_backlog=100)
    core.add_subscription(small)
    answer(core, *[delivery("t", n) for n in range(3)])
    # only 3 leased: once all 3 are acked the server waits for us, so send at once
    assert [core.ack("Q", f"c{n}", AckVerb.ACK, "t") for n in range(3)] == [False, False, True]


def test_a_handler_acking_inline_while_a_read_is_decoded_still_batches():
    """A handler called per message as a read is decoded acks before the rest of the
    read is counted: the held-nothing rule waits for the end of the read (acks_due),
    so ten messages in one read give two batches of five, not ten of one."""
    core = ClientCore(client_name="c", ack_batch_size=5)
    logged_on(core)
    sub = SubState("s", "Q", max_backlog=10)
    inline = True
    held: list[Message] = []
    send_now: list[bool] = []

    def sink(msg: Message) -> None:
        if inline:
            send_now.append(core.ack("Q", msg.bookmark, AckVerb.ACK, "s"))
            if send_now[-1]:
                core.flush_acks()  # as the face does
        else:
            held.append(msg)

    sub.sink = sink
    core.add_subscription(sub)
    answer(core, *[delivery("s", n) for n in range(10)])
    assert send_now == ([False] * 4 + [True]) * 2  # two batches of five (before: ten of one)
    assert not core.acks_due()
    send_now.clear()
    answer(core, *[delivery("s", n) for n in range(10, 13)])  # three in a read, all acked
    assert send_now == [False] * 3 and core.acks_due()  # the server waits: sent after the read
    core.flush_acks()
    # Outside a read (a handler acking later, or on another thread) the rule is as before.
    inline = False
    answer(core, delivery("s", 11))
    assert not core.acks_due()
    assert core.ack("Q", held[0].bookmark, AckVerb.ACK, "s") is True  # held nothing more: at once


def test_lost_connection_drops_stale_queue_and_replay_messages_but_keeps_pubsub():
    core = ClientCore(client_name="c")
    logged_on(core)
    got: dict[str, list[Message]] = {"q": [], "r": [], "p": []}
    for sub_id, bookmark in (("q", None), ("r", "0"), ("p", None)):
        sub = SubState(sub_id, "x", bookmark=bookmark)
        sub.sink = got[sub_id].append
        core.add_subscription(sub)
    answer(core, delivery("q", 1), delivery("r", 1, queue=None), delivery("p", 1, queue=None))
    core.connection_lost(errors.ConnectionLost("gone"))
    subs = core.subscriptions
    assert not subs["q"].accept(got["q"][0], core.epoch)
    assert not subs["r"].accept(got["r"][0], core.epoch)
    assert subs["p"].accept(got["p"][0], core.epoch)
    assert subs["r"].last_bookmark is None  # the resume starts before the dropped one


def test_an_acknowledged_message_is_not_handed_out_again_but_a_cancelled_one_is():
    core = ClientCore(client_name="c")
    logged_on(core)
    acks = []
    sub = SubState("s", "Q")
    sub.acker = sub.wrap_acker(lambda q, b, o: acks.append((b, o)))
    got: list[Message] = []
    sub.sink = got.append
    core.add_subscription(sub)
    answer(core, delivery("s", 1), delivery("s", 2))
    for msg in got:
        assert sub.accept(msg, core.epoch)
    got[0].ack()
    got[1].cancel()
    assert acks == [("7|1|10", AckVerb.ACK), ("7|2|20", AckVerb.CANCEL)]
    got.clear()
    answer(core, delivery("s", 1), delivery("s", 2))  # redelivered: lease broken, cancel
    assert [sub.accept(msg, core.epoch) for msg in got] == [False, True]


def test_auto_ack_iterator_and_handler_rules():
    acks = []
    iterator = SubState("i", "Q", auto_ack=True)
    iterator.acker = iterator.wrap_acker(lambda q, b, o: acks.append((b, o)))
    first = Message("Q", b"{}", bookmark="a", queue="Q", _acker=iterator.acker)
    second = Message("Q", b"{}", bookmark="b", queue="Q", _acker=iterator.acker)
    iterator.asking()
    assert iterator.accept(first, 0)
    iterator.asking()  # asking for the next acknowledges the previous
    assert acks == [("a", AckVerb.ACK)]
    assert iterator.accept(second, 0) and not second.acked

    handler = SubState("h", "Q", auto_ack=True, mode=DeliveryMode.HANDLER)
    handler.acker = handler.wrap_acker(lambda q, b, o: acks.append((b, o)))
    ok = Message("Q", b"{}", bookmark="c", queue="Q", _acker=handler.acker)
    bad = Message("Q", b"{}", bookmark="d", queue="Q", _acker=handler.acker)
    assert handler.accept(ok, 0) and handler.previous is None
    handler.finished(ok, None)
    handler.finished(bad, RuntimeError("boom"))
    assert acks[1:] == [("c", AckVerb.ACK), ("d", AckVerb.CANCEL)]


def test_auto_ack_leaves_a_message_the_application_settled_itself():
    acks = []
    iterator = SubState("i", "Q", auto_ack=True)
    iterator.acker = iterator.wrap_acker(lambda q, b, v: acks.append((b, v)))
    first = Message("Q", b"{}", bookmark="a", queue="Q", _acker=iterator.acker)
    assert iterator.accept(first, 0)
    first.cancel()  # settled by the application: asking again must not ack it a second time
    iterator.asking()
    handler = SubState("h", "Q", auto_ack=True, mode=DeliveryMode.HANDLER)
    handler.acker = handler.wrap_acker(lambda q, b, v: acks.append((b, v)))
    expired = Message("Q", b"{}", bookmark="b", queue="Q", _acker=handler.acker)
    expired.expire()  # inside the handler, which then returns: no second settlement
    handler.finished(expired, None)
    assert acks == [("a", AckVerb.CANCEL), ("b", AckVerb.EXPIRE)]


def test_message_verbs_are_noops_off_queues_and_a_second_settlement_raises():
    calls = []
    msg = Message("t", b"x", bookmark="1|1|1", _acker=lambda *a: calls.append(a))
    msg.ack()
    msg.cancel()
    msg.ack()
    assert calls == [] and not msg.acked
    queued = Message("Q", b"x", bookmark="1|1|1", queue="Q", _acker=lambda *a: calls.append(a))
    queued.expire()
    for verb in (queued.ack, queued.cancel, queued.expire):
        with pytest.raises(errors.AlreadyAcknowledged, match="already settled \\(expire\\); cannot"):
            verb()
    assert calls == [("Q", "1|1|1", AckVerb.EXPIRE)] and queued.acked


def test_resubscribe_failure_and_command_results_are_reported():
    core = ClientCore(client_name="c")
    logged_on(core)
    pending = core.add_subscription(SubState("s", "t", filter="bad"))
    cmd = sent(core)[0]
    answer(core, m.Ack(ack_type="processed", cid=cmd.cid, status="failure", code="bad_filter", reason="no"))
    assert isinstance(pending.error, errors.BadFilter)
    flush = core.command(m.Flush(cid=core.new_cid(), ack_type="persisted"), CommandKind.FLUSH_PERSISTED)
    answer(core, m.Ack(ack_type="processed", cid=flush_cid(core, flush)))
    assert not flush.done  # a persisted flush completes on its persisted ack only
    lost = core.connection_lost(errors.ConnectionLost("gone"))
    assert flush in lost and isinstance(flush.error, errors.ConnectionLost)


def flush_cid(core: ClientCore, pending) -> str:
    return next(cid for cid, p in core.awaiting_ack.items() if p is pending)


def test_duplicate_sub_id_is_refused_locally():
    core = ClientCore(client_name="c")
    core.add_subscription(SubState("s", "t"))
    with pytest.raises(errors.DuplicateSubscription):
        core.add_subscription(SubState("s", "u"))


# --- state machine, policy, servers ---------------------------------------------------


def test_state_table_refuses_illegal_moves_and_reports_legal_ones():
    machine = ConnectionMachine()
    seen = []
    machine.listeners.append(lambda change: seen.append((change.previous, change.state)))
    machine.listeners.append(lambda change: 1 / 0)  # a broken listener is logged, not fatal
    with pytest.raises(errors.ClientStateError):
        machine.move(S.FAILED)
    assert machine.state is S.DISCONNECTED
    for state in (S.CONNECTED, S.DISCONNECTED, S.RECONNECTING, S.CONNECTED, S.CLOSED):
        machine.move(state)
    assert seen[-1] == (S.CONNECTED, S.CLOSED) and len(seen) == 5
    assert S.CONNECTED == "connected"


def test_backoff_grows_to_its_cap_with_jitter_and_limits_end_it():
    policy = ReconnectPolicy(delay_seconds=0.1, delay_max_seconds=1.0, jitter=0.5, max_attempts=5, timeout_seconds=None)
    assert policy.delay(0, 0.9) == 0.0  # the first attempt is at once
    assert [policy.delay(k, 0.0) for k in range(1, 7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    assert policy.delay(3, 0.999) == pytest.approx(0.4 * (1 - 0.5 * 0.999))
    assert not policy.exhausted(4, 1e9) and policy.exhausted(5, 0)
    timed = ReconnectPolicy(timeout_seconds=2.0)
    assert not timed.exhausted(1000, 1.9) and timed.exhausted(1, 2.0)
    assert make_policy(False).exhausted(0, 0)
    assert make_policy(True, max_reconnect_attempts=3, reconnect_timeout=None) == ReconnectPolicy(max_attempts=3, timeout_seconds=None)
    with pytest.raises(ValueError):
        ReconnectPolicy(jitter=2)


def test_servers_are_tried_in_order_then_failover_starts_with_the_next():
    core = ClientCore(client_name="c")
    core.set_servers(["tcp://a:1", "b:2", "tcp://c:3"])
    assert [core.server_for(k, failover=False)[1] for k in range(3)] == ["tcp://a:1", "b:2", "tcp://c:3"]
    core.connection_opened(1)
    assert [core.server_for(k, failover=True)[1] for k in range(4)] == ["tcp://c:3", "tcp://a:1", "b:2", "tcp://c:3"]
    assert parse_uri("amps://h:9") == ("h", 9)
    for bad in ("http://h:1", "tcp://h", "tcp://h:x"):
        with pytest.raises(errors.ClientError):
            parse_uri(bad)
    with pytest.raises(errors.ClientError):
        core.set_servers([])


def test_replace_is_an_argument_not_an_option_string():
    """An options string is resent on every resubscription, where ``replace`` would fail:
    it is refused, and ``replace=True`` puts it on one command only."""
    with pytest.raises(errors.InvalidOption, match="replace=True"):
        SubState("s", "Q", options="max_backlog=5,replace")
    sub = SubState("s", "Q", max_backlog=2)
    with pytest.raises(errors.InvalidOption):
        sub.replace("Q", filter=None, options="replace", max_backlog=None)
    sub.replace("Q", filter="/n > 4", options=None, max_backlog=6)
    assert sub.command("1", replace=True).options == "replace,max_backlog=6"
    assert sub.command("2").options == "max_backlog=6"  # the resume after a reconnect


def test_client_error_codes_are_their_own():
    """The client's errors are in the one code table, and no other error (the engine's
    queue state errors included, which live outside errors.py) reuses their codes."""
    from conveyor.engine.queue import state as queue_state  # noqa: F401  (defines codes outside errors.py)

    def every(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from every(sub)

    for cls in (errors.AlreadyAcknowledged, errors.ClientStateError, errors.ConnectionLost, errors.TimedOut):
        assert errors.ERROR_CLASSES[cls.code] is cls
        assert [c for c in every(errors.ConveyorError) if c.code == cls.code] == [cls]


def test_a_bookmark_subscription_moved_to_another_journal_resumes_by_time_and_skips_what_it_saw():
    """Rule 7 of client/subscription.py: positions of one journal mean nothing in another."""
    from conveyor.client.subscription import CROSS_INSTANCE_MARGIN_S

    core = ClientCore(client_name="c")
    pending = core.logon()
    answer(core, m.Ack(ack_type="processed", cid=sent(core)[0].cid, journal="journal-A"))
    core.logged_on(pending.result)
    sub = SubState("r1", "t", bookmark="0")
    core.add_subscription(sub)
    t0 = 1_700_000_000.0
    for pub, seq, pos in ((7, 1, 100), (8, 1, 110), (7, 2, 120)):
        assert sub.accept(Message("t", b"{}", bookmark=f"{pub}|{seq}|{pos}", timestamp=t0 + pos), core.epoch)
    core.connection_lost(errors.ConnectionLost("gone"))
    pending = core.logon()
    answer(core, m.Ack(ack_type="processed", cid=sent(core)[0].cid, journal="journal-B"))
    core.logged_on(pending.result)
    resubscribe = [c for c in sent(core) if isinstance(c, m.Subscribe)][0]
    assert resubscribe.bookmark == "20231114T221420.000000Z"  # t0 + 120 - 60 s, UTC
    assert CROSS_INSTANCE_MARGIN_S == 60.0
    # B's order differs: what was seen is dropped, publisher by publisher; the rest passes
    epoch = core.epoch
    verdicts = [sub.accept(Message("t", b"{}", bookmark=f"{pub}|{seq}|{pos}", timestamp=t0, _epoch=epoch), epoch)
                for pub, seq, pos in ((8, 1, 5), (7, 1, 6), (8, 2, 7), (7, 2, 8), (7, 3, 9))]
    assert verdicts == [False, False, True, False, True]
    assert sub.last_bookmark == "7|3|9"


def test_a_connection_notice_makes_the_loss_that_follows_final():
    """Rule 6: an ack without a command id whose code is a final one (an administrator's
    disconnect, a name taken over) keeps its error; a new connection forgets it. A notice
    with a code the client does not know is not final (codes are only added)."""
    core = ClientCore(client_name="c")
    core.set_servers("tcp://127.0.0.1:9007")
    core.connection_opened(0)
    logged_on(core)
    answer(core, m.Ack(ack_type="processed", status="failure", code="some_future_notice", reason="?"))
    assert core.final is None
    answer(core, m.Ack(ack_type="processed", status="failure", code=errors.DisconnectedByAdmin.code,
                       reason="disconnected by an administrator"))
    assert isinstance(core.final, errors.DisconnectedByAdmin) and isinstance(core.final, errors.ConnectionLost)
    assert str(core.final) == "disconnected by an administrator"
    core.connection_lost(core.final)
    core.connection_opened(0)
    assert core.final is None


def test_an_http_answer_fails_the_connection_at_once_even_split_across_reads():
    """Rule 7: an HTTP port given as the server answers the logon in HTTP; the core says
    so from the first bytes instead of waiting for a frame of a gigabyte."""
    core = ClientCore(client_name="c")
    core.set_servers(["tcp://user:secret@127.0.0.1:8085"])
    core.connection_opened(0)
    core.logon()
    sent(core)
    assert core.receive_data(b"HT") == []  # a beginning of "HTTP/": wait for more
    with pytest.raises(errors.ConnectionLost) as raised:
        core.receive_data(b"TP/1.1 400 Bad Request\r\n\r\n")
    assert str(raised.value) == ("tcp://user@127.0.0.1:8085 answered in HTTP: that is an HTTP port (the admin "
                                 "interface?), not conveyor's client port")  # the URI as shown: no password
    # A conveyor server's first bytes go straight to the decoder (a frame starts with 0).
    core.connection_opened(0)
    pending = core.logon()
    logon = sent(core)[0]
    frame = encode_frame([m.Ack(ack_type="processed", cid=logon.cid)])
    assert core.receive_data(frame[:1]) == []
    assert core.receive_data(frame[1:]) == [pending]
