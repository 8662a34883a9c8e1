"""Errors that reach users: each carries a location and prints as one line."""
from __future__ import annotations


class DsparkError(Exception):
    """Base of every user-facing error. `location` is `file:line:col`, `node NAME`, or empty."""

    def __init__(self, message: str, location: str = ""):
        super().__init__(message)
        self.message = message
        self.location = location

    def __str__(self) -> str:
        if not self.location:
            return self.message
        return f"{self.location}: {self.message}"

    def at(self, location: str) -> "DsparkError":
        """Return a copy of this error placed at `location` (keeps an existing, more precise one)."""
        if self.location:
            return self
        return type(self)(self.message, location)


class ParseError(DsparkError):
    """Malformed .dsir text, a dim expression or a pipeline string."""


class ShapeError(DsparkError):
    """An op's shape or dtype rule rejected its operands or attributes."""


class DimError(DsparkError, ValueError):
    """A dim expression divides by zero or by a negative number (when built, or when its symbols are bound)."""


class VerifyError(DsparkError):
    """A graph broke an IR invariant."""


class ConfigError(DsparkError):
    """An impossible model configuration or layer parameter."""


def did_you_mean(name: str, candidates) -> str:
    """' (did you mean 'x'?)' when a close candidate exists, else ''."""
    import difflib

    if len(name) > 100:          # difflib is quadratic in the name: no suggestion for a long one
        return ""
    close = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
