"""The task graph: buffers, tasks with directed buffer arguments, and explicit task-ID dependencies.

One kernel task per compute node of the optimized graph (one pypto kernel = one task); `join` nodes are
dummy tasks (`task_dummy`); pure view ops are not tasks. Task IDs are the submission order. Every task
argument names a buffer view and a direction (`in`, `out`, `inout`); the hazards and the dependency
lint are computed from those regions alone. A task graph is plain data: it round-trips through
`tasks.json`, and the executors run from that data (op, reference, concrete attributes, views).

tasks.json (schema "dspark-tasks/1")
  graph, ir_hash, ranks, symbols {T: 16, ...}, attributes, generator, command, runtime_symbols,
  layer/config/tp/pipeline (when known), counts {tasks, kernels, dummies, edges, buffers, templated,
  cycles_total}, lint {ok, summary, hazards, issues[{kind, first, second, buffer, message}]},
  checks {compile|sim: [{id, name, backend, ok, cycles, pypto_tasks, wall_s, error, ...}]},
  buffers [{name, dtype, shape, kind: input|inout|local}],
  inputs {graph parameter: buffer}, outputs [{value, view, region}],
  tasks [{id, name, op, kind: kernel|dummy, core: cube|vector|mix|none, blocks, kernel: "kernels/<k>.py",
          family, reference, operands, collective, accumulate, sched,
          args [{param, value, dir: in|out|inout, dtype, shape, dims, index, region, view}],
          results [{value, alias, token, dtype}], deps [ids], dep_kinds {id: ["raw:<buffer>", "war:..",
          "waw:..", "explicit", "token", "join"]}, declared [ids], attrs, template, cycles, pypto_tasks}]
  A view is {buffer, offset, shape, strides, text} in elements of the buffer's row-major storage.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from .regions import Region, View

SCHEMA = "dspark-tasks/1"
DIRECTIONS = ("in", "out", "inout")
BUFFER_KINDS = ("input", "inout", "local")
EDGE_KINDS = ("raw", "war", "waw", "explicit", "token", "join")


@dataclass(frozen=True)
class Buffer:
    """A storage allocation: a graph input (`input`, read-only), an in-place graph parameter (`inout`,
    external) or a task-graph-local allocation (`local`)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    kind: str

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "kind": self.kind}

    @staticmethod
    def from_json(d: dict) -> "Buffer":
        return Buffer(d["name"], d["dtype"], tuple(d["shape"]), d["kind"])


@dataclass(frozen=True)
class Arg:
    """One kernel argument: `param` is the op's operand/result name, `value` the IR value it carries."""

    param: str
    value: str
    direction: str
    dtype: str
    view: View
    index: int  # operand index (in/inout) or result index (out)
    dims: tuple[str, ...] = ()  # the IR type's dims as written (symbols kept: `T`, `ceil(T/8)`)

    @property
    def reads(self) -> bool:
        return self.direction in ("in", "inout")

    @property
    def writes(self) -> bool:
        return self.direction in ("out", "inout")

    @property
    def shape(self) -> tuple[int, ...]:
        return self.view.shape

    def region(self) -> Region:
        return self.view.region()

    def to_json(self) -> dict:
        return {"param": self.param, "value": self.value, "dir": self.direction, "dtype": self.dtype,
                "shape": list(self.view.shape), "dims": list(self.dims), "index": self.index,
                "region": self.view.label(),
                "view": self.view.to_json()}

    @staticmethod
    def from_json(d: dict) -> "Arg":
        return Arg(d["param"], d["value"], d["dir"], d["dtype"], View.from_json(d["view"]), int(d["index"]),
                   tuple(d.get("dims") or ()))


@dataclass
class Task:
    id: int
    name: str                  # the IR node name (provenance)
    op: str
    kind: str                  # "kernel" | "dummy"
    core: str                  # cube | vector | mix | none (dummy)
    blocks: int                # SPMD block count
    args: list[Arg]
    attrs: dict[str, Any]      # concrete attributes (dims → ints, dtypes → names)
    reference: str = ""        # "kernels.<family>:<fn>"
    family: str = ""
    kernel: str = ""           # kernel file stem (kernels/<kernel>.py), "" for dummies
    results: list[dict] = field(default_factory=list)  # per op result: {"value", "alias" | None, "token"}
    deps: list[int] = field(default_factory=list)       # explicit dependencies (reduced)
    dep_kinds: dict[int, list[str]] = field(default_factory=dict)
    declared: list[int] = field(default_factory=list)   # IR-declared ordering (deps(...), tokens, joins)
    operands: int = 0          # the op's operand count (tokens included)
    collective: bool = False
    accumulate: str = "none"   # split reduction mode: none | atomic | ordered
    sched: str = ""            # scheduling-only marker from the IR (e.g. late_dep)
    template: bool = False     # a pypto 0.2.0 template exists for this op kind
    cycles: int | None = None  # cost-model Total Cycles of this kernel
    pypto_tasks: int | None = None

    @property
    def is_dummy(self) -> bool:
        return self.kind == "dummy"

    def reads(self) -> Iterator[Arg]:
        return (a for a in self.args if a.reads)

    def writes(self) -> Iterator[Arg]:
        return (a for a in self.args if a.writes)

    def label(self) -> str:
        return f"task {self.id} '{self.name}'"

    def to_json(self) -> dict:
        return {
            "id": self.id, "name": self.name, "op": self.op, "kind": self.kind, "core": self.core,
            "blocks": self.blocks, "kernel": f"kernels/{self.kernel}.py" if self.kernel else None,
            "family": self.family, "reference": self.reference, "operands": self.operands,
            "collective": self.collective,
            "accumulate": self.accumulate, "sched": self.sched or None,
            "args": [a.to_json() for a in self.args], "results": self.results,
            "deps": list(self.deps),
            "dep_kinds": {str(k): v for k, v in sorted(self.dep_kinds.items())},
            "declared": list(self.declared), "attrs": _jsonable(self.attrs),
            "template": self.template, "cycles": self.cycles, "pypto_tasks": self.pypto_tasks,
        }

    @staticmethod
    def from_json(d: dict) -> "Task":
        kernel = d.get("kernel") or ""
        if kernel.startswith("kernels/") and kernel.endswith(".py"):
            kernel = kernel[len("kernels/"):-3]
        return Task(
            id=int(d["id"]), name=d["name"], op=d["op"], kind=d["kind"], core=d["core"], blocks=int(d["blocks"]),
            args=[Arg.from_json(a) for a in d["args"]], attrs=dict(d.get("attrs") or {}),
            reference=d.get("reference", ""), family=d.get("family", ""), kernel=kernel,
            results=list(d.get("results") or []), deps=[int(x) for x in d.get("deps", [])],
            dep_kinds={int(k): list(v) for k, v in (d.get("dep_kinds") or {}).items()},
            declared=[int(x) for x in d.get("declared", [])], operands=int(d.get("operands", 0)),
            collective=bool(d.get("collective")),
            accumulate=d.get("accumulate") or "none", sched=d.get("sched") or "",
            template=bool(d.get("template")), cycles=d.get("cycles"), pypto_tasks=d.get("pypto_tasks"))


@dataclass
class TaskGraph:
    """Tasks in submission order (task i has id i), the buffers they touch, and the graph's I/O."""

    name: str
    buffers: dict[str, Buffer]
    tasks: list[Task]
    inputs: dict[str, str]              # graph parameter → buffer
    outputs: dict[str, View]            # returned value name → where to read it at the end
    symbols: dict[str, int] = field(default_factory=dict)
    attributes: dict[str, Any] = field(default_factory=dict)
    ranks: int = 1
    ir_hash: str = ""
    # generated kernel functions by kernel (lowering.codegen.generate) and each task's template by task id
    # (lowering.codegen.template_of): caches of the code generator, not part of the task graph
    bodies: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    templates: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)

    def task(self, key: int | str) -> Task:
        if isinstance(key, int):
            return self.tasks[key]
        for t in self.tasks:
            if t.name == key:
                return t
        raise KeyError(key)

    @property
    def kernels(self) -> list[Task]:
        return [t for t in self.tasks if not t.is_dummy]

    def edges(self) -> list[tuple[int, int]]:
        return [(d, t.id) for t in self.tasks for d in t.deps]

    def deps_map(self) -> dict[int, list[int]]:
        return {t.id: list(t.deps) for t in self.tasks}

    def to_json(self, **extra: Any) -> dict:
        doc = {
            "schema": SCHEMA, "graph": self.name, "ir_hash": self.ir_hash, "ranks": self.ranks,
            "symbols": dict(self.symbols), "attributes": _jsonable(self.attributes),
        }
        doc.update(extra)
        doc.update({
            "buffers": [b.to_json() for b in self.buffers.values()],
            "inputs": dict(self.inputs),
            "outputs": [{"value": k, "view": v.to_json(), "region": v.label()} for k, v in self.outputs.items()],
            "tasks": [t.to_json() for t in self.tasks],
        })
        return doc

    @staticmethod
    def from_json(doc: dict) -> "TaskGraph":
        if doc.get("schema") != SCHEMA:
            from .errors import LoweringError

            raise LoweringError(f"not a task graph (schema {doc.get('schema')!r}, expected {SCHEMA!r})")
        buffers = {b["name"]: Buffer.from_json(b) for b in doc["buffers"]}
        return TaskGraph(
            name=doc["graph"], buffers=buffers, tasks=[Task.from_json(t) for t in doc["tasks"]],
            inputs=dict(doc["inputs"]), outputs={o["value"]: View.from_json(o["view"]) for o in doc["outputs"]},
            symbols=dict(doc.get("symbols") or {}), attributes=dict(doc.get("attributes") or {}),
            ranks=int(doc.get("ranks", 1)), ir_hash=doc.get("ir_hash", ""))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if hasattr(value, "value") and isinstance(getattr(value, "value"), str):  # DType
        return value.value
    return str(value)
