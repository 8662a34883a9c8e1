"""Performance estimates of lowered DSpark layers, the pass A/B matrix and the compile-speed benchmark.

    from perf import PyptoCosts, estimate
    est = estimate(task_graph, PyptoCosts())      # cost-model cycles per kernel + the schedule model
    est.makespan_us, est.serial_us, est.bound_us  # scheduled latency, serial sum, 910B2 roofline

Modules (README.md beside this file has the exact schedule model; the 910B2 constants and their sources
are dspark_ir/hardware.py, re-exported here as HARDWARE):
  roofline   bytes / FLOPs / vector ops per task; chip and blocked roofline bounds; the floor a rank must move
  costs      per-kernel costs: pypto's cost model (content-addressed cache, shareable) or the roofline (flagged)
  executors  where kernel simulations run: local pypto workers (default) or a Dask cluster
  dask_worker  the Dask worker plugin (`dask worker ... --preload perf.dask_worker`) and task
  schedule   the schedule model: blocks on AIC/AIV cores, deps, dispatch overhead, span floor
  estimate   layer estimate = costs + schedule + roofline; per-kernel rows
  trace      the schedule as Perfetto / Chrome trace JSON
  program    cross-check: the layer's templated part as one pypto program (pypto schedules it)
  ab         the A/B matrix of passes (all on/off, seed-only, leave-one-out, add-one-in, waterfall steps)
  trust      trust flags of a Δ: a kernel far over its roofline, roofline-only tasks, a block-model sign flip
  cases      the case corpus (cases/*.toml): published hardware measurements beside the prediction, a verdict
  sweep      a grid of shapes x pipelines, resumable (`dspark sweep`)
  plots      PNG waterfall and on/off bars, latency per swept axis
  model      the whole decode step (43 FLASH layers) as one graph
  bench      compile-speed benchmark (parse → passes → lowering → pypto source)
Importing `perf` imports neither pypto, matplotlib nor dask.
"""
from __future__ import annotations

from dspark_ir.hardware import HARDWARE, Hardware

from .costs import FunctionCosts, KernelCost, PyptoCosts, RooflineCosts
from .estimate import LayerEstimate, estimate
from .schedule import SchedTask, Schedule, ScheduleParams, schedule

__all__ = [
    "FunctionCosts", "KernelCost", "PyptoCosts", "RooflineCosts", "LayerEstimate", "estimate", "HARDWARE",
    "Hardware", "Schedule", "ScheduleParams", "SchedTask", "schedule",
]
