"""Staged transactions, transaction atomicity across a crash, and fingerprints
(docs/spark-server.md; engine/txn.py, engine/fingerprints.py)."""

from __future__ import annotations

from conveyor import records
from conveyor.protocol.bookmarks import publisher_id, txn_publisher_id
from conveyor.journal import Journal, MemoryJournal
from conveyor.protocol import messages as m
from conveyor.protocol import replies

from .engine_harness import Harness, body, config_xml, decode, queue_xml


def harness(journal: MemoryJournal | None = None) -> Harness:
    return Harness(config_xml(queue_xml("Q", LeasePeriod="10s"), topics=("Work", "Other")), journal=journal)


def last_ack(h: Harness, conn: int) -> m.Ack:
    acks = h.acks(conn)
    assert acks
    return acks[-1]


def stage(h, conn, txn, values, topic="Work") -> dict:
    h.handle(conn, m.Stage(txn=txn, topic=topic, rows=[body({"i": v}) for v in values]))
    ack = last_ack(h, conn)
    assert ack.status == "success", ack.reason
    return ack.result


def commit(h, conn, seq, txns, publisher="sink/q1") -> m.Ack:
    h.handle(conn, m.CommitTxn(publisher=publisher, seq=seq, txns=txns))
    h.commit()
    return last_ack(h, conn)


def watcher(h: Harness) -> int:
    w = h.connect("watch")
    h.subscribe(w, "Work", "all")
    return w


def items(msgs) -> list:
    return [decode(x)["i"] for x in msgs]


def publishes(h: Harness) -> list[records.PublishRec]:
    return [r for _, p in h.journal.scan() if isinstance(r := records.decode(p), records.PublishRec)]


def test_commit_publishes_every_staged_row_atomically_once_durable():
    h = harness()
    w = watcher(h)
    sink = h.connect("sink")
    assert stage(h, sink, "t/0", [1, 2]) == replies.StageReply(staged=2)
    assert stage(h, sink, "t/0", [3]) == replies.StageReply(staged=3)
    stage(h, sink, "t/1", [4])
    h.commit()
    assert h.messages(w) == []  # staged rows are nobody's business
    h.handle(sink, m.CommitTxn(publisher="sink/q1", seq=1, txns=["t/0", "t/1"]))
    assert h.acks(sink) == [] and h.messages(w) == []  # nothing before it is durable
    h.commit()
    ack = last_ack(h, sink)
    assert (ack.status, ack.result) == ("success", replies.CommitReply(published=4))
    assert items(h.messages(w)) == [1, 2, 3, 4]
    recs = publishes(h)
    assert [(r.txn_index, r.txn_total, r.seq) for r in recs] == [(i, 4, 1) for i in range(4)]
    assert {r.publisher for r in recs} == {txn_publisher_id("sink/q1", None)}


def test_a_repeated_commit_is_a_duplicate_and_discards_the_new_staging():
    h = harness()
    w = watcher(h)
    sink = h.connect("sink")
    stage(h, sink, "a", [1])
    commit(h, sink, 1, ["a"])
    stage(h, sink, "b", [1])  # the replayed batch, staged again
    ack = commit(h, sink, 1, ["b"])
    assert ack.status == "duplicate"
    assert items(h.messages(w)) == [1]
    failed = commit(h, sink, 2, ["b"])  # discarded
    assert (failed.status, failed.code) == ("failure", "unknown_txn")


def test_an_unknown_handle_publishes_nothing():
    h = harness()
    w = watcher(h)
    sink = h.connect("sink")
    stage(h, sink, "a", [1])
    ack = commit(h, sink, 1, ["a", "lost"])
    assert (ack.status, ack.code) == ("failure", "unknown_txn")
    assert "'lost'" in ack.reason
    assert h.messages(w) == [] and publishes(h) == []
    assert commit(h, sink, 1, ["a"]).result == replies.CommitReply(published=1)  # "a" stayed staged


def test_zero_rows_and_abort():
    h = harness()
    sink = h.connect("sink")
    stage(h, sink, "empty", [])
    ack = commit(h, sink, 1, ["empty"])
    assert (ack.status, ack.result) == ("success", replies.CommitReply(published=0))
    assert publishes(h) == []
    stage(h, sink, "x", [1, 2])
    h.handle(sink, m.AbortTxn(txns=["x", "never"]))
    assert last_ack(h, sink).result == replies.AbortReply(discarded=2)
    assert commit(h, sink, 1, ["x"]).code == "unknown_txn"


def test_bad_commits_and_stages():
    h = harness()
    sink = h.connect("sink")
    stage(h, sink, "a", [1])
    assert commit(h, sink, 0, ["a"]).code == "invalid_option"  # seq 0 could not be deduplicated
    h.handle(sink, m.Stage(txn="a", topic="unrecorded", rows=[b"{}"]))
    assert last_ack(h, sink).code == "not_recorded"


def test_staging_is_bounded():
    h = harness()
    h.engine.transactions.staging.bytes_max = 1000
    sink = h.connect("sink")
    stage(h, sink, "a", [1])
    h.handle(sink, m.Stage(txn="a", topic="Work", rows=[b"x" * 2000]))
    ack = last_ack(h, sink)
    assert (ack.status, ack.code) == ("failure", "staging_full")
    assert commit(h, sink, 1, ["a"]).result == replies.CommitReply(published=1)  # the refused rows were not staged
    assert h.engine.transactions.staging.bytes == 0


def test_abandoned_staging_expires_after_ten_idle_minutes():
    h = harness()
    sink = h.connect("sink")
    stage(h, sink, "old", [1])
    stage(h, sink, "busy", [1])
    h.advance(400)
    stage(h, sink, "busy", [2])
    h.advance(201)
    assert h.engine.statistics().staging.txns == 1
    assert commit(h, sink, 1, ["old"]).code == "unknown_txn"
    assert commit(h, sink, 1, ["busy"]).result == replies.CommitReply(published=2)


def test_a_commit_survives_a_crash_exactly_once():
    h = harness()
    sink = h.connect("sink")
    stage(h, sink, "a", [1, 2, 3])
    commit(h, sink, 1, ["a"])
    h.crash(checkpoint=False)
    sink = h.connect("sink")
    w = h.connect("w")
    h.subscribe(w, "Q", options="max_backlog=10")
    assert items(h.messages(w)) == [1, 2, 3]
    ack = commit(h, sink, 1, ["gone"])  # the replay after the crash: duplicate first
    assert ack.status == "duplicate"


def test_staging_and_an_undurable_commit_are_lost_in_a_crash():
    h = harness()
    sink = h.connect("sink")
    stage(h, sink, "a", [1])
    h.handle(sink, m.CommitTxn(publisher="sink/q1", seq=1, txns=["a"]))
    assert h.acks(sink) == []  # never answered: the records were not durable
    h.crash()
    sink = h.connect("sink")
    assert commit(h, sink, 1, ["a"]).code == "unknown_txn"  # Spark re-stages the batch
    stage(h, sink, "a", [1])
    assert commit(h, sink, 1, ["a"]).result == replies.CommitReply(published=1)


def _journal_with_partial_run(segment_bytes: int | None = None) -> tuple[MemoryJournal, int]:
    """A journal: one ordinary publish, then 2 of the 3 records of a transaction."""
    kw = {"segment_bytes": segment_bytes} if segment_bytes else {}
    j = MemoryJournal(**kw)
    pub = publisher_id("someone")
    j.append(records.encode_publish("Work", pub, 1, 1.0, body({"i": 0}), None))
    sink = txn_publisher_id("sink/q1", None)
    start = None
    for i in range(2):
        rec = records.PublishRec("Work", sink, 7, 1.0, body({"i": 100 + i, "pad": "x" * 80}), None, txn_index=i, txn_total=3)
        pos = j.append(records.encode(rec))
        start = pos if start is None else start
    j.commit()
    return j, start


def test_recovery_truncates_a_transaction_cut_short_at_the_tail(caplog):
    j, start = _journal_with_partial_run()
    h = harness(journal=MemoryJournal(j.store))
    assert "cut short by a crash (2 of 3 records)" in caplog.text
    assert h.journal.end == start  # plus nothing: recovery appended nothing
    assert [r.seq for r in publishes(h)] == [1]
    w = h.connect("w")
    h.subscribe(w, "Q", options="max_backlog=10")
    assert items(h.messages(w)) == [0]
    assert not h.engine.publishes.knows(txn_publisher_id("sink/q1", None))  # the commit never happened
    sink = h.connect("sink")
    stage(h, sink, "a", [5])
    assert commit(h, sink, 7, ["a"]).result == replies.CommitReply(published=1)
    h.crash()
    w = h.connect("w")
    h.subscribe(w, "Q", options="max_backlog=10")
    assert items(h.messages(w)) == [0, 5]


def test_truncation_of_a_run_spanning_segments():
    j, start = _journal_with_partial_run(segment_bytes=150)
    assert len(j.segments()) >= 3
    h = harness(journal=MemoryJournal(j.store, segment_bytes=150))
    assert h.journal.end == start
    assert len(h.journal.store.files) == 2  # the segments after the cut are gone
    pub = h.connect("pub")
    for i in range(3):
        h.publish(pub, "Work", {"i": 10 + i})
    h.commit()
    h.crash()
    w = h.connect("w")
    h.subscribe(w, "Q", options="max_backlog=10")
    assert items(h.messages(w)) == [0, 10, 11, 12]


def test_truncation_of_a_file_backed_journal(tmp_path):
    j = Journal.open(tmp_path, segment_bytes=150)
    j.append(records.encode_publish("Work", publisher_id("someone"), 1, 1.0, body({"i": 0}), None))
    start = None
    for i in range(2):
        rec = records.PublishRec("Work", 9, 7, 1.0, body({"pad": "x" * 80}), None, txn_index=i, txn_total=5)
        pos = j.append(records.encode(rec))
        start = pos if start is None else start
    j.close()
    assert len(list(tmp_path.glob("*.log"))) >= 3
    h = harness(journal=Journal.open(tmp_path, segment_bytes=150))
    assert h.journal.end == start
    pub = h.connect("pub")
    h.publish(pub, "Work", {"i": 1})
    h.commit()
    h.journal.close()
    j = Journal.open(tmp_path, segment_bytes=150)
    assert [records.decode(p).data for _, p in j.scan()] == [body({"i": 0}), body({"i": 1})]
    j.close()


def test_a_conflicting_duplicate_fails_loudly():
    h = harness()
    pub = h.connect("p")
    h.publish(pub, "Work", {"i": 1}, seq=1, fingerprint=111, ack_type="processed")
    h.commit()
    assert last_ack(h, pub).status == "success"
    h.publish(pub, "Work", {"i": 1}, seq=1, fingerprint=111, ack_type="processed")
    h.commit()
    assert last_ack(h, pub).status == "duplicate"
    h.publish(pub, "Work", {"i": 2}, seq=1, fingerprint=222, ack_type="processed")
    h.commit()
    ack = last_ack(h, pub)
    assert (ack.status, ack.code) == ("failure", "duplicate_conflict")
    h.publish(pub, "Work", {"i": 2}, seq=1, ack_type="processed")  # no fingerprint: plain dup
    h.commit()
    assert last_ack(h, pub).status == "duplicate"
    assert [r.fingerprint for r in publishes(h)] == [111]
    h.crash(checkpoint=False)  # the window is rebuilt from the journal
    pub = h.connect("p")
    h.publish(pub, "Work", {"i": 2}, seq=1, fingerprint=222, ack_type="processed")
    h.commit()
    assert last_ack(h, pub).code == "duplicate_conflict"


def _named(h: Harness, conn: int, cmd):
    h.handle(conn, cmd)
    h.commit()
    ack = last_ack(h, conn)
    assert ack.status == "success", (ack.code, ack.reason)
    return ack.result


def test_a_fenced_commit_publishes_nothing_and_a_current_one_acks_its_deliveries():
    """Rule 5: the commit checks the named consumer's epoch, and acknowledges the
    deliveries it derives from together with its rows."""
    h = harness()
    w = watcher(h)
    pub, old, new = h.connect("pub"), h.connect("old-query"), h.connect("new-query")
    for i in range(4):
        h.publish(pub, "Work", {"i": i})
    h.commit()
    e1 = _named(h, old, m.Claim(queue="Q", consumer="c", token="old")).epoch
    assert _named(h, old, m.Lease(queue="Q", consumer="c", after=0, max=2, ttl=30, epoch=e1)).d == 2
    stage(h, old, "old/0", [10, 11])
    e2 = _named(h, new, m.Claim(queue="Q", consumer="c", token="new")).epoch  # fences the old query
    h.messages(w)  # the four published above
    fence = m.ConsumerFence("Q", "c", e1, 2)
    h.handle(old, m.CommitTxn(publisher="sink/old", seq=1, txns=["old/0"], fences=[fence]))
    h.commit()
    ack = last_ack(h, old)
    assert (ack.status, ack.code) == ("failure", "fenced")
    assert h.messages(w) == []
    assert [r.publisher for r in publishes(h)].count(txn_publisher_id("sink/old", None)) == 0
    # the newer holder re-offers deliveries 1..2 and commits them with its epoch: acked with the rows
    assert _named(h, new, m.Lease(queue="Q", consumer="c", after=0, max=2, ttl=30, epoch=e2)).d == 2
    stage(h, new, "new/0", [20, 21])
    h.handle(new, m.CommitTxn(publisher="sink/new", seq=1, txns=["new/0"], fences=[m.ConsumerFence("Q", "c", e2, 2)]))
    h.commit()
    assert last_ack(h, new).result == replies.CommitReply(published=2)
    assert _named(h, new, m.ConsumerInfo(queue="Q", consumer="c")).acked == 2
    # a fence beyond the consumer's deliveries is refused before anything is published
    stage(h, new, "new/1", [30])
    h.handle(new, m.CommitTxn(publisher="sink/new", seq=2, txns=["new/1"], fences=[m.ConsumerFence("Q", "c", e2, 9)]))
    h.commit()
    assert last_ack(h, new).code == "bad_delivery_range"
    assert [r.seq for r in publishes(h) if r.publisher == txn_publisher_id("sink/new", None)] == [1, 1]


def test_the_acknowledgement_of_a_fenced_commit_survives_a_crash():
    h = harness()
    pub, sink = h.connect("pub"), h.connect("sink")
    for i in range(3):
        h.publish(pub, "Work", {"i": i})
    h.commit()
    e = _named(h, sink, m.Claim(queue="Q", consumer="c", token="t")).epoch
    _named(h, sink, m.Lease(queue="Q", consumer="c", after=0, max=3, ttl=30, epoch=e))
    stage(h, sink, "a", [1])
    h.handle(sink, m.CommitTxn(publisher="sink/q", seq=1, txns=["a"], fences=[m.ConsumerFence("Q", "c", e, 3)]))
    h.commit()
    assert last_ack(h, sink).status == "success"
    h.crash(checkpoint=False)
    sink = h.connect("sink")
    assert _named(h, sink, m.ConsumerInfo(queue="Q", consumer="c")) == replies.ConsumerInfoReply(d=3, acked=3, epoch=e, unacked=0)
