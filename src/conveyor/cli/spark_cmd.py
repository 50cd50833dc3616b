"""``conveyor spark prepare|restore|status``: the zips Spark puts on its Python path
(:mod:`conveyor.spark.prepare`, docs/spark.md "Preparing Spark's Python")."""

from __future__ import annotations

import argparse
import sys


def cmd_spark(args: argparse.Namespace) -> int:
    from conveyor.spark import prepare as p

    home = p.spark_home(args.spark_home)  # ConfigError: main() prints it, exit 2
    found = p.zips(home)
    if not found:
        print(f"conveyor: {home}/python/lib has no zip to prepare", file=sys.stderr)
        return 2
    for path in found:
        try:
            if args.spark_command == "prepare":
                print(p.prepare(path))
            elif args.spark_command == "restore":
                print(p.restore(path))
            else:
                print(f"{path}: {p.status(path)}")
        except OSError as exc:  # a read-only Spark home, a full disk
            print(f"conveyor: {path}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("spark", help="prepare the Python that Spark starts (bytecode in Spark's pyspark.zip)")
    ssub = p.add_subparsers(dest="spark_command", required=True)
    for name, text in (
        ("prepare", "rebuild $SPARK_HOME/python/lib/*.zip with bytecode and without pyspark's test suites "
                    "(the original kept as *.zip.orig); run it with the Python the workers use"),
        ("restore", "put the original zips back"),
        ("status", "say whether each zip is prepared"),
    ):
        c = ssub.add_parser(name, help=text)
        c.add_argument("--spark-home", help="the Spark home (default $SPARK_HOME, else the installed pyspark)")
        c.set_defaults(func=cmd_spark)
