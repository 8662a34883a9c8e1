"""The pypto 0.2.0 templates of the core op kinds, run through the harness against the numpy references.

One module-level batch: every case is lowered, its kernel rendered from the template, and all kernels run
in `full` mode (SIM + pass-verify with our CPU-numerics fix) in harness workers. Small integer inputs
make every sum exact, so matmuls and adds must match bit for bit; float-normal inputs check rounding.
"""
from __future__ import annotations

import numpy as np
import pytest

from dspark_ir import parse_graph, verify
from lowering import build_task_graph
from lowering.pypto_exec import check_kernels, run_pypto
from tests.lowering.pypto_cases import Case, check_case, run_cases

pytestmark = pytest.mark.pypto

# Small integer inputs make every sum exact (matmul, add: bit for bit); normal inputs check rounding.
CASES = {
    "rmsnorm_f32_tail": Case("graph @k<T = 20>(%x: f32[T,64], %w: f32[64]) {\n"
                             "  %y = rmsnorm(%x, %w) {tile = [8], tail = clamp} : bf16[T,64]\n  return %y\n}\n",
                             ulps=1),
    "rmsnorm_bf16": Case("graph @k<T = 16>(%x: bf16[T,256], %w: bf16[256]) {\n"
                         "  %y = rmsnorm(%x, %w) : bf16[T,256]\n  return %y\n}\n", ulps=1),
    "matmul_bf16_f32": Case("graph @k<T = 20>(%a: bf16[T,64], %b: bf16[64,48]) {\n"
                            "  %y = matmul(%a, %b) : f32[T,48]\n  return %y\n}\n", integers=True),
    "matmul_bf16_bf16_trans": Case("graph @k<T = 16>(%a: bf16[T,64], %b: bf16[32,64]) {\n"
                                   "  %y = matmul(%a, %b) {out = bf16, trans_b = true} : bf16[T,32]\n  return %y\n}\n",
                                   integers=True),
    "matmul_i8_i32": Case("graph @k<T = 16>(%a: i8[T,128], %b: i8[128,32]) {\n"
                          "  %y = matmul(%a, %b) {out = i32} : i32[T,32]\n  return %y\n}\n", integers=True),
    "matmul_atomic_split_k": Case(
        "graph @k<T = 24>(%a: bf16[T,128], %b: bf16[128,64], %acc: f32[T,64] inout) {\n"
        "  %y = matmul(%a, %b, %acc) {accumulate = atomic, k_split = 4, tile = [16, 64, 32], tail = clamp}"
        " : f32[T,64]\n  return %y\n}\n", integers=True),
    # K = 2816 in L1 k tiles of 1280 (the deepest multiple of the L0 k tile that L1 holds): a shorter last step
    "matmul_deep_k": Case("graph @k<T = 32>(%a: bf16[T,2816], %b: bf16[2816,256]) {\n"
                          "  %y = matmul(%a, %b) : f32[T,256]\n  return %y\n}\n", integers=True),
    # n = 640 in a loop over 224-wide column blocks, the last partial (valid_shape), on b^T and on int8
    "matmul_trans_col_blocks": Case("graph @k<T = 40>(%a: bf16[T,128], %b: bf16[640,128]) {\n"
                                    "  %y = matmul(%a, %b) {trans_b = true} : f32[T,640]\n  return %y\n}\n",
                                    integers=True),
    "matmul_i8_col_blocks": Case("graph @k<T = 40>(%a: i8[T,256], %b: i8[256,640]) {\n"
                                 "  %y = matmul(%a, %b) {out = i32} : i32[T,640]\n  return %y\n}\n", integers=True),
    # n = 640 in a loop over 224-wide column blocks: the adds run on [32, 224] tiles; the last row block and
    # the last column block partial
    "matmul_atomic_blocks": Case(
        "graph @k<T = 40>(%a: bf16[T,512], %b: bf16[512,640], %acc: f32[T,640] inout) {\n"
        "  %y = matmul(%a, %b, %acc) {accumulate = atomic, k_split = 2, tile = [32, 256, 256], tail = clamp}"
        " : f32[T,640]\n  return %y\n}\n", integers=True),
    "add_bf16": Case("graph @k<T = 20>(%a: bf16[T,96], %b: bf16[T,96]) {\n"
                     "  %y = add(%a, %b) : bf16[T,96]\n  return %y\n}\n"),
    "mul_f32_3d": Case("graph @k<T = 8>(%a: f32[T,4,64], %b: f32[T,4,64]) {\n"
                       "  %y = mul(%a, %b) : f32[T,4,64]\n  return %y\n}\n"),
    "cast_f32_bf16": Case("graph @k<T = 20>(%x: f32[T,64]) {\n"
                          "  %y = cast(%x) {to = bf16} : bf16[T,64]\n  return %y\n}\n"),
    "cast_bf16_f32": Case("graph @k<T = 16>(%x: bf16[T,64]) {\n"
                          "  %y = cast(%x) {to = f32} : f32[T,64]\n  return %y\n}\n"),
    "cast_f32_i32": Case("graph @k<T = 16>(%x: f32[T,64]) {\n"
                         "  %y = cast(%x) {to = i32} : i32[T,64]\n  return %y\n}\n"),
    "cast_f32_i8": Case("graph @k<T = 16>(%x: f32[T,64]) {\n"
                        "  %y = cast(%x) {to = i8} : i8[T,64]\n  return %y\n}\n"),
    "cast_i32_f32": Case("graph @k<T = 16>(%x: i32[T,64]) {\n"
                         "  %y = cast(%x) {to = f32} : f32[T,64]\n  return %y\n}\n", integers=True),
    "zeros": Case("graph @k<T = 20>() {\n  %y = zeros() {shape = [T, 64]} : f32[T,64]\n  return %y\n}\n"),
    "reshape_copy": Case("graph @k<T = 8>(%x: f32[T,64]) {\n"
                         "  %s = mul(%x, %x) : f32[T,64]\n"
                         "  %c = slice(%s) {axis = 1, start = 16, size = 32} : f32[T,32]\n"
                         "  %y = reshape(%c) {shape = [T*32]} : f32[T*32]\n  return %y\n}\n"),
    "concat_copy": Case("graph @k<T = 8>(%x: f32[T,64], %z: f32[T,32]) {\n"
                        "  %s = mul(%x, %x) : f32[T,64]\n"
                        "  %y = concat(%s, %z) {axis = 1} : f32[T,96]\n  return %y\n}\n"),
}


@pytest.fixture(scope="module")
def batch():
    return run_cases(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_template_matches_numpy_reference(batch, case):
    task, job, res = batch[case]
    check_case(CASES[case], job, res)
    assert res.verify and not [r for r in res.verify if r.pass_name == "tensor_graph" and not r.passed]


def test_whole_graph_through_pypto_matches_numpy():
    """mlp.dsir end to end: 6 kernels in dependency waves, outputs bit-equal on exact inputs."""
    from lowering import run_numpy
    from lowering.pypto_exec import PyptoReport
    from tests.lowering.conftest import load, seeded_inputs

    g = load("mlp")
    tg = build_task_graph(g)
    inputs = seeded_inputs(g, integers=True)
    report = PyptoReport()
    out = run_pypto(tg, inputs, report=report)
    ref = run_numpy(tg, inputs)
    assert not report.fallbacks and not report.failed
    for k in ref:
        assert np.array_equal(out[k], ref[k]), k


def test_flash_shapes_compile():
    """Core kernels at flash sizes (T = 512, hidden 4096) compile to the execute graph."""
    text = ("graph @flash<T = 512>(%x: f32[T,4096], %w: f32[4096], %wq: bf16[4096,1024], %wi: i8[1024,512]) {\n"
            "  %n = rmsnorm(%x, %w) {tile = [8]} : bf16[T,4096]\n"
            "  %seed = zeros() {shape = [T, 1024]} : f32[T,1024]\n"
            "  %q = matmul(%n, %wq, %seed) {accumulate = atomic, k_split = 2, tile = [64, 128, 256]} : f32[T,1024]\n"
            "  %qi = cast(%q) {to = i8} : i8[T,1024]\n"
            "  %p = matmul(%qi, %wi) {out = i32} : i32[T,512]\n"
            "  %pf = cast(%p) {to = f32} : f32[T,512]\n"
            "  %r = add(%pf, %pf) : f32[T,512]\n"
            "  return %r\n}\n")
    g = parse_graph(text, "<flash>")
    verify(g)
    runs = check_kernels(build_task_graph(g), "compile")
    assert len(runs) == 7 and all(r.ok for r in runs), [r.error for r in runs if not r.ok]


def test_cli_lower_records_cycles(tmp_path, capsys):
    """`dspark lower --cycles`: every templated kernel simulated, its Total Cycles in tasks.json."""
    import json

    from dspark_cli.main import main
    from tests.lowering.conftest import GRAPHS

    out = tmp_path / "out"
    assert main(["lower", str(GRAPHS / "mlp.dsir"), "--cycles", "--compile", "-o", str(out)]) == 0
    doc = json.loads((out / "tasks.json").read_text())
    cycles = [t["cycles"] for t in doc["tasks"]]
    assert all(isinstance(c, int) and c > 0 for c in cycles), cycles
    assert doc["counts"]["cycles_total"] == sum(cycles)
    assert all(r["ok"] for r in doc["checks"]["compile"]) and len(doc["checks"]["sim"]) == 6
    assert "cost-model cycles" in capsys.readouterr().out
    assert "cycles" in (out / "tasks.dot").read_text()
