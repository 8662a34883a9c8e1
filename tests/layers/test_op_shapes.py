"""Shape/dtype rules of the hc, qkv, attention, oproj and collective ops: good types infer, bad ones raise a
ShapeError with a plain message naming the node."""
from __future__ import annotations

import pytest

from dspark_ir import Graph, ShapeError
from dspark_ir.types import TensorType

T = "T"


def ty(s: str) -> TensorType:
    dt, _, rest = s.partition("[")
    return TensorType.of(dt, [d.strip() for d in rest.rstrip("]").split(",") if d.strip()])


def infer(op, operand_types, **attrs):
    g = Graph("g", {"T": 8})
    vals = [g.add_param(f"p{i}", ty(t)) for i, t in enumerate(operand_types)]
    node = g.add_op(op, vals, attrs, names="blk.node")
    return [str(v.type) for v in node.results]


GOOD = [
    ("hc_pre_rms", ["f32[T,4,16]"], {}, ["f32[T]"]),
    ("hc_pre_linear", ["f32[T,4,16]", "f32[24,64]", "f32[T,24]"], {"k_split": 4}, ["f32[T,24]"]),
    ("hc_pre_linear", ["f32[T,4,16]", "f32[24,64]"], {"k_split": 4, "accumulate": "ordered"}, ["f32[4*T,24]"]),
    ("hc_pre_linear_reduce", ["f32[32,24]"], {"k_split": 4}, ["f32[8,24]"]),
    ("split_pre_post", ["f32[T,24]", "f32[T]", "f32[3]", "f32[24]"], {}, ["f32[T,4]", "f32[T,4]"]),
    ("comb_sinkhorn", ["f32[T,24]", "f32[T]", "f32[3]", "f32[24]"], {}, ["f32[T,4,4]"]),
    ("mix_x", ["f32[T,4,16]", "f32[T,4]"], {}, ["bf16[T,16]"]),
    ("hc_post", ["bf16[T,16]", "f32[T,4,16]", "f32[T,4]", "f32[T,4,4]"], {}, ["f32[T,4,16]"]),
    ("rope_tables", ["bf16[64,8]", "bf16[64,8]", "i32[T]"], {"rope_dim": 8}, ["bf16[T,8]", "bf16[T,8]"]),
    ("qr_rms_norm_quant", ["f32[T,32]", "bf16[32]"], {}, ["i8[T,32]", "f32[T]"]),
    ("qproj_dequant_rms_nope_rope", ["i32[T,64]", "f32[T]", "f32[64]", "bf16[T,8]", "bf16[T,8]"], {"heads": 2},
     ["bf16[T,2,32]"]),
    ("kv_rms_norm_rope", ["f32[T,32]", "bf16[32]", "bf16[T,8]", "bf16[T,8]"], {}, ["bf16[T,32]"]),
    ("swa_cache_insert_valid_bias", ["bf16[T,32]", "bf16[40,32]", "i32[T]", "i32[T]"], {"window": 16},
     ["bf16[40,32]", "f32[T,16]"]),
    ("swa_cache_writeback", ["bf16[T,32]", "bf16[40,32]", "i32[T]"], {}, ["bf16[40,32]"]),
    ("swa_valid_bias", ["i32[T]"], {"window": 16}, ["f32[T,16]"]),
    ("swa_gather_kv", ["bf16[40,32]", "i32[T,16]"], {}, ["bf16[T,16,32]"]),
    ("qk_pv", ["bf16[T,2,32]", "bf16[T,16,32]", "f32[T,16]", "i32[T,16]"], {"scale": 0.5, "k_tile": 8},
     ["f32[T,2]", "f32[T,2]", "f32[T,2,32]"]),
    ("merge_norm", ["f32[T,4]", "f32[T,4]", "f32[T,4,32]", "f32[4]", "bf16[T,8]", "bf16[T,8]"], {"o_groups": 2},
     ["bf16[2,T,64]"]),
    ("o_proj_a", ["bf16[2,T,64]", "bf16[2,16,64]"], {"group": 1}, ["f32[T,16]"]),
    ("quant_rows", ["f32[T,16]"], {}, ["i8[T,16]", "f32[T]"]),
    ("o_proj_b", ["i8[T,16]", "i8[48,32]"], {"group": 1}, ["i32[T,48]"]),
    ("o_proj_b_dequant", ["f32[48]", "i32[T,48]", "f32[T]", "i32[T,48]", "f32[T]"], {"out": "bf16"},
     ["bf16[T,48]"]),
    ("o_group_a2a", ["bf16[4,T,64]"], {"tp": 2}, ["bf16[2,2*T,64]"]),
    ("tp_o_reduce_scatter", ["f32[4*T,48]"], {"tp": 4}, ["bf16[T,48]"]),
]


@pytest.mark.parametrize("op, ins, attrs, outs", GOOD, ids=[f"{g[0]}-{i}" for i, g in enumerate(GOOD)])
def test_good_types_infer(op, ins, attrs, outs):
    assert infer(op, ins, **attrs) == outs


BAD = [
    ("hc_pre_rms", ["bf16[T,4,16]"], {}, "x_hc must be f32, got bf16[T,4,16]"),
    ("hc_pre_linear", ["f32[T,4,16]", "f32[24,60]", "f32[T,24]"], {"k_split": 4},
     "hc_fn columns vs hc_mult·hidden: 60 != 64"),
    ("hc_pre_linear", ["f32[T,4,16]", "f32[24,64]"], {"k_split": 4},
     "an atomic hc_pre_linear takes exactly one accumulator operand"),
    ("hc_pre_linear", ["f32[T,4,6]", "f32[24,24]", "f32[T,24]"], {"k_split": 4}, "must split into 4 splits"),
    ("split_pre_post", ["f32[T,20]", "f32[T]", "f32[3]", "f32[20]"], {}, "mix width must be"),
    ("mix_x", ["f32[T,4,16]", "f32[T,3]"], {}, "pre width vs hc_mult: 3 != 4"),
    ("hc_post", ["bf16[T,8]", "f32[T,4,16]", "f32[T,4]", "f32[T,4,4]"], {}, "x_attn width vs hidden: 8 != 16"),
    ("rope_tables", ["bf16[64,6]", "bf16[64,6]", "i32[T]"], {"rope_dim": 8}, "must have 8 (duplicated half) or 4"),
    ("rope_tables", ["bf16[64,8]", "bf16[64,8]", "f32[T]"], {"rope_dim": 8}, "positions must be i32[T]"),
    ("qr_rms_norm_quant", ["f32[T,32]", "bf16[16]"], {}, "gamma_cq length vs q_lora: 16 != 32"),
    ("qproj_dequant_rms_nope_rope", ["i32[T,64]", "f32[T]", "f32[64]", "bf16[T,8]", "bf16[T,8]"], {"heads": 3},
     "3 heads do not divide 64 columns"),
    ("kv_rms_norm_rope", ["f32[T,32]", "bf16[32]", "bf16[T,32]", "bf16[T,32]"], {},
     "rope tables (32 wide) must be narrower"),
    ("swa_cache_insert_valid_bias", ["bf16[T,32]", "f32[40,32]", "i32[T]", "i32[T]"], {"window": 16},
     "kv_cache dtype f32 differs from kv bf16"),
    ("swa_gather_kv", ["bf16[40,32]", "i64[T,16]"], {}, "indices must be i32"),
    ("qk_pv", ["bf16[T,2,32]", "bf16[T,16,32]", "f32[T,16]", "i32[T,16]"], {"scale": 0.5, "k_tile": 5},
     "k_tile 5 does not divide the window 16"),
    ("merge_norm", ["f32[T,4]", "f32[T,4]", "f32[T,4,32]", "f32[4]", "bf16[T,8]", "bf16[T,8]"], {"o_groups": 3},
     "3 o_groups do not divide 4 heads"),
    ("o_proj_a", ["bf16[2,T,64]", "bf16[2,16,64]"], {"group": 2}, "group 2 out of range for 2 groups"),
    ("o_proj_b", ["i8[T,16]", "i8[48,32]"], {"group": 2}, "group 2 of width 16 is outside wo_b"),
    ("o_proj_b_dequant", ["f32[48]", "i32[T,48]"], {}, "expects (acc, scale) pairs, got 1 operands"),
    ("o_group_a2a", ["bf16[3,T,64]"], {"tp": 2}, "tp 2 does not divide 3 groups"),
    ("tp_o_reduce_scatter", ["bf16[4*T,48]"], {"tp": 4}, "partial must be f32"),
]


@pytest.mark.parametrize("op, ins, attrs, message", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_types_raise_a_plain_shape_error(op, ins, attrs, message):
    with pytest.raises(ShapeError) as e:
        infer(op, ins, **attrs)
    assert message in e.value.message
    assert e.value.location == "node 'blk.node'"
    assert "\n" not in str(e.value)
