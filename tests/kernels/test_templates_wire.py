"""The pypto 0.2.0 templates of the CP payloads' wire form (kernels/wire.py: cp_wire_pack, cp_wire_unpack; the
unpack's loop is also cp_typed_readback's local part), run in pypto on CPU against the numpy references.
Tolerance: bitwise (a bit reinterpretation, pure data movement)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dspark_ir.ops.collective import CpTypedReadback
from dspark_ir.ops.wire import CpWirePack, CpWireUnpack
from dspark_ir.semantics.wire import cp_wire_pack, cp_wire_unpack
from kernels.pto import KernelSpec, TensorArg, module_prelude
from kernels.registry import template_for

T, W, K = 16, 32, 64
PARTS = ("values", "scores", "kv")


def _pack_spec() -> KernelSpec:
    return KernelSpec("k_pack", "cp_wire_pack", (TensorArg("values", (T, W), "f32"), TensorArg("scores", (T, W), "f32"),
                                                 TensorArg("kv", (T, K), "bf16")),
                      (TensorArg("out", (T, 4 * W + K), "bf16"),), {})


def _unpack_spec(rows: int = T) -> KernelSpec:
    return KernelSpec("k_unpack", "cp_wire_unpack", (TensorArg("wire", (rows, 4 * W + K), "bf16"),),
                      (TensorArg("values", (T, W), "f32"), TensorArg("scores", (T, W), "f32"),
                       TensorArg("kv", (T, K), "bf16")), {"width": W, "kv": K})


def _inputs():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((T, W)).astype(np.float32), rng.standard_normal((T, W)).astype(np.float32),
            rng.standard_normal((T, K)).astype(ml_dtypes.bfloat16))


def test_typed_readback_decodes_with_the_unpack_loop():
    assert template_for(CpTypedReadback) is template_for(CpWireUnpack)


def test_pack_reinterprets_the_f32_rows_as_bf16():
    source = template_for(CpWirePack)(_pack_spec())
    assert "dtype=pypto.DT_BF16" in source and source.count("pypto.assemble(") == 3


@pytest.fixture(scope="module")
def batch():
    from kernels.pypto_rt import KernelJob, run_jobs

    v, s, k = _inputs()
    wire = cp_wire_pack(v, s, k)
    typed = dict(zip(PARTS, cp_wire_unpack(wire, width=W, kv=K)))
    jobs = [KernelJob(module_prelude() + "\n\n" + template_for(CpWirePack)(_pack_spec()), "k_pack",
                      {"values": v, "scores": s, "kv": k}, {"out": (wire.shape, wire.dtype)}, mode="full",
                      label="pack", goldens={"out": wire}),
            KernelJob(module_prelude() + "\n\n" + template_for(CpWireUnpack)(_unpack_spec()), "k_unpack",
                      {"wire": wire}, {p: (a.shape, a.dtype) for p, a in typed.items()}, mode="full",
                      label="unpack", goldens=typed)]
    pack, unpack = run_jobs(jobs, workers=2)
    return {"pack": (pack, {"out": wire}), "unpack": (unpack, typed)}


@pytest.mark.pypto
@pytest.mark.parametrize("name", ["pack", "unpack"])
def test_wire_templates_in_pypto_match_the_reference_bitwise(batch, name):
    res, want = batch[name]
    assert res.ok, f"{res.error}\n{res.log[-3000:]}"
    for param, expected in want.items():
        got = res.outputs[param]
        assert got.shape == expected.shape and np.array_equal(got.view(np.uint8), np.asarray(expected).view(np.uint8))
