"""The example verifies; mutated copies are rejected with located, one-line messages."""
from pathlib import Path

import pytest

from dspark_ir import DsparkError, VerifyError, parse_graph, verify
from dspark_ir.verifier import check

EXAMPLE = Path(__file__).parents[2] / "examples" / "rmsnorm_matmul_rope.dsir"
SOURCE = EXAMPLE.read_text()


def mutate(old: str, new: str) -> str:
    assert old in SOURCE, old
    return SOURCE.replace(old, new, 1)


def test_example_verifies():
    verify(parse_graph(SOURCE, "ex.dsir"))


MUTATIONS = {
    "wrong result shape": (
        ": bf16[T,64]\n  return", ": bf16[T,32]\n  return",
        "ex.dsir:15:3: node 'qkv.kv_rope': result %qkv.kv_rope has type bf16[T,32] but rope gives bf16[T,64]"),
    "wrong operand shape": (
        "%wkv: bf16[256,64]", "%wkv: bf16[128,64]",
        "node 'qkv.kv_proj_matmul': contraction dims: 256 != 128"),
    "cycle": (
        "rmsnorm(%x, %norm_w)", "rmsnorm(%qkv.kv_rope, %norm_w)",
        "cycle: "),
    "unknown op": ("%qkv.kv_rope = rope(", "%qkv.kv_rope = rop(",
                   "ex.dsir:15:18: unknown op 'rop' (did you mean 'rope'?)"),
    "missing operand": (
        "rope(%qkv.kv_proj_matmul, %cos, %sin)", "rope(%qkv.kv_proj_matmul, %cos)",
        "node 'qkv.kv_rope': op 'rope' takes 3 operands, got 2"),
    "undefined operand": ("%cos, %sin)", "%cos, %sine)",
                          "ex.dsir:15:50: use of undefined value '%sine' (did you mean 'sin'?)"),
    "bad attribute value": ("rope_dim = 16", "rope_dim = 15", "rope_dim must be positive and even, got 15"),
    "bad attribute type": ("rope_dim = 16", "rope_dim = \"16\"", "attribute 'rope_dim' expects int"),
    "unknown attribute": ("rope_dim = 16", "rope_dims = 16",
                          "unknown attribute 'rope_dims' for op 'rope' (did you mean 'rope_dim'?)"),
    "tile does not divide": ("tile = [8], blocks = ceil(T/8)} : bf16[T,64]",
                             "tile = [6], blocks = ceil(T/8)} : bf16[T,64]",
                             "tile 6 does not divide axis 'rows' = 16 (declare tail = clamp)"),
    "tile arity": ("tile = [16, 64, 128]", "tile = [16, 64]", "tile has 2 entries but matmul tiles 3 axes (m, n, k)"),
    "undeclared symbol": ("%cos: bf16[T,8]", "%cos: bf16[Q,8]", "parameter %cos uses undeclared symbol 'Q'"),
    "blocks = 0": ("blocks = 2}", "blocks = 0}", "ex.dsir:14:3: node 'qkv.kv_proj_matmul': attribute 'blocks' must be at least 1, got 0"),
    "blocks < 0": ("blocks = 2}", "blocks = -5}", "attribute 'blocks' must be at least 1, got -5"),
    "blocks = 0 once T is bound": ("blocks = 2}", "blocks = T - 16}", "attribute 'blocks' must be at least 1, got T - 16 = 0"),
    "blocks over an undeclared symbol": ("blocks = 2}", "blocks = ceil(TT/4)}", "attribute 'blocks' uses undeclared symbol 'TT'"),
    "blocks dividing by zero": ("blocks = 2}", "blocks = ceil(T/(T-16))}",
                                "attribute 'blocks': ceil(T/(T - 16)) has a division by non-positive 0 at T = 16"),
    "result dividing by zero": ("f32[T,64]\n  %qkv.kv_rope", "f32[T//(T-16),64]\n  %qkv.kv_rope",
                                "result %qkv.kv_proj_matmul: f32[T//(T - 16),64]: T//(T - 16) has a division"),
    "parameter dividing by zero": ("%cos: bf16[T,8]", "%cos: bf16[ceil(T/(T-16)),8]", "ex.dsir:3:7: graph '@kv_side': "
                                   "parameter %cos: bf16[ceil(T/(T - 16)),8]: ceil(T/(T - 16)) has a division"),
    "negative extent": ("%cos: bf16[T,8]", "%cos: bf16[T-17,8]", "parameter %cos: bf16[T - 17,8]: extent T - 17 is -1 at T = 16"),
    "T = 0": ("<T = 16>", "<T = 0>", "graph '@kv_side': symbol T = 0: a bound symbol must be at least 1"),
    "ranks = 2.0": ('config = "tiny"', 'config = "tiny", ranks = 2.0', "graph attribute 'ranks' must be an integer >= 1, got 2.0"),
    "ranks = true": ('config = "tiny"', 'config = "tiny", ranks = true', "graph attribute 'ranks' must be an integer >= 1, got true"),
    "tp = 0": ('config = "tiny"', 'config = "tiny", tp = 0', "graph attribute 'tp' must be an integer >= 1, got 0"),
    "tp = \"x\"": ('config = "tiny"', 'config = "tiny", tp = "x"', "graph attribute 'tp' must be an integer >= 1, got \"x\""),
    "layer = 3": ('layer = "example"', 'layer = 3', "graph attribute 'layer' must be a string, got 3"),
    "outputs = [1]": ('config = "tiny"', 'config = "tiny", outputs = [1]', "graph attribute 'outputs' must be a list of strings, got [1]"),
    "in-place update of an input": (
        "%wkv, %qkv.kv_proj_seed)", "%wkv, %x)",
        "node 'qkv.kv_proj_matmul': accumulator must be f32"),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_mutations_are_rejected_with_location(name):
    old, new, expected = MUTATIONS[name]
    with pytest.raises(DsparkError) as e:
        verify(parse_graph(mutate(old, new), "ex.dsir"))
    message = str(e.value)
    assert expected in message, message
    assert "\n" not in message
    assert message.startswith("ex.dsir:"), message


def test_tail_clamp_allows_ragged_tiles():
    verify(parse_graph(mutate("tile = [8], blocks = ceil(T/8)} : bf16[T,64]",
                              "tile = [6], blocks = ceil(T/6), tail = clamp} : bf16[T,64]"), "ex.dsir"))


def test_in_place_update_must_chain_from_inout_or_allocation():
    text = """graph @g<T = 4>(%a: bf16[T,8], %w: bf16[8,8], %acc: f32[T,8]) {
  %m.mm = matmul(%a, %w, %acc) {accumulate = atomic} : f32[T,8]
  return %m.mm
}
"""
    with pytest.raises(VerifyError, match="neither an inout parameter nor a locally allocated buffer"):
        verify(parse_graph(text, "g.dsir"))
    verify(parse_graph(text.replace("%acc: f32[T,8])", "%acc: f32[T,8] inout)"), "g.dsir"))


def test_stale_read_after_in_place_update_is_rejected():
    text = """graph @g<T = 4>(%a: bf16[T,8], %w: bf16[8,8], %acc: f32[T,8] inout) {
  %m.mm = matmul(%a, %w, %acc) {accumulate = atomic} : f32[T,8]
  %m.late = add(%acc, %m.mm) deps(%m.mm) : f32[T,8]
  return %m.late, %m.mm
}
"""
    errors = [str(e) for e in check(parse_graph(text, "g.dsir"))]
    assert any("reads %acc after 'm.mm' overwrote it in place" in e for e in errors), errors


def test_final_inout_version_must_be_returned():
    text = """graph @g<T = 4>(%a: bf16[T,8], %w: bf16[8,8], %acc: f32[T,8] inout) {
  %m.mm = matmul(%a, %w, %acc) {accumulate = atomic} : f32[T,8]
  %m.out = cast(%m.mm) {to = bf16} : bf16[T,8]
  return %m.out
}
"""
    with pytest.raises(VerifyError, match="final version of inout buffer %acc is not returned"):
        verify(parse_graph(text, "g.dsir"))
