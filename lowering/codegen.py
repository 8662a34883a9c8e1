"""Task → pypto 0.2.0 kernel source, through the kernel families' templates.

A template `fn(KernelSpec) -> str` is registered against its op definition in `kernels.registry` (by the
family modules `kernels/<family>.py`: `@template(RmsNorm)`, see kernels/README.md). The function name is the
task's kernel stem; tensor parameters are the op's operand and result names. A dim is `pypto.DYNAMIC` when
its IR extent mentions a runtime symbol (the token count `T` by default): the template then loops over it
with `pypto.loop`.

`generate(task, template, name=...)` is the one kernel generator: the kernel files (`kernel_module`, and the
compile driver through `kernel_file`), the perf cost cache (the kernel under the name `kernel`) and the
whole-layer pypto program (`inline_kernel`: its parameters and statements) all take their kernels from it.
`template_of` resolves a task's template once per task graph.

A model's layers repeat the same kernels under other names, so `generate` (given a task graph's `bodies`)
generates each distinct kernel (the spec but its name) once per task graph and renames it for the others: a
template uses `spec.name` as the function's name only. When a kernel comes again, it is generated once more
under a probe name, and the probe is kept for renaming only when renaming it gives the very same source as
the first one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable, Iterable

from dspark_ir.ops import OP_REGISTRY, OpDef, load_all
from kernels import registry
from kernels.pto import KernelSpec, TensorArg, module_prelude

from .errors import LoweringError
from .taskgraph import Arg, Task, TaskGraph

RUNTIME_SYMBOLS = ("T",)
Template = Callable[[KernelSpec], str]
_PROBE = "dspark_kernel_name_probe"     # a name no template writes on its own


def find_template(task: Task, ranks: int = 0) -> Template | None:
    """The op's pypto template, or None (no template for the op yet). At one rank (`ranks` == 1) an op
    without a template may have a one-rank form (`@one_rank_template`: a collective whose every peer is
    itself, e.g. MoE dispatch/combine at EP1)."""
    if task.is_dummy or not task.family:
        return None
    opdef = op_definition(task.op)
    return registry.template_for(opdef, ranks) if opdef is not None else None


def op_definition(op: str) -> type[OpDef] | None:
    """The registered definition of op kind `op` (None for a name no op module declares)."""
    if op not in OP_REGISTRY:
        load_all()
    return OP_REGISTRY.get(op)


def _dynamic(arg: Arg, runtime: Iterable[str]) -> tuple[bool, ...]:
    """Per dim: is it a runtime extent? Only the leading (row) axis can be: templates loop over it."""
    names = set(runtime)
    if not names or not arg.dims:
        return ()
    lead = bool(names & set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", arg.dims[0])))
    return (lead,) + (False,) * (len(arg.dims) - 1)


def runtime_leading(arg: Arg, runtime_symbols: Iterable[str] = RUNTIME_SYMBOLS) -> bool:
    """Is the argument's leading axis a runtime extent (a pypto.DYNAMIC dim in its kernel's signature)?"""
    dynamic = _dynamic(arg, runtime_symbols)
    return bool(dynamic and dynamic[0])


def inout_input_name(param: str) -> str:
    """The read-side parameter of an in-place argument. pypto 0.2.0 rejects a kernel that reads and
    assembles into the same tensor parameter ("cycle detected"), so an in-place buffer is passed twice:
    `<param>_in` to read and `<param>` to write (the orchestrator passes the same buffer for both; the
    CPU harness passes the current contents for both)."""
    return f"{param}_in"


def kernel_spec(task: Task, runtime_symbols: Iterable[str] = RUNTIME_SYMBOLS) -> KernelSpec:
    runtime = tuple(runtime_symbols)

    def tensor(a: Arg) -> TensorArg:
        return TensorArg(a.param, tuple(a.shape), a.dtype, _dynamic(a, runtime))

    operands: list[TensorArg | None] = [None] * task.operands
    for a in task.args:
        if a.reads:
            operands[a.index] = tensor(a)
            if a.direction == "inout":  # read as `<param>_in`, written as `<param>`: one buffer, two params
                operands[a.index] = TensorArg(inout_input_name(a.param), tuple(a.shape), a.dtype, _dynamic(a, runtime))
    outs = {a.index: tensor(a) for a in task.args if a.direction == "out"}
    inout = {a.index: tensor(a) for a in task.args if a.direction == "inout"}
    results: list[TensorArg | None] = []
    for r, res in enumerate(task.results):
        if res.get("token"):
            results.append(None)
        elif res.get("alias") is not None:
            results.append(inout[res["alias"]])
        else:
            results.append(outs[r])
    inouts = tuple(a.index for a in task.args if a.direction == "inout")
    return KernelSpec(task.kernel, task.op, tuple(operands), tuple(results), dict(task.attrs), inouts,
                      task.blocks, task.core)


def kernel_body(task: Task, runtime_symbols: Iterable[str] = RUNTIME_SYMBOLS, known: dict | None = None,
                ranks: int = 0) -> str | None:
    """The generated function source, or None when the op has no template (at `ranks`, see find_template).
    `known`: the kernels generated so far (a task graph's `bodies`: kernel key → (spec, source) of the first,
    then its probe or ""), to rename."""
    template = find_template(task, ranks)
    if template is None:
        return None
    return generate(task, template, runtime_symbols, known)


def generate(task: Task, template: Template, runtime_symbols: Iterable[str] = RUNTIME_SYMBOLS,
             known: dict | None = None, name: str | None = None) -> str:
    """The one kernel generator: `task`'s function from `template` (find_template's answer for it), named
    `name` (default: the task's kernel stem). `known`: see kernel_body."""
    name = name or task.kernel

    def spec() -> KernelSpec:
        return replace(kernel_spec(task, runtime_symbols), name=name)

    if known is None:
        return template(spec())
    key = _kernel_key(template, task, tuple(runtime_symbols))
    first = known.get(key)
    if first is None:                  # the first of its kind: keep it, to rename for the next one
        first_spec = spec()
        source = template(first_spec)
        known[key] = (first_spec, source)
        return source
    if isinstance(first, tuple):       # the second: is renaming the first one's source right?
        first = known[key] = _probe(template, *first)
    return first.replace(_PROBE, name) if first else template(spec())


def template_of(task: Task, tg: TaskGraph) -> Template | None:
    """The task's template, resolved once per task graph (find_template at the graph's ranks), kept in
    `tg.templates`."""
    if task.id not in tg.templates:
        tg.templates[task.id] = find_template(task, tg.ranks)
    return tg.templates[task.id]


@dataclass(frozen=True)
class InlineKernel:
    """A generated kernel function taken apart for inlining into another function (perf/program.py)."""

    params: tuple[str, ...]            # tensor parameters, in signature order
    dynamic: frozenset[str]            # parameters whose leading axis the signature declares pypto.DYNAMIC
    statements: tuple[str, ...]        # the body, indented one level, blank lines dropped
    source: str                        # the whole function


def inline_kernel(task: Task, template: Template, runtime_symbols: Iterable[str] = RUNTIME_SYMBOLS) -> InlineKernel:
    """`task`'s kernel (generate) as its parameters and statements. A template writes its spec's signature or,
    without a dynamic-extent form, that of `spec.static()`; the one it wrote says which axes are DYNAMIC."""
    spec = kernel_spec(task, runtime_symbols)
    source = generate(task, template, runtime_symbols)
    for form in (spec, spec.static()):
        head = form.signature() + "\n"
        if source.startswith(head):
            params = form.params()
            return InlineKernel(tuple(p.name for p in params), frozenset(p.name for p in params if p.is_dynamic(0)),
                                tuple(line for line in source[len(head):].splitlines() if line.strip()), source)
    raise LoweringError(f"the '{task.op}' template does not start with its kernel's signature",
                        f"task {task.id} '{task.name}'")


def _kernel_key(template: Template, task: Task, runtime: tuple[str, ...]) -> tuple:
    """Everything kernel_spec reads from the task, but the kernel's name (attributes by repr: 1, 1.0 and True
    differ)."""
    args = tuple((a.param, a.direction, a.dtype, a.view.shape, a.index, a.dims) for a in task.args)
    results = tuple((r.get("token"), r.get("alias")) for r in task.results)
    return (template, task.op, task.operands, args, results, repr(task.attrs), task.blocks, task.core, runtime)


def _probe(template: Template, spec: KernelSpec, source: str) -> str:
    """The kernel under the probe name when renaming it gives `source`, else "" (generate each one)."""
    try:
        probe = template(replace(spec, name=_PROBE))
    except Exception:  # noqa: BLE001 - a template that cares about the name is simply not renamed
        return ""
    return probe if probe.replace(_PROBE, spec.name) == source else ""


def kernel_module(task: Task, tg: TaskGraph, command: str = "",
                  runtime_symbols: Iterable[str] = RUNTIME_SYMBOLS) -> str:
    """A complete, readable kernel file: provenance header, imports and the kernel function."""
    template = template_of(task, tg)
    body = None if template is None else generate(task, template, runtime_symbols, tg.bodies)
    return kernel_file(task, tg, body, command)


def kernel_file(task: Task, tg: TaskGraph, body: str | None, command: str = "") -> str:
    """The kernel file of `task` around its generated function `body` (None: a stub that says no template)."""
    lines = [
        f"# Generated by dspark lower: task {task.id} '{task.name}' of graph @{tg.name} (ir {tg.ir_hash}).",
        reproduce_line(command, "#"),
        f"# op {task.op} | core {task.core} | {task.blocks} SPMD block(s) | numpy reference {task.reference}",
    ]
    for a in task.args:
        dims = ",".join(a.dims) if a.dims else ",".join(map(str, a.shape))
        lines.append(f"#   {a.direction:<5} {a.param:<10} %{a.value} {a.dtype}[{dims}] = {a.view.label()}")
    if task.attrs:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(task.attrs.items()))
        lines.append(f"# attrs: {shown}")
    lines.append("#")
    lines.append("# A plain function: kernels.pypto_rt wraps it with pypto.frontend.jit(**JIT_OPTIONS) for its mode.")
    lines.append(module_prelude())
    lines.append("")
    if body is None:
        lines.append(f"TEMPLATE_MISSING = {task.op!r}  # no pypto 0.2.0 template for this op kind yet")
        lines.append("")
        lines.append("")
        lines.append(f"def {task.kernel}(*_args):")
        lines.append(f"    raise NotImplementedError(\"no pypto 0.2.0 template for op '{task.op}'\")")
        return "\n".join(lines) + "\n"
    return "\n".join(lines) + "\n" + body


def reproduce_line(command: str, comment: str) -> str:
    """The `Reproduce:` header line of a generated file (`comment`: its comment marker)."""
    return f"{comment} Reproduce: {command}" if command else f"{comment} Reproduce: dspark lower <graph> -o <dir>"


def template_coverage() -> dict[str, bool]:
    """Every registered op kind that lowers to a kernel → whether it has a pypto template."""
    from dspark_ir.ops import OP_REGISTRY, load_all

    from .build import lowers_to_kernel

    load_all()
    out = {}
    for name, opdef in sorted(OP_REGISTRY.items()):
        if not lowers_to_kernel(opdef):
            continue
        out[name] = registry.template_for(opdef) is not None
    return out
