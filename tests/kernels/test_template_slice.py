"""The pypto 0.2.0 template of `slice` (kernels/elementwise.py), run in pypto on CPU against the numpy reference.

The lowering makes every slice a strided view of its operand (lowering/build.py VIEW_RULES), so no layer
emits it as a kernel task; its template is the copy form for a view rule that declines, the worked example of
kernels/README.md. The kernels are rendered from hand-built `KernelSpec`s (no task graph has a slice task) and
run in one batch, `full` mode (SIM + pass-verify). Tolerance: bitwise (pure data movement).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dspark_ir.ops.core import Slice
from dspark_ir.semantics.elementwise import slice_
from kernels.pto import KernelSpec, TensorArg, module_prelude
from kernels.registry import template_for

NP = {"bf16": ml_dtypes.bfloat16, "f32": np.float32, "i32": np.int32}

# name: (input shape, dtype, axis, start, size)
CASES = {
    "rows_bf16": ((24, 64), "bf16", 0, 5, 11),
    "cols_f32": ((8, 96), "f32", 1, 32, 48),
    "cols_unaligned_bf16": ((8, 64), "bf16", 1, 3, 20),
    "middle_axis_f32": ((4, 6, 32), "f32", 1, 2, 3),
    "last_i32": ((16, 40), "i32", 1, 8, 32),
}


def _spec(name: str, shape, dtype: str, axis: int, start: int, size: int) -> KernelSpec:
    out_shape = list(shape)
    out_shape[axis] = size
    return KernelSpec(name, "slice", (TensorArg("x", tuple(shape), dtype),),
                      (TensorArg("out", tuple(out_shape), dtype),), {"axis": axis, "start": start, "size": size})


def _input(shape, dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "i32":
        return rng.integers(-1000, 1000, shape).astype(np.int32)
    return (rng.standard_normal(shape) * 3).astype(np.float32).astype(NP[dtype])


def test_slice_is_registered_against_its_op():
    assert template_for(Slice).__name__ == "pypto_slice"


def test_slice_renders_one_view_copy():
    source = template_for(Slice)(_spec("k_slice", (8, 96), "f32", 1, 32, 48))
    assert "pypto.view(x, [8, 48], [0, 32])" in source and "pypto.assemble(" in source


@pytest.fixture(scope="module")
def batch():
    from kernels.pypto_rt import KernelJob, run_jobs

    jobs, wants = [], []
    for i, (name, (shape, dtype, axis, start, size)) in enumerate(CASES.items()):
        spec = _spec(f"k_{name}", shape, dtype, axis, start, size)
        x = _input(shape, dtype, i)
        want = slice_(x, axis=axis, start=start, size=size)
        source = module_prelude() + "\n\n" + template_for(Slice)(spec)
        jobs.append(KernelJob(source, spec.name, {"x": x}, {"out": (want.shape, want.dtype)}, mode="full",
                              label=name, goldens={"out": want}))
        wants.append(want)
    results = run_jobs(jobs, workers=2)
    return dict(zip(CASES, zip(results, wants)))


@pytest.mark.pypto
@pytest.mark.parametrize("name", sorted(CASES))
def test_slice_in_pypto_matches_the_reference_bitwise(batch, name):
    res, want = batch[name]
    assert res.ok, f"{res.error}\n{res.log[-3000:]}"
    assert not res.clobbered
    got = res.outputs["out"]
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), name
