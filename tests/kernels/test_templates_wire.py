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
from kernels import wire as wire_templates
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


# 6 wire rows per loop step: T = 16 rows run as blocks of 6, 6 and a partial 4, so the looped form (every flash
# instance) is checked too, not only the one-block form
LOOPED_BLOCK_BYTES = 6 * 2 * (4 * W + K)


def _sources(block_bytes: int) -> tuple[str, str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(wire_templates, "BLOCK_BYTES", block_bytes)
        return (template_for(CpWirePack)(_pack_spec()), template_for(CpWireUnpack)(_unpack_spec()))


def test_the_looped_form_runs_partial_row_blocks():
    pack, unpack = _sources(LOOPED_BLOCK_BYTES)
    for source in (pack, unpack):
        assert "pypto.loop(" in source and "valid = pypto.min(rows - r0, 6)" in source


@pytest.fixture(scope="module")
def batch():
    from kernels.pypto_rt import KernelJob, run_jobs

    v, s, k = _inputs()
    wire = cp_wire_pack(v, s, k)
    typed = dict(zip(PARTS, cp_wire_unpack(wire, width=W, kv=K)))
    jobs, names = [], []
    for form, block_bytes in (("one-block", wire_templates.BLOCK_BYTES), ("looped", LOOPED_BLOCK_BYTES)):
        pack, unpack = _sources(block_bytes)
        jobs += [KernelJob(module_prelude() + "\n\n" + pack, "k_pack", {"values": v, "scores": s, "kv": k},
                           {"out": (wire.shape, wire.dtype)}, mode="full", label=f"pack-{form}",
                           goldens={"out": wire}),
                 KernelJob(module_prelude() + "\n\n" + unpack, "k_unpack", {"wire": wire},
                           {p: (a.shape, a.dtype) for p, a in typed.items()}, mode="full", label=f"unpack-{form}",
                           goldens=typed)]
        names += [(f"pack-{form}", {"out": wire}), (f"unpack-{form}", typed)]
    results = run_jobs(jobs, workers=2)
    return {name: (res, want) for (name, want), res in zip(names, results)}


@pytest.mark.pypto
@pytest.mark.parametrize("name", ["pack-one-block", "unpack-one-block", "pack-looped", "unpack-looped"])
def test_wire_templates_in_pypto_match_the_reference_bitwise(batch, name):
    res, want = batch[name]
    assert res.ok, f"{res.error}\n{res.log[-3000:]}"
    for param, expected in want.items():
        got = res.outputs[param]
        assert got.shape == expected.shape and np.array_equal(got.view(np.uint8), np.asarray(expected).view(np.uint8))
