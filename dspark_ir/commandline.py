"""The command line that reproduces a run: the one place that writes `Reproduce:` lines.

Generated files, dump headers, reproducers and reports all say how to get them again; the CLI commands and the
pass machinery (whose reproducers rerun `dspark opt`) build those lines with `CommandLine`, so the quoting, the
order of options and the environment prefix are decided once.
"""
from __future__ import annotations

import argparse
import os
import shlex
from typing import Sequence


class CommandLine:
    """Options turned back into the command line that reproduces a run: the one place that writes the
    `Reproduce:` commands of generated files and reports. Each command adds the options that decide its
    output, in its own order; `str()` is the shell-quoted line.

        str(CommandLine("lower", "decode-swa").layer(args).option("-o", "out"))
        # 'dspark lower decode-swa --config tiny --tp 1 -o out'
    """

    def __init__(self, command: str, *words: str):
        self.words = ["dspark", command, *words]
        self.prefix: list[str] = []

    def add(self, *words: str) -> "CommandLine":
        self.words += words
        return self

    def option(self, flag: str, value: object) -> "CommandLine":
        """`flag value`, unless value is None."""
        return self if value is None else self.add(flag, str(value))

    def repeated(self, flag: str, values: Sequence[object]) -> "CommandLine":
        for value in values:
            self.option(flag, value)
        return self

    def flag(self, flag: str, on: bool) -> "CommandLine":
        return self.add(flag) if on else self

    def layer(self, args: argparse.Namespace,
              options: Sequence[str] = ("tp", "batch", "seq", "context")) -> "CommandLine":
        """The layer options (add_layer_arguments) of a layer-name target: --config always, the others when given;
        nothing for a .dsir file."""
        if args.target.endswith(".dsir"):
            return self
        self.option("--config", args.config)
        for name in options:
            self.option(f"--{name}", getattr(args, name, None))
        return self

    def environment(self, honoured: bool = True) -> "CommandLine":
        """Prefix the environment variables that change the pipeline (DSPARK_DISABLE_PASSES=a,b), when set and
        `honoured` by this command (it ran passes with the environment on)."""
        value = os.environ.get("DSPARK_DISABLE_PASSES", "").strip()
        if honoured and value:
            self.prefix = ["DSPARK_DISABLE_PASSES=" + shlex.quote(value)]     # an assignment: the value is quoted
        return self

    def __str__(self) -> str:
        return " ".join([*self.prefix, *(shlex.quote(w) for w in self.words)])
