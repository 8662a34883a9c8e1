"""Cross-check of the schedule model: the layer's templated part as ONE pypto program, scheduled by pypto.

`layer_program(tg)` writes one pypto 0.2.0 module with an entry function `layer(...)` in which the body of every
templated, non-collective kernel task (as the code generator splits it: lowering.codegen.inline_kernel) is
inlined, in submission order, after lines that bind its parameter names to the program's tensors (the jit
parser must see the bodies: some kernels branch on runtime scalars, which only the parser turns into pypto
conditions; a plain helper call would evaluate them). Buffers are
passed in SSA form: every version of a buffer (each in-place update makes a new one) is its own tensor
parameter, so pypto sees exactly the read-after-write edges of the task graph between the included tasks
(write-after-read needs no edge in SSA form). Tasks that are left out (no template yet, collectives that
pypto cannot simulate on one process) are simply absent: their outputs become program inputs. pypto's graph
partitioning and its runtime model then schedule all the kernels' tasks together on 24 AIC + 48 AIV.

`cross_check(tg, estimate)` runs that program in SIM mode and returns pypto's end-to-end time next to our
schedule of the same tasks (perf/schedule.py on the included tasks, with their deps to other included tasks).
"""
from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from lowering.taskgraph import TaskGraph

from .schedule import SchedTask, ScheduleParams, schedule


@dataclass
class Program:
    source: str
    entry: str
    inputs: dict            # name -> (shape, dtype)  (zeros in SIM: numbers do not matter)
    outputs: dict           # name -> (shape, dtype)
    tasks: list[int]        # included task ids
    left_out: dict[int, str] = field(default_factory=dict)   # task id -> why


def layer_program(tg: TaskGraph) -> Program:
    from kernels.pto import PTO_DTYPES, module_prelude
    from lowering.codegen import RUNTIME_SYMBOLS, inline_kernel, inout_input_name, runtime_leading, template_of

    version: dict[str, int] = {}          # buffer -> current version
    params: dict[str, tuple] = {}         # tensor param -> (shape, dtype, is_input)
    blocks, included, left = [], [], {}
    # A tensor that an included kernel declares with a static leading axis is static in the program (a static-T
    # kernel's in-place reshapes of a DYNAMIC axis kill the simulation, SIGFPE); a kernel that reshapes it in
    # place as DYNAMIC then fails the program (a matmul of mismatched valid shapes), so it is left out.
    static_by: dict[str, str] = {}        # tensor -> the first included task that declares it static
    reshaped: dict[str, str] = {}         # tensor -> an included task that reshapes it in place as DYNAMIC

    def current(arg) -> str:
        v = version.get(arg.view.buffer, 0)
        return "T__" + pypto_ident(arg.view.buffer) + (f"__v{v}" if v else "")

    def tensor(arg) -> str:
        buf, v, name = arg.view.buffer, version.get(arg.view.buffer, 0), current(arg)
        if name not in params:
            b = tg.buffers[buf]                          # a token-count leading axis stays DYNAMIC, as in
            params[name] = (tuple(b.shape), b.dtype, v == 0, runtime_leading(arg))   # the kernels themselves
        return name

    for t in tg.tasks:
        if t.is_dummy:
            continue
        if t.collective:
            left[t.id] = "collective"
            continue
        template = template_of(t, tg)
        if template is None:
            left[t.id] = "no pypto template"
            continue
        if any(a.view.offset or tuple(a.view.shape) != tuple(tg.buffers[a.view.buffer].shape) for a in t.args):
            left[t.id] = "argument is a partial view of a buffer"
            continue
        kernel = inline_kernel(t, template, RUNTIME_SYMBOLS)
        if any(line.strip().startswith("return") for line in kernel.statements):
            left[t.id] = "kernel body returns early"
            continue
        reads = {a.param if a.direction == "in" else inout_input_name(a.param): a
                 for a in t.args if a.direction in ("in", "inout")}
        dynamic, in_place = kernel.dynamic, _reshaped_in_place(kernel.source)
        names = {p: current(a) for p, a in reads.items()}
        clash = sorted({*(static_by[n] for p, n in names.items() if p in in_place & dynamic and n in static_by),
                        *(reshaped[n] for p, n in names.items() if p not in dynamic and n in reshaped)})
        if clash:   # checked on what it reads: the versions it would write are new to the program
            left[t.id] = f"shares a tensor with {clash[0]}, static in one and reshaped in place on DYNAMIC in the other"
            continue
        args = {p: tensor(a) for p, a in reads.items()}
        for a in t.args:
            if a.writes:
                version[a.view.buffer] = version.get(a.view.buffer, 0) + 1
                args[a.param] = tensor(a)
        static_by.update((n, t.name) for p, n in args.items() if p not in dynamic and n not in static_by)
        reshaped.update((n, t.name) for p, n in args.items() if p in in_place & dynamic)
        head = [f"    # ---- task {t.id} {t.name} ({t.op})"]
        head += [f"    {p} = {args[p]}" for p in kernel.params]
        blocks.append("\n".join(head + list(kernel.statements)))
        included.append(t.id)
    sig = ",\n".join(f"        {n}: pypto.Tensor([{_dims(s, dyn and n not in static_by)}], {PTO_DTYPES[d]})"
                      for n, (s, d, _i, dyn) in params.items())
    source = ("# One pypto program for the templated part of a task graph (perf/program.py): every kernel body\n"
              "# inlined in submission order (the jit parser must see them: some use `if` on runtime scalars).\n"
              + module_prelude() + "\n\n" + f"def layer(\n{sig},\n):\n" + "\n".join(blocks) + "\n")
    inputs = {n: (s, d) for n, (s, d, i, _dyn) in params.items() if i}
    outputs = {n: (s, d) for n, (s, d, i, _dyn) in params.items() if not i}
    return Program(source, "layer", inputs, outputs, included, left)


def _reshaped_in_place(body: str) -> set[str]:
    """Parameters the kernel reshapes in place (`pypto.reshape(x, ..., inplace=True)`)."""
    return set(re.findall(r"pypto\.reshape\(([A-Za-z_][A-Za-z0-9_]*),[^\n]*inplace=True", body))


def _dims(shape, dynamic_lead: bool) -> str:
    dims = [str(d) for d in shape]
    if dynamic_lead and dims:
        dims[0] = "pypto.DYNAMIC"
    return ", ".join(dims)


def pypto_ident(name: str) -> str:
    s = re.sub(r"[^0-9A-Za-z_]", "_", name)
    return s if s and not s[0].isdigit() else "b_" + s


def restricted_schedule(tg: TaskGraph, costs, ids: list[int], params: ScheduleParams):
    keep = set(ids)
    tasks = [SchedTask(t.id, t.name, t.core, int(t.blocks), tuple(d for d in t.deps if d in keep), t.op)
             for t in tg.tasks if t.id in keep]
    return schedule(tasks, costs, params)


def cross_check(tg: TaskGraph, est, params: ScheduleParams, *, workers: int = 1, timeout: float = 3600.0,
                keep: str | None = None) -> dict:
    """Run the program in SIM; {ok, pypto_us, pypto_span_us, ours_us, tasks, left_out, error}."""
    import numpy as np

    from dspark_ir.semantics.dtypes import NP_DTYPES
    from kernels.pypto_rt import KernelJob, run_jobs

    from .executors import read_swimlanes

    prog = layer_program(tg)
    ours = restricted_schedule(tg, est.schedule.costs, prog.tasks, params)
    doc = {"tasks": len(prog.tasks), "left_out": {tg.tasks[i].name: why for i, why in prog.left_out.items()},
           "ours_us": ours.makespan_us, "ours_serial_us": ours.serial_us, "ok": False}
    if not prog.tasks:
        doc["error"] = "no templated task"
        return doc
    job = KernelJob(prog.source, prog.entry, {n: np.zeros(s, NP_DTYPES[d]) for n, (s, d) in prog.inputs.items()},
                    {n: (s, d) for n, (s, d) in prog.outputs.items()}, mode="sim", label="layer-program")
    art = Path(tempfile.mkdtemp(prefix="dspark-program-"))
    try:
        [res] = run_jobs([job], timeout, workers=1, artifacts_dir=art)
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            (Path(keep) / "layer_program.py").write_text(prog.source)
        if not res.ok:
            doc["error"] = (res.error or "failed").splitlines()[0][:300]
            return doc
        lanes = read_swimlanes(res.artifacts)
        doc.update(ok=True, pypto_us=res.us, pypto_tasks=res.tasks, wall_s=res.wall_s)
        doc["pypto_span_us"] = (lanes["last"] - lanes["first"]) / params.clock_hz * 1e6 if lanes else res.us
    finally:
        shutil.rmtree(art, ignore_errors=True)
    return doc
