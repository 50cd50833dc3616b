"""Segment summaries made behind the writer (journal/index.py, SealSummarizer): in the
server, each on a thread of its own, so a summary reading a large sealed segment never
holds up a journal write queued behind it, and closing the summarizer stops the one
under way instead of waiting for the whole segment."""

from __future__ import annotations

import os
import threading
import time

from conveyor import records as r
from conveyor.journal import Journal
from conveyor.journal.format import FILE_HEADER_LEN
from conveyor.journal.index import SealSummarizer, load_summary, summarize_segment, summary_path
from conveyor.records.facts import describe_record


def _sealed(directory, records: int) -> tuple[str, int, int]:
    """A journal whose first segment is sealed with about ``records`` records: (its
    path, base, end), as ``on_seal`` is called with them."""
    j = Journal.open(directory, segment_bytes=records * 60, fsync=False)
    for k in range(records + 200):
        j.append(r.encode(r.PublishRec("t", 1, k + 1, 1000.0, bytes(20))))
    j.commit()
    j.close()
    first = sorted(p for p in os.listdir(directory) if p.endswith(".log"))[0]
    path = os.path.join(directory, first)
    return path, 0, os.path.getsize(path) - FILE_HEADER_LEN


class Gate:
    """A describe that holds the summary at its first record until released."""

    def __init__(self) -> None:
        self.calls = 0
        self.started, self.go = threading.Event(), threading.Event()
        self.thread: str | None = None

    def __call__(self, payload: bytes):
        self.calls += 1
        if self.calls == 1:
            self.thread = threading.current_thread().name
            self.started.set()
            self.go.wait(10)
        return describe_record(payload)


def test_a_background_summary_is_written_on_a_thread_of_its_own(tmp_path):
    path, base, end = _sealed(tmp_path, 500)
    gate = Gate()
    summaries = SealSummarizer(gate, background=True)
    started = time.monotonic()
    summaries(path, base, end)  # returns at once: the summary waits on its own thread
    assert gate.started.wait(10) and time.monotonic() - started < 5
    assert gate.thread is not None and gate.thread.startswith("journal-summary")
    gate.go.set()
    deadline = time.monotonic() + 10
    while load_summary(path) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert load_summary(path) == summarize_segment(path, describe_record)
    summaries.close()


def test_close_stops_the_summary_under_way_and_writes_nothing(tmp_path):
    path, base, end = _sealed(tmp_path, 20_000)
    gate = Gate()
    summaries = SealSummarizer(gate, background=True)
    summaries(path, base, end)
    assert gate.started.wait(10)
    closing = threading.Thread(target=summaries.close)
    closing.start()
    time.sleep(0.05)  # close() has set the flag and waits for the thread
    gate.go.set()
    closing.join(10)
    assert not closing.is_alive()
    assert gate.calls < 20_000  # it gave up at a check, not at the end of the segment
    assert not os.path.exists(summary_path(path))
    summaries(path, base, end)  # after close: nothing is started
    assert not os.path.exists(summary_path(path))


def test_without_background_the_summary_is_written_at_once(tmp_path):
    path, base, end = _sealed(tmp_path, 300)
    SealSummarizer(describe_record)(path, base, end)
    assert load_summary(path) == summarize_segment(path, describe_record)
