"""Entry point: dispatch to one module per subcommand; turn errors into one line and exit code 2.

Start-up stays cheap (benchmarks/cli_startup.py): a command module imports only the standard library and
dspark_cli.common at its top, everything else inside its functions, and only the chosen command's arguments are
declared (`add_arguments`)."""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from typing import Sequence

from dspark_ir import __version__
from dspark_ir.errors import DsparkError

from . import commands

ALL = "*"


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `dspark <cmd>: error: ...`, exit 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(only: str = ALL) -> argparse.ArgumentParser:
    """The parser; every subcommand's arguments, or only those of the subcommand `only` names."""
    parser = _Parser(prog="dspark", description="Compile DSpark decode layers: IR, passes, lowering to pypto.")
    parser.add_argument("--version", action="version", version=f"dspark {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.__doc__)
        if only in (ALL, module.NAME):
            module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(next((a for a in argv if not a.startswith("-")), ""))
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except DsparkError as e:
        print(f"dspark: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dspark: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # an internal bug: one line unless DSPARK_DEBUG asks for the traceback
        if os.environ.get("DSPARK_DEBUG"):
            raise
        print(f"dspark: internal error: {type(e).__name__}: {e} (set DSPARK_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
