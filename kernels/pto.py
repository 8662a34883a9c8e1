"""Helpers for the pypto 0.2.0 source templates of the kernel families (no pypto import here).

A template is `fn(spec: KernelSpec) -> str`: it returns the source of one *plain* Python function
(no decorator; the harness `kernels.pypto_rt` applies `pypto.frontend.jit` for its mode) whose tensor
parameters are annotated `pypto.Tensor(shape, dtype)`; inputs are read, outputs and in-place buffers
are written in place (`pypto.assemble`, `out[:] = ...`). Family modules register their templates against the
op definitions with `kernels.registry.template` (see kernels/README.md).

Only idioms verified on pypto 0.2.0 (see the project notes on pypto ops) are emitted: explicit vec/cube
tile shapes before every op group, `pypto.loop` + `pypto.view(..., valid_shape=...)` + single-form
`pypto.assemble` over the row axis (dynamic when the IR extent is a runtime symbol), fp32 math.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Mapping

from dspark_ir.hardware import HARDWARE, ITEMSIZE

PTO_DTYPES = {
    "bf16": "pypto.DT_BF16", "fp16": "pypto.DT_FP16", "f32": "pypto.DT_FP32", "fp8": "pypto.DT_FP8E4M3",
    "i8": "pypto.DT_INT8", "i32": "pypto.DT_INT32", "i64": "pypto.DT_INT64", "bool": "pypto.DT_BOOL",
}
# jit options every generated kernel module carries (`JIT_OPTIONS`, read by kernels.pypto_rt): the runtime's
# root-function memory pools at the size pypto's own model kernels use (its default of 10 root functions in flight
# serialises a loop of more iterations behind workspace reuse).
KERNEL_JIT_OPTIONS = {"runtime_options": {"stitch_function_inner_memory": 128, "stitch_function_outcast_memory": 128}}


def module_prelude() -> str:
    """The top of a generated kernel module: the pypto import and its jit options."""
    return f"import pypto\n\nJIT_OPTIONS = {KERNEL_JIT_OPTIONS!r}\n"


VEC_TILE_BYTES = 16 * 1024  # per operand tile; an op group holds several of them in the 192 KiB UB
BLOCK_BYTES = HARDWARE.ub_block_bytes  # a tile's last dim must span a multiple of 32 bytes
# the widest vector operand tile a template asks for (64 KiB): an op's inputs and output still fit the UB
WIDE_VEC_TILE_BYTES = HARDWARE.ub_bytes // 3


@dataclass(frozen=True)
class TensorArg:
    """One tensor parameter: name, concrete shape, dtype name, and which dims are runtime extents."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    dynamic: tuple[bool, ...] = ()

    @property
    def pto(self) -> str:
        return PTO_DTYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def rank(self) -> int:
        return len(self.shape)

    def is_dynamic(self, axis: int) -> bool:
        return bool(self.dynamic) and self.dynamic[axis]

    def annotation(self) -> str:
        dims = ", ".join("pypto.DYNAMIC" if self.is_dynamic(i) else str(s) for i, s in enumerate(self.shape))
        return f"pypto.Tensor([{dims}], {self.pto})"


@dataclass(frozen=True)
class KernelSpec:
    """What a template needs to know about one task.

    `operands[i]` / `results[r]` are the tensor arguments by the op's operand and result index (None for
    tokens); a result updated in place is the same TensorArg as its operand (listed in `inouts`).
    `attrs` are the node's concrete attributes (dims as ints, dtypes by name).
    """

    name: str
    op: str
    operands: tuple[TensorArg | None, ...]
    results: tuple[TensorArg | None, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    inouts: tuple[int, ...] = ()
    blocks: int = 1
    core: str = "vector"

    def static(self) -> "KernelSpec":
        """The same kernel with every extent static (for templates without a dynamic-extent form)."""
        fix = {t.name: TensorArg(t.name, t.shape, t.dtype) for t in self.params()}
        return replace(self, operands=tuple(None if t is None else fix[t.name] for t in self.operands),
                       results=tuple(None if t is None else fix[t.name] for t in self.results))

    def params(self) -> list[TensorArg]:
        """Tensor parameters in signature order: operands (in and in-place), then fresh results."""
        seen, out = set(), []
        for t in list(self.operands) + list(self.results):
            if t is not None and t.name not in seen:
                seen.add(t.name)
                out.append(t)
        return out

    def inputs(self) -> list[TensorArg]:
        return [t for i, t in enumerate(self.operands) if t is not None and i not in self.inouts]

    def outputs(self) -> list[TensorArg]:
        """Everything the kernel writes: in-place operands and fresh results."""
        names = {t.name for t in self.inputs()}
        return [t for t in self.params() if t.name not in names]

    def signature(self) -> str:
        args = ",\n".join(f"        {t.name}: {t.annotation()}" for t in self.params())
        return f"def {self.name}(\n{args},\n):"


class Src:
    """An indented line builder for generated function bodies."""

    def __init__(self, header: str = ""):
        self.lines: list[str] = [header] if header else []
        self.depth = 1

    def __call__(self, line: str = "") -> "Src":
        self.lines.append(("    " * self.depth + line) if line else "")
        return self

    @contextmanager
    def block(self, header: str) -> Iterator[None]:
        self(header)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def vec_tile(shape: tuple[int, ...], itemsize: int, budget: int = VEC_TILE_BYTES) -> list[int]:
    """A vector tile for `shape`: the last dim whole when it fits (else a 32-byte-aligned chunk; never under
    32 bytes), then as many leading rows as the byte budget allows (innermost leading dims first)."""
    if not shape:
        return []
    align = max(1, BLOCK_BYTES // itemsize)
    last = max(shape[-1], align)  # narrower tensors still get a 32-byte tile (pypto checks the tile, not the data)
    if last * itemsize > budget:
        last = max(align, (budget // itemsize) // align * align)
    tile = [last]
    room = max(1, budget // (last * itemsize))
    for extent in reversed(shape[:-1]):
        take = max(1, min(extent, room))
        tile.insert(0, take)
        room = max(1, room // take)
    return tile


def cube_tile(extent: int, preferred: int, align: int = 16) -> list[int]:
    """One `set_cube_tile_shapes` entry ([L0, L1]) for an axis of `extent`."""
    t = min(preferred, round_up(max(extent, 1), align))
    return [t, t]


L0A_BYTES = HARDWARE.l0a_bytes  # a tile of the left operand
L0B_BYTES = HARDWARE.l0b_bytes  # a tile of the right operand
L0C_BYTES = HARDWARE.l0c_bytes  # the fp32/int32 accumulator tile


def cube_shapes(m: int, k: int, n: int, dtype: str) -> str:
    """The arguments of `pypto.set_cube_tile_shapes` for an [m,k]·[k,n] product: the largest power-of-two
    tiles (16-aligned, 32 for int8) up to m 128, k 256, n 128 that fit the L0A/L0B/L0C buffers."""
    item = ITEMSIZE[dtype]
    align = 32 if item == 1 else 16
    tm = min(128, round_up(max(m, 1), 16))
    tk = min(256 if item > 1 else 512, round_up(max(k, 1), align))
    tn = min(128, round_up(max(n, 1), align))
    while tm * tk * item > L0A_BYTES and tk > align:
        tk //= 2
    while tk * tn * item > L0B_BYTES and tn > align:
        tn //= 2
    while tm * tn * 4 > L0C_BYTES and tm > 16:
        tm //= 2
    return f"[{tm}, {tm}], [{tk}, {tk}], [{tn}, {tn}]"


def py_list(items) -> str:
    return "[" + ", ".join(str(i) for i in items) + "]"


@dataclass
class RowLoop:
    """The loop over row blocks (axis 0) that every row-tiled template shares.

    Emits `rows = <arg>.shape[0]` (dynamic extents) or a constant, then
    `for blk in pypto.loop(...)` with `r0`/`valid`, unless a single static block covers all rows.
    `view(arg)` then returns the source of the block's view of `arg` (whole tensor when unlooped).
    """

    src: Src
    rows_from: TensorArg
    block_rows: int
    name: str = "rows"

    def __post_init__(self):
        total = self.rows_from.shape[0]
        self.dynamic = self.rows_from.is_dynamic(0)
        self.block_rows = max(1, min(self.block_rows, total)) if not self.dynamic else max(1, self.block_rows)
        self.looped = self.dynamic or total > self.block_rows
        self.partial = self.dynamic or total % self.block_rows != 0

    @contextmanager
    def loop(self) -> Iterator["RowLoop"]:
        if not self.looped:
            yield self
            return
        br = self.block_rows
        rows = f"{self.rows_from.name}.shape[0]" if self.dynamic else str(self.rows_from.shape[0])
        self.src(f"{self.name} = {rows}")
        with self.src.block(f"for blk in pypto.loop(0, ({self.name} + {br - 1}) // {br}, 1, "
                            f"name=\"{self.name}_loop\", idx_name=\"blk\"):"):
            self.src(f"r0 = blk * {br}")
            if self.partial:
                self.src(f"valid = pypto.min({self.name} - r0, {br})")
            yield self

    def shape(self, t: TensorArg) -> list[int]:
        return [self.block_rows if self.looped else t.shape[0]] + list(t.shape[1:])

    def view(self, t: TensorArg) -> str:
        if not self.looped:
            return t.name
        shape = self.shape(t)
        offsets = ["r0"] + ["0"] * (t.rank - 1)
        if not self.partial:
            return f"pypto.view({t.name}, {py_list(shape)}, {py_list(offsets)})"
        valid = ["valid"] + [str(s) for s in t.shape[1:]]
        return f"pypto.view({t.name}, {py_list(shape)}, {py_list(offsets)}, valid_shape={py_list(valid)})"

    def store(self, value: str, t: TensorArg) -> None:
        """Write a block result into output `t` (assemble at the block offset)."""
        offsets = ["r0" if self.looped else "0"] + ["0"] * (t.rank - 1)
        self.src(f"pypto.assemble({value}, {py_list(offsets)}, {t.name})")


def row_block(spec: KernelSpec, default: int = 8) -> int:
    """Rows per loop iteration: the op's `tile` row entry when given (the IR's SPMD tiling), else `default`."""
    tile = spec.attrs.get("tile")
    if tile:
        return int(tile[0])
    return default


def cast_expr(value: str, src_dtype: str, dst_dtype: str, mode: str = "rint") -> str:
    """pypto source converting `value` from `src_dtype` to `dst_dtype` like kernels.elementwise.cast.

    Floats to integers round with rint (to int8 through the documented int32 → fp16 → int8 path);
    float narrowing rounds to nearest even.
    """
    if src_dtype == dst_dtype:
        return value
    rint = "pypto.CastMode.CAST_RINT" if mode == "rint" else "pypto.CastMode.CAST_TRUNC"
    if dst_dtype == "i8":
        via = value if src_dtype in ("i32",) else f"pypto.cast({value}, pypto.DT_INT32, {rint})"
        return (f"pypto.cast(pypto.cast({via}, pypto.DT_FP16, pypto.CastMode.CAST_ROUND), "
                f"pypto.DT_INT8, pypto.CastMode.CAST_TRUNC)")
    if dst_dtype in ("i32", "i64") and src_dtype not in ("i8", "i32", "i64"):
        return f"pypto.cast({value}, {PTO_DTYPES[dst_dtype]}, {rint})"
    if src_dtype == "i8":
        value = f"pypto.cast({value}, pypto.DT_FP16)"
        if dst_dtype == "fp16":
            return value
    if dst_dtype in ("bf16", "fp16") and src_dtype in ("f32",):
        return f"pypto.cast({value}, {PTO_DTYPES[dst_dtype]}, pypto.CastMode.CAST_RINT)"
    return f"pypto.cast({value}, {PTO_DTYPES[dst_dtype]})"
