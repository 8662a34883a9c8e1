"""Text → Graph. Errors carry `file:line:col` and say what was expected."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from .. import dims as D
from ..errors import DsparkError, ParseError, did_you_mean
from ..graph import Graph, Module, Node, Value
from ..ops import OP_REGISTRY, get_op, load_all
from ..types import TOKEN, DType, TensorType, dtype
from .fastparse import MAX_LIST_DEPTH, MAX_NAME, MAX_RUN_TOKENS, Unsupported, parse_fast
from .plain import plain
from .strings import StringError, unquote

GRAMMAR = Path(__file__).with_name("dsir.lark")
MAX_INPUT_BYTES = 64 << 20     # a 43-layer model prints to a few MB

MAX_PARSER_STACK = 1000       # LALR states: the flash model needs 29, a dim nested MAX_DIM_DEPTH deep ~300
_NAMES = {"VALUE", "IDENT", "GRAPH_NAME", "OP_NAME"}

_TERMINAL_NAMES = {
    "VALUE": "a value (%name)", "OP_NAME": "an op name", "IDENT": "a name", "INT": "an integer",
    "FLOAT": "a number", "STRING": "a string", "DTYPE": "a dtype", "GRAPH_NAME": "a graph name (@name)",
    "LPAR": "'('", "RPAR": "')'", "LBRACE": "'{'", "RBRACE": "'}'", "LSQB": "'['", "RSQB": "']'",
    "COMMA": "','", "COLON": "':'", "EQUAL": "'='", "LESSTHAN": "'<'", "MORETHAN": "'>'",
    "RETURN": "'return'", "GRAPH": "'graph'", "DEPS": "'deps'", "TOKEN": "'token'", "INOUT": "'inout'",
    "ATTRIBUTES": "'attributes'", "MINUS": "'-'", "PLUS": "'+'", "STAR": "'*'", "SLASH": "'/'",
    "__ANON_0": "'//'", "$END": "end of input",
}


@lru_cache(maxsize=None)
def _lark(start: str) -> Lark:
    # Tokens carry line:col; trees do not need positions (and building them costs a third of a parse).
    return Lark(GRAMMAR.read_text(), parser="lalr", start=start, maybe_placeholders=False, cache=_cache_path(start))


def _cache_path(start: str) -> str | bool:
    """Cache the compiled grammar under the user cache dir (a cold build costs ~0.3 s per process)."""
    import hashlib
    import os
    import tempfile

    import lark

    root = Path(os.environ.get("DSPARK_CACHE_DIR") or Path.home() / ".cache" / "dspark") / "lark"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError:
        root = Path(tempfile.gettempdir())
    digest = hashlib.sha256(GRAMMAR.read_bytes() + lark.__version__.encode()).hexdigest()[:16]
    return str(root / f"dsir-{start}-{digest}.lark")


def parse_module(text: str, filename: str = "<input>") -> Module:
    from ..gctools import paused_gc

    if len(text) > MAX_INPUT_BYTES:
        raise ParseError(_too_big(), f"{filename}:1:1")
    with paused_gc():                     # no result depends on it: see dspark_ir/gctools.py
        load_all()
        try:
            return Module(parse_fast(text, filename))
        except Unsupported:               # other layouts, and every error: the grammar decides
            pass
        tree = _parse_tree(text, filename, "start")
        return Module([_GraphBuilder(filename).build(t) for t in tree.children])


def parse_graph(text: str, filename: str = "<input>") -> Graph:
    module = parse_module(text, filename)
    if len(module.graphs) != 1:
        raise ParseError(f"expected one graph, found {len(module.graphs)}", f"{filename}:1:1")
    return module.entry


def parse_file(path: str | Path) -> Module:
    path = Path(path)
    try:
        chunks, size = [], 0
        with path.open("rb") as f:              # in chunks: never much more than the limit in memory
            while size <= MAX_INPUT_BYTES and (chunk := f.read(1 << 20)):
                chunks.append(chunk)
                size += len(chunk)
        data = b"".join(chunks)
        text = data.decode()
    except OSError as e:
        raise ParseError(f"cannot read file: {e.strerror}", str(path)) from None
    except UnicodeDecodeError:
        raise ParseError("file is not UTF-8 text", str(path)) from None
    if len(data) > MAX_INPUT_BYTES:
        raise ParseError(_too_big(), str(path))
    return parse_module(text, str(path))


def _too_big() -> str:
    return f"input too large (the limit is {MAX_INPUT_BYTES >> 20} MiB)"


def parse_dim_text(text: str) -> D.Dim:
    tree = _parse_tree(text, "<dim>", "dim")
    return _dim(tree, "<dim>") if isinstance(tree, Tree) else _dim_token(tree, "<dim>")


def _parse_tree(text: str, filename: str, start: str) -> Tree:
    """The lark parse, token by token, so that nesting, names and runs of tokens stay bounded: a 10 MB input of
    '[' or of 'T+T+...' is refused at its first few thousand tokens, not after minutes and gigabytes."""
    try:
        parser = _lark(start).parse_interactive(text)
        stack = parser.parser_state.state_stack
        token, run = None, 0
        for token in parser.iter_parse():
            run = 0 if token.type == "VALUE" else run + 1
            if len(stack) > MAX_PARSER_STACK:
                raise ParseError("input nested too deeply", _loc(filename, token))
            if run > MAX_RUN_TOKENS:
                raise ParseError(f"more than {MAX_RUN_TOKENS} tokens without a %value (no attribute, type or "
                                 "header is that long)", _loc(filename, token))
            if len(token) > MAX_NAME and token.type in _NAMES and len(token.lstrip("%@")) > MAX_NAME:
                raise ParseError(f"name longer than {MAX_NAME} characters", _loc(filename, token))
        return parser.feed_eof(token)
    except UnexpectedInput as e:
        missing = _missing_closer(e, text)
        if missing is not None:
            message, line, column = missing
            raise ParseError(message, f"{filename}:{line}:{column}") from None
        raise ParseError(_describe(e), f"{filename}:{e.line}:{e.column}") from None
    except RecursionError:
        raise ParseError("input nested too deeply", f"{filename}:1:1") from None


def _describe(e: UnexpectedInput) -> str:
    if isinstance(e, UnexpectedCharacters):
        if e.char == '"':
            return "unterminated string (a string ends on its line; write a line break as \\n)"
        char = e.char if e.char.isprintable() else repr(e.char)
        return f"unexpected character '{char}'{_expected(e.allowed)}"
    if isinstance(e, UnexpectedEOF):
        return f"unexpected end of input{_expected(e.expected)}"
    if isinstance(e, UnexpectedToken):
        if e.token.type == "$END":
            return f"unexpected end of input{_expected(e.accepts or e.expected)}"
        expected = e.accepts or e.expected
        hint = did_you_mean(str(e.token.value), [d.value for d in DType]) if "DTYPE" in expected else ""
        return f"unexpected {e.token.value!r}{_expected(expected)}{hint}"
    return "syntax error"


_CLOSERS = {"RSQB": "']'", "RPAR": "')'", "RBRACE": "'}'", "MORETHAN": "'>'"}


def _missing_closer(e: UnexpectedInput, text: str) -> tuple[str, int, int] | None:
    """A closing bracket the parser wanted at the end of a line, found missing only at the next token on a later
    line: (message, line, column) just after the last token before the gap, where the bracket is missing."""
    if not isinstance(e, UnexpectedToken) or e.token.type == "$END" or e.token.start_pos is None:
        return None
    closers = [_CLOSERS[n] for n in (e.accepts or e.expected) if n in _CLOSERS]
    if len(closers) != 1:
        return None
    end = e.token.start_pos
    while end > 0 and text[end - 1].isspace():
        end -= 1
    if "\n" not in text[end:e.token.start_pos]:
        return None
    line = text.count("\n", 0, end) + 1
    column = end - text.rfind("\n", 0, end)
    return f"missing {closers[0]} (found {e.token.value!r} on line {e.line})", line, column


def _expected(names) -> str:
    if not names:
        return ""
    readable = sorted({_TERMINAL_NAMES.get(n, n.lower()) for n in names})
    if len(readable) > 6:
        readable = readable[:6] + ["..."]
    return "; expected " + (readable[0] if len(readable) == 1 else "one of " + ", ".join(readable))


def _loc(filename: str, item: Tree | Token) -> str:
    token = item if isinstance(item, Token) else _first_token(item)
    if token is None:
        return filename
    return f"{filename}:{token.line}:{token.column}"


def _first_token(tree: Tree) -> Token | None:
    """The leftmost token under `tree` (iterative: expression trees can be thousands deep)."""
    stack: list[Tree | Token] = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, Token):
            return item
        stack.extend(reversed(item.children))
    return None


# ---- dims ---------------------------------------------------------------------------------------
_DIM_BUILDERS = {"add": D.add, "sub": D.sub, "mul": D.mul, "floordiv": D.floordiv}
MAX_DIM_DEPTH = 100
MAX_INT = 2**63 - 1


def _dim(t: Tree | Token, filename: str, depth: int = 0) -> D.Dim:
    if isinstance(t, Token):
        return _dim_token(t, filename)
    if depth > MAX_DIM_DEPTH:
        raise ParseError(f"dim expression nested more than {MAX_DIM_DEPTH} levels deep", _loc(filename, t))
    if t.data in _DIM_BUILDERS:
        a, b = (_dim(c, filename, depth + 1) for c in t.children)
        try:
            return _DIM_BUILDERS[t.data](a, b)
        except ValueError as e:
            raise ParseError(str(e), _loc(filename, t)) from None
    if t.data == "int_dim":
        return _dim_token(t.children[0], filename)
    if t.data == "sym_dim":
        return D.Sym(str(t.children[0]))
    if t.data == "neg":
        return D.sub(0, _dim(t.children[0], filename, depth + 1))
    if t.data == "truediv":
        raise ParseError("'/' is only allowed inside ceil(a/b); use '//' for floor division", _loc(filename, t))
    if t.data == "call_dim":
        return _call(t, filename, depth + 1)
    raise ParseError(f"not a dim expression ({t.data})", _loc(filename, t))


def _int(t: Token, filename: str) -> int:
    if len(t) > 19 or int(t) > MAX_INT:
        raise ParseError("integer literal out of range (at most 2^63-1)", _loc(filename, t))
    return int(t)


def _dim_token(t: Token, filename: str) -> D.Dim:
    if t.type == "INT":
        return D.Const(_int(t, filename))
    if t.type == "IDENT":
        return D.Sym(str(t))
    raise ParseError(f"not a dim: {t.value!r}", _loc(filename, t))


def _call(t: Tree, filename: str, depth: int) -> D.Dim:
    fn, *args = t.children
    name = str(fn)
    if name not in D.FUNCTIONS:
        raise ParseError(f"unknown dim function '{name}'{did_you_mean(name, D.FUNCTIONS)}", _loc(filename, fn))
    try:
        if name == "ceil":
            if len(args) != 1 or not (isinstance(args[0], Tree) and args[0].data == "truediv"):
                raise ParseError("ceil takes one argument of the form a/b", _loc(filename, t))
            a, b = (_dim(c, filename, depth) for c in args[0].children)
            return D.ceildiv(a, b)
        if len(args) != 2:
            raise ParseError(f"{name} takes two arguments", _loc(filename, t))
        a, b = (_dim(c, filename, depth) for c in args)
        return D.dmin(a, b) if name == "min" else D.dmax(a, b)
    except ValueError as e:
        raise ParseError(str(e), _loc(filename, t)) from None


# ---- graphs -------------------------------------------------------------------------------------
class _GraphBuilder:
    def __init__(self, filename: str):
        self.filename = filename

    def build(self, tree: Tree) -> Graph:
        name_tok = tree.children[0]
        g = Graph(str(name_tok)[1:])
        g.loc = _loc(self.filename, name_tok)
        stmts: list[Tree] = []
        ret: Tree | None = None
        for child in tree.children[1:]:
            if not isinstance(child, Tree):
                continue
            if child.data == "symbols":
                self._symbols(g, child)
            elif child.data == "params":
                self._params(g, child)
            elif child.data == "graph_attrs":
                g.attributes = {k: plain(v) for k, v in self._attrs(child.children[0]).items()}
            elif child.data == "stmt":
                stmts.append(child)
            elif child.data == "ret":
                ret = child
        pending = [self._declare(g, s) for s in stmts]
        for node, operand_toks, dep_toks in pending:
            node.operands = [self._lookup(g, t) for t in operand_toks]
            node.deps = [self._lookup(g, t) for t in dep_toks]
        assert ret is not None
        g.returns = [self._lookup(g, t) for t in ret.children]
        return g

    def _symbols(self, g: Graph, tree: Tree) -> None:
        for sym in tree.children:
            name_tok = sym.children[0]
            if str(name_tok) in g.symbols:
                raise ParseError(f"symbol '{name_tok}' declared twice", _loc(self.filename, name_tok))
            g.symbols[str(name_tok)] = _int(sym.children[1], self.filename) if len(sym.children) > 1 else None

    def _params(self, g: Graph, tree: Tree) -> None:
        for p in tree.children:
            name_tok, type_tree, *rest = p.children
            self._check_fresh(g, name_tok)
            g.add_param(str(name_tok)[1:], self._type(type_tree), inout=bool(rest))

    def _declare(self, g: Graph, stmt: Tree) -> tuple[Node, list[Token], list[Token]]:
        results_tree, op_tok, *rest = stmt.children
        operand_toks: list[Token] = []
        dep_toks: list[Token] = []
        attrs: dict[str, Any] = {}
        types: list[TensorType] = []
        attr_tree = None
        attr_keys: dict[str, Token] = {}
        for child in rest:
            if child.data == "operands":
                operand_toks = list(child.children)
            elif child.data == "attr_dict":
                attr_tree = child
                attrs = self._attrs(child)
                attr_keys = {str(a.children[0]): a.children[0] for a in child.children}
            elif child.data == "deps":
                dep_toks = list(child.children)
            elif child.data == "types":
                types = [self._type(t) for t in child.children]
        op_name = str(op_tok)
        if op_name not in OP_REGISTRY:
            raise ParseError(f"unknown op '{op_name}'{did_you_mean(op_name, OP_REGISTRY)}", _loc(self.filename, op_tok))
        result_toks = list(results_tree.children)
        if len(types) != len(result_toks):
            raise ParseError(f"{len(result_toks)} results but {len(types)} types", _loc(self.filename, stmt))
        for t in result_toks:
            self._check_fresh(g, t)
        try:
            normalized = get_op(op_name).normalize_attrs(attrs)
        except DsparkError as e:
            named = [tok for key, tok in attr_keys.items() if f"'{key}'" in e.message]
            raise ParseError(e.message, _loc(self.filename, named[0] if named else (attr_tree or op_tok))) from None
        node = Node(str(result_toks[0])[1:], op_name, [], [], normalized, [], (), _loc(self.filename, result_toks[0]))
        node.seq = g._seq_for(None)
        node.results = [Value(str(t)[1:], ty, node, i) for i, (t, ty) in enumerate(zip(result_toks, types))]
        g.nodes[node.name] = node
        for v in node.results:
            g.values[v.name] = v
        return node, operand_toks, dep_toks

    def _check_fresh(self, g: Graph, tok: Token) -> None:
        if str(tok)[1:] in g.values:
            raise ParseError(f"value '{tok}' is defined twice", _loc(self.filename, tok))

    def _lookup(self, g: Graph, tok: Token) -> Value:
        name = str(tok)[1:]
        try:
            return g.values[name]
        except KeyError:
            hint = did_you_mean(name, g.values)
            raise ParseError(f"use of undefined value '{tok}'{hint}", _loc(self.filename, tok)) from None

    def _type(self, t: Tree) -> TensorType:
        if t.data == "token_type":
            return TOKEN
        dt_tok, *dim_trees = t.children
        return TensorType(dtype(str(dt_tok)), tuple(_dim(d, self.filename) for d in dim_trees))

    def _attrs(self, tree: Tree) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for attr in tree.children:
            key_tok, value = attr.children
            if str(key_tok) in out:
                raise ParseError(f"attribute '{key_tok}' given twice", _loc(self.filename, key_tok))
            out[str(key_tok)] = self._value(value, key_tok)
        return out

    def _value(self, v: Tree | Token, key: Token, depth: int = 0) -> Any:
        if isinstance(v, Token):
            return _dim_token(v, self.filename)
        if v.data == "list_value":
            if depth >= MAX_LIST_DEPTH:
                raise ParseError(f"attribute '{key}': list nested more than {MAX_LIST_DEPTH} levels deep",
                                 _loc(self.filename, key))
            return [self._value(c, key, depth + 1) for c in v.children]
        if v.data == "string_value":
            token = v.children[0]
            try:
                return unquote(str(token))
            except StringError as e:
                raise ParseError(str(e), f"{self.filename}:{token.line}:{token.column + e.offset}") from None
        if v.data in ("float_value", "neg_float_value"):
            number = float(v.children[0])
            if number == float("inf"):
                raise ParseError("number out of range", _loc(self.filename, v))
            return -number if v.data == "neg_float_value" else number
        return _dim(v, self.filename)
