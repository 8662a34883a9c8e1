"""Describe a pass (origin, contract, options with type, default and range, then its docstring) or a command.

    dspark help split-m-fanout
    dspark help opt              # the same as `dspark opt --help`
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil

from dspark_ir.errors import did_you_mean

from ..common import UsageError

NAME = "help"
HELP = "describe a pass (options, defaults, ranges, contract, origin) or a command"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic", metavar="PASS|COMMAND", help="a pass name (dspark list passes) or a command name")


def command_names() -> list[str]:
    from .. import commands

    return sorted(importlib.import_module(f"{commands.__name__}.{m.name}").NAME
                  for m in pkgutil.iter_modules(commands.__path__))


def run(args: argparse.Namespace) -> int:
    import passes

    from ..main import build_parser

    if args.topic in passes.registered_names():
        doc = inspect.cleandoc(passes.get_pass(args.topic).__doc__ or "")
        body = doc.split("\n", 1)[1].strip() if "\n" in doc else ""
        print(passes.describe(args.topic) + ("\n\n" + body if body else ""))
        return 0
    commands = command_names()
    if args.topic in commands:
        try:
            build_parser().parse_args([args.topic, "--help"])
        except SystemExit as e:
            return int(e.code or 0)
    raise UsageError(f"no pass or command named '{args.topic}'"
                     f"{did_you_mean(args.topic, [*passes.registered_names(), *commands])}", "help")
