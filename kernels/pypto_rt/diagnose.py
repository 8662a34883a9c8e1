"""Turn what a failing pypto call left behind into one line that names the real cause.

pypto's exceptions are often not the cause:

* ``... tile shape not set`` is what a failed *recording* leaves behind; the cause is in
  the earlier ``logging.error`` line ``Record function <k> failed: <cause>``.
* ``Run pass failed.`` names no pass; the cause (e.g. a UB overflow) is only in the plog,
  ``$ASCEND_PROCESS_LOG_PATH/debug/plog/pypto-log-<pid>_*.log``.
"""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NOISE = (
    re.compile(r"\S+\.so[.0-9]*\("),  # C++ backtrace frames
    re.compile(r"\+0x[0-9a-f]+\)"),
    re.compile(r"^\s*\d+\s*\|"),  # rendered source excerpt
    re.compile(r"^\s*\^+\s*$"),
)
_LOCATION = re.compile(r",\s*func \S+, file \S+, line \d+")
_PLOG_PREFIX = re.compile(r"^\[ERROR\]\s*\S+\(\d+\):\S+ \S+ (?:\[[^\]]*\]:?)+")
_PLOG_HARMLESS = ("F7A001", "cmd error: python3", "swim_lane")
_RECORD = "Record function "
_UNPREFIXED = ("RenderedParserError", "JobError")  # their text says enough


def _lines(text: str) -> list[str]:
    out = []
    for line in _ANSI.sub("", text).splitlines():
        line = line.strip()
        if line and not any(p.search(line) for p in _NOISE):
            out.append(line)
    return out


def one_line(text: str, max_lines: int = 2, limit: int = 400) -> str:
    """The first meaningful lines of a pypto message, joined, without backtraces or locations."""
    joined = " ".join(_lines(text)[:max_lines])
    joined = _LOCATION.sub("", joined).strip()
    return joined if len(joined) <= limit else joined[: limit - 3] + "..."


def plog_cause(plog_text: str) -> str | None:
    """The most telling ERROR line of a plog excerpt (a UB overflow first), without its prefix."""
    errors = []
    for line in plog_text.splitlines():
        if not line.startswith("[ERROR]") or any(h in line for h in _PLOG_HARMLESS):
            continue
        errors.append(_PLOG_PREFIX.sub("", line).strip())
    for line in errors:
        if "exceeds" in line:
            return line
    return errors[0] if errors else None


def cause(exc_type: str, exc_text: str, log_errors: list[str], plog_text: str) -> str:
    """One line naming the real cause of a failed kernel call."""
    if "Run pass failed" in exc_text:
        found = plog_cause(plog_text)
        if found:
            return f"Run pass failed: {found}"
    records = [line for line in log_errors if line.startswith(_RECORD)]
    if records:
        return one_line(records[-1])
    summary = one_line(exc_text)
    if not summary:
        return plog_cause(plog_text) or exc_type or "unknown failure"
    if exc_type and exc_type not in _UNPREFIXED and not summary.startswith(exc_type):
        summary = f"{exc_type}: {summary}"
    return summary
