"""The generated orchestrate.py runs a multi-rank task graph (the default tiny config is TP2): seeded inputs for
every rank, or --inputs once per rank / one file with 'rank<r>/' keys."""
import subprocess
import sys
from pathlib import Path

import numpy as np

from dspark_cli.main import main
from lowering.orchestration import random_rank_inputs
from lowering.taskgraph import TaskGraph

ROOT = Path(__file__).parents[2]


def run_script(out: Path, *argv):
    return subprocess.run([sys.executable, str(out / "orchestrate.py"), *argv], capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=600)


def test_orchestrate_runs_the_default_tiny_graph_on_its_two_ranks(tmp_path, capsys):
    out = tmp_path / "low"
    assert main(["lower", "decode-swa", "-o", str(out)]) == 0
    import json

    tg = TaskGraph.from_json(json.loads((out / "tasks.json").read_text()))
    assert tg.ranks == 2
    done = run_script(out, "--out", str(tmp_path / "a.npz"))
    assert done.returncode == 0, done.stderr
    assert "rank0/" in done.stdout and "rank1/" in done.stdout
    # .npz cannot hold bfloat16: store float32 (exact for bf16 values; the executor casts back)
    ranks = [{k: v.astype(np.float32) if v.dtype.name == "bfloat16" else v for k, v in d.items()}
             for d in random_rank_inputs(tg, 0)]
    for r, inputs in enumerate(ranks):
        np.savez(tmp_path / f"r{r}.npz", **inputs)
    np.savez(tmp_path / "both.npz", **{f"rank{r}/{k}": v for r, d in enumerate(ranks) for k, v in d.items()})
    per_file = run_script(out, "--inputs", str(tmp_path / "r0.npz"), "--inputs", str(tmp_path / "r1.npz"))
    one_file = run_script(out, "--inputs", str(tmp_path / "both.npz"))
    assert per_file.returncode == 0 and per_file.stdout == done.stdout == one_file.stdout
    wrong = run_script(out, "--inputs", str(tmp_path / "r0.npz"))
    assert wrong.returncode == 2 and "give --inputs once per rank" in wrong.stderr
