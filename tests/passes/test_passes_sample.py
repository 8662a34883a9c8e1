"""dspark_ir.sample: seeded inputs per parameter dtype/shape, per rank, with clear errors."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dspark_ir import DsparkError, parse_graph
from dspark_ir.ops.base import Attr
from dspark_ir.ops.core import Join
from dspark_ir.sample import sample_inputs

from .support import checked

G = """graph @s<T = 4, S>(%x: bf16[T,8], %y: f32[2,3], %i: i32[T], %b: bool[5], %q: i8[T], %t: token) {
  %a.j = join(%x, %y, %i, %b, %q, %t) : token
  return %a.j
}"""


def test_dtypes_shapes_and_ranges():
    inputs = sample_inputs(checked(G), 0)
    assert sorted(inputs) == ["b", "i", "q", "x", "y"]                      # tokens get no value
    assert inputs["x"].dtype == ml_dtypes.bfloat16 and inputs["x"].shape == (4, 8)
    assert inputs["y"].dtype == np.float32 and inputs["i"].dtype == np.int32 and inputs["b"].dtype == np.bool_
    assert inputs["i"].min() >= 0 and inputs["i"].max() < 8
    assert inputs["q"].min() >= -8 and inputs["q"].max() < 8


def test_seeded_and_independent_per_parameter():
    g = checked(G)
    a, b, c = sample_inputs(g, 0), sample_inputs(g, 0), sample_inputs(g, 1)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["x"], c["x"])
    other = checked(G.replace("%y: f32[2,3], ", "").replace("%x, %y,", "%x,"))
    assert np.array_equal(sample_inputs(other, 0)["x"], a["x"])            # keyed by name, not position


def test_ranks_give_a_list():
    g = checked(G.replace(") {\n  %a.j", ") attributes {ranks = 2} {\n  %a.j"))
    inputs = sample_inputs(g, 0)
    assert isinstance(inputs, list) and len(inputs) == 2
    assert not np.array_equal(inputs[0]["x"], inputs[1]["x"])


def test_unbound_symbol_is_a_clear_error():
    g = parse_graph(G.replace("%q: i8[T]", "%q: i8[S]"))
    with pytest.raises(DsparkError) as e:
        sample_inputs(g, 0)
    assert str(e.value) == ("graph '@s': cannot sample %q: i8[S] uses unbound symbol S "
                            "(bind it in the graph header, e.g. <S = 16>)")


def test_index_operands_bound_index_values(monkeypatch):
    monkeypatch.setattr(Join, "index_operands", {2: (0, 1)}, raising=False)  # %i indexes axis 1 of %x
    g = checked(G.replace("%x: bf16[T,8]", "%x: bf16[T,3]"))
    assert sample_inputs(g, 0)["i"].max() < 3


def test_page_tables_index_pages(monkeypatch):
    """A page table (`(target, axis, page attr)`) draws page numbers: extent // page size, here 12 // 4 = 3."""
    monkeypatch.setattr(Join, "index_operands", {2: (0, 1, "page")})
    monkeypatch.setattr(Join, "attrs", {**Join.attrs, "page": Attr("int", 1)})
    g = checked(G.replace("%x: bf16[T,8]", "%x: bf16[T,12]").replace("%t) :", "%t) {page = 4} :"))
    values = sample_inputs(g, 0)["i"]
    assert values.max() < 3 and values.max() >= 1


def test_the_prefill_model_runs_on_sampled_inputs():
    """Every paged or slot-mapped op declares its index operands, so random inputs stay in range through a
    prefill model (before: the compressor pool's block table indexed past its state)."""
    from dspark_ir.interp import run
    from perf.model import model_graph

    g = model_graph("tiny", prefill=7, layers=3)
    outputs = run(g, sample_inputs(g, 0))
    assert outputs
