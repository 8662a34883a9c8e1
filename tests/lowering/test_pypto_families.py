"""pypto 0.2.0 templates of the DSpark op families, run through the harness against the numpy references."""
from __future__ import annotations

import numpy as np
import pytest

from tests.lowering.pypto_cases import Case, check_case, run_cases

pytestmark = pytest.mark.pypto


def _oproj_dequant_inputs(g, rng):
    out = {}
    for p in g.params:
        shape = p.type.concrete_shape(g.env)
        if p.type.dtype.is_int:
            out[p.name] = rng.integers(-3000, 3000, shape).astype(np.int32)
        else:
            out[p.name] = rng.uniform(0.001, 0.02, shape).astype(np.float32)
    return out


CASES = {
    "o_proj_a": Case("graph @k<T = 16>(%h: bf16[4,T,128], %w: bf16[4,64,128]) {\n"
                     "  %y = o_proj_a(%h, %w) {group = 2} : f32[T,64]\n  return %y\n}\n", ulps=None, rel=1e-5),
    # K = 1024: several L0 k steps per L1 k tile and two L1 tiles (the deep-L1 cube tiles of flash); f32 sums
    # of 1024 products in the calculator's order (torch's, which depends on the CPU's vector kernels): 1.1e-5 and
    # 3.1e-5 max relative error against the once-rounded f64 golden on two machines; the worst case
    # K·u·Σ|h·w| / max(|y|, 1) is about 1e-3 for these inputs
    "o_proj_a_deep_k": Case("graph @k<T = 16>(%h: bf16[2,T,1024], %w: bf16[2,64,1024]) {\n"
                            "  %y = o_proj_a(%h, %w) {group = 1} : f32[T,64]\n  return %y\n}\n", ulps=None, rel=1e-4),
    # 128 × 128 output tiles with an L1 k tile of 1024: K = 1536 ends in a shorter L1 step (1024 + 512); f32
    # sums of 1536 products: 1.3e-4 max relative error (1.4e-4 with the 128 × 256 power-of-two tiles)
    "o_proj_a_partial_l1_step": Case("graph @k<T = 256>(%h: bf16[2,T,1536], %w: bf16[2,768,1536]) {\n"
                                     "  %y = o_proj_a(%h, %w) {group = 1} : f32[T,768]\n  return %y\n}\n",
                                     ulps=None, rel=3e-4),
    # 80 × 176 output tiles in loops over row and column blocks, both last blocks partial, at group 1's offsets;
    # f32 sums of 1024 products over 156 000 outputs: 1.1e-4 max relative error
    "o_proj_a_partial_blocks": Case("graph @k<T = 300>(%h: bf16[2,T,1024], %w: bf16[2,520,1024]) {\n"
                                    "  %y = o_proj_a(%h, %w) {group = 1} : f32[T,520]\n  return %y\n}\n",
                                    ulps=None, rel=3e-4),
    "quant_rows": Case("graph @k<T = 20>(%x: f32[T,64]) {\n"
                       "  %q, %s = quant_rows(%x) {tile = [8], tail = clamp} : i8[T,64], f32[T]\n"
                       "  return %q, %s\n}\n"),
    # the SPMD grid of quant-workers: blocks of a worker's rows (3 tiles of 8 on 3 workers: 24, 24 and 4 rows,
    # valid_shape) and, for wide rows, of one 16-row vector tile (13 tiles on 4 workers: 6 × 16 rows and 4)
    "quant_rows_workers": Case("graph @k<T = 52>(%x: f32[T,64]) {\n"
                               "  %q, %s = quant_rows(%x) {tile = [8], workers = 3, blocks = 3, tail = clamp}"
                               " : i8[T,64], f32[T]\n  return %q, %s\n}\n"),
    "quant_rows_workers_wide": Case("graph @k<T = 100>(%x: f32[T,1024]) {\n"
                                    "  %q, %s = quant_rows(%x) {tile = [8], workers = 4, blocks = 4, tail = clamp}"
                                    " : i8[T,1024], f32[T]\n  return %q, %s\n}\n"),
    "o_proj_b": Case("graph @k<T = 20>(%x: i8[T,64], %w: i8[256,256]) {\n"
                     "  %y = o_proj_b(%x, %w) {group = 1} : i32[T,256]\n  return %y\n}\n"),
    "o_proj_b_deep_k": Case("graph @k<T = 20>(%x: i8[T,1024], %w: i8[64,2048]) {\n"
                            "  %y = o_proj_b(%x, %w) {group = 1} : i32[T,64]\n  return %y\n}\n"),
    # 4 row blocks of 64 (the last partial) × 11 output tiles 256 wide on 16 SPMD blocks: three tiles share
    # their activations per task in a loop over 768-wide column blocks (the last partial)
    "o_proj_b_merged": Case("graph @k<T = 200>(%x: i8[T,256], %w: i8[2816,512]) {\n"
                            "  %y = o_proj_b(%x, %w) {group = 1, blocks = 16} : i32[T,2816]\n  return %y\n}\n"),
    "o_proj_b_dequant_bf16": Case(
        "graph @k<T = 16>(%sw: f32[256], %a0: i32[T,256], %s0: f32[T], %a1: i32[T,256], %s1: f32[T]) {\n"
        "  %y = o_proj_b_dequant(%sw, %a0, %s0, %a1, %s1) {out = bf16, tile = [8, 256]} : bf16[T,256]\n"
        "  return %y\n}\n", make_inputs=_oproj_dequant_inputs),
    # N = 2048: blocks of 8 rows in 64 KiB tiles of 8 rows, the last block partial (valid_shape), f32 partial
    "o_proj_b_dequant_blocks": Case(
        "graph @k<T = 20>(%sw: f32[2048], %a0: i32[T,2048], %s0: f32[T], %a1: i32[T,2048], %s1: f32[T]) {\n"
        "  %y = o_proj_b_dequant(%sw, %a0, %s0, %a1, %s1) {out = f32, tile = [8, 256], tail = clamp} : f32[T,2048]\n"
        "  return %y\n}\n", make_inputs=_oproj_dequant_inputs),
    "hc_pre_rms": Case("graph @k<T = 20>(%x: f32[T,4,256]) {\n"
                       "  %y = hc_pre_rms(%x) {tile = [8, 128], tail = clamp} : f32[T]\n  return %y\n}\n",
                       ulps=None, rel=2e-6),
    # T = 40: one whole 32-row block (partials assembled from the cube task) and a partial one
    "hc_pre_linear_atomic": Case("graph @k<T = 40>(%x: f32[T,4,64], %fn: f32[24,256], %acc: f32[T,24] inout) {\n"
                                 "  %y = hc_pre_linear(%x, %fn, %acc) {k_split = 4, tile = [8, 64], tail = clamp}"
                                 " : f32[T,24]\n  return %y\n}\n", ulps=None, rel=5e-5),
    "hc_pre_linear_ordered": Case("graph @k<T = 40>(%x: f32[T,4,64], %fn: f32[24,256]) {\n"
                                  "  %y = hc_pre_linear(%x, %fn) {accumulate = ordered, k_split = 2, tile = [8, 64]}"
                                  " : f32[2*T,24]\n  return %y\n}\n", ulps=None, rel=5e-5),
    "hc_pre_linear_reduce": Case("graph @k<T = 20>(%p: f32[4*T,24]) {\n"
                                 "  %y = hc_pre_linear_reduce(%p) {k_split = 4} : f32[T,24]\n  return %y\n}\n"),
    "mix_x": Case("graph @k<T = 20>(%x: f32[T,4,256], %pre: f32[T,4]) {\n"
                  "  %y = mix_x(%x, %pre) {tile = [8, 64], tail = clamp} : bf16[T,256]\n  return %y\n}\n"),
    # mix_x then rmsnorm in one task per row block (fuse-mix-x-rms-norm): 20 rows in blocks of 8 (the last partial);
    # the norm's rsqrt is pypto's, one bf16 ulp from numpy's on rare points (as the rmsnorm template's own case)
    "mix_x_rms_norm": Case("graph @k<T = 20>(%x: f32[T,4,256], %pre: f32[T,4], %w: bf16[256]) {\n"
                           "  %y = mix_x_rms_norm(%x, %pre, %w) {tile = [8], tail = clamp} : bf16[T,256]\n"
                           "  return %y\n}\n", ulps=1),
    # one block per token: one token per task
    "hc_post": Case("graph @k<T = 12>(%a: bf16[T,256], %x: f32[T,4,256], %post: f32[T,4], %comb: f32[T,4,4]) {\n"
                    "  %y = hc_post(%a, %x, %post, %comb) {tile = [8, 1], tail = clamp, blocks = 12}"
                    " : f32[T,4,256]\n  return %y\n}\n"),
    # one block: groups of 4 tokens per task (3) and two tail tokens
    "hc_post_groups": Case("graph @k<T = 14>(%a: bf16[T,256], %x: f32[T,4,256], %post: f32[T,4],"
                           " %comb: f32[T,4,4]) {\n"
                           "  %y = hc_post(%a, %x, %post, %comb) {tile = [8, 1], tail = clamp} : f32[T,4,256]\n"
                           "  return %y\n}\n"),
    "split_pre_post": Case("graph @k<T = 20>(%m: f32[T,24], %inv: f32[T], %s: f32[3], %b: f32[24]) {\n"
                           "  %pre, %post = split_pre_post(%m, %inv, %s, %b) {tile = [8], tail = clamp}"
                           " : f32[T,4], f32[T,4]\n  return %pre, %post\n}\n", ulps=None, rel=1e-6),
    # T = 20: one whole 16-token block (tokens as the wide last dim) and 4 single-token tail iterations
    "comb_sinkhorn": Case("graph @k<T = 20>(%m: f32[T,24], %inv: f32[T], %s: f32[3], %b: f32[24]) {\n"
                          "  %c = comb_sinkhorn(%m, %inv, %s, %b) {tile = [8], tail = clamp} : f32[T,4,4]\n"
                          "  return %c\n}\n", ulps=None, rel=1e-5),
    "qr_rms_norm_quant": Case("graph @k<T = 20>(%qa: f32[T,64], %g: f32[64]) {\n"
                              "  %q, %s = qr_rms_norm_quant(%qa, %g) {tile = [8], tail = clamp} : i8[T,64], f32[T]\n"
                              "  return %q, %s\n}\n", ulps={"qr": 1, "scale": 8}),  # mean: pairwise vs tile sum
    "idx_weights_reduce_narrow": Case("graph @k<T = 20>(%p: f32[4,T,4]) {\n"
                                      "  %w = idx_weights_reduce(%p) {scale = 0.25} : f32[T,4]\n  return %w\n}\n"),
    "idx_weights_reduce": Case("graph @k<T = 20>(%p: f32[4,T,32]) {\n"
                               "  %w = idx_weights_reduce(%p) {scale = 0.25} : f32[T,32]\n  return %w\n}\n"),
    "kv_touch": Case("graph @k<T = 4>(%c: bf16[40,64] inout) {\n"
                     "  %c2 = kv_touch(%c) : bf16[40,64]\n  return %c2\n}\n"),
    "o_local_bridge": Case("graph @k<T = 20>(%x: bf16[T,64]) {\n"
                           "  %y = o_local_bridge(%x) : bf16[T,64]\n  return %y\n}\n"),
}


@pytest.fixture(scope="module")
def batch():
    return run_cases(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_family_template_matches_numpy_reference(batch, case):
    task, job, res = batch[case]
    check_case(CASES[case], job, res)
