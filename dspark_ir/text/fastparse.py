"""The fast path of the parser: .dsir text laid out as the printer lays it out, read without lark.

`parse_fast(text, filename)` returns the graphs of a module, or raises `Unsupported` and the caller parses the
text with the lark grammar instead. It accepts a subset of the grammar (comments only between parameters and
statements, no comments inside a statement or a type) and builds exactly what the lark path builds from it:
the same graphs, nodes, values, sequence keys and locations. Anything else, every syntax error and every error
the lark path reports (an unknown op, an undefined value, a bad attribute, ...) raises `Unsupported`, so
the lark path alone decides what is an error and how it reads.

It is fast because one regular expression takes a whole statement, and the text of its attribute dict and
of its result types (the same few texts over and over in a model) is parsed once per text and parse.
"""
from __future__ import annotations

import re
from typing import Any

from .. import dims as D
from ..errors import DsparkError
from ..graph import Graph, Node, Value
from ..ops import OP_REGISTRY, get_op
from ..types import TOKEN, TensorType, dtype
from .plain import plain
from .strings import TOKEN as STRING
from .strings import unquote

MAX_INT = 2**63 - 1
MAX_DIM_TOKENS = 100   # a dim this short nests less deep than the lark path's limit (MAX_DIM_DEPTH)
MAX_NAME = 1024        # characters in a name (%value and @graph without their sigil, symbol, op, attribute)
MAX_RUN_TOKENS = 10000 # tokens without a %value: attribute dicts and types are far shorter
MAX_LIST_DEPTH = 16    # attribute lists nest one or two levels; deeper is an error (the lark path reports it)

# Every run is possessive (*+): a pattern never gives back what a run took, so no match backtracks (a failing
# match costs one scan, not one per split of a whitespace run).
WS = r"[ \t\f\r\n]*+"   # the grammar's whitespace (common.WS): not Python's \s
VALUE = r"%[A-Za-z_][A-Za-z0-9_.]*+"
VALUES = rf"{VALUE}(?:{WS},{WS}{VALUE})*+"
IDENT = r"[A-Za-z_][A-Za-z0-9_]*+"
INT = r"[0-9]++"
TYPE = r"(?:token|(?:bf16|fp16|f32|fp8|i8|i32|i64|bool)\[[^\]#]*+\])"
ATTR_DICT = rf"\{{[^{{}}\"#]*+(?:{STRING}[^{{}}\"#]*+)*+\}}"

_SKIP = re.compile(r"(?:[ \t\f\r\n]++|#[^\n]*+)*+")
_WS = re.compile(WS)
_GRAPH = re.compile(rf"graph{WS}(@[A-Za-z_][A-Za-z0-9_.\-]*){WS}")
_SYMBOL = re.compile(rf"({IDENT}){WS}(?:={WS}({INT}){WS})?")
_PARAM = re.compile(rf"({VALUE}){WS}:{WS}({TYPE}){WS}(inout)?{WS}")
_ATTRIBUTES = re.compile(rf"attributes{WS}({ATTR_DICT}){WS}")
_STMT = re.compile(
    rf"({VALUES}){WS}={WS}([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*){WS}\({WS}((?:{VALUES})?){WS}\){WS}"
    rf"({ATTR_DICT})?{WS}(?:deps{WS}\({WS}({VALUES}){WS}\){WS})?:{WS}({TYPE}(?:{WS},{WS}{TYPE})*)")
_RETURN = re.compile(rf"return{WS}((?:{VALUES})?){WS}\}}")
_TOKEN = re.compile(   # the grammar's terminals in lark's order of preference (FLOAT before INT, DTYPE before IDENT)
    rf"(?P<float>[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+)|(?P<int>{INT})"
    rf"|(?P<dtype>(?:bf16|fp16|f32|fp8|i8|i32|i64|bool)(?=\[))|(?P<ident>{IDENT})|(?P<string>{STRING})"
    rf"|(?P<punct>//|[-+*/(),\[\]{{}}=])")
_NAME_STRIP = " \t\f\r\n"


class Unsupported(Exception):
    """Not in the fast path's subset (or an error): parse with the lark grammar."""


def parse_fast(text: str, filename: str) -> list[Graph]:
    try:
        return _Reader(text, filename).module()
    except (DsparkError, ValueError, SyntaxError, TypeError, RecursionError) as e:
        raise Unsupported(str(e)) from None


class _Reader:
    def __init__(self, text: str, filename: str):
        self.text = text
        self.filename = filename
        self.pos = 0
        self.line, self.line_pos = 1, 0         # the line of `line_pos` (a position at or before any asked)
        self.line_start = 0                     # where that line starts
        self.attrs: dict[tuple[str, str], dict[str, Any]] = {}    # (op, attr dict text) → normalized attrs
        self.types: dict[str, list[TensorType]] = {}              # result types text → types

    # ---- scanning -----------------------------------------------------------------------------------
    def skip(self) -> None:
        self.pos = _SKIP.match(self.text, self.pos).end()

    def match(self, pattern: re.Pattern) -> re.Match:
        m = pattern.match(self.text, self.pos)
        if m is None:
            raise Unsupported(f"no {pattern.pattern[:20]!r} at {self.pos}")
        self.pos = m.end()
        return m

    def expect(self, char: str) -> None:
        if not self.text.startswith(char, self.pos):
            raise Unsupported(f"expected {char!r} at {self.pos}")
        self.pos = _WS.match(self.text, self.pos + len(char)).end()

    def loc(self, pos: int) -> str:
        """`file:line:col` of a position (asked in increasing order), as lark counts them."""
        newlines = self.text.count("\n", self.line_pos, pos)
        if newlines:
            self.line += newlines
            self.line_start = self.text.rfind("\n", self.line_pos, pos) + 1
        self.line_pos = pos
        return f"{self.filename}:{self.line}:{pos - self.line_start + 1}"

    # ---- graphs -------------------------------------------------------------------------------------
    def module(self) -> list[Graph]:
        graphs = []
        self.skip()
        while True:
            graphs.append(self.graph())
            self.skip()
            if self.pos == len(self.text):
                return graphs

    def graph(self) -> Graph:
        head = self.match(_GRAPH)
        g = Graph(_short(head.group(1)[1:]))
        g.loc = self.loc(head.start(1))
        if self.text.startswith("<", self.pos):
            self.symbols(g)
        self.expect("(")
        self.params(g)
        if self.text.startswith("attributes", self.pos):
            attr_text = self.match(_ATTRIBUTES).group(1)
            g.attributes = {k: plain(v) for k, v in _Values(attr_text).attr_dict().items()}
        self.expect("{")
        pending = []
        self.skip()
        while self.text.startswith("%", self.pos):
            pending.append(self.statement(g))
            self.skip()
        ret = self.match(_RETURN)
        for node, operands, deps in pending:
            node.operands = [_lookup(g, name) for name in operands]
            node.deps = [_lookup(g, name) for name in deps]
        g.returns = [_lookup(g, name) for name in _names(ret.group(1))]
        return g

    def symbols(self, g: Graph) -> None:
        self.expect("<")
        while not self.text.startswith(">", self.pos):
            m = self.match(_SYMBOL)
            if _short(m.group(1)) in g.symbols:
                raise Unsupported(f"symbol '{m.group(1)}' declared twice")
            g.symbols[m.group(1)] = None if m.group(2) is None else _int(m.group(2))
            if not self.text.startswith(">", self.pos):
                self.expect(",")
                if self.text.startswith(">", self.pos):
                    raise Unsupported("a trailing ','")
        self.expect(">")

    def params(self, g: Graph) -> None:
        while not self.text.startswith(")", self.pos):
            m = self.match(_PARAM)
            name = _short(m.group(1)[1:])
            _check_fresh(g, name)
            g.add_param(name, self.type_list(m.group(2))[0], inout=m.group(3) is not None)
            if not self.text.startswith(")", self.pos):
                self.expect(",")
                if self.text.startswith(")", self.pos):
                    raise Unsupported("a trailing ','")
        self.expect(")")

    def statement(self, g: Graph) -> tuple[Node, list[str], list[str]]:
        start = self.pos
        m = self.match(_STMT)
        results_text, op_name, operands_text, attr_text, deps_text, types_text = m.groups()
        if op_name not in OP_REGISTRY:
            raise Unsupported(f"unknown op '{op_name}'")
        results = _names(results_text)
        types = self.type_list(types_text)
        if len(types) != len(results):
            raise Unsupported(f"{len(results)} results but {len(types)} types")
        for name in results:
            _check_fresh(g, name)
        node = Node(results[0], op_name, [], [], self.node_attrs(op_name, attr_text or "{}"), [], (),
                    self.loc(start))
        node.seq = g._seq_for(None)
        node.results = [Value(name, ty, node, i) for i, (name, ty) in enumerate(zip(results, types))]
        g.nodes[node.name] = node
        for v in node.results:
            g.values[v.name] = v
        return node, _names(operands_text), _names(deps_text or "")

    # ---- cached sub-parses --------------------------------------------------------------------------
    def node_attrs(self, op_name: str, attr_text: str) -> dict[str, Any]:
        key = (op_name, attr_text)
        attrs = self.attrs.get(key)
        if attrs is None:
            attrs = self.attrs[key] = get_op(op_name).normalize_attrs(_Values(attr_text).attr_dict())
        return dict(attrs)             # values are immutable (ints, floats, strings, dims, tuples)

    def type_list(self, text: str) -> list[TensorType]:
        types = self.types.get(text)
        if types is None:
            types = self.types[text] = _Values(text).type_list()
        return types


def _names(text: str) -> list[str]:
    """The names of a comma-separated list of %values (already matched by VALUES)."""
    names = [part.strip(_NAME_STRIP)[1:] for part in text.split(",")] if text else []
    for name in names:
        _short(name)
    return names


def _short(name: str) -> str:
    if len(name) > MAX_NAME:
        raise Unsupported("a long name")
    return name


def _check_fresh(g: Graph, name: str) -> None:
    if name in g.values:
        raise Unsupported(f"value '%{name}' is defined twice")


def _lookup(g: Graph, name: str) -> Value:
    value = g.values.get(name)
    if value is None:
        raise Unsupported(f"use of undefined value '%{name}'")
    return value


def _int(text: str) -> int:
    if len(text) > 19 or int(text) > MAX_INT:
        raise Unsupported("integer literal out of range")
    return int(text)


# ---- attribute values, types and dims ----------------------------------------------------------------
class _TrueDiv:
    """a/b: only the argument of ceil(...) may be one."""

    def __init__(self, a: D.Dim, b: D.Dim):
        self.a, self.b = a, b


class _Values:
    """A recursive-descent reader of one attribute dict or one list of types, mirroring dsir.lark."""

    def __init__(self, text: str):
        self.tokens: list[tuple[str, str]] = []
        pos, end = 0, len(text)
        while True:
            pos = _WS.match(text, pos).end()
            if pos == end:
                break
            m = _TOKEN.match(text, pos)
            if m is None:
                raise Unsupported(f"unexpected character {text[pos]!r}")
            self.tokens.append((m.lastgroup, m.group(m.lastgroup)))
            pos = m.end()
            if len(self.tokens) > MAX_RUN_TOKENS or (m.lastgroup == "ident" and pos - m.start() > MAX_NAME):
                raise Unsupported("too many tokens, or a long name")
        self.tokens.append(("end", ""))
        self.i = 0

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.i]

    def take(self) -> tuple[str, str]:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def at(self, punct: str) -> bool:
        return self.tokens[self.i] == ("punct", punct)

    def expect(self, punct: str) -> None:
        if self.take() != ("punct", punct):
            raise Unsupported(f"expected {punct!r}")

    def bracketed(self, item) -> list:
        """The ','-separated items up to the closing ']' (the '[' already read), which it reads too."""
        items = []
        while not self.at("]"):
            items.append(item())
            if not self.at("]"):
                self.expect(",")
                if self.at("]"):
                    raise Unsupported("a trailing ','")
        self.take()
        return items

    def done(self) -> None:
        if self.peek()[0] != "end":
            raise Unsupported("trailing text")

    # attr_dict: "{" [attr ("," attr)*] "}" ; attr: IDENT "=" value
    def attr_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        self.expect("{")
        while not self.at("}"):
            kind, key = self.take()
            if kind != "ident" or key in out:
                raise Unsupported("a bad or repeated attribute name")
            self.expect("=")
            out[key] = self.value()
            if not self.at("}"):
                self.expect(",")
                if self.at("}"):
                    raise Unsupported("a trailing ','")
        self.expect("}")
        self.done()
        return out

    def value(self, depth: int = 0) -> Any:
        kind, text = self.peek()
        if (kind, text) == ("punct", "["):
            if depth >= MAX_LIST_DEPTH:
                raise Unsupported("a deeply nested list")
            self.take()
            return self.bracketed(lambda: self.value(depth + 1))
        if kind == "string":
            self.take()
            return unquote(text)
        if kind == "float":
            self.take()
            return _float(text)
        if (kind, text) == ("punct", "-") and self.tokens[self.i + 1][0] == "float":
            self.take()
            return -_float(self.take()[1])
        return self.dim()

    # types: type ("," type)* ; type: DTYPE "[" [dim ("," dim)*] "]" | "token"
    def type_list(self) -> list[TensorType]:
        types = []
        while True:
            kind, text = self.take()
            if (kind, text) == ("ident", "token"):
                types.append(TOKEN)
            elif kind == "dtype":
                self.expect("[")
                types.append(TensorType(dtype(text), tuple(self.bracketed(self.dim))))
            else:
                raise Unsupported("not a type")
            if self.peek()[0] == "end":
                return types
            self.expect(",")

    # ?dim: sum ; sum: product (("+" | "-") product)* ; product: unary (("*" | "//" | "/") unary)*
    def dim(self) -> D.Dim:
        start = self.i
        d = self.sum()
        if isinstance(d, _TrueDiv) or self.i - start > MAX_DIM_TOKENS:
            raise Unsupported("'/' outside ceil, or a deeply nested dim")
        return d

    def sum(self) -> D.Dim | _TrueDiv:
        left = self.product()
        while self.at("+") or self.at("-"):
            op = self.take()[1]
            right = self.product()
            left = (D.add if op == "+" else D.sub)(_plain_dim(left), _plain_dim(right))
        return left

    def product(self) -> D.Dim | _TrueDiv:
        left = self.unary()
        while self.at("*") or self.at("//") or self.at("/"):
            op = self.take()[1]
            a, b = _plain_dim(left), _plain_dim(self.unary())
            left = D.mul(a, b) if op == "*" else D.floordiv(a, b) if op == "//" else _TrueDiv(a, b)
        return left

    def unary(self) -> D.Dim | _TrueDiv:
        if self.at("-"):
            self.take()
            return D.sub(0, _plain_dim(self.atom()))
        return self.atom()

    # atom: INT | IDENT | IDENT "(" dim ("," dim)* ")" | "(" dim ")"
    def atom(self) -> D.Dim | _TrueDiv:
        kind, text = self.take()
        if kind == "int":
            return D.Const(_int(text))
        if kind == "ident":
            if not self.at("("):
                return D.Sym(text)
            self.take()
            args = [self.sum()]
            while self.at(","):
                self.take()
                args.append(self.sum())
            self.expect(")")
            return _call(text, args)
        if (kind, text) == ("punct", "("):
            inner = self.sum()
            self.expect(")")
            return inner
        raise Unsupported("not a dim")


def _plain_dim(d: D.Dim | _TrueDiv) -> D.Dim:
    if isinstance(d, _TrueDiv):
        raise Unsupported("'/' outside ceil")
    return d


def _call(name: str, args: list) -> D.Dim:
    if name == "ceil" and len(args) == 1 and isinstance(args[0], _TrueDiv):
        return D.ceildiv(args[0].a, args[0].b)
    if name in ("min", "max") and len(args) == 2:
        a, b = (_plain_dim(x) for x in args)
        return D.dmin(a, b) if name == "min" else D.dmax(a, b)
    raise Unsupported(f"bad call of '{name}'")


def _float(text: str) -> float:
    number = float(text)
    if number == float("inf"):
        raise Unsupported("number out of range")
    return number
