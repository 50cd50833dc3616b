"""Dead letters on the admin interface: the listing, and re-drive jobs (docs/queues.md,
"Dead letters: inspect and re-drive"; the selection itself is engine/dead_letters.py).

Rules:

1. **Reads share the loop.** A listing or a job's selection scans the journal on the
   event loop (the engine's thread, which owns the journal), ``SCAN_RECORDS_PER_TURN``
   records per turn, so a long journal never holds up clients. The scan ends at the
   durable end when it starts: a re-driven message that dead-letters again during
   the job is not taken by the same run.
2. **Exactly once per job and dead letter.** A job named N publishes as the internal
   client ``redrive-N`` (publisher id of that name), each message with the sequence
   number of its dead letter's journal position, in increasing position order. The
   server's duplicate detection (publisher, sequence) therefore drops a second publish
   of the same dead letter, across restarts (the highest sequence is recovered from the
   journal and the checkpoints). Before each publish the job asks the publish log for
   that publisher's highest sequence and skips what is at or below it (``already``), so
   re-running a job that a crash, a restart or a cancel interrupted resumes it. The
   selection of a job must stay the same across its runs: a dead letter it did not take
   the first time but at or below its high-water mark counts as ``already``; use a new
   job name for another selection. A dead letter whose original message this job
   published (it was re-driven and failed again) is not taken by the same job
   (``own``): another job name re-drives it again.
3. **What is published** is the original message, read from the journal at the dead
   letter's ``expired_position``: its body and correlation id (when it had none, the
   correlation id is ``redrive:N:BOOKMARK``, naming the dead letter), to its source
   queue's ``DefaultPublishTarget``, else its literal ``UnderlyingTopic``, else the topic
   the original was published to; or to ``to`` (a queue, resolved so, or a recorded
   topic). It is a new message: fresh delivery and cancel counts. Every queue over that
   topic gets it (the job reports them: ``reaches``). An original that retention
   removed, or that cannot be read, is reported (``not_redrivable``, with why), never
   skipped silently; a publish the server refuses is reported (``failed``).
4. **Rate.** At most ``rate`` messages per second (a token bucket refilled every
   ``TICK_S``; 0: as fast as the journal takes them). A message counts as re-driven once
   it is durable.
5. **Jobs** live in this process: ``/amps/administrator/dead_letters/jobs`` lists them
   with their counts; a job may be cancelled; the server stopping cancels them (they
   resume when run again). One run of a name at a time; a run of a name whose previous
   run is remembered with other parameters is refused (409): rule 2.
6. **Entitlements.** On a server without ``<Entitlement>`` the job's client may publish
   anywhere (the Admin grant ``full`` let it start). With them it is authenticated as
   the admin user who started the job, with that user's publish entitlements (a
   publish they refuse is ``failed``), and its publisher id is that user's, as any
   authenticated client's: run a job again as the same user, or it starts afresh.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from conveyor import errors, records
from conveyor.config._invalid import Invalid
from conveyor.config.model import QueueConfig, is_regex_topic
from conveyor.config.units import duration_s
from conveyor.engine.dead_letters import DeadLetter, Listing, Selection, TemplateFields
from conveyor.engine.filters import compile_filter
from conveyor.protocol import messages as m

if TYPE_CHECKING:
    from conveyor.server.server import Server

log = logging.getLogger("conveyor.admin")

SCAN_RECORDS_PER_TURN = 4096
LIST_LIMIT_DEFAULT = 100
LIST_LIMIT_MAX = 10_000
RATE_DEFAULT = 100.0  # messages per second
TICK_S = 0.05
JOB_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
REPORT_MAX = 1000  # dead letters a job lists as not re-drivable or failed (all are counted)
JOBS_KEPT = 64  # finished jobs remembered (the oldest are forgotten first)


class RedriveError(errors.ClientError):
    """A request the admin interface answers with ``status`` (server/admin.py)."""

    code = "bad_request"
    status = 400


class BadRequest(RedriveError):
    pass


class Conflict(RedriveError):
    code = "conflict"
    status = 409


class UnknownJob(RedriveError):
    code = "unknown_job"
    status = 404


# --- parameters -------------------------------------------------------------------------------------


def parse_time(text: str, now: float, what: str) -> float:
    """Epoch seconds, an ISO 8601 time (``2025-01-31T12:00:00Z``; no zone: UTC), or a
    duration ago, written as the configuration writes durations (``90s``, ``15m``,
    ``1h30m``, ``1d``)."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return now - duration_s(text)  # the configuration's durations (config/units.py)
    except Invalid:
        pass
    try:
        t = datetime.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadRequest(f"{what} {text!r}: give epoch seconds, an ISO 8601 time (2025-01-31T12:00:00Z) "
                         "or a duration ago (90s, 15m, 2h, 1d)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.timezone.utc)
    return t.timestamp()


def selection(topic: str, arg: Callable[[str], str | None], now: float) -> Selection:
    """The selection the query parameters ask for (``arg(name)``: the parameter or None);
    BadRequest / BadFilter for what cannot be."""
    reasons = tuple(r.strip() for r in (arg("reason") or "").split(",") if r.strip())
    since, until = arg("since"), arg("until")
    return Selection(
        topic=topic, reasons=reasons, app_reason=arg("app_reason") or None,
        filter=compile_filter(arg("filter")),
        since=parse_time(since, now, "since") if since else None,
        until=parse_time(until, now, "until") if until else None,
        queue=arg("queue") or None,
    )


def limit_of(text: str | None) -> int:
    if text is None or text == "":
        return LIST_LIMIT_DEFAULT
    if not text.isdigit():
        raise BadRequest("limit must be a non-negative integer")
    return min(int(text), LIST_LIMIT_MAX)


# --- the listing -----------------------------------------------------------------------------------


async def scan(server: Server, listing: Listing) -> None:
    """Feed ``listing`` the journal's durable records (rule 1)."""
    journal = server.journal
    start, end = journal.first_position, journal.durable_end
    while start < end:
        last = None
        count = 0
        for pos, payload in journal.scan(start, end):
            last = pos
            count += 1
            if not listing.feed(pos, payload):
                return
            if count >= SCAN_RECORDS_PER_TURN:
                break
        if last is None:
            return
        start = journal.position_after(last)
        await asyncio.sleep(0)
        start = max(start, journal.first_position)  # retention may have run meanwhile


async def list_dead_letters(server: Server, sel: Selection, limit: int | None) -> Listing:
    listing = Listing(sel, TemplateFields(server.config.actions), server.clock(), limit)
    try:
        await scan(server, listing)
    except errors.JournalError as exc:
        raise errors.ServerError(f"the journal could not be read: {exc}") from None
    return listing


def letter_json(letter: DeadLetter) -> dict[str, Any]:
    body = letter.data.decode("utf-8", errors="replace")
    f = letter.failure
    return {
        "position": letter.position, "bookmark": letter.bookmark, "topic": letter.topic,
        "published_at": letter.published_at, "queue": letter.queue, "original_position": letter.original_position,
        "reasons": list(letter.reasons), "failure_reason": f.reason, "deliveries": f.deliveries,
        "last_consumer": f.consumer, "data": body,
    }


def listing_json(listing: Listing) -> dict[str, Any]:
    sel = listing.selection
    return {
        "topic": sel.topic, "dead_letters": [letter_json(x) for x in listing.letters], "count": len(listing.letters),
        "truncated": listing.truncated, "records_scanned": listing.scanned,
    }


# --- re-drive jobs ---------------------------------------------------------------------------------


@dataclass
class Job:
    name: str
    topic: str
    params: dict[str, str | None]  # as asked: a later run must ask the same (rule 5)
    to: str | None
    rate: float
    selection: Selection
    state: str = "selecting"  # selecting, running, done, cancelled, failed
    started_at: float = 0.0
    finished_at: float | None = None
    selected: int = 0
    redriven: int = 0  # published and durable in this run
    already: int = 0  # at or below the job's high-water mark: done by an earlier run
    own: int = 0  # its original was published by this job (re-driven, failed again)
    not_redrivable: int = 0
    failed: int = 0
    problems: list[dict[str, Any]] = field(default_factory=list)  # the first REPORT_MAX, with why
    resumed_after: int = 0  # the publisher's highest sequence when this run started
    reaches: dict[str, list[str]] = field(default_factory=dict)  # target topic -> queues over it
    error: str | None = None
    user: str | None = None  # the admin user who started it (with Entitlements: rule 6)
    task: asyncio.Task[None] | None = None

    def problem(self, kind: str, letter: DeadLetter, why: str, to: str | None = None) -> None:
        """A dead letter not re-driven (rule 3): counted, and listed up to REPORT_MAX."""
        if kind == "failed":
            self.failed += 1
        else:
            self.not_redrivable += 1
        if len(self.problems) < REPORT_MAX:
            self.problems.append({"kind": kind, "bookmark": letter.bookmark, "position": letter.position,
                                  "to": to, "why": why})

    @property
    def client_name(self) -> str:
        return f"redrive-{self.name}"

    def view(self) -> dict[str, Any]:
        done = self.redriven + self.already + self.own + self.not_redrivable + self.failed
        return {
            "job": self.name, "client_name": self.client_name, "topic": self.topic, "to": self.to,
            "parameters": self.params, "rate": self.rate, "state": self.state, "started_at": self.started_at,
            "finished_at": self.finished_at, "selected": self.selected, "processed": done, "redriven": self.redriven,
            "already": self.already, "own": self.own, "not_redrivable": self.not_redrivable,
            "failed": self.failed, "problems": self.problems, "resumed_after": self.resumed_after, "reaches": self.reaches, "error": self.error,
        }


class Redrive:
    """The re-drive jobs of one server (rule 5)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.jobs: dict[str, Job] = {}

    def view(self) -> dict[str, Any]:
        return {"jobs": [job.view() for job in self.jobs.values()]}

    def start(self, topic: str, name: str | None, arg: Callable[[str], str | None], who: str,
              user: str | None = None) -> Job:
        server = self.server
        if not name or not JOB_NAME.fullmatch(name):
            raise BadRequest("a re-drive needs ?job=NAME: 1 to 64 letters, digits, '_', '.' or '-' (the job's "
                             "name makes it exactly-once: run the same name again to resume it)")
        rate_text = arg("rate")
        try:
            rate = RATE_DEFAULT if not rate_text else float(rate_text)
        except ValueError:
            rate = -1.0
        if not rate >= 0 or rate == float("inf"):
            raise BadRequest(f"rate {rate_text!r}: give messages per second (a number >= 0; 0: no limit)")
        params = {k: arg(k) or None for k in ("to", "reason", "app_reason", "filter", "since", "until", "queue")}
        params["topic"] = topic
        sel = selection(topic, arg, server.clock())
        to = params["to"]
        if to is not None and to not in self._queues() and not server.engine.publishes.recorded(to):
            raise BadRequest(f"to {to!r}: no queue of that name, and the topic is not recorded in the transaction "
                             "log (a message published there would reach no one)")
        previous = self.jobs.get(name)
        if previous is not None:
            if previous.state in ("selecting", "running"):
                raise Conflict(f"re-drive job {name!r} is running (cancel it first, or wait)")
            if previous.params != params:
                raise Conflict(f"re-drive job {name!r} ran with other parameters ({_describe(previous.params)}): a job "
                               "keeps its selection across runs; use another job name for another selection")
            del self.jobs[name]
        job = Job(name=name, topic=topic, params=params, to=to, rate=rate, selection=sel, started_at=server.clock(),
                  user=user)
        self.jobs[name] = job
        while len(self.jobs) > JOBS_KEPT:
            oldest = next((k for k, j in self.jobs.items() if j.task is None or j.task.done()), None)
            if oldest is None:
                break
            del self.jobs[oldest]
        log.info("admin: re-drive job %r of dead letters on %r started by %s (%s)", name, topic, who,
                 _describe(params))
        job.task = asyncio.ensure_future(self._run(job))
        return job

    def cancel(self, name: str) -> Job:
        job = self.jobs.get(name)
        if job is None:
            raise UnknownJob(f"no re-drive job {name!r}")
        if job.task is not None and not job.task.done():
            job.task.cancel()
        return job

    def cancel_all(self) -> None:
        for job in self.jobs.values():
            if job.task is not None and not job.task.done():
                job.task.cancel()

    def _queues(self) -> dict[str, QueueConfig]:
        return {q.name: q for q in self.server.config.queues}

    async def _run(self, job: Job) -> None:
        server = self.server
        conn_id = None
        try:
            listing = await list_dead_letters(server, job.selection, None)
            job.selected = len(listing.letters)
            job.state = "running"
            if server.supervisor.failure is not None:
                raise errors.ServerError("the server failed")
            conn_id = self._open_session(job)
            await self._publish_all(job, listing.letters, conn_id)
            job.state = "done"
        except asyncio.CancelledError:
            job.state = "cancelled"
            raise
        except Exception as exc:  # noqa: BLE001 - a job's failure is reported, never the server's
            job.state = "failed"
            job.error = str(exc) if isinstance(exc, errors.ConveyorError) else f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, errors.ConveyorError):
                log.exception("re-drive job %r failed", job.name)
        finally:
            job.finished_at = server.clock()
            if conn_id is not None and server.supervisor.failure is None and conn_id in server.engine.sessions:
                server.engine.disconnect(conn_id, server.clock())
                server._after_engine()
            log.info("re-drive job %r %s: %d selected, %d re-driven, %d already, %d own, %d not re-drivable, "
                     "%d failed", job.name, job.state, job.selected, job.redriven, job.already, job.own,
                     job.not_redrivable, job.failed)

    def _open_session(self, job: Job) -> int:
        """The job's internal client: a session with no connection (its output is
        dropped), logged on as ``redrive-NAME``; with Entitlements, as the admin user who
        started the job (rule 6)."""
        server = self.server
        engine = server.engine
        conn_id = next(server._conn_ids)
        engine.connect(conn_id)
        if engine.entitlements.required:
            if job.user is None:
                engine.disconnect(conn_id, server.clock())
                raise errors.NotAuthenticated("with Entitlements, a re-drive publishes as the admin user who starts "
                                              "it: start it with credentials")
            engine.authenticate(conn_id, job.user)
        engine.handle(conn_id, [m.Logon(client_name=job.client_name, ack_type="none")], server.clock())
        server._after_engine()
        if conn_id not in engine.sessions or not engine.sessions[conn_id].logged_on:
            raise errors.ServerError(f"the re-drive's internal client {job.client_name!r} could not log on")
        return conn_id

    async def _publish_all(self, job: Job, letters: list[DeadLetter], conn_id: int) -> None:
        server = self.server
        engine = server.engine
        publisher = engine.sessions[conn_id].publisher
        assert publisher is not None  # set by the logon
        job.resumed_after = engine.publishes.highest_seq(publisher)
        targets: dict[tuple[str, str], str | None] = {}
        tokens = 0.0
        last = time.monotonic()
        pending = 0
        for letter in sorted(letters, key=lambda x: x.position):
            if engine.publishes.is_duplicate(publisher, letter.position):
                job.already += 1
                continue
            if job.rate > 0:
                while tokens < 1.0:
                    if pending:
                        await server.wait_durable(server.journal.end)
                        job.redriven += pending
                        pending = 0
                    await asyncio.sleep(TICK_S)
                    now = time.monotonic()
                    tokens = min(max(1.0, job.rate * TICK_S * 2), tokens + (now - last) * job.rate)
                    last = now
                tokens -= 1.0
            original = self._original(job, letter, publisher)
            if original is None:
                continue
            target = self._target(job, letter, original, targets)
            if target is None:
                continue
            if self._publish(job, conn_id, publisher, letter, original, target):
                pending += 1
            if job.rate <= 0 and pending >= SCAN_RECORDS_PER_TURN // 16:
                await server.wait_durable(server.journal.end)
                job.redriven += pending
                pending = 0
        if pending:
            await server.wait_durable(server.journal.end)
            job.redriven += pending

    def _original(self, job: Job, letter: DeadLetter, publisher: int) -> records.PublishRec | None:
        journal = self.server.journal
        where = letter.original_position
        why = None
        rec = None
        if where < journal.first_position:
            why = "its original message was removed by retention"
        else:
            try:
                rec = records.decode(journal.read(where))
            except errors.JournalError as exc:
                why = f"its original message cannot be read: {exc}"
            except Exception as exc:  # noqa: BLE001 - a record that does not decode
                why = f"its original message cannot be decoded: {exc}"
            else:
                if type(rec) is not records.PublishRec:
                    why = f"position {where} holds no message"
        if why is not None or not isinstance(rec, records.PublishRec):
            job.problem("not_redrivable", letter, why or "its original message cannot be read")
            return None
        if rec.publisher == publisher:
            job.own += 1
            return None
        return rec

    def _target(self, job: Job, letter: DeadLetter, original: records.PublishRec,
                targets: dict[tuple[str, str], str | None]) -> str | None:
        """Rule 3: where the message goes; None (reported) when nowhere."""
        name = job.to or letter.queue
        key = (name, original.topic)
        if key not in targets:
            q = self._queues().get(name)
            target: str | None
            if q is None:
                target = name if job.to is not None else None
            elif q.default_publish_target:
                target = q.default_publish_target
            elif not is_regex_topic(q.underlying):
                target = q.underlying
            else:
                target = original.topic if q.takes_from(original.topic) else None
            targets[key] = target
            if target is not None:
                job.reaches[target] = [b.name for b in self.server.engine.bindings.for_topic(target)]
        target = targets[key]
        if target is None:
            why = (f"queue {name!r} is not configured" if name not in self._queues() else
                   f"queue {name!r} takes from a pattern without DefaultPublishTarget, and not from the original's "
                   f"topic {original.topic!r}")
            job.problem("not_redrivable", letter, why)
        return target

    def _publish(self, job: Job, conn_id: int, publisher: int, letter: DeadLetter, original: records.PublishRec,
                 target: str) -> bool:
        server = self.server
        engine = server.engine
        if server.supervisor.failure is not None or conn_id not in engine.sessions:
            raise errors.ServerError("the server failed or is stopping")
        correlation_id = original.correlation_id or f"redrive:{job.name}:{letter.bookmark}"
        cmd = m.Publish(topic=target, data=original.data, seq=letter.position, ack_type="processed",
                        correlation_id=correlation_id)
        engine.handle(conn_id, [cmd], server.clock())
        out = engine.take_output()
        mine = out.pop(conn_id, [])
        for other, msgs in out.items():  # not ours: back in the outbox, in order, for the flush
            for msg in msgs:
                engine.outbox.send(other, msg)
        server._after_engine()
        if engine.publishes.highest_seq(publisher) >= letter.position:
            return True
        reason = next((a.reason for a in mine if isinstance(a, m.Ack) and a.status == "failure"), None)
        job.problem("failed", letter, reason or "refused by the server", target)
        return False


def _describe(params: dict[str, str | None]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items() if v is not None) or "everything"
