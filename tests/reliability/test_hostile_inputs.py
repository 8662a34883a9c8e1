"""Hostile and edge inputs through the whole pipeline: build → verify → default pass pipeline → lowering (lint
clean) → numpy executor. Each case ends in the golden's output (and the interpreter's bits) or in a clear,
located, one-line error; never a traceback. Huge symbolic dims (T = 2**40) compile in bounded memory."""
from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from dspark_cli.main import main
from dspark_ir import parse_file, parse_graph, print_graph, verify
from dspark_ir.errors import ConfigError, DsparkError
from dspark_ir.interp import run
from dspark_ir.layers import build
from goldens.config import config_by_name
from lowering import LoweringError, build_task_graph, lint, run_numpy
from runner import compare_outputs, golden_outputs, layer_inputs

EXAMPLE = Path(__file__).parents[2] / "examples" / "rmsnorm_matmul_rope.dsir"
HUGE_T = 2 ** 40


def default_pipeline(g):
    from passes import run_pipeline

    return run_pipeline(g, use_env=False, check_numerics=False).graph


def through_pipeline(layer: str, regime: str = "default", **params):
    g = build(layer, "tiny", **params)
    verify(g)
    g = default_pipeline(g)
    verify(g)
    tg = build_task_graph(g)
    report = lint(tg)
    assert report.ok, report.summary()
    inputs = layer_inputs(g, 0, regime)
    return g, inputs, run_numpy(tg, inputs)


EDGE_CASES = {
    "swa-window-at-position-0": ("decode-swa", "empty_cmp", {}),
    "swa-first-token-alone": ("decode-swa", "empty_cmp", {"batch": 1, "seq": 1}),
    "swa-window-boundary": ("decode-swa", "window_boundary", {}),
    "csa-empty-compressed-cache": ("decode-csa", "empty_cmp", {}),
    "hca-empty-compressed-cache": ("decode-hca", "empty_cmp", {}),
    "hca-zero-compressed-rows": ("decode-hca", "empty_cmp", {"max_context": 4}),
    "csa-compressed-cache-exactly-at-topk": ("decode-csa", "topk_boundary", {}),
    "csa-topk-bound-by-context": ("decode-csa", "empty_cmp", {"max_context": 4}),
    "swa-ragged-tiles": ("decode-swa", "default", {"batch": 3, "seq": 3}),
    "csa-ragged-tiles": ("decode-csa", "default", {"batch": 3, "seq": 3}),
    "hca-ragged-tiles-tp4": ("decode-hca", "default", {"batch": 3, "seq": 3, "tp": 4}),
    "moe-ragged-tiles": ("moe", "default", {"batch": 3, "seq": 3}),
}


@pytest.mark.parametrize("case", sorted(EDGE_CASES))
def test_edge_inputs_give_the_golden_output(case):
    layer, regime, params = EDGE_CASES[case]
    g, inputs, out = through_pipeline(layer, regime, **params)
    comparisons = compare_outputs(g, out, golden_outputs(g, inputs))
    assert comparisons and all(c.ok for c in comparisons), [c.detail for c in comparisons if not c.ok]
    want = run(g, inputs)
    for got, exp in zip(out if isinstance(out, list) else [out], want if isinstance(want, list) else [want]):
        for k in exp:
            np.testing.assert_array_equal(got[k], exp[k], err_msg=k)


def test_ragged_tiles_really_are_ragged():
    g = build("decode-swa", "tiny", batch=3, seq=3)
    assert g.symbols["T"] == 9 and any(n.attrs.get("tail") == "clamp" for n in g.nodes.values())


# ---- configurations that cannot exist: one-line ConfigErrors ---------------------------------------------------
TINY = config_by_name("tiny")


@pytest.mark.parametrize("layer", ["decode-swa", "decode-csa", "moe"])
@pytest.mark.parametrize("config, tp, message", [
    (TINY.with_(o_groups=2), 4, "tp: 4 does not divide o_groups=2"),
    (TINY.with_(heads=6, o_groups=3, tp=1), 2, "tp: 2 does not divide o_groups=3"),
    (TINY.with_(heads=6, o_groups=6, tp=1), 4, "tp: 4 does not divide o_groups=6"),
    ("tiny", 3, "tp: 3 is not supported for config 'tiny' (choose 1, 2 or 4)"),
    ("flash", 2, "tp: 2 is not supported for config 'flash' (choose 1 or 4)"),
])
def test_tp_that_does_not_divide_the_heads_is_a_one_line_config_error(layer, config, tp, message):
    with pytest.raises(ConfigError) as e:
        build(layer, config, tp=tp)
    assert str(e.value) == message


@pytest.mark.parametrize("params, message", [({"batch": 0}, "batch: must be positive, got 0"),
                                             ({"seq": 0}, "seq: must be positive"),
                                             ({"batch": -2}, "batch: must be positive, got -2")])
def test_empty_batches_are_config_errors(params, message):
    with pytest.raises(ConfigError, match=message):
        build("decode-swa", "tiny", **params)


def dspark(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, message", [
    (["show", "decode-swa", "--tp", "3"], "dspark: tp: 3 is not supported for config 'tiny' (choose 1, 2 or 4)"),
    (["run", "decode-csa", "--tp", "3"], "dspark: tp: 3 is not supported for config 'tiny' (choose 1, 2 or 4)"),
    (["lower", "decode-hca", "--config", "flash", "--tp", "2", "-o", "never"],
     "dspark: tp: 2 is not supported for config 'flash' (choose 1 or 4)"),
    (["run", "decode-swa", "--batch", "0"], "dspark: batch: must be positive, got 0"),
])
def test_cli_config_errors_are_one_line_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = dspark(capsys, *argv)
    assert (code, out, err.strip()) == (2, "", message)
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("argv", [
    ["run", "decode-csa", "--regime", "topk_boundary", "--backend", "numpy"],
    ["run", "decode-swa", "--regime", "empty_cmp", "--batch", "1", "--seq", "1", "--backend", "numpy"],
    ["run", "decode-hca", "--batch", "3", "--seq", "3", "--backend", "shuffled"],
])
def test_cli_runs_edge_inputs_to_the_golden(argv, capsys):
    code, out, err = dspark(capsys, *argv)
    assert code == 0 and err == "" and out.splitlines()[-1].startswith("ok: "), out + err


# ---- huge symbolic dims ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("layer", ["decode-swa", "decode-csa", "decode-hca", "moe"])
def test_t_2_pow_40_compiles_in_bounded_memory(layer):
    """Building, verifying, printing, parsing, the default pipeline, lowering and the lint allocate nothing
    proportional to T = 2**40 (a few MiB in all)."""
    tracemalloc.start()
    try:
        g = build(layer, "tiny", batch=HUGE_T // 4, seq=4)
        assert g.symbols["T"] == HUGE_T
        verify(g)
        text = print_graph(g)
        assert print_graph(parse_graph(text)) == text
        tg = build_task_graph(default_pipeline(g))
        assert lint(tg).ok and max(b.numel for b in tg.buffers.values()) >= HUGE_T
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"peak {peak / 2**20:.1f} MiB"


def test_huge_t_in_a_file_and_unbound_t():
    text = EXAMPLE.read_text().replace("<T = 16>", f"<T = {HUGE_T}>")
    g = parse_graph(text, "huge.dsir")
    verify(g)
    assert print_graph(parse_graph(print_graph(g))) == print_graph(g)
    assert build_task_graph(g).buffers["qkv.kv_rope"].shape == (HUGE_T, 64)
    free = parse_graph(EXAMPLE.read_text().replace("<T = 16>", "<T>"), "free.dsir")
    verify(free)                                        # shapes are checked symbolically
    with pytest.raises(LoweringError) as e:
        build_task_graph(free)
    assert "has unbound symbol 'T'; lowering needs concrete shapes" in str(e.value)
    assert str(e.value).startswith("graph '@kv_side': %x: bf16[T,256]")


def test_past_int64_the_chain_ends_in_a_dspark_error():
    """T = 2**64 is beyond what the textual IR can spell: some stage says so in one line."""
    with pytest.raises(DsparkError) as e:
        g = build("decode-swa", "tiny", batch=2 ** 62, seq=4)
        verify(g)
        parse_graph(print_graph(g))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("command", ["run", "simulate"])
def test_executing_huge_t_is_a_one_line_error(command, capsys):
    code, out, err = dspark(capsys, command, "decode-swa", "--batch", str(HUGE_T // 4))
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith("dspark: graph '@decode_swa': the inputs need ") or \
        err.startswith("dspark: task graph '@decode_swa': ") and "exceed the simulator's limit" in err


def test_lowering_huge_t_writes_small_files(tmp_path, capsys):
    out = tmp_path / "huge"
    code, stdout, err = dspark(capsys, "lower", "decode-swa", "--batch", str(HUGE_T // 4), "-o", str(out))
    assert code == 0, err
    assert sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) < 4 << 20


def test_a_file_with_unbound_t_fails_to_lower_in_one_line(tmp_path, capsys):
    path = tmp_path / "free.dsir"
    path.write_text(EXAMPLE.read_text().replace("<T = 16>", "<T>"))
    for argv in (["lower", str(path), "-o", str(tmp_path / "o")], ["simulate", str(path)]):
        code, out, err = dspark(capsys, *argv)
        assert code == 2 and len(err.splitlines()) == 1 and "unbound symbol 'T'" in err, err
    assert not (tmp_path / "o").exists()
    assert parse_file(path).entry.symbols == {"T": None}
