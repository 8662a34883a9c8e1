"""pypto 0.2.0 templates of the prefill compressor (prefill_cmp_pool, prefill_cmp_finish_write), run through the
harness (full mode: SIM + pass-verify with our CPU-numerics fix) against the numpy references.

Jobs: every prefill compressor task of the tiny TP1 prefill-csa (ratio 4 with the overlap, and the indexer's
compressor) and prefill-hca (ratio 16) layers on the layers' own data, at
* a 7-token chunk from position 9 (not a multiple of either ratio: the first window mixes rows of the ring state
  as received with rows of the chunk; CSA: the overlap's previous window lies wholly in the state);
* a 12-token CSA chunk from position 9: the ring (16 rows) wraps inside the chunk, so positions 16…20 overwrite the
  ring rows of positions 0…4 while the window of position 11 still reads position 4 as received (the state is
  read before it is written), and a later token wins a ring row;
* a 6-token CSA chunk from position 0: the overlap's previous window of position 3 lies before position 0;
plus edge variants (inputs changed, goldens recomputed): an unmapped state page inside a window and under the
chunk's own writes (those rows masked / not written), and at the finish a −1 slot at a window-closing token and a
slot shared by two closing tokens (the later one wins).

Comparisons (always: res.ok, inputs untouched, pypto's tensor-graph + 6 default pass-verify rows all PASS):
* the state output of prefill_cmp_pool: bitwise (data movement);
* pooled: pypto's row sums over the window and the CPU calculator's exp (torch's, up to 2 ulps off numpy's) are
  not numpy's, so per point |Δ| ≤ (rows + 4)·2⁻²⁴·Σ_rows |kv|·w (any summation order of the two row sums plus
  the exp), with Σ |kv|·w the reference pool of |kv|; zero where the reference is zero (tokens closing no window);
* prefill_cmp_finish_write: bitwise equal to the reference evaluated with the calculator's sqrt
  (tests/kernels/test_templates_swa.py `calculator_libm`), and within 1 bf16 ulp of the plain reference.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.kernels.test_templates_csa import job_variant, reference_outputs
from tests.kernels.test_templates_swa import ulp_units

pytestmark = pytest.mark.pypto

OPS = ("prefill_cmp_pool", "prefill_cmp_finish_write")
F32_U = 2.0 ** -24


def _layer_jobs(layer: str, prefix: str, chunk: int, start: int) -> dict:
    """{name: (task, job)} of the prefill compressor tasks of the tiny TP1 layer on its own data."""
    import passes
    import runner
    from dspark_ir import layers
    from lowering import build_task_graph
    from lowering.executors import Memory, run_task
    from lowering.pypto_exec import kernel_job

    g = passes.run_pipeline(layers.build(layer, config="tiny", tp=1, chunk=chunk, start=start)).graph
    tg = build_task_graph(g)
    mem = Memory(tg, runner.layer_inputs(g, 0, "default"))
    out = {}
    for t in tg.tasks:
        if t.is_dummy:
            continue
        if t.op in OPS:
            out[f"{prefix}{t.name}"] = (t, kernel_job(t, tg, mem, "full", True, ("T",)))
        run_task(t, [mem])
    return out


def _closing(positions, ratio: int) -> np.ndarray:
    return np.flatnonzero((np.asarray(positions, np.int64) + 1) % ratio == 0)


def _edges(base: dict) -> dict:
    out = {}
    # chunk 9…15: its own ring page (positions 8…15) unmapped: no state write, position 8 of the window masked
    task, job = base["csa7:cmp.prefill_pool"]
    table = job.inputs["state_block_table"].copy()
    table[0, 1] = -1
    out["edge7:cmp.prefill_pool"] = (task, job_variant(task, job, state_block_table=table))
    # chunk 9…20: the page of positions 0…7 unmapped: the window of position 11 loses 4…7 (8 from page 1), the
    # wrapped writes of positions 16…20 are skipped
    task, job = base["csa12:cmp.prefill_pool"]
    table = job.inputs["state_block_table"].copy()
    table[0, 0] = -1
    out["edge12:cmp.prefill_pool"] = (task, job_variant(task, job, state_block_table=table))
    # finish of chunk 9…20 (closing positions 11, 15, 19): the first slot −1, the third shares the second's slot
    task, job = base["csa12:cmp.prefill_finish_write"]
    slots = job.inputs["slot_mapping"].copy()
    hits = _closing(job.inputs["positions"], int(task.attrs["ratio"]))
    slots[hits[0]] = -1
    slots[hits[2]] = slots[hits[1]]
    out["edge12:cmp.prefill_finish_write"] = (task, job_variant(task, job, slot_mapping=slots))
    return out


@pytest.fixture(scope="module")
def prefill_jobs():
    base = _layer_jobs("prefill-csa", "csa7:", 7, 9)
    base |= _layer_jobs("prefill-hca", "hca7:", 7, 9)
    base |= _layer_jobs("prefill-csa", "csa12:", 12, 9)
    base |= _layer_jobs("prefill-csa", "csa0:", 6, 0)
    return base | _edges(base)


@pytest.fixture(scope="module")
def prefill_batch(prefill_jobs):
    from kernels.pypto_rt import run_jobs

    names = list(prefill_jobs)
    results = run_jobs([prefill_jobs[n][1] for n in names], 900, workers=2)
    return {n: (prefill_jobs[n][0], prefill_jobs[n][1], r) for n, r in zip(names, results)}


NAMES = ["csa7:cmp.prefill_pool", "csa7:cmp.prefill_finish_write", "csa7:icmp.prefill_pool",
         "hca7:cmp.prefill_pool", "hca7:cmp.prefill_finish_write",
         "csa12:cmp.prefill_pool", "csa12:cmp.prefill_finish_write", "csa12:icmp.prefill_pool",
         "csa0:cmp.prefill_pool", "csa0:cmp.prefill_finish_write", "csa0:icmp.prefill_pool",
         "edge7:cmp.prefill_pool", "edge12:cmp.prefill_pool", "edge12:cmp.prefill_finish_write"]


def _pool_scale(task, job) -> np.ndarray:
    """Σ_rows |kv|·w per (token, channel): the reference pool of |kv| (chunk rows and the state's kv columns)."""
    inputs = dict(job.inputs)
    out_dim = inputs["kv"].shape[1]
    state = inputs["state_in"].copy()
    state[:, :out_dim] = np.abs(state[:, :out_dim])
    inputs |= {"kv": np.abs(inputs["kv"]), "state_in": state}
    return reference_outputs(task, inputs)["pooled"].astype(np.float64)


def _check(task, job, res) -> None:
    assert res.ok, f"{res.error}\n{res.log[-3000:]}"
    assert not res.clobbered
    assert res.verify and not res.verify_failed, [str(r) for r in res.verify_failed]
    if task.op == "prefill_cmp_pool":
        got, want = res.outputs["state"], job.goldens["state"]
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), "state differs"
        got, want = res.outputs["pooled"].astype(np.float64), job.goldens["pooled"]
        rows = (2 if task.attrs["overlap"] else 1) * int(task.attrs["ratio"])
        bound = (rows + 4) * F32_U * _pool_scale(task, job)
        assert np.all(np.abs(got - want) <= bound), f"pooled: max |Δ| {np.abs(got - want).max()}"
        assert np.array_equal(got == 0, want == 0), "pooled: zero rows differ"
        return
    calc = reference_outputs(task, job.inputs, libm=True)["cmp_kv"]
    got, want = res.outputs["cmp_kv"], job.goldens["cmp_kv"]
    assert np.array_equal(got.view(np.uint16), calc.view(np.uint16)), "cmp_kv differs from the reference under " \
                                                                     "the calculator's sqrt"
    assert ulp_units(got, want).max(initial=0) <= 1


def test_batch_covers_both_ops(prefill_batch):
    assert sorted(prefill_batch) == sorted(NAMES)
    assert {task.op for task, _, _ in prefill_batch.values()} == set(OPS)


@pytest.mark.parametrize("name", NAMES)
def test_prefill_task_matches_reference(prefill_batch, name):
    task, job, res = prefill_batch[name]
    _check(task, job, res)


def test_jobs_reach_what_they_claim(prefill_batch):
    """Non-vacuity: ragged starts, the overlap, the ring wrap, entries pooled with rows from the state and with
    missing rows, stores skipped and overwritten."""
    def pos(name):
        return prefill_batch[name][1].inputs["positions"]

    for name, first in (("csa7:cmp.prefill_pool", 9), ("hca7:cmp.prefill_pool", 9), ("csa12:cmp.prefill_pool", 9),
                        ("csa0:cmp.prefill_pool", 0)):
        task, job, _ = prefill_batch[name]
        assert pos(name)[0] == first and np.array_equal(pos(name), first + np.arange(len(pos(name))))
        pooled = job.goldens["pooled"]
        hits = _closing(pos(name), int(task.attrs["ratio"]))
        assert len(hits) and (pooled[hits] != 0).any(1).all() and not np.delete(pooled, hits, 0).any(), name
    assert prefill_batch["csa7:cmp.prefill_pool"][0].attrs["overlap"]
    assert not prefill_batch["hca7:cmp.prefill_pool"][0].attrs["overlap"]
    # the wrap: more tokens than ring rows past the window, so a written ring row held a row the pool reads
    task, job, _ = prefill_batch["csa12:cmp.prefill_pool"]
    assert len(pos("csa12:cmp.prefill_pool")) + 2 * int(task.attrs["ratio"]) > job.inputs["state_in"].shape[0]
    for edge, base in (("edge7:cmp.prefill_pool", "csa7:cmp.prefill_pool"),
                       ("edge12:cmp.prefill_pool", "csa12:cmp.prefill_pool")):
        e, b = prefill_batch[edge][1].goldens, prefill_batch[base][1].goldens
        assert not np.array_equal(e["pooled"], b["pooled"]) and not np.array_equal(e["state"], b["state"])
    _, job, _ = prefill_batch["edge12:cmp.prefill_finish_write"]
    assert (job.goldens["cmp_kv"] != job.inputs["cmp_kv_in"]).any()
    base = prefill_batch["csa12:cmp.prefill_finish_write"][1]
    assert not np.array_equal(job.goldens["cmp_kv"], base.goldens["cmp_kv"])
