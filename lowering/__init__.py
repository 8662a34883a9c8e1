"""Lowering: optimized graph → task graph → pypto 0.2.0 kernels + orchestration; executors and lint.

One driver does the steps in order (lowering/driver.py); every command and perf call it:

    c = compile(graph_or_layer, pipeline="default", ctx=PassContext(...), command="dspark lower ...")
    c.graph, c.passes, c.tg, c.lint, c.templates, c.sources   # optimised graph, pass result, task graph, lint,
                                                              # templates resolved once, generated files
    emit(c, out_dir, extra=...)           # only writes: DIR/kernels/*.py, orchestrate.py, tasks.json, tasks.dot

The steps, also callable alone:
    tg = build_task_graph(graph)          # tasks, buffers, regions, deps (hazards ∪ declared, reduced)
    lint(tg)                              # every hazard covered by a dep path? redundant edges?
    codegen.generate(task, template)      # the one kernel generator (kernel files, cost cache, layer program)
    run_numpy(tg, inputs)                 # numpy references in submission order
    run_shuffled(tg, inputs, seed)        # a random valid order (and split order for atomics)
    run_pypto(tg, inputs)                 # every kernel through pypto 0.2.0 on CPU (harness workers)
    check_kernels(tg, "compile"|"sim")    # compile every kernel / collect cost-model cycles
"""
from __future__ import annotations

from .build import build_task_graph, register_view_rule
from .codegen import kernel_module, template_coverage
from .driver import Compiled, compile, compile_task_graph, run_passes
from .emit import emit
from .errors import LoweringError
from .executors import EXECUTORS, random_topological_order, run_numpy, run_shuffled
from .lint import LintIssue, LintReport, lint, mutation_check
from .pypto_exec import PyptoReport, TaskRun, check_kernels, run_pypto
from .regions import Region, View
from .taskgraph import Arg, Buffer, Task, TaskGraph

__all__ = [
    "build_task_graph", "register_view_rule", "kernel_module", "template_coverage", "Compiled", "compile",
    "compile_task_graph", "run_passes", "emit", "LoweringError",
    "PyptoReport", "TaskRun", "check_kernels", "run_pypto", "EXECUTORS", "random_topological_order",
    "run_numpy", "run_shuffled", "LintIssue", "LintReport", "lint", "mutation_check", "Region", "View",
    "Arg", "Buffer", "Task", "TaskGraph",
]
