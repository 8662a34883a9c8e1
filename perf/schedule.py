"""The schedule model: per-kernel costs composed over the task graph on one chip's cores.

The model (exact)
-----------------
Inputs per task t (submission order = task id): its core kind (cube | vector | mix; dummies need no
core), its SPMD block count B_t, its dependencies, and a `KernelCost` c_t (perf/costs.py): span S_t (the
kernel's makespan on a whole chip), busy cycles W_t^cube, W_t^vec. Parameters: N_cube AICs and N_vec AIVs
(a mix block takes one core group = 1 AIC + 2 AIV) and the dispatch overhead D (cycles per task).

1. Ready. t is ready at r_t = D + max(f_d over its deps d), or D with no deps.
2. Blocks. Each block of t needs d_t cycles on one core (group) of its kind:
     cube, vector:  d_t = (W_t^cube + W_t^vec) / B_t     (the kernel's work, split evenly over its blocks)
     mix:           d_t = max(W_t^cube, W_t^vec / 2) / B_t
   (a cost with no work, e.g. a stub, uses d_t = S_t.) A block holds its core(s) for d_t.
   Block models (`block_model`; write w_t for the work above, W_t^cube + W_t^vec or the mix form, and
   waves_t = ceil(B_t / N_kind)):
     work:  d_t = w_t / B_t                        (the default above)
     span:  d_t = S_t / waves_t                    (every task keeps the parallelism pypto found inside the
                                                    kernel; only the core budget limits overlap)
     grid:  d_t = max(S_t / waves_t, w_t / B_t)    (the task's own grid bounds its parallelism)
   Why `grid`: pypto's cost model may spread a kernel's busy cycles over more lanes than the task has
   blocks (a 1-block kernel whose body is a serial loop is costed on many lanes), but on the chip a task
   runs on at most min(B_t, N_kind) cores. Alone (rule 5) a task takes max(S_t, waves_t · d_t) =
   max(S_t, waves_t · w_t / B_t), which is max(S_t, w_t / min(B_t, N_kind)) when B_t <= N_kind or N_kind
   divides B_t: a 1-block task pays its whole work on one core, and a task whose grid is at least as wide
   as the lanes pypto used (B_t >= lanes · waves_t, so w_t · waves_t / B_t <= S_t) keeps its span exactly.
   So grid >= span block by block, and grid = span once the grid covers pypto's lanes.
   A task without a grid of its own (`SchedTask.grid` false: a rendezvous collective, whose lowering is not
   an SPMD kernel and whose block count is the default 1, costed by its local part's cost form) keeps the
   span rule under `grid`: its single block is no statement of how many workers the chip runs it on.
3. Placement. Time advances from event to event (a block ends, a task becomes ready). At each event the
   ready tasks are served in (r_t, id) order: each places as many of its remaining blocks as its kind has
   free cores (lowest core index first); a task whose kind is full is skipped, so later tasks of another
   kind backfill. Blocks are never preempted.
4. Finish. f_t = max(end of t's last block, s_t + S_t), s_t = start of its first block: a kernel cannot
   beat its own cost-model makespan, however many of its blocks run at once. A dummy or zero-block task
   finishes when it is ready: f_t = r_t.
5. Results. makespan = max f_t. serial = Σ alone_t with alone_t = D + max(S_t, ceil(B_t/N_kind)·d_t)
   (0 work for dummies): every task alone, one after another. critical = the longest dependency path
   weighted by alone_t (core limits ignored): a lower bound of the makespan under the model.

The chip terms (`ScheduleParams.chip()`, all zero in the legacy model `ScheduleParams()`)
-----------------------------------------------------------------------------------------
6. Hop. A task becomes ready H cycles (`hop_cycles`) after the later of its last dependency's finish and
   the dispatch overhead: r_t = D + H + max f_d (the chip swimlane's 2.6-9.5 µs producer→consumer gaps).
   A task without dependencies is ready at D (no hop: nothing to wait for). A consumer that is a kernel (a
   task with a cost of its own: span or busy cycles > 0) waits S more (`kernel_start_cycles`): r_t = D + H + S +
   max f_d. The chip's gaps say the start of a kernel costs more than the start of a task with nothing to run:
   6.28 µs on average before the swimlane's 20 compute tasks, 4.26 µs before its 7 signal tasks (a wait, a
   complete, a retire: flag polls), 2.3 µs per extra serial task of the empty launch probes. Rule 10's signal
   tasks, dummies and the probes' empty tasks pay H alone. (What the start is made of, the kernel's code and
   payload reaching the core, is not observed: S is a fitted constant.)
7. Block dispatch. K dispatchers (`dispatchers`, the AICPU's scheduler threads) issue every task's blocks;
   issuing one costs c (`block_dispatch_cycles`) of one dispatcher. How many blocks a task issues is the
   issue rule (`block_issue`):
     cores: min(B_t, N_kind) (a wider SPMD grid as if it ran as cyclic workers, one per core: the model's
            default, the rule `dspark calibrate` fitted c under);
     grid:  B_t, every logical block of the grid (pypto's `pl.spmd(n)` is n logical blocks that the AICPU
            scheduler hands to the cores one by one; only a kernel written as cyclic workers, `pl.spmd(48)`
            looping over its items, issues 48). See docs/seed-baselines.md "HCA sparse-attention stage".
   They are issued in the order tasks become ready, each on the dispatcher free first, not before r_t. The
   task's first block may start when its first issue ends, and f_t >= (end of its last issue) + d_t.
   K = 0 turns the term off.
8. Launch. `launch_cycles` L is paid once per call, before the first task: `call = L + makespan`
   (the AICore makespan itself starts at the first task, as the chip's swimlane does).
9. Early dispatch (`early_dispatch`; pypto-lib docs/debug-and-tune/dependency-and-scheduling.md, "Speculative
   early dispatch"). A producer flagged `allow_early_resolve` (`SchedTask.aer`, the IR's `aer` attribute) lets
   the AICPU stage its consumers before it finishes. A consumer is eligible once every direct dependency is
   finished or flagged and fully published (every block of its grid placed on a core and issued, rule 7: a
   grid wider than its cores publishes with its last wave); it is then staged when its kind
   has an idle core and no normal ready task waits for cores of a kind it needs (normal work strictly
   precedes early work): its blocks are issued from that moment, and when its last dependency finishes it is
   ready as in rule 6 (the hop is still paid: the release waits for the producer's FIN, and the chip swimlane
   shows full gaps before such consumers) with its issue already done. Not modelled: a staged block holds its
   core while gated; predicated tasks (none in the IR) never stage.
10. Cross-rank steps (`cross_rank`). pypto simulates a rendezvous collective's local part only (its cost form,
   kernels/collective.py); the seeds' code also moves data over the inter-chip link and runs signal tasks of
   their own (peer waits, completes, retires). Each collective op declares both (`OpDef.cross_rank`:
   dspark_ir/ops/collective.py). With the term on:
     link:    the R_t bytes the rank sends (`SchedTask.remote_bytes`) take R_t / link bandwidth (dspark_ir/
              hardware.py, 196 GB/s: nothing fitted). S_t becomes max(S_t, link) when the local part makes the
              same stores (`link = overlap`: a push, a put) and S_t + link when the publish precedes a local
              part that does not contain it (`link = before`: the reduce-scatter's publish, then its reduce);
     signals: each of the task's `signals` signal tasks follows its data as the seed's own task: one hop after
              the step before it (rule 6's D + H), then its single zero-work block's issue c (rule 7). The
              consumers wait for the last; f_t moves by signals · (D + H + c) and `TaskRun.gaps` records the
              signals · (D + H) of it that are gaps, not task spans; alone_t (rule 5) adds
              signals · (D + c), without the hops. Not modelled: a signal task's core and
              dispatcher occupancy (one zero-work block each), the skew of a slower peer (the ranks are
              symmetric here), the order of a publish and its wait inside one task (the chain's length is the
              same). `link_overlap = False` reads every `overlap` as `before` (the trust flag L's sensitivity:
              how far a Δ rests on the transfer hiding under the local part).
The chip model uses `block_model = "grid"`: a kernel keeps the parallelism pypto's swimlane shows inside it
(its busy cycles spread over its lanes) as far as its own grid allows, so a task alone takes its span S_t when
its blocks cover pypto's lanes and its work over min(B_t, N_kind) cores when they do not (a 1-block serial
loop: its whole work on one core). `span` and `work` stay selectable as sensitivity variants. Its free
constants H, S, c and L are fitted by `dspark calibrate` (perf/calibrate.py, perf/calibration/result.json).
"""
from __future__ import annotations

import heapq
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

from dspark_ir.hardware import HARDWARE, Hardware
from lowering.codegen import op_definition

from .costs import DUMMY, KernelCost
from .roofline import remote_bytes

CALIBRATION = Path(__file__).parent / "calibration" / "result.json"
CHIP_BLOCK_MODEL = "grid"
FITTED = ("hop_cycles", "block_dispatch_cycles", "launch_cycles", "kernel_start_cycles")   # the free constants
RULES = {"block_issue": "cores", "early_dispatch": False,            # the chip model's rules the fit ran under
         "cross_rank": False}


def fitted_constants(path: Path = CALIBRATION) -> dict[str, float]:
    """The chip model's free constants as `dspark calibrate` last fitted them (perf/calibration/result.json;
    each with its value, unit, residuals and sources there). Missing file: all zero."""
    if not path.is_file():
        return {k: 0.0 for k in FITTED}
    fitted = json.loads(path.read_text())["constants"]
    return {k: float(fitted[k]["value"]) if k in fitted else 0.0 for k in FITTED}   # a constant not fitted: 0


def fitted_rules(path: Path = CALIBRATION) -> dict[str, object]:
    """The rules (rule 7's issue, rule 9) the constants were fitted under, from the same result file: the chip
    model runs under them (a rule absent from the file: its RULES default)."""
    fixed = json.loads(path.read_text()).get("fixed", {}) if path.is_file() else {}
    return {k: type(default)(fixed[k]["value"]) if k in fixed else default for k, default in RULES.items()}


BLOCK_MODELS = ("work", "span", "grid")     # rule 2
BLOCK_ISSUE = ("cores", "grid")             # rule 7
NEEDS = {"cube": {"cube": 1}, "vector": {"vector": 1}, "mix": {"cube": 1, "vector": 2}}
LANE = {"cube": "AIC", "vector": "AIV"}


class ScheduleError(ValueError):
    pass


@dataclass(frozen=True)
class ScheduleParams:
    """Core budget and dispatch overhead (defaults: 910B2 cores, pypto's AICPU dispatch cycles)."""

    cube_cores: int = HARDWARE.cube_cores
    vector_cores: int = HARDWARE.vector_cores
    dispatch_cycles: float = HARDWARE.dispatch_cycles
    clock_hz: float = HARDWARE.clock_hz
    block_model: str = "work"      # rule 2: work d = W / B; span d = S / waves; grid d = max of the two
    hop_cycles: float = 0.0        # rule 6: producer finish -> consumer ready
    kernel_start_cycles: float = 0.0   # rule 6: more before a consumer that is a kernel (has a cost)
    block_dispatch_cycles: float = 0.0   # rule 7: one dispatcher's cost to issue one block
    dispatchers: int = 0           # rule 7: AICPU scheduler threads issuing blocks (0: no dispatch term)
    block_issue: str = "cores"     # rule 7: blocks a task issues: cores = min(B, N_kind); grid = B
    early_dispatch: bool = False   # rule 9: consumers of allow-early-resolve producers are staged ahead
    cross_rank: bool = False       # rule 10: collectives' link transfer and signal tasks
    link_bytes_per_s: float = HARDWARE.link_bytes_per_s   # rule 10: the inter-chip link
    link_overlap: bool = True      # rule 10: `overlap` links overlap their local part (False: a sensitivity, they add)
    launch_cycles: float = 0.0     # rule 8: paid once per call
    name: str = "legacy"

    def __post_init__(self):
        if self.block_model not in BLOCK_MODELS:
            raise ScheduleError(f"block_model must be one of {', '.join(BLOCK_MODELS)}, got {self.block_model!r}")
        if self.block_issue not in BLOCK_ISSUE:
            raise ScheduleError(f"block_issue must be one of {', '.join(BLOCK_ISSUE)}, got {self.block_issue!r}")
        if min(self.hop_cycles, self.kernel_start_cycles, self.block_dispatch_cycles, self.launch_cycles,
               self.dispatchers) < 0:
            raise ScheduleError("hop, kernel start, block dispatch, launch and dispatchers must be >= 0")

    @staticmethod
    def chip(**changes) -> "ScheduleParams":
        """The calibrated chip model (rules 6-9, grid blocks) with the constants and rules `dspark calibrate`
        fitted."""
        base = ScheduleParams(block_model=CHIP_BLOCK_MODEL, dispatchers=HARDWARE.aicpu_schedulers, name="chip",
                              **fitted_constants(), **fitted_rules())
        return replace(base, **changes)

    @staticmethod
    def named(model: str) -> "ScheduleParams":
        """`legacy` (rules 1-5 only, work blocks) or `chip` (rules 1-8, calibrated)."""
        if model == "legacy":
            return ScheduleParams()
        if model == "chip":
            return ScheduleParams.chip()
        raise ScheduleError(f"unknown schedule model {model!r} (legacy | chip)")

    @staticmethod
    def of(hw: Hardware, **changes) -> "ScheduleParams":
        base = ScheduleParams(hw.cube_cores, hw.vector_cores, hw.dispatch_cycles, hw.clock_hz)
        return replace(base, **changes)

    def cores(self, kind: str) -> int:
        if kind == "mix":
            return min(self.cube_cores, self.vector_cores // 2)
        return {"cube": self.cube_cores, "vector": self.vector_cores}.get(kind, 0)

    def us(self, cycles: float) -> float:
        return cycles / self.clock_hz * 1e6


@dataclass(frozen=True)
class SchedTask:
    """What the model needs of one task (build with `sched_tasks(tg)` or by hand in tests)."""

    id: int
    name: str
    core: str                    # cube | vector | mix | none (dummy)
    blocks: int
    deps: tuple[int, ...] = ()
    op: str = ""
    grid: bool = True            # `blocks` is the task's own SPMD grid (false: a collective without one, rule 2)
    aer: bool = False            # allow early resolve: its consumers may be staged before it finishes (rule 9)
    remote_bytes: float = 0.0    # bytes it sends over the inter-chip link (rule 10)
    link: str = "none"           # overlap | before | none: how that transfer composes with its local part (rule 10)
    signals: int = 0             # signal tasks after its data (rule 10)


@dataclass(frozen=True)
class BlockRun:
    task: int
    block: int
    lanes: tuple[str, ...]       # e.g. ("AIC3",) or ("AIC0", "AIV0", "AIV1")
    start: float
    end: float


@dataclass
class TaskRun:
    id: int
    ready: float
    start: float
    finish: float
    block_cycles: float
    alone: float
    floor_bound: bool = False    # finished at s + span rather than at its last block's end
    gaps: float = 0.0            # rule 10: the hops before its signal tasks, inside start → finish


@dataclass
class Schedule:
    params: ScheduleParams
    tasks: list[SchedTask]
    costs: dict[int, KernelCost]
    runs: dict[int, TaskRun] = field(default_factory=dict)
    blocks: list[BlockRun] = field(default_factory=list)
    makespan: float = 0.0
    call: float = 0.0            # launch + makespan (rule 8)
    serial: float = 0.0
    critical: float = 0.0
    critical_path: list[int] = field(default_factory=list)

    @property
    def makespan_us(self) -> float:
        return self.params.us(self.makespan)

    @property
    def serial_us(self) -> float:
        return self.params.us(self.serial)

    @property
    def call_us(self) -> float:
        return self.params.us(self.call)

    def busy(self) -> dict[str, float]:
        """Core-cycles spent in blocks, per core kind."""
        out = {"cube": 0.0, "vector": 0.0}
        for b in self.blocks:
            for lane in b.lanes:
                out["cube" if lane.startswith("AIC") else "vector"] += b.end - b.start
        return out

    def utilization(self) -> dict[str, float]:
        busy = self.busy()
        span = max(self.makespan, 1e-9)
        return {"cube": busy["cube"] / (span * max(self.params.cube_cores, 1)),
                "vector": busy["vector"] / (span * max(self.params.vector_cores, 1))}

    def summary(self) -> str:
        u = self.utilization()
        return (f"makespan {self.makespan_us:.1f} µs, serial {self.serial_us:.1f} µs, critical path "
                f"{self.params.us(self.critical):.1f} µs; {len(self.tasks)} tasks, {len(self.blocks)} blocks; "
                f"AIC busy {100 * u['cube']:.0f}%, AIV busy {100 * u['vector']:.0f}%")


def sched_tasks(tg) -> list[SchedTask]:
    """SchedTasks of a lowered TaskGraph."""
    producer = {r["value"]: t.op for t in tg.tasks for r in t.results}
    return [SchedTask(t.id, t.name, "none" if t.is_dummy else t.core, 0 if t.is_dummy else int(t.blocks),
                      tuple(t.deps), t.op, has_grid(t), bool(t.attrs.get("aer")) and not t.is_dummy,
                      **cross_rank_fields(t, producer))
            for t in tg.tasks]


def cross_rank_fields(task, producer: Mapping[str, str] | None = None) -> dict:
    """Rule 10's fields of a lowered task: its op's declared cross-rank steps (`OpDef.cross_rank`) at its TP
    degree; nothing for a task that meets no peer (not a collective, or TP 1). A read-back's signal tasks are
    the ones its exchange declares (`readback_signals`; `producer`: value name -> the op that wrote it)."""
    opdef = op_definition(task.op)
    spec = opdef.cross_rank if opdef is not None and task.collective and not task.is_dummy else None
    if spec is None or int(task.attrs.get("tp") or 0) == 1:
        return {}
    signals = spec.signals
    read = task.args[0].value if task.args and task.args[0].reads else None
    exchange = op_definition(producer[read]) if producer and read in producer else None
    if exchange is not None and exchange.cross_rank is not None and exchange.cross_rank.readback_signals is not None:
        signals = exchange.cross_rank.readback_signals
    return {"remote_bytes": remote_bytes(task), "link": spec.link, "signals": signals}


def signal_tail(task: SchedTask, params: ScheduleParams) -> tuple[float, float]:
    """Rule 10: (cycles the task's signal tasks add after its data, the hops among them)."""
    if not params.cross_rank or task.signals <= 0:
        return 0.0, 0.0
    hops = task.signals * (params.dispatch_cycles + params.hop_cycles)
    return hops + task.signals * params.block_dispatch_cycles, hops


def cross_rank_note(task: SchedTask, params: ScheduleParams) -> str:
    """Rule 10's share of a task's time in words ('' when none): its link transfer is a peak-bandwidth estimate,
    not a simulation, so every table that shows the task says so."""
    if not params.cross_rank or (task.remote_bytes <= 0 and task.signals <= 0):
        return ""
    parts = []
    if task.remote_bytes > 0 and task.link != "none":
        us = params.us(link_cycles(task, params))
        parts.append(f"link {task.remote_bytes / 1e6:.2f} MB = {us:.1f} µs at the link's peak ({task.link})")
    if task.signals > 0:
        parts.append(f"{task.signals} signal task{'s' if task.signals > 1 else ''}")
    return "rule 10: " + ", ".join(parts)


def link_cycles(task: SchedTask, params: ScheduleParams) -> float:
    """Rule 10: the task's remote bytes at the link's peak bandwidth, in cycles."""
    return task.remote_bytes / params.link_bytes_per_s * params.clock_hz


def chip_cost(task: SchedTask, cost: KernelCost, params: ScheduleParams) -> KernelCost:
    """Rule 10's link term on the task's cost: its span with the transfer of its remote bytes (unchanged with the
    term off or nothing sent)."""
    if not params.cross_rank or task.remote_bytes <= 0 or task.link == "none":
        return cost
    link = link_cycles(task, params)
    span = max(cost.span, link) if task.link == "overlap" and params.link_overlap else cost.span + link
    return replace(cost, span=span)


def is_kernel(cost: KernelCost) -> bool:
    """Rule 6: a task with something to run (a span or busy cycles of its own), whose start costs the kernel
    start S; a dummy, or an empty probe task, has none."""
    return cost.span > 0 or cost.work_cube + cost.work_vector > 0


def has_grid(task) -> bool:
    """Whether a lowered task's block count is its own grid: every kernel's is (its `blocks` attribute, 1 when
    absent); a collective's only when it carries a `blocks` attribute (the rendezvous collectives without one
    are no SPMD kernel of ours: rule 2's `grid` keeps their span)."""
    return not (task.collective and "blocks" not in task.attrs)


def block_cycles(task: SchedTask, cost: KernelCost, params: ScheduleParams | None = None) -> float:
    """d_t of the model (rule 2) under `params.block_model` (work without params)."""
    if task.core == "none" or task.blocks <= 0:
        return 0.0
    model = params.block_model if params is not None else "work"
    if model == "work":
        return work_block_cycles(task, cost)
    per_wave = cost.span / math.ceil(task.blocks / max(params.cores(task.core), 1))
    if model == "span" or not task.grid:
        return per_wave
    return max(per_wave, task_work(task, cost) / task.blocks)


def task_work(task: SchedTask, cost: KernelCost) -> float:
    """w_t of rule 2: the busy cycles one core (group) of the task's kind must run (mix: 1 AIC + 2 AIV)."""
    if task.core == "mix":
        return max(cost.work_cube, cost.work_vector / 2)
    return cost.work_cube + cost.work_vector


def work_block_cycles(task: SchedTask, cost: KernelCost) -> float:
    if cost.work_cube + cost.work_vector <= 0:
        return cost.span
    return task_work(task, cost) / task.blocks


def alone_cycles(task: SchedTask, cost: KernelCost, params: ScheduleParams) -> float:
    """alone_t: dispatch plus the task with the whole chip to itself (rule 5), with rule 10's signal tasks (each
    D + c; their hops, like every hop, are not in it)."""
    if task.core == "none" or task.blocks <= 0:
        return params.dispatch_cycles
    n = params.cores(task.core)
    waves = math.ceil(task.blocks / n)
    d = block_cycles(task, cost, params)
    tail = task.signals * (params.dispatch_cycles + params.block_dispatch_cycles) if params.cross_rank else 0.0
    if params.dispatchers <= 0:
        return params.dispatch_cycles + max(cost.span, waves * d) + tail
    c = params.block_dispatch_cycles
    last_issue = math.ceil(dispatched_blocks(task, params) / params.dispatchers) * c
    return params.dispatch_cycles + max(c + cost.span, c + waves * d, last_issue + d) + tail


def dispatched_blocks(task: SchedTask, params: ScheduleParams) -> int:
    """Blocks the dispatchers issue for a task (rule 7): its whole grid under `block_issue = "grid"`, else one
    per core it can use, at most its grid."""
    if task.core == "none" or task.blocks <= 0:
        return 0
    if params.block_issue == "grid":
        return task.blocks
    return min(task.blocks, params.cores(task.core))


def schedule(tasks: Sequence[SchedTask], costs: Mapping[int, KernelCost],
             params: ScheduleParams = ScheduleParams()) -> Schedule:
    """Run the model (module docstring) and return every task's and block's times."""
    tasks = list(tasks)
    by_id = {t.id: t for t in tasks}
    _check(tasks, by_id, costs, params)
    sched = Schedule(params, tasks, {t.id: costs.get(t.id, DUMMY) for t in tasks})
    cost = {t.id: chip_cost(t, sched.costs[t.id], params) for t in tasks}     # the kernels' costs under rule 10
    succ: dict[int, list[int]] = {t.id: [] for t in tasks}
    missing = {t.id: len(set(t.deps)) for t in tasks}
    for t in tasks:
        for d in set(t.deps):
            succ[d].append(t.id)
    free = {"cube": list(range(params.cube_cores)), "vector": list(range(params.vector_cores))}
    for pool in free.values():
        heapq.heapify(pool)
    ready: list[tuple[float, int]] = []            # (r_t, id) of tasks with blocks left to place
    left: dict[int, int] = {}                      # blocks not yet placed
    running: dict[int, int] = {}                   # blocks placed, not finished
    dep_done: dict[int, float] = {}
    events: list[tuple[float, int, int, str, tuple]] = []   # (time, order, task, kind, payload)
    order = 0

    def push(time: float, kind: str, task: int, payload: tuple = ()) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (time, order, task, kind, payload))

    dispatcher_free = [0.0] * params.dispatchers        # rule 7: when each dispatcher is next free
    issued: dict[int, float] = {}                       # task -> end of its last block issue
    staged: dict[int, tuple[float, float]] = {}         # rule 9: task -> (first, last) issue end, issued early
    released = {t.id: 0 for t in tasks}                 # rule 9: deps finished, or flagged and fully issued
    early_wait: list[int] = []                          # rule 9: eligible, waiting for an idle core of its kind

    def issue(t: SchedTask, at: float) -> tuple[float, float]:
        ends = []
        for _ in range(dispatched_blocks(t, params)):
            k = min(range(len(dispatcher_free)), key=lambda i: (dispatcher_free[i], i))
            dispatcher_free[k] = max(dispatcher_free[k], at) + params.block_dispatch_cycles
            ends.append(dispatcher_free[k])
        return ends[0], ends[-1]

    def make_ready(tid: int, at: float, hop: bool) -> None:
        t = by_id[tid]
        r = at + params.dispatch_cycles + (params.hop_cycles if hop else 0.0)
        if hop and is_kernel(cost[tid]):
            r += params.kernel_start_cycles
        run = TaskRun(tid, r, r, r, block_cycles(t, cost[tid], params), alone_cycles(t, cost[tid], params))
        sched.runs[tid] = run
        if t.core == "none" or t.blocks <= 0:
            push(r, "finish", tid)
            return
        left[tid] = t.blocks
        running[tid] = 0
        first = r
        if tid in staged:
            first, issued[tid] = max(r, staged[tid][0]), staged[tid][1]
        elif dispatcher_free:
            first, issued[tid] = issue(t, r)
        push(first, "ready", tid)

    def release(tid: int) -> None:
        """Rule 9: one more dependency of `tid` is finished, or flagged and fully issued."""
        released[tid] += 1
        t = by_id[tid]
        if (released[tid] == len(set(t.deps)) and missing[tid] > 0 and t.core != "none" and t.blocks > 0
                and dispatcher_free):
            early_wait.append(tid)

    def stage_early(now: float) -> None:
        """Rule 9: stage an eligible consumer's blocks while its kind has an idle core and no normal work
        waits for one (normal work strictly precedes early work)."""
        waiting = {k for _, tid in ready for k in NEEDS[by_id[tid].core]}
        for tid in list(early_wait):
            t = by_id[tid]
            if missing[tid] == 0:
                early_wait.remove(tid)
                continue
            need = NEEDS[t.core]
            if waiting & need.keys() or any(len(free[k]) < n for k, n in need.items()):
                continue
            early_wait.remove(tid)
            staged[tid] = issue(t, now)

    for t in tasks:
        if missing[t.id] == 0:
            make_ready(t.id, 0.0, hop=False)

    signalled: set[int] = set()

    def finish(tid: int, at: float) -> None:
        run = sched.runs[tid]
        tail, run.gaps = signal_tail(by_id[tid], params)
        if tail > 0 and tid not in signalled:       # rule 10: its signal tasks follow the data
            signalled.add(tid)
            push(at + tail, "finish", tid)
            return
        run.finish = at
        for s in succ[tid]:
            dep_done[s] = max(dep_done.get(s, 0.0), at)
            missing[s] -= 1
            if params.early_dispatch and not by_id[tid].aer:
                release(s)
            if missing[s] == 0:
                make_ready(s, dep_done[s], hop=True)

    def place(now: float) -> None:
        for r, tid in sorted(ready):
            t = by_id[tid]
            need = NEEDS[t.core]
            run = sched.runs[tid]
            while left[tid] > 0 and all(len(free[k]) >= n for k, n in need.items()):
                lanes = tuple(f"{LANE[k]}{heapq.heappop(free[k])}" for k, n in need.items() for _ in range(n))
                block = t.blocks - left[tid]
                if block == 0:
                    run.start = now
                left[tid] -= 1
                running[tid] += 1
                end = now + run.block_cycles
                sched.blocks.append(BlockRun(tid, block, lanes, now, end))
                push(end, "block", tid, lanes)
            if left[tid] == 0:
                ready.remove((r, tid))
                if params.early_dispatch and t.aer:     # rule 9: every logical block handed out
                    push(max(now, issued.get(tid, now)), "published", tid)

    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, tid, kind, payload = heapq.heappop(events)
            if kind == "ready":
                ready.append((now, tid))
            elif kind == "block":
                for lane in payload:
                    heapq.heappush(free["cube" if lane.startswith("AIC") else "vector"], int(lane[3:]))
                running[tid] -= 1
                if running[tid] == 0 and left[tid] == 0:
                    run = sched.runs[tid]
                    floor = max(run.start + cost[tid].span, issued.get(tid, 0.0) + run.block_cycles)
                    if floor > now:
                        run.floor_bound = True
                        push(floor, "finish", tid)
                    else:
                        finish(tid, now)
            elif kind == "finish":
                finish(tid, now)
            elif kind == "published":
                for s in succ[tid]:
                    release(s)
        place(now)
        if early_wait:
            stage_early(now)
    unfinished = [t.name for t in tasks if t.id not in sched.runs or (left.get(t.id, 0) > 0)]
    if unfinished:
        raise ScheduleError(f"tasks never ran (dependency cycle?): {', '.join(unfinished[:5])}")
    sched.makespan = max((r.finish for r in sched.runs.values()), default=0.0)
    sched.call = params.launch_cycles + sched.makespan
    sched.serial = sum(r.alone for r in sched.runs.values())
    sched.critical, sched.critical_path = _critical(tasks, sched.runs)
    return sched


def _check(tasks, by_id, costs, params: ScheduleParams) -> None:
    for t in tasks:
        for d in t.deps:
            if d not in by_id:
                raise ScheduleError(f"task {t.id} '{t.name}' depends on unknown task {d}")
        if t.core not in ("none", *NEEDS):
            raise ScheduleError(f"task {t.id} '{t.name}': unknown core kind '{t.core}'")
        if t.core != "none" and t.blocks > 0 and params.cores(t.core) <= 0:
            raise ScheduleError(f"task {t.id} '{t.name}' needs {t.core} cores; the budget has none")
        c = costs.get(t.id)
        if c is not None and (c.span < 0 or c.work_cube < 0 or c.work_vector < 0):
            raise ScheduleError(f"task {t.id} '{t.name}': negative cost {c}")


def _critical(tasks: Sequence[SchedTask], runs: Mapping[int, TaskRun]) -> tuple[float, list[int]]:
    best: dict[int, tuple[float, int | None]] = {}
    for t in _topological(tasks):
        prev = max(((best[d][0], d) for d in t.deps if d in best), default=(0.0, None))
        best[t.id] = (prev[0] + runs[t.id].alone, prev[1])
    if not best:
        return 0.0, []
    end = max(best, key=lambda k: best[k][0])
    path, cur = [], end
    while cur is not None:
        path.append(cur)
        cur = best[cur][1]
    return best[end][0], list(reversed(path))


def _topological(tasks: Sequence[SchedTask]) -> list[SchedTask]:
    """Kahn's order, ties by id (task graphs are already in order; hand-built ones may not be)."""
    by_id = {t.id: t for t in tasks}
    indeg = {t.id: len(set(t.deps)) for t in tasks}
    succ: dict[int, list[int]] = {t.id: [] for t in tasks}
    for t in tasks:
        for d in set(t.deps):
            succ[d].append(t.id)
    heap = [i for i, n in indeg.items() if n == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        i = heapq.heappop(heap)
        out.append(by_id[i])
        for s in succ[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, s)
    return out
