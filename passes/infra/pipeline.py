"""Pipeline strings: `canonicalize,topk-bypass,split-m-fanout{ways=4},deterministic-split-k`.

Grammar (whitespace is allowed between tokens):

    pipeline := [entry ("," entry)*]
    entry    := NAME ["{" [option ("," option)*] "}"]
    option   := KEY "=" value
    value    := "[" [value ("," value)*] "]" | '"' chars '"' | bare
    bare     := one or more characters other than , { } [ ] = " and whitespace

Errors are located `pipeline:1:COL` (or the source given, e.g. `--enable`, `DSPARK_DISABLE_PASSES`).
`format_pipeline` prints each pass with its non-default options in field order, so
parse → print → parse gives equal passes and print → parse → print the same text.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from dspark_ir.errors import DsparkError, did_you_mean

from .errors import PipelineError
from .options import Raw, coerce, format_value, option_specs
from .registry import get_pass

if TYPE_CHECKING:
    from .base import Pass

KEY_VERSION = "dspark-pipeline/1"
_STOP = set(',{}[]="') | set(" \t\r\n")


@dataclass(frozen=True)
class Entry:
    """A parsed pipeline entry before typing: name, raw options, and where it was written."""

    name: str
    options: tuple[tuple[str, Raw], ...]
    col: int
    key_cols: tuple[int, ...] = ()


@dataclass(frozen=True)
class Pipeline:
    """An ordered tuple of configured passes."""

    passes: tuple["Pass", ...] = ()

    def __str__(self) -> str:
        return ",".join(format_pass(p) for p in self.passes)

    def __iter__(self) -> Iterator["Pass"]:
        return iter(self.passes)

    def __len__(self) -> int:
        return len(self.passes)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Pipeline(self.passes[i])
        return self.passes[i]

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.passes]

    @property
    def key(self) -> str:
        """Cache key of the pipeline: its text plus each pass's version (16 hex digits)."""
        versions = ",".join(f"{p.name}@{p.version}" for p in self.passes)
        text = f"{KEY_VERSION}\n{self}\n{versions}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def format_pass(p: "Pass") -> str:
    specs = option_specs(type(p))
    shown = [f"{k}={format_value(s, getattr(p, k))}" for k, s in specs.items()
             if not _same(getattr(p, k), s.default)]
    return p.name + ("{" + ",".join(shown) + "}" if shown else "")


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def parse_pipeline(text: str, source: str = "pipeline") -> Pipeline:
    return Pipeline(tuple(build(e, source) for e in parse_entries(text, source)))


def build(entry: Entry, source: str) -> "Pass":
    """Type the raw options of an entry and construct the pass."""
    try:
        cls = get_pass(entry.name)
    except DsparkError as e:
        raise e.at(f"{source}:1:{entry.col}") from None
    specs = option_specs(cls)
    kwargs = {}
    for (key, raw), col in zip(entry.options, entry.key_cols or [entry.col] * len(entry.options)):
        kwargs[key] = typed_option(cls, specs, key, raw, f"{source}:1:{col}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise PipelineError(f"bad options for '{entry.name}': {e}", f"{source}:1:{entry.col}") from None


def typed_option(cls: type, specs: Mapping[str, Any], key: str, value: Any, where: str) -> Any:
    if key not in specs:
        hint = did_you_mean(key, specs) or (f" (options: {', '.join(specs)})" if specs else " (it has no options)")
        raise PipelineError(f"pass '{cls.name}' has no option '{key}'{hint}", where)
    try:
        return coerce(specs[key], value)
    except ValueError as e:
        raise PipelineError(f"{cls.name}: {e}", where) from None


# ---- the scanner --------------------------------------------------------------------------------
class _Scanner:
    def __init__(self, text: str, source: str):
        self.text, self.source, self.i = text, source, 0

    def error(self, message: str, i: int | None = None) -> PipelineError:
        return PipelineError(message, f"{self.source}:1:{(self.i if i is None else i) + 1}")

    def ws(self) -> None:
        while self.i < len(self.text) and self.text[self.i].isspace():
            self.i += 1

    def peek(self) -> str:
        self.ws()
        return self.text[self.i] if self.i < len(self.text) else ""

    def expect(self, ch: str, what: str) -> None:
        got = self.peek()
        if got != ch:
            raise self.error(f"expected {what}, got {_show(got)}")
        self.i += 1

    def word(self, what: str) -> tuple[str, int]:
        self.ws()
        start = self.i
        while self.i < len(self.text) and self.text[self.i] not in _STOP:
            self.i += 1
        if self.i == start:
            raise self.error(f"expected {what}, got {_show(self.peek())}")
        return self.text[start:self.i], start + 1

    def entries(self) -> list[Entry]:
        if not self.peek():
            return []
        out = [self.entry()]
        while self.peek():
            self.expect(",", "',' or the end of the pipeline")
            out.append(self.entry())
        return out

    def entry(self) -> Entry:
        name, col = self.word("a pass name")
        if self.peek() != "{":
            return Entry(name, (), col)
        self.i += 1
        options: list[tuple[str, Raw]] = []
        cols: list[int] = []
        if self.peek() != "}":
            while True:
                key, key_col = self.word("an option name")
                if any(k == key for k, _ in options):
                    raise self.error(f"option '{key}' given twice", key_col - 1)
                self.expect("=", f"'=' after '{key}'")
                options.append((key, self.value()))
                cols.append(key_col)
                if self.peek() != ",":
                    break
                self.i += 1
        self.expect("}", "',' or '}'")
        return Entry(name, tuple(options), col, tuple(cols))

    def value(self) -> Raw:
        ch = self.peek()
        col = self.i + 1
        if ch == "[":
            self.i += 1
            items: list[Raw] = []
            if self.peek() != "]":
                items.append(self.value())
                while self.peek() == ",":
                    self.i += 1
                    items.append(self.value())
            self.expect("]", "',' or ']'")
            return Raw(items=tuple(items), col=col)
        if ch == '"':
            return self.string(col)
        text, _ = self.word("a value")
        return Raw(text, col=col)

    def string(self, col: int) -> Raw:
        self.i += 1
        out = []
        while self.i < len(self.text) and self.text[self.i] != '"':
            if self.text[self.i] == "\\" and self.i + 1 < len(self.text):
                self.i += 1
            out.append(self.text[self.i])
            self.i += 1
        if self.i >= len(self.text):
            raise self.error("unterminated string", col - 1)
        self.i += 1
        return Raw("".join(out), quoted=True, col=col)


def _show(ch: str) -> str:
    return f"'{ch}'" if ch else "end of input"


def parse_entries(text: str, source: str = "pipeline") -> list[Entry]:
    return _Scanner(text, source).entries()


def parse_value_text(text: str, source: str = "option") -> Raw:
    """One option value written as text (a command-line `--pass-option` value)."""
    s = _Scanner(text, source)
    raw = s.value()
    if s.peek():
        raise s.error(f"unexpected {_show(s.peek())} after the value")
    return raw
