"""GraphBuilder: what a layer builder function gets as `b` (see the docstring of dspark_ir/layers)."""
from __future__ import annotations

from typing import Any, Sequence

from goldens.config import ConfigError as GoldensConfigError
from goldens.config import cache_geometry, tiles_for, with_context

from ..dims import Dim, Sym, dim
from ..errors import ConfigError
from ..graph import Graph, Value
from ..types import TensorType

__all__ = ["GraphBuilder"]


class GraphBuilder:
    """Builds one layer graph: parameters, ops with provenance names, returns and the graph attributes."""

    def __init__(self, layer: str, cfg, kind: str = "", graph_name: str | None = None):
        self.layer = layer
        self.cfg = cfg
        self.tiles = tiles_for(cfg)
        self.geo = cache_geometry(cfg)
        self.tp = cfg.tp
        symbols = {"T": cfg.tokens, "B": cfg.batch, "S": cfg.seq}
        attributes = {"layer": layer, "config": cfg.name, "tp": cfg.tp, "ranks": cfg.tp, "kind": kind}
        self.graph = Graph(graph_name or layer.replace("-", "_"), symbols, attributes)
        self.T, self.B, self.S = Sym("T"), Sym("B"), Sym("S")

    def set_context(self, max_context: int | None) -> None:
        """Record the caller's bound on kv_seq_len (graph attribute `max_context`). Beyond the cache capacity the
        layer's caches grow to hold it (goldens.config.with_context: page tables, pools, max_pos); call before
        declaring the parameters. Below it the caches keep their shape and only the static bounds tighten."""
        if max_context is None:
            return
        self.graph.attributes["max_context"] = int(max_context)
        if max_context <= self.geo.ctx_cap:
            return
        try:
            self.cfg = with_context(self.cfg, int(max_context))
        except GoldensConfigError as e:
            raise ConfigError(f"max_context: {e}") from None
        self.geo = cache_geometry(self.cfg)
        self.tiles = tiles_for(self.cfg)

    @property
    def ranks(self) -> int:
        return int(self.graph.attributes["ranks"])

    @ranks.setter
    def ranks(self, n: int) -> None:
        self.graph.attributes["ranks"] = int(n)

    @property
    def kind(self) -> str:
        return str(self.graph.attributes["kind"])

    @kind.setter
    def kind(self, kind: str) -> None:
        self.graph.attributes["kind"] = kind

    def clamp(self, extent, tile: int) -> dict[str, str]:
        """{"tail": "clamp"} when `tile` does not divide `extent` (a dim over the bound symbols), else {}."""
        return {} if self.value(extent) % tile == 0 else {"tail": "clamp"}

    # dims and symbols
    def dim(self, x) -> Dim:
        return dim(x)

    def bind(self, symbol: str, value: int) -> Dim:
        """Declare an extra bound symbol (a cache extent) and return it as a dim."""
        self.graph.symbols[symbol] = int(value)
        return Sym(symbol)

    def value(self, d) -> int:
        """The integer value of a dim under the bound symbols."""
        n = dim(d).value(self.graph.env)
        assert n is not None, f"{d} is not bound"
        return n

    # parameters, ops, returns
    def param(self, name: str, dtype: str, shape: Sequence[Any], inout: bool = False) -> Value:
        return self.graph.add_param(name, TensorType.of(dtype, shape), inout=inout)

    def op(self, kind: str, *operands: Value, name: str | None = None, names: Sequence[str] | None = None,
           deps: Sequence[Value] = (), **attrs: Any) -> Any:
        """Add one node. Returns its Value, or a tuple of Values for a multi-result op."""
        assert (name is None) != (names is None), "give name= or names="
        attrs = {k: v for k, v in attrs.items() if v is not None}
        node = self.graph.add_op(kind, list(operands), attrs, names=name if names is None else list(names),
                                 deps=[d for d in deps if d is not None])
        return node.results[0] if len(node.results) == 1 else tuple(node.results)

    def ret(self, **outputs: Value) -> Graph:
        """Return `outputs` (golden output name → value) in the given order and record their names."""
        self.graph.set_returns(list(outputs.values()))
        self.graph.attributes["outputs"] = list(outputs)
        return self.graph
