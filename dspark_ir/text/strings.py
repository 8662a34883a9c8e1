"""The string syntax of .dsir attribute values, shared by the printer, the lark grammar and its fast path.

A string is `"..."` on one line. Inside it `\\"`, `\\\\`, `\\n`, `\\r`, `\\t`, `\\xHH`, `\\uHHHH` and `\\UHHHHHHHH`
are the only escapes; raw control characters (U+0000-U+001F, U+007F) are not allowed. The lexer takes any
`"..."` without a line break (TOKEN); `unquote` then checks the escapes and control characters and says where a
bad one is. `quote` writes every character that is not printable as an escape, so printed text always reads back.
"""
from __future__ import annotations

import re

# The lexer's string token: linear (possessive runs, no backtracking); the same text is in dsir.lark (a test checks).
TOKEN = r'"[^"\\\n]*+(?:\\[^\n][^"\\\n]*+)*+"'
ESCAPES_HELP = '\\" \\\\ \\n \\r \\t \\xHH \\uHHHH or \\UHHHHHHHH'

_NAMED = {'"': '"', "\\": "\\", "n": "\n", "r": "\r", "t": "\t"}
_NAMES = {v: "\\" + k for k, v in _NAMED.items()}
_SPECIAL = re.compile(r"[\\\x00-\x1f\x7f]")
_ESCAPE = re.compile(r'\\(?:(["\\nrt])|x([0-9a-fA-F]{2})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8}))')
# Stops at the first bad character. No capturing group inside the possessive run (Python 3.11's re mishandles it).
_VALID = re.compile(r'(?:[^\\\x00-\x1f\x7f]++|\\(?:["\\nrt]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}))*+')


class StringError(ValueError):
    """A bad escape or a raw control character; `offset` is its position in the token (the quote is 0)."""

    def __init__(self, message: str, offset: int):
        super().__init__(message)
        self.offset = offset


def unquote(token: str) -> str:
    """The value of a string token (quotes included), or StringError."""
    body = token[1:-1]
    if _SPECIAL.search(body) is None:
        return body
    i = _VALID.match(body).end()
    if i < len(body):
        if body[i] != "\\":
            raise StringError(f"raw control character U+{ord(body[i]):04X} in a string (write it as "
                              f"{_escape_char(body[i])})", i + 1)
        raise StringError(f"bad escape '{body[i:i + 2]}' in a string (the escapes are {ESCAPES_HELP})", i + 1)
    try:    # the escapes are a subset of Python's, with the same meaning: decode them at C speed
        return body.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError:   # an escape beyond U+10FFFF: _decode says which
        return _ESCAPE.sub(_decode, body)


def _decode(escape: re.Match) -> str:
    named, *hexes = escape.groups()
    if named is not None:
        return _NAMED[named]
    code = int(next(h for h in hexes if h is not None), 16)
    if code > 0x10FFFF:
        raise StringError(f"escape '{escape.group(0)}' is beyond U+10FFFF", escape.start() + 1)
    return chr(code)


def quote(value: str) -> str:
    """`"value"` with '"', '\\' and every character that is not printable escaped."""
    if value.isprintable() and '"' not in value and "\\" not in value:
        return f'"{value}"'
    return '"' + "".join(c if c.isprintable() and c not in '"\\' else _escape_char(c) for c in value) + '"'


def printable(text: str) -> str:
    """`text` with the characters that are not printable escaped (for comments: they end at a line break)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape_char(c) for c in text)


def _escape_char(c: str) -> str:
    named = _NAMES.get(c)
    if named is not None:
        return named
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
