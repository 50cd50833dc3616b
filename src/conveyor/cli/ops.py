"""Operator commands: ``stats``, ``queues``, ``clients``, ``explain``, ``replication``,
``disconnect``: each reads the server's admin interface over HTTP.

Rules:

1. The admin address is ``--admin URL``, else the ``CONVEYOR_ADMIN`` environment
   variable, else ``DEFAULT_ADMIN`` (the embedded default configuration's
   ``Admin/InetAddr``). A bare ``HOST:PORT`` or ``PORT`` is accepted.
2. ``--json`` prints the admin interface's JSON unchanged (for scripts); otherwise a
   table or a few lines meant for a person.
3. A server that cannot be reached, or answers with an error, is one line on stderr
   and exit code 1 (2 for a request the server calls bad); never a traceback. The line
   has the error's message: from a JSON body its ``message``, from a plain-text one its
   first line (a conveyor client port answers HTTP with a 400 saying what it is and
   where the admin interface is).
4. **Credentials** (a server with ``Authentication``): in the address
   (``http://USER:PASSWORD@HOST:PORT``), else ``--user`` (or ``CONVEYOR_USER``) with the
   password from ``CONVEYOR_PASSWORD``, sent as HTTP Basic. They are never printed: the
   address in messages is shown without them. ``--ca-file`` verifies an HTTPS admin
   port's certificate.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import ssl
import sys
import time
import urllib.parse
from typing import Any

from conveyor import errors

# The client's (conveyor.client.endpoints; tests/test_startup_imports.py holds them
# equal): named here because importing that module loads the whole client package, and
# ``conveyor serve`` builds this module's parsers before it starts (issue 38).
USER_ENV = "CONVEYOR_USER"
PASSWORD_ENV = "CONVEYOR_PASSWORD"
ADMIN_ENV = "CONVEYOR_ADMIN"
DEFAULT_ADMIN = "http://127.0.0.1:8085"
REQUEST_TIMEOUT_S = 10.0


class AdminUnreachable(errors.ConveyorError):
    code = "admin_unreachable"


def admin_url(args: argparse.Namespace) -> str:
    url = getattr(args, "admin", None) or os.environ.get(ADMIN_ENV) or DEFAULT_ADMIN
    if url.isdigit():
        url = f"127.0.0.1:{url}"
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


def _credentials(args: argparse.Namespace, url: str) -> tuple[str, str | None]:
    """Rule 4: the address without its user information, and the Authorization header
    (None: no credentials)."""
    split = urllib.parse.urlsplit(url)
    user = urllib.parse.unquote(split.username) if split.username else None
    password = urllib.parse.unquote(split.password) if split.password is not None else None
    if split.username or split.password is not None:
        netloc = split.hostname if ":" not in (split.hostname or "") else f"[{split.hostname}]"
        netloc += f":{split.port}" if split.port else ""
        url = urllib.parse.urlunsplit((split.scheme, netloc, split.path, split.query, split.fragment))
    user = user or getattr(args, "user", None) or os.environ.get(USER_ENV)
    if user is None:
        return url, None
    if password is None:
        password = os.environ.get(PASSWORD_ENV, "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return url, f"Basic {token}"


def fetch(args: argparse.Namespace, path: str) -> Any:
    """GET ``path`` from the admin interface as JSON (rule 3 for failures)."""
    import urllib.error  # here: http.client and email cost every command (serve too) otherwise
    import urllib.request

    base, authorization = _credentials(args, admin_url(args))
    request = urllib.request.Request(base + path, headers={"Authorization": authorization} if authorization else {})
    ca_file = getattr(args, "ca_file", None)
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S, context=context) as resp:  # noqa: S310
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            body = json.loads(raw)
            message = body.get("message") or body.get("error")
        except (ValueError, AttributeError):
            message = _first_line(raw) or exc.reason
        if exc.code == 401:
            message = (f"{message}: give credentials in the address (http://USER:PASSWORD@HOST:PORT), or --user "
                       f"(or ${USER_ENV}) with ${PASSWORD_ENV}")
        error = errors.ClientError if 400 <= exc.code < 500 and exc.code not in (401, 403, 404) else errors.ServerError
        raise error(f"{base}{path}: {message} (HTTP {exc.code})") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ssl.SSLError) and reason.reason == "WRONG_VERSION_NUMBER":
            # The peer answered, but not in TLS: a plain-HTTP admin port, or a client port.
            raise AdminUnreachable(
                f"cannot reach the admin interface at {base}: that port does not speak TLS (an admin interface "
                f"without <Certificate> is http://, and conveyor's client port is not the admin port: set "
                f"{ADMIN_ENV} or --admin to the admin interface's address)"
            ) from None
        raise AdminUnreachable(
            f"cannot reach the admin interface at {base}: {reason} (is the server running with <Admin>? "
            f"set {ADMIN_ENV} or --admin to its address)"
        ) from None


def _first_line(body: bytes, limit: int = 300) -> str:
    """The first non-blank line of a plain-text error body (at most ``limit`` characters)."""
    for line in body.decode("utf-8", errors="replace").splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[:limit] + "..."
    return ""


def _fetch_or_print(args: argparse.Namespace, path: str) -> Any:
    """The admin interface's JSON at ``path``; with ``--json`` it is printed as it came
    (rule 2) and None is returned: the command has nothing more to do."""
    value = fetch(args, path)
    if args.json:
        _print_json(value)
        return None
    return value


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


def _table(rows: list[list[Any]], header: list[str]) -> None:
    cells = [header] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.1f}s"
    if value < 7200:
        return f"{value / 60:.1f}m"
    if value < 172800:
        return f"{value / 3600:.1f}h"
    return f"{value / 86400:.1f}d"


def _bytes(n: int | float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


# --- commands -------------------------------------------------------------------------------------


def cmd_stats(args: argparse.Namespace) -> int:
    tree = _fetch_or_print(args, "/amps/instance")
    if tree is None:
        return 0
    j = tree["journal"]
    queues = tree["queues"].values()
    print(f"instance    {tree['name']} ({tree['version']}), pid {tree['pid']} on {tree['hostname']}")
    state = "FAILED: " + str(tree["failure"]) if tree["failed"] else ("ready" if tree["ready"] else "starting")
    print(f"state       {state}, up {_seconds(tree['uptime'])}")
    print(f"clients     {tree['client_count']} ({tree['connections']} connections), "
          f"{len(tree['subscriptions'])} subscriptions")
    if j["in_memory"]:
        print("journal     in memory (no TransactionLog)")
    else:
        print(f"journal     {j['directory']}: {_bytes(j['bytes'])} in {j.get('segments', '?')} segment(s), "
              f"durable to {j['durable_end']}, {_bytes(j['unwritten_bytes'])} unwritten")
    if j["commits"]:
        print(f"commits     {j['commits']}: mean {j['commit_seconds_mean'] * 1000:.2f} ms, "
              f"max {j['commit_seconds_max'] * 1000:.2f} ms, "
              f"{j['commit_records_mean']:.1f} records / {_bytes(j['commit_bytes_mean'])} per group")
    depth = sum(q["queue_depth"] for q in queues)
    leased = sum(q["in_flight"] for q in queues)
    print(f"queues      {len(tree['queues'])}: {depth} messages, {leased} in flight, "
          f"{sum(q['consumers'] for q in queues)} consumers")
    unrouted = tree.get("engine", {}).get("publishes_unrouted")
    if unrouted:
        print(f"unrouted    {unrouted} publish(es) reached no one (to a topic neither recorded nor subscribed)")
    links = tree["replication"]["outgoing"]
    if links:
        up = sum(1 for link in links if link["state"] == "streaming")
        print(f"replication {up}/{len(links)} outgoing link(s) streaming, "
              f"{len(tree['replication']['incoming'])} incoming")
    return 0


def cmd_queues(args: argparse.Namespace) -> int:
    if args.queue:
        return _queue_details(args)
    queues = _fetch_or_print(args, "/amps/instance/queues")
    if queues is None:
        return 0
    rows = [
        [name, q["queue_depth"], q["available"], q["in_flight"], q["consumers"], q["inactive_message_count"],
         _seconds(q["seconds_behind"]), q["enqueued"], q["delivered"], q["acknowledged"], q["expired"]]
        for name, q in sorted(queues.items())
    ]
    # OLDEST: the age of the oldest unacknowledged message (the admin's seconds_behind)
    _table(rows, ["QUEUE", "DEPTH", "AVAILABLE", "IN-FLIGHT", "CONSUMERS", "INACTIVE", "OLDEST", "ENQUEUED",
                  "DELIVERED", "ACKED", "EXPIRED"])
    if rows:  # the counters restart with the server, the rest is now (docs/operations.md, "Start-up")
        print("(ENQUEUED, DELIVERED, ACKED, EXPIRED: counted since the server started)")
    return 0


def _queue_details(args: argparse.Namespace) -> int:
    name = urllib.parse.quote(args.queue, safe="")
    stats = fetch(args, f"/amps/instance/queues/{name}")
    query = f"limit={args.limit}" + (f"&filter={urllib.parse.quote(args.filter, safe='')}" if args.filter else "")
    details = fetch(args, f"/amps/instance/queues/{name}/details?{query}")
    if args.json:
        _print_json({"statistics": stats, "details": details})
        return 0
    print(f"queue {args.queue}: depth {stats['queue_depth']}, available {stats['available']}, "
          f"in flight {stats['in_flight']}, inactive {stats['inactive_message_count']}, "
          f"{stats['consumers']} consumer(s), oldest unacknowledged {_seconds(stats['seconds_behind'])} old")
    if stats.get("settings"):
        print("\nsettings:")
        for line in _settings_lines(stats["settings"]):
            print("  " + line)
    if details["cursors"]:
        print("\nsubscribers:")
        _table([[c["subscriber"], c["client"], c["outstanding"], c["max_backlog"]] for c in details["cursors"]],
               ["SUBSCRIBER", "CLIENT", "OUTSTANDING", "MAX_BACKLOG"])
    now = time.time()
    print()
    _table(
        [[m["bookmark"] or m["position"], m["state"], m["holder_client"] or m["holder"],
          _lease_left(m, now), m["deliveries"], _retry_in(m, now), m.get("reason"),
          _when(m["published_at"])] for m in details["messages"]],
        ["BOOKMARK", "STATE", "HOLDER", "LEASE LEFT", "DELIVERIES", "RETRY IN", "FAILURE REASON", "PUBLISHED"],
    )
    if details["messages_truncated"]:
        matching = " matching the filter" if args.filter else " available"
        print(f"(the first {args.limit}{matching} messages; --limit N for more)")
    return 0


#: The settings block of ``conveyor queues QUEUE``: one line per theme, and what each
#: setting's null (none) means; the values are the server's (the admin JSON's
#: ``settings``: the queue's effective configuration, defaults included).
_SETTINGS_LINES = (
    (("Semantics", None), ("FairnessModel", None), ("Leasing", None)),
    (("LeasePeriod", "infinite"), ("Expiration", "never"), ("DeferredAckExpiration", "never")),
    (("MaxBacklog", "unlimited"), ("MaxPerSubscriptionBacklog", "unlimited"), ("TargetQueueDepth", "none")),
    (("MaxCancels", "unlimited"), ("MaxDeliveries", "unlimited")),
    (("Priority", "none"), ("BarrierExpression", "none"), ("Filter", "none")),
    (("UnderlyingTopic", None), ("DefaultPublishTarget", "none"), ("RecoveryPoint", "epoch"),
     ("FileBackedMetadata", None)),
    (("RetryBackoff", "none"), ("OrderingKey", "none"), ("MaxInFlightPerKey", "none")),
)
_SETTING_DURATIONS = frozenset({"LeasePeriod", "Expiration", "DeferredAckExpiration"})
_SETTING_EXPRESSIONS = frozenset({"Priority", "BarrierExpression", "Filter", "OrderingKey"})


def _settings_lines(settings: dict) -> list[str]:
    lines = []
    shown = set()
    for group in _SETTINGS_LINES:
        parts = []
        for key, none in group:
            if key not in settings:
                continue
            shown.add(key)
            parts.append(f"{key} {_setting(key, settings[key], none)}")
        if parts:
            lines.append(", ".join(parts))
    rest = [f"{k} {_setting(k, v, 'none')}" for k, v in settings.items() if k not in shown]
    if rest:  # a setting a newer server reports
        lines.append(", ".join(rest))
    return lines


def _setting(key: str, value: Any, none: str | None) -> str:
    if value is None:
        return none or "none"
    if isinstance(value, bool):
        return "enabled" if value else "disabled"
    if key in _SETTING_DURATIONS and isinstance(value, (int, float)):
        return _duration(value)
    if key == "RetryBackoff" and isinstance(value, list):
        return ",".join(_duration(v) for v in value)
    if key in _SETTING_EXPRESSIONS:
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _duration(seconds: float) -> str:
    """A duration as the configuration writes it: the largest unit it is a whole number
    of (``30s``, ``5m``, ``1h``, ``1d``), else seconds (``1.5s``)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"


def _lease_left(message: dict, now: float) -> str | None:
    if message["lease_deadline"]:
        return _seconds(max(0.0, message["lease_deadline"] - now))
    if message["state"] == "leased":
        return "infinite"  # an endless lease (LeasePeriod infinite): no deadline
    return None


def _retry_in(message: dict, now: float) -> str | None:
    """How long a delayed retry still waits (docs/queues.md, "Delayed retry"); for a
    message owned elsewhere, its owner's."""
    not_before = message.get("not_before")
    return _seconds(round(max(0.0, not_before - now), 1)) if not_before else None


def cmd_clients(args: argparse.Namespace) -> int:
    clients = _fetch_or_print(args, "/amps/instance/clients")
    if clients is None:
        return 0
    rows = [
        [c["id"], c["name"], c["user"], c["address"], _seconds(c["connected_for"]), c["subscriptions"],
         c["messages_in"], c["messages_out"], _bytes(c["bytes_in"]), _bytes(c["bytes_out"]), _bytes(c["unsent_bytes"])]
        for c in sorted(clients.values(), key=lambda c: c["id"])
    ]
    _table(rows, ["ID", "NAME", "USER", "ADDRESS", "CONNECTED", "SUBS", "MSGS IN", "MSGS OUT", "BYTES IN",
                  "BYTES OUT", "UNSENT"])
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    name = urllib.parse.quote(args.queue, safe="")
    bookmark = urllib.parse.quote(args.bookmark, safe="")
    e = _fetch_or_print(args, f"/amps/instance/queues/{name}/explain?bookmark={bookmark}")
    if e is None:
        return 0
    print(f"{args.queue} {args.bookmark}: {e['verdict']}")
    print(f"  {e['summary']}")
    for reason in e["reasons"]:
        print(f"  - {reason}")
    return 0


def cmd_replication(args: argparse.Namespace) -> int:
    repl = _fetch_or_print(args, "/amps/instance/replication")
    if repl is None:
        return 0
    if not repl["outgoing"] and not repl["incoming"]:
        print("no replication links (no <Replication> destinations, no source connected)")
        return 0
    if repl["outgoing"]:
        _table(
            [[link["destination"], link["state"], "sync" if link["sync"] else "async",
              "yes" if link["downgraded"] else "no", link["acked"], _bytes(link["bytes_behind"]),
              _seconds(link["seconds_behind"]), link["records_sent"], link["last_error"]]
             for link in repl["outgoing"]],
            ["DESTINATION", "STATE", "SYNC", "DOWNGRADED", "ACKED", "BEHIND", "BEHIND(s)", "SENT", "LAST ERROR"],
        )
    if repl["incoming"]:
        if repl["outgoing"]:
            print()
        _table([[link["source"], link["group"], link["received_through"], link["records_received"],
                 link["records_recorded"], link["gaps"]] for link in repl["incoming"]],
               ["SOURCE", "GROUP", "RECEIVED THROUGH", "RECEIVED", "RECORDED", "GAPS"])
    return 0


def cmd_disconnect(args: argparse.Namespace) -> int:
    client = urllib.parse.quote(args.client, safe="")
    result = fetch(args, f"/amps/administrator/clients/{client}/disconnect")
    if args.json:
        _print_json(result)
    else:
        print(f"disconnected client {result['disconnected']} ({result['client']})")
    return 0


def admin_arguments(p: argparse.ArgumentParser) -> None:
    """The options of every command that talks to the admin interface."""
    p.add_argument("--admin", "-a", metavar="URL",
                   help=f"admin interface address (default: ${ADMIN_ENV}, else {DEFAULT_ADMIN})")
    p.add_argument("--json", action="store_true", help="print the admin interface's JSON")
    p.add_argument("--user", help=f"admin user (default ${USER_ENV}); the password comes from the address "
                                  f"or ${PASSWORD_ENV}")
    p.add_argument("--ca-file", help="CA certificates (PEM) that sign an HTTPS admin port's certificate")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    common = admin_arguments

    p = sub.add_parser("stats", help="instance overview: state, clients, journal, queues, replication")
    common(p)
    p.set_defaults(func=cmd_stats)
    p = sub.add_parser("queues", help="queue depths and rates; with QUEUE: its subscribers and messages")
    p.add_argument("queue", nargs="?")
    p.add_argument("--limit", type=int, default=50, help="messages to list for one queue (default 50)")
    p.add_argument("--filter", help="with QUEUE: list only the messages whose body matches this content filter")
    common(p)
    p.set_defaults(func=cmd_queues)
    p = sub.add_parser("clients", help="connected clients: name, user, address, traffic, unsent bytes")
    common(p)
    p.set_defaults(func=cmd_clients)
    p = sub.add_parser("explain", help="why a queue message is or is not being delivered")
    p.add_argument("queue")
    p.add_argument("bookmark", help="the message's bookmark (or its journal position)")
    common(p)
    p.set_defaults(func=cmd_explain)
    p = sub.add_parser("replication", help="replication links: state, lag, errors per destination and source")
    common(p)
    p.set_defaults(func=cmd_replication)
    p = sub.add_parser("disconnect", help="close a client's connection (by id or name)")
    p.add_argument("client")
    common(p)
    p.set_defaults(func=cmd_disconnect)
