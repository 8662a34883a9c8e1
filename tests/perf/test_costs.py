"""Cost sources (perf/costs.py): cache keys, the swimlane reader, the cache, the roofline fallback."""
from __future__ import annotations

import json

import pytest

from dspark_ir import layers
from lowering import build_task_graph
from perf.costs import (
    LOCAL_PART_NOTE,
    KernelCost,
    PyptoCosts,
    cost_key,
    kernel_source,
    local_part_source,
    roofline_cost,
)
from perf.executors import SimOutcome, parse_swimlane, read_swimlanes


@pytest.fixture(scope="module")
def tg():
    return build_task_graph(layers.build("decode-swa", config="tiny"))


def test_kernel_source_renames_the_entry(tg):
    t = tg.task("attn.rms_norm")
    src = kernel_source(t)
    assert src.startswith("import pypto") and "\ndef kernel(" in src and f"def {t.kernel}(" not in src


def test_kernel_source_is_the_generator_s_kernel_named_kernel(tg):
    """The hashed text: the prelude and the task's function as lowering.codegen.generate writes it under the name
    `kernel`, with the task graph's resolved template or a fresh look-up alike."""
    from kernels.pto import module_prelude
    from lowering.codegen import generate, template_of

    for t in tg.kernels:
        if t.collective or template_of(t, tg) is None:
            continue
        src = kernel_source(t, tg)
        assert src == kernel_source(t) == module_prelude() + "\n\n" + generate(t, template_of(t, tg), name="kernel")


def test_same_body_same_key_changed_body_new_key(tg):
    import dataclasses

    a = tg.task("attn.rms_norm")
    b = dataclasses.replace(a, id=99, name="other.rms_norm", kernel="other_rms_norm")   # another task, same kernel
    assert kernel_source(a) == kernel_source(b)
    assert cost_key(a, kernel_source(a)) == cost_key(b, kernel_source(b))
    assert cost_key(a, kernel_source(a)) != cost_key(a, kernel_source(a) + "\n# changed\n")


def test_parse_swimlane(tmp_path):
    lanes = [{"blockIdx": 0, "coreType": "AIC", "tasks": [{"execStart": 100, "execEnd": 300}]},
             {"blockIdx": 1, "coreType": "AIV", "tasks": [{"execStart": 150, "execEnd": 250},
                                                         {"execStart": 260, "execEnd": 400}]},
             {"blockIdx": 2, "coreType": "AIV", "tasks": []},
             # pypto's control tasks: a root in the program start-up and a sink after its dependency resolution
             {"blockIdx": 3, "coreType": "HUB", "tasks": [{"execStart": 20, "execEnd": 21},
                                                         {"execStart": 900, "execEnd": 901}]}]
    path = tmp_path / "_simulate.swim.json"
    path.write_text(json.dumps(lanes))
    assert parse_swimlane(path) == {"first": 100.0, "last": 400.0, "cube": 200.0, "vector": 240.0}


def test_cache_round_trip_and_offline_fallback(tg, tmp_path):
    src = PyptoCosts(cache=tmp_path, offline=True)
    t = tg.task("attn.rms_norm")
    costs = src.costs(tg, [t.id])
    assert costs[t.id].source == "roofline" and "no cached cost-model result" in costs[t.id].note
    # a finished run, as the harness reports it, lands in the cache; the next lookup is a hit
    art = tmp_path / "art" / "call" / "CostModelSimulationOutput"
    art.mkdir(parents=True)
    (art / "_simulate.swim.json").write_text(json.dumps(
        [{"coreType": "AIV", "tasks": [{"execStart": 9000, "execEnd": 12600}]}]))
    res = SimOutcome(True, cycles=12600, tasks=1, lanes=read_swimlanes(tmp_path / "art"))
    key = cost_key(t, kernel_source(t))
    assert src._record(t, key, res)
    hit = PyptoCosts(cache=tmp_path, offline=True).costs(tg, [t.id])[t.id]
    assert hit == KernelCost("pypto", 3600.0, 0.0, 3600.0, total=12600, pypto_tasks=1)
    # a template error is cached as a roofline estimate with the reason; a timeout is not cached
    u = tg.task("hc.hc_post")
    failed = cost_key(u, kernel_source(u) or "x")
    assert src._record(u, failed, SimOutcome(False, "Record function failed: bad"))
    assert json.loads((tmp_path / f"{failed}.json").read_text())["note"] == "pypto failed: Record function failed: bad"
    assert not src._record(t, "other", SimOutcome(False, "timed out after 5 s (worker killed)"))
    assert not (tmp_path / "other.json").exists()


def test_untemplated_and_collective_tasks_fall_back_to_the_roofline(tg, tmp_path):
    """A collective without a local part (the window release and the CP all-gather's row mask) is a roofline
    estimate; the others costed from their local part (here offline with an empty cache: roofline until a run
    is cached)."""
    src = PyptoCosts(cache=tmp_path, offline=True)
    coll = [t for t in tg.kernels if t.collective]
    costs = src.costs(tg, [t.id for t in coll])
    assert {t.op for t in coll} >= {"o_group_a2a", "tp_o_reduce_scatter", "window_copy_out", "cp_allgather"}
    for t in coll:
        local = kernel_source(t, tg) or local_part_source(t)
        assert costs[t.id].source == "roofline"
        assert ("no cached cost-model result" if local else "collective") in costs[t.id].note, t.op
        assert (local is None) == (t.op in ("window_release", "cp_own_rows")), t.op
    dummy = next(t for t in tg.tasks if t.is_dummy)
    assert src.costs(tg, [dummy.id])[dummy.id].source == "dummy"
    rc = roofline_cost(tg.task("swa.swa_gather_kv"))
    assert rc.span > 0 and rc.work_vector >= rc.span


def test_a_collective_s_local_part_is_costed_and_labelled(tg, tmp_path):
    """The reduce-scatter's local part (its ordered sum of tp row slices) is what the cost model runs; a cached
    run of it is its cost, labelled as the local part only. Never a lowering template."""
    from lowering.codegen import find_template

    t = next(t for t in tg.kernels if t.op == "tp_o_reduce_scatter")
    assert find_template(t, tg.ranks) is None and kernel_source(t, tg) is None
    src_text = local_part_source(t)
    assert "\ndef kernel(" in src_text and src_text.count("pypto.add(") == int(t.attrs["tp"]) - 1
    src = PyptoCosts(cache=tmp_path, offline=True)
    art = tmp_path / "art" / "call" / "CostModelSimulationOutput"
    art.mkdir(parents=True)
    (art / "_simulate.swim.json").write_text(json.dumps(
        [{"coreType": "AIV", "tasks": [{"execStart": 9000, "execEnd": 10800}]}]))
    assert src._record(t, cost_key(t, src_text), SimOutcome(True, cycles=10800, tasks=1,
                                                            lanes=read_swimlanes(tmp_path / "art")))
    got = src.costs(tg, [t.id])[t.id]
    assert got.source == "pypto" and got.span == 1800.0 and got.note == LOCAL_PART_NOTE


@pytest.mark.pypto
def test_pypto_costs_of_a_tiny_layer_kernel(tg, tmp_path):
    """One small kernel through pypto's cost model (SIM), then from the cache."""
    t = tg.task("attn.rms_norm")
    src = PyptoCosts(cache=tmp_path, workers=1, timeout=600)
    c = src.costs(tg, [t.id])[t.id]
    assert c.source == "pypto" and c.span > 0 and c.work_vector + c.work_cube > 0 and c.total >= c.span
    assert src.ran == 1
    again = PyptoCosts(cache=tmp_path, offline=True)
    assert again.costs(tg, [t.id])[t.id] == c and again.hits == 1
