"""``conveyor dead-letters`` and ``conveyor redrive``: dead letters through the admin
interface (docs/cli.md; the server side is server/redrive.py).

The re-drive runs in the server, not in this process: the server owns the journal
the originals are read from, and the duplicate detection that makes a job exactly
once; a job started here goes on if this command loses its connection. This command
starts it (or resumes it: the same ``--job`` again) and shows its progress until it
ends. Ctrl-C cancels the job on the server (it resumes when run again); ``--detach``
starts it and returns at once. Addresses, credentials, ``--json`` and errors are those
of the other operator commands (cli/ops.py rules 1-4).
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.parse
from typing import Any

from conveyor import errors
from conveyor.cli import ops

POLL_S = 0.2
BODY_CHARS = 60
EXIT_INTERRUPTED = 130  # as cli/main.py
EXIT_INCOMPLETE = 1  # a job that ended with dead letters it could not re-drive, failed or cancelled

_BASE = "/amps/administrator/dead_letters"


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def _query(args: argparse.Namespace, names: tuple[str, ...]) -> str:
    pairs = [(name, getattr(args, name, None)) for name in names]
    return urllib.parse.urlencode([(k, str(v)) for k, v in pairs if v is not None and v != ""])


_SELECTION = ("reason", "app_reason", "filter", "since", "until", "queue")


def cmd_dead_letters(args: argparse.Namespace) -> int:
    query = _query(args, (*_SELECTION, "limit"))
    result = ops.fetch(args, f"{_BASE}/{_quote(args.topic)}?{query}")
    if args.json:
        ops._print_json(result)
        return 0
    letters = result["dead_letters"]
    if not letters:
        print(f"no dead letters on {args.topic!r} match ({result['records_scanned']} journal records read)")
        return 0
    rows = [[d["bookmark"], ops._when(d["published_at"]), d["queue"], ",".join(d["reasons"]) or "-",
             d["failure_reason"], d["deliveries"], _short(d["data"])] for d in letters]
    ops._table(rows, ["BOOKMARK", "EXPIRED", "QUEUE", "REASONS", "FAILURE REASON", "DELIVERIES", "BODY"])
    if result["truncated"]:
        print(f"(the first {len(letters)}; --limit N for more)")
    return 0


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= BODY_CHARS else text[: BODY_CHARS - 3] + "..."


def cmd_redrive(args: argparse.Namespace) -> int:
    if args.status or args.cancel:
        return _status_or_cancel(args)
    if not args.topic:
        raise errors.ClientError("give the dead-letter topic: conveyor redrive TOPIC --job NAME "
                                 "(or --status / --cancel)")
    if not args.job:
        raise errors.ClientError("give the job's name: --job NAME (running the same name again resumes the "
                                 "job, and never re-drives a dead letter twice)")
    query = _query(args, ("job", "to", *_SELECTION, "rate"))
    job = ops.fetch(args, f"{_BASE}/{_quote(args.topic)}/redrive?{query}")
    if args.detach:
        if args.json:
            ops._print_json(job)
        else:
            print(f"re-drive job {job['job']!r} started; `conveyor redrive --job {job['job']} --status` shows it")
        return 0
    try:
        job = _follow(args, job)
    except KeyboardInterrupt:
        try:
            ops.fetch(args, f"{_BASE}/jobs/{_quote(args.job)}/cancel")
            print(f"\nconveyor: interrupted: re-drive job {args.job!r} cancelled; run the same command again to "
                  "resume it", file=sys.stderr)
        except errors.ConveyorError as exc:
            print(f"\nconveyor: interrupted; the job could not be cancelled: {exc}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.json:
        ops._print_json(job)
    else:
        _summary(job)
    return 0 if job["state"] == "done" and not job["failed"] and not job["not_redrivable"] else EXIT_INCOMPLETE


def _follow(args: argparse.Namespace, job: dict[str, Any]) -> dict[str, Any]:
    """Poll the job until it ends; a progress line on stderr when it is a terminal."""
    tty = sys.stderr.isatty() and not args.json
    while job["state"] in ("selecting", "running"):
        if tty:
            print(f"\r{job['state']}: {job['processed']}/{job['selected']} ({job['redriven']} re-driven)",
                  end="", file=sys.stderr, flush=True)
        time.sleep(POLL_S)
        job = ops.fetch(args, f"{_BASE}/jobs/{_quote(job['job'])}")
    if tty:
        print(file=sys.stderr)
    return job


def _summary(job: dict[str, Any]) -> None:
    print(f"re-drive job {job['job']!r} ({job['client_name']}): {job['state']}")
    print(f"  selected        {job['selected']} dead letter(s) on {job['topic']!r}")
    print(f"  re-driven       {job['redriven']}" + (f" to {', '.join(job['reaches'])}" if job["reaches"] else ""))
    for topic, queues in job["reaches"].items():
        if len(queues) > 1:
            print(f"  note            topic {topic!r} feeds {len(queues)} queues: {', '.join(queues)}")
    if job["already"]:
        print(f"  already         {job['already']} (re-driven by an earlier run of this job)")
    if job["own"]:
        print(f"  own             {job['own']} (re-driven by this job and dead again: use another --job)")
    for kind, label in (("not_redrivable", "not re-drivable"), ("failed", "failed")):
        if job[kind]:
            print(f"  {label:<15} {job[kind]}")
            items = [p for p in job["problems"] if p["kind"] == kind]
            for item in items[:10]:
                print(f"    {item['bookmark']}: {item['why']}")
            if job[kind] > 10:
                print(f"    ... and {job[kind] - min(10, len(items))} more (--json lists up to 1,000)")
    if job["error"]:
        print(f"  error           {job['error']}")


def _status_or_cancel(args: argparse.Namespace) -> int:
    if args.cancel:
        if not args.job:
            raise errors.ClientError("--cancel needs --job NAME")
        job = ops.fetch(args, f"{_BASE}/jobs/{_quote(args.job)}/cancel")
        if args.json:
            ops._print_json(job)
        else:
            print(f"re-drive job {args.job!r} cancelled (run it again to resume it)")
        return 0
    if args.job:
        jobs = [ops.fetch(args, f"{_BASE}/jobs/{_quote(args.job)}")]
    else:
        jobs = ops.fetch(args, f"{_BASE}/jobs")["jobs"]
    if args.json:
        ops._print_json({"jobs": jobs})
        return 0
    if not jobs:
        print("no re-drive jobs since the server started")
        return 0
    ops._table([[j["job"], j["topic"], j["state"], j["selected"], j["redriven"], j["already"],
                 j["not_redrivable"], j["failed"], ops._when(j["started_at"])] for j in jobs],
               ["JOB", "TOPIC", "STATE", "SELECTED", "REDRIVEN", "ALREADY", "NOT REDRIVABLE", "FAILED", "STARTED"])
    return 0


def add_parsers(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    common = ops.admin_arguments

    def selection(p: argparse.ArgumentParser) -> None:
        p.add_argument("--reason", help="system reasons (max_cancels, max_deliveries, time_limit, forced_expire; "
                                        "comma list) or text of the application's failure reason")
        p.add_argument("--app-reason", dest="app_reason", help="text of the application's failure reason only")
        p.add_argument("--filter", help="content filter on the dead letter's body (as a subscription's)")
        p.add_argument("--since", help="published (expired) at or after: epoch seconds, ISO 8601, or ago (15m, 2h)")
        p.add_argument("--until", help="published (expired) before: epoch seconds, ISO 8601, or ago (15m, 2h)")
        p.add_argument("--queue", help="only dead letters of this source queue")

    p = sub.add_parser("dead-letters", help="list the dead letters of a topic, by reason, content or time")
    p.add_argument("topic", help="the dead-letter topic (an expiry action's Do Topic)")
    selection(p)
    p.add_argument("--limit", type=int, default=50, help="dead letters to list (default 50)")
    common(p)
    p.set_defaults(func=cmd_dead_letters)

    p = sub.add_parser("redrive", help="re-publish dead letters' original messages to their queue, exactly once")
    p.add_argument("topic", nargs="?", help="the dead-letter topic")
    p.add_argument("--job", help="the job's name: the same name again resumes it without duplicates")
    p.add_argument("--to", help="a queue or recorded topic to re-drive to (default: each dead letter's source queue)")
    selection(p)
    p.add_argument("--rate", type=float, help="messages per second (default 100; 0: no limit)")
    p.add_argument("--detach", action="store_true", help="start the job and return (it runs in the server)")
    p.add_argument("--status", action="store_true", help="show the re-drive jobs (or --job's)")
    p.add_argument("--cancel", action="store_true", help="cancel --job (it resumes when run again)")
    common(p)
    p.set_defaults(func=cmd_redrive)
