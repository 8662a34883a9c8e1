"""The one error type of the pypto harness."""

from __future__ import annotations


class PyptoError(RuntimeError):
    """A pypto harness failure, worded as one line.

    ``str(err)`` is a single line fit for a CLI. Everything else that was captured
    (traceback, worker stdout/stderr, plog excerpts, build logs) is in ``err.log``.
    """

    def __init__(self, message: str, log: str = ""):
        one_line = " ".join(str(message).split())
        super().__init__(one_line)
        self.log = log
