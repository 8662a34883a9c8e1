"""`dspark run LAYER`: per-output errors with the tolerance, exit 0 within tolerance and 1 outside it."""
from __future__ import annotations

import numpy as np
import pytest

from dspark_cli.commands import run as run_cmd
from dspark_cli.main import main


@pytest.mark.parametrize("tp", ["1", "4"])
def test_run_swa_within_tolerance(tp, capsys):
    assert main(["run", "decode-swa", "--config", "tiny", "--tp", tp, "--seed", "1",
                 "--regime", "window_boundary"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (f"dspark run decode-swa · config tiny · tp {tp} · seed 1 · "
                                   "regime window_boundary · pipeline none (the graph as given; -p default runs "
                                   "the default pipeline) · backend numpy")
    assert "x_out" in out and "kv_cache" in out and "rows_channels(diff=0.003" in out
    assert out.rstrip().endswith("outputs within tolerance" + (" (all 4 ranks)" if tp == "4" else "")
                                 + ", 7/7 sub-blocks")
    assert "ok: 2/2" in out


def test_run_fails_a_fault_only_a_sub_block_sees(monkeypatch, capsys):
    """Sinkhorn at 19 iterations moves x_out by less than a midpoint flip; the comb sub-block sees it."""
    from dspark_ir.ops import get_op

    fn = get_op("comb_sinkhorn").reference
    nineteen = staticmethod(lambda *a, **k: fn(*a, **{**k, "iters": 19}))
    monkeypatch.setattr(get_op("comb_sinkhorn"), "reference", nineteen)
    assert main(["run", "decode-swa", "--tp", "1"]) == 1
    out = capsys.readouterr().out
    assert "sub-block hc.comb (hc.comb_sinkhorn): FAIL" in out and out.rstrip().endswith("6/7 sub-blocks")


def test_run_exits_1_outside_tolerance(monkeypatch, capsys):
    def broken(g, inputs):
        from dspark_ir.interp import run

        out = run(g, inputs)
        x_out = g.returns[0].name
        out[x_out] = out[x_out] * np.float32(1.01)
        return out

    monkeypatch.setitem(run_cmd.BACKENDS, "numpy", broken)
    assert main(["run", "decode-swa", "--tp", "1"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "FAIL: 1/2 outputs within tolerance" in out


def test_run_errors_are_one_line(capsys):
    assert main(["run", "decode-swa", "--regime", "window_boundry"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown regime 'window_boundry' (did you mean 'window_boundary'?)" in err
    with pytest.raises(SystemExit) as e:
        main(["run", "decode-swa", "--backend", "gpu"])
    assert e.value.code == 2
    assert main(["run", "decode-swq"]) == 2
    assert "did you mean 'decode-swa'" in capsys.readouterr().err


def test_backends_are_a_small_extensible_dict():
    assert "numpy" in run_cmd.backends()
    assert all(callable(run_cmd.backend(name)) for name in run_cmd.backends())


def test_run_pipeline_and_ep(capsys):
    """-p default runs the default pipeline first (named in the header); -p none (or '') runs none; --ep picks the
    moe layer's expert parallelism."""
    assert main(["run", "moe", "--tp", "1", "--ep", "1", "-p", "default"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == ("dspark run moe · config tiny · tp 1 · ep 1 · seed 0 · regime default · "
                                   "pipeline default · backend numpy")
    assert "ok: 1/1" in out and "ranks" not in out
    for none in ("none", ""):
        assert main(["run", "decode-swa", "--tp", "1", "-p", none]) == 0
        assert "pipeline none (the graph as given" in capsys.readouterr().out.splitlines()[0]
    assert main(["run", "decode-swa", "--ep", "2"]) == 2
    assert "ep: not a parameter of layer 'decode-swa'" in capsys.readouterr().err
