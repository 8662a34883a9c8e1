"""pypto 0.2.0 templates of the attention kernel family (the ops' numpy semantics: dspark_ir/semantics/attention.py)."""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generators for the lowering (see kernels/pto.py), mirroring the references above.
# * swa_cache_insert_valid_bias: the row insert is a `pypto.loop` over tokens that reads the slot as a
#   runtime scalar (`slot_mapping[t]`, GetTensorData) and assembles the kv row at [slot, 0] only
#   `if slot >= 0`: −1 is skipped and, iterations running in token order, the later token wins a duplicate
#   slot, as in the reference (verified on CPU; on the NPU the order of two iterations that hit the same row
#   through data-dependent offsets is the runtime's, which CPU cannot check). `scatter_update` is not used:
#   with a −1 slot it writes row −1 (the last row) and, on CPU, also corrupts other rows. The kernel writes
#   only the inserted rows of `kv_cache` (the caller passes the same buffer as `kv_cache_in`). The bias is
#   where(col < lens, 0, −1e20) with col = arange(window).
# * swa_gather_kv: groups of n tokens (4 on flash: 512 KiB of rows), 4 groups per loop iteration, each group
#   one forced subgraph, i.e. one pypto task: index_select of the clamped index max(idx, 0), then
#   where(idx ≥ 0, f32(row), 0) rounded back (bf16 → f32 → bf16 is exact; a −1 row reads +0). The where is
#   written in f32: pypto puts the implicit casts of a bf16 where outside the subgraph (more tasks per tile).
#   The cost model's span follows the task count and the loop iterations (each task ~300 cycles of dispatch,
#   ~10 iterations in flight), not the bytes: one token per iteration and an unfused chain made 1280 tasks and
#   253 µs on flash TP4; this makes 32 tasks and 21 µs (its roofline). The index_select tile covers the group's
#   whole [n, window] index (only head_dim is split, to ≤ 32 KiB of rows as for the broadcast where in
#   kernels/sparse.py): with an in-kernel computed index, pypto 0.2.0's InferParamIndex pass mis-assigns index
#   tiles otherwise (pass-verify FAILS whenever a tile splits the index dims; the tensor graph itself computes
#   right). A group past the last row is moved back to end there (rewriting rows of an earlier group with the
#   same values; no `if` per token: pypto's compile time grows with the body's paths, > 10 min for 16 tokens),
#   partial only when rows < n.
# * qk_pv: kernels/attention_blocks.py `PtoWindowAttn` (2-D cube matmuls on in-place 2-D reshapes of q and kv_rows,
#   key-major sᵀ = K·qᵀ so m, l come out as rows; token pairs share one q·Kᵀ task when the window is one tile),
#   one k_tile of the token's window rows at a time, valid where index ≥ 0 and bias ≥ 0, the reference's
#   mask/exp order, l in numpy's pairwise order, the tiles merged in order. The matmuls accumulate in f32 where
#   the reference rounds an f64 sum once, so s, m, l, o agree to f32 rounding (not bitwise).
# * merge_norm: kernels/attention_blocks.py `PtoGroupMerge` (one task per head group and block of 32 tokens, static T):
#   o / (l + exp(sink − m)) in f32, the inverse RoPE partner r[j ^ 1] by `pypto.gather` with an in-kernel swap
#   index, one bf16 rounding, each head assembled straight into its place of the group-major pack. Bitwise the
#   reference's on CPU except where the calculator's exp (torch) and numpy's differ by an f32 ulp (≤ 1 bf16 ulp on
#   rare points).
from dspark_ir.ops.attention import (
    MergeNorm,
    QkPv,
    SwaCacheInsertValidBias,
    SwaCacheWriteback,
    SwaGatherKv,
    SwaValidBias,
)

from .attention_blocks import PtoGroupMerge, PtoWindowAttn
from .pto import KernelSpec, RowLoop, Src, cast_expr
from .registry import template
from .vector import PtoBlock, pto_scope, pto_set_tile

_PTO_NEG_INF_ATTN = -1.0e20


def pto_scatter_slots(src: Src, kv, slots, cache, loop_name: str) -> None:
    """Emit the serial slot scatter: row t of `kv` to row slots[t] of `cache` (in place), slot −1 skipped,
    in token order (so the last of duplicate slots wins, as in the reference)."""
    d = kv.shape[1]
    n = f"{slots.name}.shape[0]" if slots.is_dynamic(0) else str(slots.shape[0])
    src(f"tokens = {n}")
    pto_set_tile(src, [1, d])
    with src.block(f'for t in pypto.loop(0, tokens, 1, name="{loop_name}", idx_name="t"):'):
        src(f"slot = {slots.name}[t]")
        with src.block("if slot >= 0:"):
            src(f"pypto.assemble(pypto.clone(pypto.view({kv.name}, [1, {d}], [t, 0])), [slot, 0], {cache.name})")


def pto_valid_bias_rows(src: Src, lens, bias, window: int) -> None:
    """Emit the valid bias: per token row, 0 for window columns < lens[t], the attention mask value (−1e20) beyond,
    in row blocks of 32 tokens, one subgraph per block (the bias is small)."""
    loop = RowLoop(src, lens, 32)
    blk = PtoBlock(loop, lens)
    br = blk.rows
    with loop.loop():
        pto_scope(src, 1)
        pto_set_tile(src, [br, max(window, 8)])
        src(f"lf = {blk.reshape(cast_expr(loop.view(lens), lens.dtype, 'f32'), [br, 1])}")
        src(f"cols = pypto.reshape(pypto.cast(pypto.arange({window}), pypto.DT_FP32), [1, {window}])")
        src(f"b = pypto.where(pypto.lt(cols, lf), 0.0, {_PTO_NEG_INF_ATTN!r})")
        loop.store("b", bias)
        pto_scope(src, -1)


@template(SwaCacheInsertValidBias)
def pypto_swa_cache_insert_valid_bias(spec: KernelSpec) -> str:
    kv, _cache_in, slots, lens = spec.operands
    cache, bias = spec.results
    window = int(spec.attrs["window"])
    src = Src(spec.signature())
    pto_scatter_slots(src, kv, slots, cache, "insert_loop")
    pto_valid_bias_rows(src, lens, bias, window)
    return src.text()


_PTO_GATHER_TASK_ELEMS = 4 * 128 * 512  # rows one gather task writes: 4 flash tokens (512 KiB of bf16)
_PTO_GATHER_TASKS_PER_ITER = 4


@template(SwaGatherKv)
def pypto_swa_gather_kv(spec: KernelSpec) -> str:
    cache, idx = spec.operands
    out = spec.results[0]
    window = idx.shape[1]
    d = cache.shape[1]
    n = max(1, min(8, _PTO_GATHER_TASK_ELEMS // (window * d)))  # tokens per gather task
    groups = _PTO_GATHER_TASKS_PER_ITER
    if not idx.is_dynamic(0):
        n = min(n, idx.shape[0])
        groups = min(groups, -(-idx.shape[0] // n))
    d_tile = d
    while n * window * d_tile * 2 > 32 * 1024 and d_tile % 2 == 0 and d_tile > 16:
        d_tile //= 2
    step = n * groups
    src = Src(spec.signature())
    src(f"rows = {idx.name}.shape[0]" if idx.is_dynamic(0) else f"rows = {idx.shape[0]}")
    loop = f'pypto.loop(0, (rows + {step - 1}) // {step}, 1, name="rows_loop", idx_name="blk")'
    with src.block(f"for blk in {loop}:"):
        for j in range(groups):
            src(f"r = pypto.max(pypto.min(blk * {step} + {j * n}, rows - {n}), 0)")  # (see above)
            src(f"valid = pypto.min(rows - r, {n})")
            pto_scope(src, j + 1)
            pto_set_tile(src, [n, window])
            src(f"iv = pypto.view({idx.name}, [{n}, {window}], [r, 0], valid_shape=[valid, {window}])")
            src("ci = pypto.maximum(iv, 0)")
            pto_set_tile(src, [n, window, 8])
            src(f"ok = pypto.reshape({cast_expr('iv', idx.dtype, 'f32')}, [{n}, {window}, 1], "
                f"valid_shape=[valid, {window}, 1])")
            pto_set_tile(src, [n, window, d_tile])  # the whole index block in one tile (see above)
            src(f"g = pypto.index_select({cache.name}, 0, ci)")
            where = f"pypto.where(pypto.ge(ok, 0.0), {cast_expr('g', cache.dtype, 'f32')}, 0.0)"
            src(f"y = {cast_expr(where, 'f32', out.dtype)}")
            src(f"pypto.assemble(y, [r, 0, 0], {out.name})")
            pto_scope(src, -1)
    return src.text()


@template(QkPv)
def pypto_qk_pv(spec: KernelSpec) -> str:
    spec = spec.static()  # see PtoWindowAttn
    q, rows, bias, idx = spec.operands
    k_tile = int(spec.attrs.get("k_tile") or rows.shape[1])
    src = Src(spec.signature())

    def valid_row(tok: str, a: int, n: int, r: int) -> None:
        ix = cast_expr(f"pypto.view({idx.name}, [{r}, {n}], [{tok}, {a}])", idx.dtype, "f32")
        src(f"vr = pypto.where(pypto.ge({ix}, 0.0), pypto.view({bias.name}, [{r}, {n}], [{tok}, {a}]), -1.0)")

    PtoWindowAttn(src, q, rows, spec.results, k_tile, float(spec.attrs["scale"]), valid_row).emit()
    return src.text()


@template(MergeNorm)
def pypto_merge_norm(spec: KernelSpec) -> str:
    spec = spec.static()  # see PtoGroupMerge
    m, l, o, sink, cos_il, sin_signed = spec.operands
    out = spec.results[0]
    ntok, heads, hd = o.shape
    src = Src(spec.signature())
    src(f"o2 = pypto.reshape({o.name}, [{ntok}, {heads * hd}], inplace=True)")
    src(f"sink2 = pypto.reshape({sink.name}, [1, {heads}], inplace=True)")
    mg = PtoGroupMerge(src, ntok, heads, hd, int(spec.attrs["o_groups"]))
    with mg.blocks():
        mg.load_state(mg.cols(m.name), mg.cols(l.name))
        mg.denominator("sink2")
        mg.tables(cos_il, sin_signed, None)
        for j in mg.head_loop():
            src(f"o_acc = {mg.head('o2', f'(h0 + {j}) * {hd}')}")
            mg.normalize_head()
            mg.pack_head(j, cos_il.shape[1], out)
    return src.text()


# The two halves of the fused task, produced by the split-writeback-bias pass: the same code as the fused
# template's insert loop and bias blocks (bitwise the same as the fused op's, which its tests check).
@template(SwaCacheWriteback)
def pypto_swa_cache_writeback(spec: KernelSpec) -> str:
    kv, _cache_in, slots = spec.operands
    (cache,) = spec.results
    src = Src(spec.signature())
    pto_scatter_slots(src, kv, slots, cache, "writeback_loop")
    return src.text()


@template(SwaValidBias)
def pypto_swa_valid_bias(spec: KernelSpec) -> str:
    (lens,) = spec.operands
    (bias,) = spec.results
    window = int(spec.attrs["window"])
    src = Src(spec.signature())
    pto_valid_bias_rows(src, lens, bias, window)
    return src.text()
