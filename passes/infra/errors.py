"""Errors of the pass machinery. All are DsparkErrors: the CLI prints them as one line (exit 2 for bad input,
3 for a pass that crashed, 4 for a broken contract: dspark_cli/main.py)."""
from __future__ import annotations

from dspark_ir.errors import DsparkError, ParseError


class PipelineError(ParseError):
    """A bad pipeline string, an unknown pass, a bad option or a bad toggle."""


class PassError(DsparkError):
    """A pass failed: it crashed, produced an invalid graph, broke its numeric contract or a requirement.

    `kind` is one of: crash, error, invalid-graph, roundtrip, contract, guarantee, requirement, signature.
    `rerun` is the command that reproduces it (set once a reproducer is written).
    """

    def __init__(self, message: str, location: str = "", *, kind: str = "error", pass_name: str = "",
                 index: int = 0):
        super().__init__(message, location)
        self.kind = kind
        self.pass_name = pass_name
        self.index = index
        self.rerun = ""
        self.reproducer = ""
