"""The ``conveyor`` command: serve, publish, subscribe, sow, ack, and journal tools.

Exit codes: 0 success, 1 a runtime failure (connection, server error; for ``serve``: the
server stopped itself after a failure of its background work, such as a failed journal
write or fsync), 2 bad usage or bad configuration, 3 a damaged journal (verify found
problems / open refused), 4 a client command's connection was closed by an administrator
(``conveyor disconnect``: the client does not reconnect), 130 interrupted (Ctrl-C).

No traceback reaches the user: every failure is one line on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
import time
from typing import Any
from pathlib import Path

from conveyor import errors

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_JOURNAL = 3
EXIT_DISCONNECTED = 4  # an administrator closed the connection (conveyor disconnect): not reconnected
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT
DEFAULT_URI = "tcp://127.0.0.1:9007"
SERVER_ENV = "CONVEYOR_SERVER"  # the client commands' --server when not given


def _setup_logging(verbose: bool, command: str) -> None:
    """``serve`` (and ``-v``) log records as a server does, with time, level and logger.
    Every other command shows what the client library reports (a publish the server
    refused, a warning about a topic) as its own messages: one line, ``conveyor COMMAND:
    ...``, without time, logger or traceback, and only warnings and errors."""
    if verbose or command == "serve":
        logging.basicConfig(
            level=logging.DEBUG if verbose else logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            stream=sys.stderr,
        )
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLineFormatter(f"conveyor {command}"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])


class _OneLineFormatter(logging.Formatter):
    """A log record as one line of the command's output (see _setup_logging): the
    client's name, which the user did not choose, is left out, and an exception is its
    message, not its traceback (-v shows everything)."""

    _CLIENT_PREFIX = re.compile(r"^client \S+: ")

    def __init__(self, prog: str) -> None:
        super().__init__()
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        text = self._CLIENT_PREFIX.sub("", record.getMessage())
        if record.exc_info and record.exc_info[1] is not None:
            text += f": {record.exc_info[1]}"
        return f"{self.prog}: {text}".replace("\n", " ")


# --- serve ---------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace) -> int:
    from conveyor.config import default_config, load_file

    config = load_file(args.config) if args.config else default_config()
    if args.port is not None:
        from dataclasses import replace

        transports = config.transports or ()
        if not transports:
            from conveyor.config.model import Transport

            transports = (Transport(name="default"),)
        config = replace(config, transports=tuple(replace(t, port=args.port) for t in transports[:1]) + transports[1:])
    if args.journal is not None and config.transaction_log is not None:
        from dataclasses import replace

        config = replace(config, transaction_log=replace(config.transaction_log, journal_directory=Path(args.journal)))
    if args.no_admin or args.admin_port is not None:
        from dataclasses import replace

        from conveyor.config.model import Admin

        admin = None if args.no_admin else replace(config.admin or Admin(), port=args.admin_port)
        config = replace(config, admin=admin)
    from conveyor.server.log_targets import install

    install(config.logging, verbose=args.verbose)  # <Logging>: replaces the stderr default
    return _run_server(config, _port_origins(args, config),
                       no_clients_until_replicated=args.no_clients_until_replicated)


def _port_origins(args: argparse.Namespace, config) -> dict[str, tuple[str, str]]:
    """The listening addresses whose port the configuration file did not give: element
    path -> (the option that sets it, where it came from), so that a port that cannot be
    used is told in the words the user chose it in (``--port 9007``, the default)."""
    from conveyor.config.model import Transport
    from conveyor.server.startup import ADMIN_LISTEN_PATH, listen_path

    origins = {}
    first = (config.transports or (Transport(name="default"),))[0]
    if args.port is not None:
        origins[listen_path(first)] = ("--port", f"--port {args.port}")
    elif not args.config or not config.transports:
        origins[listen_path(first)] = ("--port", "the default client port")
    if args.admin_port is not None:
        origins[ADMIN_LISTEN_PATH] = ("--admin-port", f"--admin-port {args.admin_port}")
    elif not args.config and config.admin is not None:
        origins[ADMIN_LISTEN_PATH] = ("--admin-port", "the default admin port")
    return origins


def _name_the_option(exc: errors.ConfigError, origins: dict[str, tuple[str, str]]) -> errors.ConfigError:
    """A listening address that cannot be used, said with the option that sets its port
    (see _port_origins) instead of an element of a configuration the user did not write."""
    origin = origins.get(exc.path)
    if origin is None:
        return exc
    option, source = origin
    text = exc.message.removeprefix(f"{exc.path}: ").removesuffix(f" (hint: {exc.hint})")
    hint = f"choose another with {option} N, or {option} 0 for any free port"
    if option == "--admin-port":
        hint += "; --no-admin runs without the admin interface"
    return errors.ConfigError(text, path=source, hint=hint)


def _run_server(config, port_origins: dict[str, tuple[str, str]] | None = None, *,
                no_clients_until_replicated: bool = False) -> int:
    import uvloop

    from conveyor.server.collector import settle_after_recovery
    from conveyor.server.server import Server

    from conveyor import native

    log = logging.getLogger("conveyor")
    log.info("conveyor %s", native.describe())

    async def main() -> None:
        # Signals first: a SIGTERM that arrives as soon as the readiness line is out (or
        # during recovery) asks for a graceful stop instead of killing the process.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        try:
            # binds nothing yet, but checks the ports before creating the journal
            server = Server(config, no_clients_until_replicated=no_clients_until_replicated)
        except errors.ConfigError as exc:
            raise _name_the_option(exc, port_origins or {}) from None

        def shut_down() -> None:
            log.info("shutting down")
            stop.set()

        def reload() -> None:
            log.info("SIGHUP: reloading the users file, TLS certificates and entitlements")
            server.reload_security(force=True)

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, shut_down)
        loop.add_signal_handler(signal.SIGHUP, reload)
        try:
            await server.start()
        except errors.ConfigError as exc:
            raise _name_the_option(exc, port_origins or {}) from None
        settle_after_recovery()  # process-wide: this command owns the process
        if server.admin is not None:
            # Before the listening lines: tests and scripts read up to those.
            print(f"conveyor admin on {server.admin.url}", flush=True)
        for port in server.ports:
            # Machine-readable readiness line: tests and scripts wait for it.
            print(f"conveyor listening on port {port}", flush=True)
        if config.transaction_log is not None:
            print(f"journal: {config.transaction_log.journal_directory}", flush=True)
        if config.queues:
            print("queues: " + ", ".join(q.name for q in config.queues), flush=True)
        print("conveyor ready", flush=True)
        await server.run_until(stop)  # raises ServerFailed (exit 1) if the server fails

    uvloop.run(main())
    return EXIT_OK


# --- client commands -----------------------------------------------------------------------


def _client(args: argparse.Namespace):
    from conveyor.client import Client

    return Client(args.name, user_id=args.user, ca_file=args.ca_file).connect(args.server)


#: After a Ctrl-C during a publish, how long to wait for the confirmations of what was
#: already sent, so the count reported is what is on disk (a second Ctrl-C cuts it short).
INTERRUPTED_PERSIST_WAIT_S = 5.0


def cmd_publish(args: argparse.Namespace) -> int:
    """Publish one message per non-blank line. Lines are read as they come (a pipe
    streams), so a Ctrl-C stops at once and says how many messages are persisted."""
    from tqdm import tqdm

    if args.data is not None and args.file:
        raise errors.ClientError("give DATA or --file, not both")
    if args.data is not None and not args.data.strip():
        raise errors.ClientError("DATA is empty: there is no message to publish; nothing was published")
    if args.json:
        messages = _json_messages(args)  # all parsed before anything is sent
        lines, total = iter(messages), len(messages)
    elif args.data is not None:
        lines, total = iter([args.data]), 1
    elif args.file:
        text = _read_file(args.file).splitlines()
        lines, total = iter(text), len(text)
    else:
        lines, total = sys.stdin, None
    sent = 0
    with _client(args) as client:
        try:
            progress = tqdm(lines, total=total, disable=not sys.stderr.isatty() or (total or 0) < 1000, unit="msg")
            for line in progress:
                line = line.rstrip("\r\n")
                if line.strip():
                    client.publish(args.topic, line.encode())
                    sent += 1
            try:
                client.flush()
            except errors.ConveyorError as exc:
                # flush() reports the first refused publish once everything is persisted;
                # each refusal was logged with its reason, and they are counted below.
                if exc.details.get("seq") is None:
                    raise
        except KeyboardInterrupt:
            persisted = _persisted_after_interrupt(client, sent)
            print(f"conveyor publish: interrupted: {persisted} message(s) persisted to {args.topic}"
                  + (f", {sent - persisted} sent but not confirmed (they may or may not be on disk)"
                     if persisted < sent else ""), file=sys.stderr)
            return EXIT_INTERRUPTED
        refused = client.statistics().publishes_refused
        unrouted = client.statistics().publish_warnings
    if refused:  # each was logged with the server's reason (not JSON on a json topic...)
        print(f"conveyor publish: {sent - refused} message(s) published to {args.topic}, {refused} refused by the "
              "server (reasons above)", file=sys.stderr)
        return EXIT_FAILURE
    # A topic that is not recorded and has no subscriber: the server's warning (logged
    # once, above) says so; the publish itself succeeded, as pub/sub needs no declaration.
    note = f" ({unrouted} reached no one, as said above)" if unrouted else ""
    print(f"published {sent} message(s) to {args.topic}{note}", file=sys.stderr)
    return EXIT_OK


def _read_file(path: str) -> str:
    """The text of ``--file``: one that cannot be read is bad usage (exit 2)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise errors.ClientError(f"--file {path!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise errors.ClientError(f"--file {path!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _json_messages(args: argparse.Namespace) -> list[str]:
    """``publish --json``: the whole input (DATA, --file or stdin) is one JSON document,
    pretty-printed or not; an array is one message per element, anything else one
    message. Each message goes out compact, on one line. Input that is not JSON is
    refused before anything is sent, with the line and column."""
    import json

    if args.data is not None:
        text, source = args.data, "DATA"
    elif args.file:
        text, source = _read_file(args.file), args.file
    else:
        text, source = sys.stdin.read(), "stdin"
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise errors.ClientError(f"{source} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
                                 "nothing was published") from None
    items = document if isinstance(document, list) else [document]
    return [json.dumps(item, ensure_ascii=False, separators=(",", ":")) for item in items]


def _persisted_after_interrupt(client, sent: int) -> int:
    """How many of the ``sent`` publishes the server confirmed persisted: the client
    keeps every unconfirmed publish in its store until then."""
    try:
        client.wait_persisted(timeout=INTERRUPTED_PERSIST_WAIT_S)
    except (KeyboardInterrupt, errors.ConveyorError):
        pass  # a second Ctrl-C, a timeout or a lost connection: count what is confirmed
    stats = client.statistics()
    return sent - stats.unpersisted - stats.publishes_refused


#: How often ``subscribe`` looks at its Ctrl-C flag while no message comes.
INTERRUPT_POLL_S = 0.2


def cmd_subscribe(args: argparse.Namespace) -> int:
    """Ctrl-C stops at once, sends the acknowledgements made so far, exit code 130."""
    count = 0
    ack_ignored = False
    guard = _InterruptGuard()
    with guard, _client(args) as client:
        sub = client.subscribe(args.topic, filter=args.filter, bookmark=args.bookmark, max_backlog=args.max_backlog)
        deadline = None if args.timeout is None else time.monotonic() + args.timeout
        while (args.count is None or count < args.count) and not guard.interrupted:
            wait = INTERRUPT_POLL_S if deadline is None else min(INTERRUPT_POLL_S, max(0.0, deadline - time.monotonic()))
            msg = sub.get(timeout=wait)
            if msg is None:
                if sub.error is not None:
                    raise sub.error  # the subscription ended: an administrator's disconnect, a failure
                if sub.ended or (deadline is not None and time.monotonic() >= deadline):
                    break
                continue
            count += 1
            line = msg.data.decode(errors="replace")
            # a message printed is a message acknowledged: Ctrl-C is only looked at between messages
            print(f"{msg.bookmark}\t{line}" if args.show_bookmarks else line, flush=True)
            if args.ack and msg.is_queue_message:
                msg.ack()
            elif args.ack and not ack_ignored:
                ack_ignored = True
                why = "a replay (--bookmark) has no queue semantics" if args.bookmark is not None \
                    else f"{args.topic!r} is a topic, not a queue"
                print(f"conveyor subscribe: --ack has no effect: {why}, so its messages take no "
                      "acknowledgement", file=sys.stderr, flush=True)
        client.flush()
    return EXIT_INTERRUPTED if guard.interrupted else EXIT_OK


class _InterruptGuard:
    """While installed (``with guard:``), a Ctrl-C sets :attr:`interrupted`, which
    ``subscribe`` reads between messages, instead of raising KeyboardInterrupt wherever
    the main thread happens to be: raised inside the client library (a lock, a command
    waiting for its reply) it could leave the client unable to flush its
    acknowledgements. A second Ctrl-C raises at once (the user insists). Where SIGINT
    is not Python's default (ignored, as under nohup), nothing changes."""

    def __init__(self) -> None:
        self.interrupted = False
        self._previous = None

    def __enter__(self) -> "_InterruptGuard":
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _on_sigint(self, signum, frame) -> None:
        if self.interrupted:
            raise KeyboardInterrupt
        self.interrupted = True


def cmd_sow(args: argparse.Namespace) -> int:
    with _client(args) as client:
        for msg in client.sow(args.topic, filter=args.filter, top_n=args.top_n):
            line = msg.data.decode(errors="replace")
            print(f"{msg.bookmark}\t{line}" if args.show_bookmarks else line)
    return EXIT_OK


def cmd_ack(args: argparse.Namespace) -> int:
    if not args.bookmark and not args.filter:
        print("conveyor ack: give bookmarks or --filter", file=sys.stderr)
        return EXIT_USAGE
    with _client(args) as client:
        try:
            removed = client.sow_delete(args.queue, bookmarks=args.bookmark or None, filter=args.filter,
                                        options=args.option)
        except errors.UnknownTopic:  # the server's message names the protocol command
            raise errors.ClientError(f"{args.queue!r} is not a queue: ack settles the messages of a queue "
                                     "(`conveyor queues` lists them)") from None
    print(f"{removed} message(s) acknowledged", file=sys.stderr)
    return EXIT_OK


# --- users ------------------------------------------------------------------------------------


def _users_file(args: argparse.Namespace):
    from conveyor.security.users import UsersFile

    if args.file:
        return UsersFile(args.file)
    from conveyor.config import load_file

    config = load_file(args.config)
    if config.authentication is None or config.authentication.users_file is None:
        raise errors.ClientError(f"{args.config} has no Authentication/UsersFile: give the file with --file")
    return UsersFile(config.authentication.users_file)


def _read_password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
    else:
        import getpass

        if not sys.stdin.isatty():
            raise errors.ClientError("no terminal to ask for the password: use --password-stdin")
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            raise errors.ClientError("the two passwords differ; nothing was changed")
    if not password:
        raise errors.ClientError("a password cannot be empty; nothing was changed")
    return password


def cmd_users_add(args: argparse.Namespace) -> int:
    users = _users_file(args)
    from conveyor.security.users import check_name

    check_name(args.name)
    new = users.add(args.name, _read_password(args), replace=args.replace)
    print(f"user {args.name} {'added to' if new else 'given a new password in'} {users.path}", file=sys.stderr)
    return EXIT_OK


def cmd_users_remove(args: argparse.Namespace) -> int:
    users = _users_file(args)
    users.remove(args.name)
    print(f"user {args.name} removed from {users.path}", file=sys.stderr)
    return EXIT_OK


def cmd_users_list(args: argparse.Namespace) -> int:
    for name in sorted(_users_file(args).read()):
        print(name)
    return EXIT_OK


# --- journal tools -------------------------------------------------------------------------


def cmd_journal_verify(args: argparse.Namespace) -> int:
    from conveyor.journal import verify

    report = verify(args.directory)
    print(report)
    return EXIT_OK if not getattr(report, "problems", None) else EXIT_JOURNAL


def cmd_journal_repair(args: argparse.Namespace) -> int:
    """Without --apply: say what repair would drop, change nothing, exit 3 if there is
    anything to repair. With --apply: do it (the same plan, under the journal's lock)."""
    from conveyor.journal import repair

    report = repair(args.directory, logger=logging.getLogger("conveyor.journal"), apply=args.apply)
    print(report)
    if report.problem is not None and not report.applied:
        return EXIT_JOURNAL
    return EXIT_OK


def cmd_journal_dump(args: argparse.Namespace) -> int:
    import msgspec

    from conveyor import records
    from conveyor.journal import dump

    enc = msgspec.json.Encoder()
    for position, payload in dump(args.directory, start=args.start):
        rec = records.decode(payload)
        fields = msgspec.structs.asdict(rec)
        if isinstance(rec, records.PublishRec):
            try:
                fields["data"] = msgspec.json.decode(rec.data)
            except msgspec.DecodeError:
                fields["data"] = rec.data.decode(errors="replace")
        line = {"position": position, "type": type(rec).__name__.removesuffix("Rec").lower(), **fields}
        sys.stdout.write(enc.encode(line).decode() + "\n")
    return EXIT_OK


# --- parser --------------------------------------------------------------------------------


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("conveyor")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``, looked up only when asked for: importlib.metadata costs every
    command (``serve`` too, whose start-up it delays) some 30 ms otherwise."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show program's version number and exit", **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from conveyor import native

        parser._print_message(f"conveyor {_version()}, {native.describe()}\n", sys.stdout)
        parser.exit()


def _port(text: str) -> int:
    """A TCP port for argparse: 0..65535 (0: any free port)."""
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0..65535; 0 picks a free one)")
    return int(text)


class _IntermixedParser(argparse.ArgumentParser):
    """A command's parser: its options may come before, between or after its
    positionals (``publish Work --json '{...}'``, ``publish Work --server URI DATA``),
    by argparse's intermixed parsing, and arguments it does not know are refused under
    its own usage. A parser of subcommands parses as usual (intermixed parsing cannot)."""

    _parsing_intermixed = False

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        if self._parsing_intermixed or any(a.nargs in (argparse.PARSER, argparse.REMAINDER)
                                           for a in self._actions if not a.option_strings):
            return super().parse_known_args(args, namespace)
        self._parsing_intermixed = True
        try:
            namespace, extras = self.parse_known_intermixed_args(args, namespace)
        finally:
            self._parsing_intermixed = False
        if extras:
            self.error("unrecognized arguments: " + " ".join(extras))
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="conveyor", description="conveyor: durable message queues over a transaction log")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_IntermixedParser)

    p = sub.add_parser("serve", help="run the server (embedded default configuration unless --config)")
    p.add_argument("--config", "-c", help="XML configuration file (AMPSConfig)")
    p.add_argument("--port", type=_port, help="override the first transport's port (0: any free port)")
    p.add_argument("--journal", help="override the journal directory")
    p.add_argument("--admin-port", type=_port, metavar="N",
                   help="override the admin interface's port (0: any free port); adds one on 127.0.0.1 if none")
    p.add_argument("--no-admin", action="store_true", help="do not start the admin interface")
    p.add_argument("--no-clients-until-replicated", action="store_true",
                   help="refuse client logons (retryably) until the sync replication peers have caught this instance "
                        "up after its start, or Replication/RecoveryCatchUpTimeout passes")
    p.set_defaults(func=cmd_serve)

    _client_commands(sub)
    _users_commands(sub)
    _journal_commands(sub)
    from conveyor.cli import config_cmd, dead_letters, ops, spark_cmd

    ops.add_parsers(sub)
    dead_letters.add_parsers(sub)
    config_cmd.add_parsers(sub)
    spark_cmd.add_parsers(sub)
    return parser


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--server", "-s", default=os.environ.get(SERVER_ENV) or DEFAULT_URI,
                   help=f"server URI (default ${SERVER_ENV}, else {DEFAULT_URI}); tcps://HOST:PORT for TLS")
    p.add_argument("--name", help="client name (default: generated)")
    p.add_argument("--user", help="user name to log on with (the password comes from the URI or "
                                  "the CONVEYOR_PASSWORD environment variable)")
    p.add_argument("--ca-file", help="CA certificates (PEM) that sign the server's certificate, for tcps://")


def _client_commands(sub: Any) -> None:
    """publish, subscribe, sow, ack: the commands that talk to a server as a client."""
    p = sub.add_parser("publish", help="publish messages (one per line from DATA, --file or stdin)")
    p.add_argument("topic")
    p.add_argument("data", nargs="?", help="message body (default: read lines from stdin)")
    p.add_argument("--file", "-f", help="read messages from this file, one per line")
    p.add_argument("--json", action="store_true",
                   help="read the whole input as one JSON document (pretty-printed or not): an array is one "
                        "message per element, anything else one message")
    _client_args(p)
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser("subscribe", help="print messages of a topic or queue")
    p.add_argument("topic")
    p.add_argument("--filter", help="content filter")
    p.add_argument("--bookmark", help="replay from: 0 (beginning), a bookmark, a timestamp, NOW")
    p.add_argument("--max-backlog", type=int, help="queue backlog (messages held unacknowledged)")
    p.add_argument("--count", "-n", type=int, help="stop after this many messages")
    p.add_argument("--timeout", type=float, help="stop after this many seconds without a message")
    p.add_argument("--ack", action="store_true", help="acknowledge queue messages once printed")
    p.add_argument("--show-bookmarks", action="store_true", help="print each message's bookmark before it")
    _client_args(p)
    p.set_defaults(func=cmd_subscribe)

    p = sub.add_parser("sow", help="query a queue: the messages currently available")
    p.add_argument("topic")
    p.add_argument("--filter")
    p.add_argument("--top-n", type=int)
    p.add_argument("--show-bookmarks", action="store_true")
    _client_args(p)
    p.set_defaults(func=cmd_sow)

    p = sub.add_parser("ack", help="acknowledge queue messages by bookmark or filter")
    p.add_argument("queue")
    p.add_argument("bookmark", nargs="*")
    p.add_argument("--filter")
    p.add_argument("--option", choices=["cancel", "expire"])
    _client_args(p)
    p.set_defaults(func=cmd_ack)


def _users_commands(sub: Any) -> None:
    p = sub.add_parser("users", help="manage a users file (Authentication/UsersFile)")
    usub = p.add_subparsers(dest="users_command", required=True)

    def users_file(p: argparse.ArgumentParser) -> None:
        where = p.add_mutually_exclusive_group(required=True)
        where.add_argument("--file", "-f", help="the users file")
        where.add_argument("--config", "-c", help="the server configuration whose Authentication/UsersFile to use")

    u = usub.add_parser("add", help="add a user (the password is asked for, never echoed, or read from stdin)")
    u.add_argument("name")
    users_file(u)
    u.add_argument("--password-stdin", action="store_true", help="read the password from the first line of stdin")
    u.add_argument("--replace", action="store_true", help="set a new password for an existing user")
    u.set_defaults(func=cmd_users_add)
    u = usub.add_parser("remove", help="remove a user")
    u.add_argument("name")
    users_file(u)
    u.set_defaults(func=cmd_users_remove)
    u = usub.add_parser("list", help="list the users (names only)")
    users_file(u)
    u.set_defaults(func=cmd_users_list)


def _journal_commands(sub: Any) -> None:
    p = sub.add_parser("journal", help="transaction log tools")
    jsub = p.add_subparsers(dest="journal_command", required=True)
    j = jsub.add_parser("verify", help="check every record (read-only, safe beside a running server); exit 3 on damage")
    j.add_argument("directory")
    j.set_defaults(func=cmd_journal_verify)
    j = jsub.add_parser(
        "repair",
        help="say what truncating the log at its first damaged record would drop; --apply does it",
    )
    j.add_argument("directory")
    j.add_argument("--apply", action="store_true", help="truncate and remove what the plan names (default: only show it)")
    j.set_defaults(func=cmd_journal_repair)
    j = jsub.add_parser("dump", help="print records as JSON lines")
    j.add_argument("directory")
    j.add_argument("--start", type=int, help="first position")
    j.set_defaults(func=cmd_journal_dump)


_FILTER_KEYWORDS = frozenset({"and", "or", "not", "in", "like", "between", "is", "null", "true", "false"})


def _filter_error(text: str | None, exc: errors.ConveyorError) -> str:
    """A filter the server refused: say that the filter is the problem, and, when the
    mistake is at a bare word or a dot (``qty > 5``, ``order.qty > 5``), that field
    paths start with ``/``."""
    if text is None:
        return f"the filter was refused: {exc}"
    message = f"the filter {text!r} is not valid: {exc}"
    position = exc.details.get("position")
    token = str(exc.details.get("token") or "")
    bare = re.compile(r"(?<![/\w'\"])[A-Za-z_]\w*(?!\s*\()")
    at_word = isinstance(position, int) and any(
        m.start() <= position <= m.end() and m.group().lower() not in _FILTER_KEYWORDS for m in bare.finditer(text))
    if at_word or token == "." or "/" not in text:
        message += " (field paths start with /, as in /order/qty > 5)"
    return message


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose, args.command)
    try:
        return args.func(args)
    except errors.ConfigError as exc:
        print(f"conveyor: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except errors.JournalCorrupt as exc:
        print(f"conveyor: {exc}", file=sys.stderr)
        return EXIT_JOURNAL
    except errors.DisconnectedByAdmin as exc:
        print(f"conveyor: {exc}", file=sys.stderr)
        return EXIT_DISCONNECTED
    except errors.BadFilter as exc:
        print(f"conveyor: {_filter_error(getattr(args, 'filter', None), exc)}", file=sys.stderr)
        return EXIT_USAGE
    except errors.ClientError as exc:
        print(f"conveyor: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except errors.ConveyorError as exc:
        print(f"conveyor: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        print("conveyor: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as exc:  # a file that cannot be read, a port that cannot be used...
        where = f" {exc.filename!r}" if exc.filename else ""
        print(f"conveyor: {exc.strerror or exc}{':' + where if where else ''}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
