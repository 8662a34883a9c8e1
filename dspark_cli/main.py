"""Entry point: dispatch to one module per subcommand; turn errors into one line and an exit code.

Exit codes (README, "Exit codes"): 0 success; 1 a check of the result failed (outputs vs. the golden, a pypto
kernel check, a fuzz crash, a failed sweep point); 2 bad input (usage, a file or pipeline that does not parse or
verify, an out-of-range option); 3 an internal error (a bug: an uncaught exception, or a pass that crashed);
4 a pass broke a contract (its numeric contract, the verifier, a guaranteed property, the round trip or the
graph's signature); 130 interrupted. `--debug` anywhere on the line (or DSPARK_DEBUG=1) adds the traceback.

Start-up stays cheap (benchmarks/cli_startup.py): a command module imports only the standard library and
dspark_cli.common at its top, everything else inside its functions, and only the chosen command's arguments are
declared (`add_arguments`).
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import traceback
from typing import Sequence

from dspark_ir import __version__
from dspark_ir.errors import DsparkError

from . import commands

ALL = "*"
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3
EXIT_CONTRACT = 4
EXIT_INTERRUPTED = 130
DEBUG_FLAG = "--debug"


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `dspark <cmd>: error: ...`, exit 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(only: str = ALL) -> argparse.ArgumentParser:
    """The parser; every subcommand's arguments, or only those of the subcommand `only` names."""
    parser = _Parser(prog="dspark", description="Compile DSpark decode layers: IR, passes, lowering to pypto.")
    parser.add_argument("--version", action="version", version=f"dspark {__version__}")
    parser.add_argument(DEBUG_FLAG, action="store_true",
                        help="print the traceback of an internal error or a crashing pass (anywhere on the line; "
                             "also DSPARK_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.__doc__)
        if only in (ALL, module.NAME):
            module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in argv or os.environ.get("DSPARK_DEBUG", "").strip() not in ("", "0")
    argv = [a for a in argv if a != DEBUG_FLAG]
    parser = build_parser(next((a for a in argv if not a.startswith("-")), ""))
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return int(args.run(args) or 0)
    except DsparkError as e:
        code = exit_code(e)
        hint = " (--debug for the traceback)" if code == EXIT_INTERNAL and not debug else ""
        print(f"dspark: {e}{hint}", file=sys.stderr)
        if debug:
            traceback.print_exception(e, file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print("dspark: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except Exception as e:  # an internal bug: one line unless --debug asks for the traceback
        print(f"dspark: internal error: {type(e).__name__}: {e}{'' if debug else ' (--debug for the traceback)'}",
              file=sys.stderr)
        if debug:
            traceback.print_exception(e, file=sys.stderr)
        return EXIT_INTERNAL


def exit_code(e: DsparkError) -> int:
    """A pass that crashed is an internal error (3); one that broke a check is a broken contract (4); any other
    DsparkError is bad input (2)."""
    from passes.infra.errors import PassError  # only on an error: `dspark --help` does not import the passes

    if not isinstance(e, PassError):
        return EXIT_BAD_INPUT
    return EXIT_INTERNAL if e.kind == "crash" else EXIT_CONTRACT


if __name__ == "__main__":
    sys.exit(main())
