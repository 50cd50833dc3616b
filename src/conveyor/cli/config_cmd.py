"""``conveyor config check FILE`` and ``conveyor config default``.

``check`` loads the file exactly as ``conveyor serve`` would (the same loader), runs the
same start-up validation (:func:`conveyor.config.validate`, which the server calls
before it opens the journal or builds the engine), and prints what it configures; exit 0
when valid, 2 with the element path otherwise.
``default`` prints the embedded default configuration, a starting point to edit.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources


def cmd_config_check(args: argparse.Namespace) -> int:
    from conveyor.config import load_file, validate

    config = load_file(args.file)  # ConfigError: main() prints it, exit 2
    validate(config)  # what `serve` refuses at startup, the same function
    print(f"{args.file}: valid")
    print(f"  instance    {config.name}" + (f" (group {config.group})" if config.group else ""))
    for t in config.transports:
        kind = "incoming replication" if t.type == "replication" else "clients"
        print(f"  transport   {t.name}: {t.host}:{t.port} ({kind})")
    if config.admin is not None:
        print(f"  admin       {config.admin.host}:{config.admin.port}")
    if config.transaction_log is not None:
        tlog = config.transaction_log
        print(f"  journal     {tlog.journal_directory.resolve()}, recording "
              + ", ".join(t.name for t in tlog.topics))
    for q in config.queues:
        target = f", a publish to {q.name} goes to {q.default_publish_target}" \
            if q.default_publish_target and q.default_publish_target != q.name else ""
        print(f"  queue       {q.name} ({q.kind.value}, {q.semantics.value}) over {q.underlying}{target}")
    for t in config.sow_topics:
        keys = ", ".join(t.keys) if t.keys else "the publisher's sow_key"
        print(f"  SOW topic   {t.name} ({t.message_type}), keyed by {keys}")
    for v in config.views:
        kind = "join" if v.joins else "view"
        print(f"  view        {v.name} ({v.message_type}, {kind}) over {', '.join(v.underlying)}")
    if config.replication is not None:
        for d in config.replication.destinations:
            print(f"  replicates  to {d.name} ({d.sync_type}) at {', '.join(d.addresses)}")
    return 0


def cmd_config_default(args: argparse.Namespace) -> int:
    sys.stdout.write(resources.files("conveyor.config").joinpath("default.xml").read_text())
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="check a configuration file, or print the embedded default")
    csub = p.add_subparsers(dest="config_command", required=True)
    c = csub.add_parser("check", help="validate FILE as `conveyor serve` would; exit 2 with the element path")
    c.add_argument("file")
    c.set_defaults(func=cmd_config_check)
    c = csub.add_parser("default", help="print the embedded default configuration (XML)")
    c.set_defaults(func=cmd_config_default)
