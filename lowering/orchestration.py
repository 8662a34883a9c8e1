"""The runtime side of a generated `orchestrate.py`.

`orchestrate(o)` calls `o.submit(...)` / `o.dummy(...)` once per task, in submission order, each with its
`deps`. The Orchestrator checks every call against `tasks.json` beside the script (same task, same deps,
deps already submitted), then runs the recorded order with the chosen executor. With `--backend pypto`
the kernels are the generated files under `kernels/`, not a fresh rendering of the templates.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from dspark_ir.semantics.dtypes import NP_DTYPES

from .errors import LoweringError
from .taskgraph import TaskGraph


def arg(param: str, direction: str, region: str) -> tuple[str, str, str]:
    """One kernel argument as written in orchestrate.py: parameter, direction, buffer region."""
    return (param, direction, region)


class Orchestrator:
    def __init__(self, tg: TaskGraph, root: Path | None = None):
        self.tg = tg
        self.root = root
        self.order: list[int] = []
        self._done: set[int] = set()

    def _check(self, tid: int, name: str, deps: Sequence[int]) -> None:
        if not 0 <= tid < len(self.tg):
            raise LoweringError(f"submit of unknown task {tid} '{name}'")
        task = self.tg.tasks[tid]
        if task.name != name:
            raise LoweringError(f"task {tid} is '{task.name}' in tasks.json, orchestrate.py says '{name}'")
        if sorted(deps) != sorted(task.deps):
            raise LoweringError(f"task {tid} '{name}': deps {sorted(deps)} differ from tasks.json {task.deps}")
        missing = [d for d in deps if d not in self._done]
        if missing:
            raise LoweringError(f"task {tid} '{name}' submitted before its deps {missing}")
        if tid in self._done:
            raise LoweringError(f"task {tid} '{name}' submitted twice")

    def submit(self, tid: int, name: str, kernel: str, *, core: str, blocks: int,
               args: Sequence[tuple[str, str, str]], deps: Sequence[int]) -> int:
        self._check(tid, name, deps)
        task = self.tg.tasks[tid]
        given = [(p, d) for p, d, _ in args]
        if given != [(a.param, a.direction) for a in task.args]:
            raise LoweringError(f"task {tid} '{name}': arguments {given} differ from tasks.json")
        self._done.add(tid)
        self.order.append(tid)
        return tid

    def dummy(self, tid: int, name: str, *, deps: Sequence[int]) -> int:
        self._check(tid, name, deps)
        self._done.add(tid)
        self.order.append(tid)
        return tid

    def kernel_sources(self) -> dict[int, str]:
        if self.root is None:
            return {}
        return {t.id: (self.root / "kernels" / f"{t.kernel}.py").read_text() for t in self.tg.kernels}

    @staticmethod
    def main(script: str, orchestrate: Callable[["Orchestrator"], None], argv: Sequence[str] | None = None) -> int:
        p = argparse.ArgumentParser(prog=Path(script).name, description="Run this lowered task graph.")
        p.add_argument("--backend", choices=("numpy", "shuffled", "pypto"), default="numpy")
        p.add_argument("--inputs", action="append", default=[], metavar="NPZ",
                       help="graph inputs by parameter name: one .npz per rank (repeat it, rank order), or one .npz "
                            "with keys 'rank<r>/<param>' (default: seeded random inputs for every rank)")
        p.add_argument("--out", help="write the outputs to this .npz (keys 'rank<r>/<name>' on several ranks)")
        p.add_argument("--seed", type=int, default=0, help="input seed and shuffle seed (default 0)")
        args = p.parse_args(argv)
        root = Path(script).resolve().parent
        tg = TaskGraph.from_json(json.loads((root / "tasks.json").read_text()))
        o = Orchestrator(tg, root)
        try:
            orchestrate(o)
            if sorted(o.order) != list(range(len(tg))):
                raise LoweringError("orchestrate() did not submit every task")
            inputs = load_inputs(tg, args.inputs) if args.inputs else random_rank_inputs(tg, args.seed)
            outputs = _run(o, tg, inputs, args)
        except LoweringError as e:
            print(f"{Path(script).name}: {e}", file=sys.stderr)
            return 2
        per_rank = {"": outputs} if isinstance(outputs, dict) else {f"rank{r}/": out for r, out in enumerate(outputs)}
        flat = {prefix + name: value for prefix, out in per_rank.items() for name, value in out.items()}
        if args.out:
            np.savez(args.out, **flat)
        for name, value in flat.items():
            finite = np.asarray(value, dtype=np.float64)
            print(f"{name:<28} {value.dtype}{list(value.shape)} sum={np.nansum(finite):.6g}")
        return 0


def load_inputs(tg: TaskGraph, paths: Sequence[str]) -> dict | list[dict]:
    """The --inputs files: one per rank, or one file with 'rank<r>/' keys on a multi-rank graph."""
    files = [dict(np.load(path)) for path in paths]
    if tg.ranks == 1 and len(files) == 1:
        return files[0]
    if len(files) == 1 and any("/" in k for k in files[0]):
        files = [{k.split("/", 1)[1]: v for k, v in files[0].items() if k.startswith(f"rank{r}/")}
                 for r in range(tg.ranks)]
    if len(files) != tg.ranks:
        raise LoweringError(f"the task graph runs on {tg.ranks} ranks: give --inputs once per rank, or one .npz with "
                            f"'rank<r>/<param>' keys (got {len(paths)} file(s))")
    return files if tg.ranks > 1 else files[0]


def random_rank_inputs(tg: TaskGraph, seed: int = 0) -> dict | list[dict]:
    """random_inputs for every rank the task graph runs on (rank r draws from seed + r)."""
    if tg.ranks == 1:
        return random_inputs(tg, seed)
    return [random_inputs(tg, seed + r) for r in range(tg.ranks)]


def _run(o: Orchestrator, tg: TaskGraph, inputs: dict, args: argparse.Namespace) -> dict:
    if args.backend == "numpy":
        from .executors import run_numpy

        return run_numpy(tg, inputs, order=o.order)
    if args.backend == "shuffled":
        from .executors import run_shuffled

        return run_shuffled(tg, inputs, args.seed)
    from .pypto_exec import PyptoReport, run_pypto

    report = PyptoReport()
    out = run_pypto(tg, inputs, report=report, sources=o.kernel_sources())
    print(report.summary(), file=sys.stderr)
    return out


def random_inputs(tg: TaskGraph, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for every graph parameter: normal floats, small integers (indices may need real data)."""
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for param, buf_name in tg.inputs.items():
        buf = tg.buffers[buf_name]
        dt = np.dtype(NP_DTYPES[buf.dtype])
        if buf.dtype in ("i8", "i32", "i64"):
            out[param] = rng.integers(0, 4, buf.shape).astype(dt)
        else:
            out[param] = rng.standard_normal(buf.shape).astype(np.float32).astype(dt)
    return out
