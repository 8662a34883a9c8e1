"""pypto 0.2.0 templates of the qkv kernel family (the ops' numpy semantics: dspark_ir/semantics/qkv.py)."""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generators for the lowering (see kernels/pto.py), mirroring the references above op for op:
# * every row reduction (the mean of the RMSNorms) is emitted in numpy's own float32 order (pairwise sum:
#   8 strided accumulators per ≤128 block, combined ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), blocks halved
#   recursively) and divides by the width like np.mean. pypto.sum would reduce in torch's order, which
#   differs from numpy's in most rows at widths ≥ 16;
# * the interleaved RoPE partner r[j^1] is built by data movement only, then out = r·cos_il ± swapped·sin_signed
#   exactly as `rope_il`; the interleaved tables come from `index_select` rows at the positions, the half
#   duplicated/negated and interleaved by data movement (exact).
# So every op and rounding point is the reference's: on CPU the results are bitwise the reference's except
# where pypto's calculator evaluates SQRT with torch's f32 sqrt, which is 1 ulp off the correctly rounded
# value on ~0.6 % of arguments (then inv_rms moves by an ulp: ≤ 1 bf16 ulp / ±1 int8 LSB on rare points).
#
# The templates use the rank-2 helpers of kernels/vector.py (see its docstring for why). Flash TP4 cost-model µs,
# before → after: qproj_dequant_rms_nope_rope 2217 → 194 → 83 → 46.5, kv_rms_norm_rope 87 → 10 → 4.4,
# qr_rms_norm_quant 26 → 12 → 5.5, rope_tables (1 block) 135 → 3.
from dspark_ir.ops.qkv import KvRmsNormRope, QprojDequantRmsNopeRope, QrRmsNormQuant, RopeTables

from .pto import KernelSpec, Src, cast_expr
from .registry import template
from .vector import (
    PTO_QPROJ_CHAIN,
    PTO_T_TILE,
    pto_align,
    pto_block_loops,
    pto_divisor,
    pto_inv_rms_rows,
    pto_qproj_inv_rms,
    pto_qproj_width,
    pto_rms_norm_block,
    pto_rope_rows,
    pto_scope,
    pto_swap_index,
    pto_tile2,
    pto_token_units,
)

_PTO_ROPE_TABLE_ROWS = 32   # tokens per forced subgraph


@template(RopeTables)
def pypto_rope_tables(spec: KernelSpec) -> str:
    """cos_il / sin_signed [T, rd] bf16: the table rows at `positions` (index_select), the first rd/2 columns
    transposed to [rd/2, R], duplicated (cos) or [−s | s] (sin) side by side as [rd/2, 2R], which reshapes to
    the interleaved [rd, R] (row 2i, 2i+1 = column i twice), transposed back (pure data movement, exact).
    Whole blocks of R tokens, then the rest one at a time (the packing needs whole blocks)."""
    cos, sin, pos = spec.operands
    cos_il, sin_signed = spec.results
    rd = int(spec.attrs["rope_dim"])
    half = rd // 2
    src = Src(spec.signature())
    for r, r0 in pto_block_loops(src, pos, _PTO_ROPE_TABLE_ROWS):
        w = pto_align(r, 8)
        pto_scope(src, 1)
        src(f"pypto.set_vec_tile_shapes({w})")
        src(f"pv = pypto.view({pos.name}, [{r}], [{r0}])")
        src(f"pypto.set_vec_tile_shapes({r}, {pto_align(cos.shape[1])})")
        for name, table in (("c", cos), ("s", sin)):
            src(f"{name}f = {cast_expr(f'pypto.index_select({table.name}, 0, pv)', table.dtype, 'f32')}")
        src(f"pypto.set_vec_tile_shapes({half}, {w})")
        for name in ("c", "s"):
            src(f"{name}t = pypto.transpose(pypto.view({name}f, [{r}, {half}], [0, 0]), 0, 1)")
        src(f"pypto.set_vec_tile_shapes({half}, {pto_align(2 * r, 8)})")
        src("cc = pypto.concat([ct, ct], -1)")
        src("ss = pypto.concat([pypto.neg(st), st], -1)")
        for name, target in (("cc", cos_il), ("ss", sin_signed)):
            src(f"pypto.set_vec_tile_shapes({rd}, {w})")
            src(f"{name}2 = pypto.reshape({name}, [{rd}, {r}])")
            src(f"pypto.set_vec_tile_shapes({r}, {pto_align(rd)})")
            src(f"{name}o = {cast_expr(f'pypto.transpose({name}2, 0, 1)', 'f32', target.dtype)}")
            src(f"pypto.assemble({name}o, [{r0}, 0], {target.name})")
        pto_scope(src, -1)
    return src.text()


_PTO_NORM_ROWS = 16   # rows per forced subgraph of the row-norm templates (whole blocks, then single rows)


@template(QrRmsNormQuant)
def pypto_qr_rms_norm_quant(spec: KernelSpec) -> str:
    """qn = (qa·inv)·gamma in f32, then q8 per row: amax = max(max|qn|, 1e-4), k = 127/amax (true division),
    qr = rint(qn·k) through int32 → fp16 → int8, scale = 1/k. Blocks of whole rows (the row sums:
    `pto_rms_norm_block`), each one forced subgraph. Flash TP4 cost model: 8 tasks of 8.4 k cycles, 5.5 µs
    alone (12.4 with `pto_row_sums`' regrouping of the block sums through global memory)."""
    qa, gamma = spec.operands
    qr, scale = spec.results
    n = qa.shape[1]
    eps = float(spec.attrs.get("eps", 1e-6))
    src = Src(spec.signature())
    for r, r0 in pto_block_loops(src, qa, _PTO_NORM_ROWS):
        pto_scope(src, 1)
        pto_rms_norm_block(src, qa, gamma, r, r0, eps, "qn")
        src("amax = pypto.maximum(pypto.amax(pypto.abs(qn), -1, keepdim=True), 0.0001)")
        src(f"pypto.set_vec_tile_shapes({r}, 8)")
        src(f"k = pypto.div(pypto.full([{r}, 1], 127.0, pypto.DT_FP32), amax)")
        src(f"s = pypto.div(pypto.full([{r}, 1], 1.0, pypto.DT_FP32), k)")
        pto_tile2(src, r, n)
        src(f"qv = {cast_expr('pypto.mul(qn, k)', 'f32', 'i8')}")
        src(f"pypto.assemble(qv, [{r0}, 0], {qr.name})")
        src(f"pypto.set_vec_tile_shapes({pto_align(r, 8)})")
        src(f"pypto.assemble(pypto.reshape(s, [{r}]), [{r0}], {scale.name})")
        pto_scope(src, -1)
    return src.text()


_PTO_QPROJ_UNROLL = 4    # tokens per loop iteration (one task each)
_PTO_QPROJ_GROUP = 8      # tokens per task of the group body (8: every chain has a multiple of 8 rows)


def _pto_qproj_chain_heads(heads: int, hd: int, rd: int) -> int | None:
    """Heads per chain of the fast token body, or None when the shapes need the generic one. The fast body
    needs numpy's pairwise order of width hd to be 8 accumulators over whole 128-blocks (hd = 128·2^k, or
    hd ≤ 128 and a multiple of 8), chains of whole 8-head groups (its transposes) and the rope part at a
    32-byte aligned column (a view, not a copy)."""
    if not pto_qproj_width(hd):
        return None
    if (hd - rd) % 8 or rd % 2:
        return None
    hg = next((d for d in range(min(heads, PTO_QPROJ_CHAIN // hd), 0, -1) if heads % d == 0), 1)
    return hg if hg % 8 == 0 else None


def _pto_qproj_token_chains(src: Src, spec: KernelSpec, hg: int) -> None:
    """One token (row r0) in chains of hg heads, each one tile [hg, hd] (`_pto_qproj_chain`), with the partner
    index j ^ 1 built once per token."""
    rd = spec.operands[3].shape[1]
    heads = spec.results[0].shape[1]
    pto_swap_index(src, rd, "sji")
    src(f"pypto.set_vec_tile_shapes({hg}, {rd})")
    src(f"si = pypto.expand_clone(pypto.reshape(sji, [1, {rd}]), [{hg}, {rd}])")
    for g in range(heads // hg):
        # sa per chain: one [1, 1] read each, so no chain keeps the other's broadcast tile alive (a spill)
        src("pypto.set_vec_tile_shapes(1, 8)")
        src(f"sav = pypto.view(pypto.reshape({spec.operands[1].name}, [rows, 1], inplace=True), [1, 1], [r0, 0])")
        _pto_qproj_chain(src, spec, g, 1, hg, "sav", read_rope_rows=g == 0)


def _pto_qproj_chain(src: Src, spec: KernelSpec, g: int, lead: int, hg: int, scale: str,
                     read_rope_rows: bool = False) -> None:
    """Chain g of `lead` tokens from row r0, hg heads: one tile [lead, hg·hd] = [lead·hg, hd] (row t·hg + h).
    q = (f32(acc)·scale)·sw, inv_rms (`pto_qproj_inv_rms`), the nope part cast and assembled, the rope part
    r·c + r[j ^ 1]·s with the partner by `pypto.gather` on the last axis (`si`; `cf`, `sf` the [lead·hg, rd]
    tables, or with `read_rope_rows` read here as the [lead, rd] rows of cos_il / sin_signed)."""
    acc, _, sw, cos_il, sin_signed = spec.operands
    out = spec.results[0]
    hd = out.shape[2]
    rd = cos_il.shape[1]
    nope = hd - rd
    rows, w = lead * hg, hg * hd
    src(f"pypto.set_vec_tile_shapes({lead}, {w})")
    src(f"x = {cast_expr(f'pypto.view({acc.name}, [{lead}, {w}], [r0, {g * w}])', acc.dtype, 'f32')}")
    src(f"swr = pypto.view(pypto.reshape({sw.name}, [1, {acc.shape[1]}]), [1, {w}], [0, {g * w}])")
    src(f"q2 = pypto.mul(pypto.mul(x, {scale}), swr)")
    src(f"pypto.set_vec_tile_shapes({rows}, {hd})")
    src(f"q = pypto.reshape(q2, [{rows}, {hd}])")
    pto_qproj_inv_rms(src, "q", rows, hd, float(spec.attrs.get("eps", 1e-6)), "inv")
    src(f"pypto.set_vec_tile_shapes({rows}, {hd})")
    src("qn = pypto.mul(q, inv)")
    if nope:
        src(f"nb_ = {cast_expr(f'pypto.view(qn, [{rows}, {nope}], [0, 0])', 'f32', out.dtype)}")
        src(f"pypto.set_vec_tile_shapes({lead}, {hg}, {pto_align(nope)})")
        src(f"pypto.assemble(pypto.reshape(nb_, [{lead}, {hg}, {nope}]), [r0, {g * hg}, 0], {out.name})")
    src(f"pypto.set_vec_tile_shapes({rows}, {rd})")
    if read_rope_rows:
        for name, t in (("cf", cos_il), ("sf", sin_signed)):
            src(f"{name} = {cast_expr(f'pypto.view({t.name}, [{lead}, {rd}], [r0, 0])', t.dtype, 'f32')}")
    src(f"rp = pypto.view(qn, [{rows}, {rd}], [0, {nope}])")
    src("ro = pypto.add(pypto.mul(rp, cf), pypto.mul(pypto.gather(rp, 1, si), sf))")
    src(f"rob = {cast_expr('ro', 'f32', out.dtype)}")
    src(f"pypto.set_vec_tile_shapes({lead}, {hg}, {pto_align(rd)})")
    src(f"pypto.assemble(pypto.reshape(rob, [{lead}, {hg}, {rd}]), [r0, {g * hg}, {nope}], {out.name})")


def _pto_qproj_group_heads(heads: int, hd: int) -> int | None:
    """Heads per chain of the group body (the largest divisor of `heads` whose chain of G tokens fits one
    64 KiB tile), or None when not even one head does."""
    cap = PTO_QPROJ_CHAIN // (_PTO_QPROJ_GROUP * hd)
    return pto_divisor(heads, cap) if cap else None


def _pto_qproj_group_chains(src: Src, spec: KernelSpec, hg: int, chain_range: range | None = None) -> None:
    """G tokens from row r0 in chains of hg heads (`_pto_qproj_chain` with lead G), the per-token reads done once
    for the G tokens. The qr_scale column is spread over one 32-byte-aligned column per chain (an own view per
    chain: a view shared by the chains makes pypto keep its [G, hg·hd] broadcast alive across them, a spill); the
    cos/sin rows are repeated over the heads once ([G, rd] → [G, hg, rd] → [G·hg, rd]). `chain_range`: the chains
    to emit (default all of them)."""
    _, sa, _, cos_il, sin_signed = spec.operands
    heads = spec.results[0].shape[1]
    rd = cos_il.shape[1]
    g_ = _PTO_QPROJ_GROUP
    rows = g_ * hg
    chosen = chain_range if chain_range is not None else range(heads // hg)
    chains = len(chosen)
    pto_swap_index(src, rd, "sji")
    src(f"pypto.set_vec_tile_shapes({rows}, {rd})")
    src(f"si = pypto.expand_clone(pypto.reshape(sji, [1, {rd}]), [{rows}, {rd}])")
    src(f"pypto.set_vec_tile_shapes({g_}, 8)")
    src(f"sav = pypto.view(pypto.reshape({sa.name}, [rows, 1], inplace=True), [{g_}, 1], [r0, 0])")
    src(f"pypto.set_vec_tile_shapes({g_}, {8 * chains})")
    src(f"sa8 = pypto.expand_clone(sav, [{g_}, {8 * chains}])")
    for name, t in (("cf", cos_il), ("sf", sin_signed)):
        src(f"pypto.set_vec_tile_shapes({g_}, {rd})")
        src(f"{name} = {cast_expr(f'pypto.view({t.name}, [{g_}, {rd}], [r0, 0])', t.dtype, 'f32')}")
        src(f"pypto.set_vec_tile_shapes({g_}, 1, {rd})")
        src(f"{name} = pypto.reshape({name}, [{g_}, 1, {rd}])")
        src(f"pypto.set_vec_tile_shapes({g_}, {hg}, {rd})")
        src(f"{name} = pypto.expand_clone({name}, [{g_}, {hg}, {rd}])")
        src(f"pypto.set_vec_tile_shapes({rows}, {rd})")
        src(f"{name} = pypto.reshape({name}, [{rows}, {rd}])")
    for i, g in enumerate(chosen):
        src(f"pypto.set_vec_tile_shapes({g_}, 8)")
        src(f"sac = pypto.view(sa8, [{g_}, 1], [0, {8 * i}])")
        _pto_qproj_chain(src, spec, g, g_, hg, "sac")


def _pto_qproj_parts(spec: KernelSpec, chains: int) -> list[range]:
    """The head chains of a token group split into one forced subgraph per part: one part, unless the task runs
    on `workers` cyclic workers (dequant-workers), whose count the token groups share: ceil(workers / groups)
    parts of nearly equal chain counts, so the task's pypto tasks fill the workers' lanes."""
    workers = int(spec.attrs.get("workers") or 0)
    groups = spec.operands[0].shape[0] // _PTO_QPROJ_GROUP
    if workers <= 1 or groups < 1:
        return [range(chains)]
    n = max(1, min(chains, -(-workers // groups)))
    cuts = [chains * i // n for i in range(n + 1)]
    return [range(a, b) for a, b in zip(cuts, cuts[1:])]


def _pto_qproj_token_rows(src: Src, spec: KernelSpec) -> None:
    """One token (row r0) for any shape: rank-2 math on q [H, hd] (the row sums by `pto_row_sums`, the RoPE
    pair swap by `pto_rope_rows`), tiles split as pypto likes (may go through global memory)."""
    acc, sa, sw, cos_il, sin_signed = spec.operands
    out = spec.results[0]
    _, heads, hd = out.shape
    n = acc.shape[1]
    rd = cos_il.shape[1]
    nope = hd - rd
    eps = float(spec.attrs.get("eps", 1e-6))
    src("pypto.set_vec_tile_shapes(8)")
    src(f"sav = pypto.reshape(pypto.view({sa.name}, [1], [r0]), [1, 1])")
    src(f"pypto.set_vec_tile_shapes(1, {pto_align(rd)})")
    src(f"cf = {cast_expr(f'pypto.view({cos_il.name}, [1, {rd}], [r0, 0])', cos_il.dtype, 'f32')}")
    src(f"sf = {cast_expr(f'pypto.view({sin_signed.name}, [1, {rd}], [r0, 0])', sin_signed.dtype, 'f32')}")
    src(f"pypto.set_vec_tile_shapes(1, {pto_align(min(n, 16384))})")
    src(f"x = {cast_expr(f'pypto.view({acc.name}, [1, {n}], [r0, 0])', acc.dtype, 'f32')}")
    src(f"q2 = pypto.mul(pypto.mul(x, sav), pypto.reshape({sw.name}, [1, {n}]))")
    pto_tile2(src, heads, hd)
    src(f"q = pypto.reshape(q2, [{heads}, {hd}])")
    pto_inv_rms_rows(src, "q", heads, hd, eps, "inv")
    pto_tile2(src, heads, hd)
    src("qn = pypto.mul(q, inv)")
    if nope:
        src(f"nb_ = {cast_expr(f'pypto.view(qn, [{heads}, {nope}], [0, 0])', 'f32', out.dtype)}")
        src(f"pypto.set_vec_tile_shapes(1, {pto_divisor(heads, 16384 // pto_align(nope))}, {pto_align(nope)})")
        src(f"pypto.assemble(pypto.reshape(nb_, [1, {heads}, {nope}]), [r0, 0, 0], {out.name})")
    src(f"pypto.set_vec_tile_shapes({min(heads, PTO_T_TILE)}, {pto_align(rd, 8)})")
    src(f"rp = pypto.view(qn, [{heads}, {rd}], [0, {nope}])")
    pto_rope_rows(src, "rp", heads, rd, "cf", "sf", "ro")
    src(f"rob = {cast_expr('ro', 'f32', out.dtype)}")
    src(f"pypto.set_vec_tile_shapes(1, {min(heads, PTO_T_TILE)}, {pto_align(rd)})")
    src(f"pypto.assemble(pypto.reshape(rob, [1, {heads}, {rd}]), [r0, 0, {nope}], {out.name})")


@template(QprojDequantRmsNopeRope)
def pypto_qproj_dequant_rms_nope_rope(spec: KernelSpec) -> str:
    """q = (f32(acc)·qr_scale)·wq_b_scale → [H, hd] per token; q·inv_rms per head; RoPE on the last rd dims;
    one bf16 rounding (nope and rope parts assembled separately).

    Shapes `_pto_qproj_chain_heads` accepts run in chains of whole 64 KiB tiles without any copy through global
    memory: groups of G = 8 tokens as one forced subgraph each (`_pto_qproj_group_chains`), the remaining tokens
    one per subgraph (`_pto_qproj_token_chains`); the others one token per subgraph, 4 per loop iteration, as
    rank-2 [H, hd] math (`_pto_qproj_token_rows`). Every tensor is read inside the subgraph (a shared reshape of
    wq_b_scale outside the loop was a task with all T token tasks as successors: the AICPU resolves each edge
    serially, ~50 k cycles at T = 128). Flash TP4 cost model: 16 tasks of 82.7 k cycles, vector-bound (the
    token body: 128 tasks of 18.6 k, each waiting on its own qr_scale / cos / sin / wq_b_scale copies of
    ~1.4 k cycles fixed cost), 46.5 µs alone (token body 83, before it 194)."""
    acc, _, _, cos_il, _ = spec.operands
    _, heads, hd = spec.results[0].shape
    hg = _pto_qproj_chain_heads(heads, hd, cos_il.shape[1])
    gh = None if hg is None else _pto_qproj_group_heads(heads, hd)
    src = Src(spec.signature())
    if gh is not None:
        parts = _pto_qproj_parts(spec, heads // gh)
        for r, r0 in pto_block_loops(src, acc, _PTO_QPROJ_GROUP):
            if r > 1:
                for scope, chains in enumerate(parts, 1):
                    pto_scope(src, scope)
                    _pto_qproj_group_chains(src, spec, gh, chains)
                    pto_scope(src, -1)
            else:
                pto_scope(src, 1)
                src(f"r0 = {r0}")
                _pto_qproj_token_chains(src, spec, hg)
                pto_scope(src, -1)
        return src.text()
    for unit in pto_token_units(src, acc, _PTO_QPROJ_UNROLL):
        pto_scope(src, unit)
        if hg is None:
            _pto_qproj_token_rows(src, spec)
        else:
            _pto_qproj_token_chains(src, spec, hg)
        pto_scope(src, -1)
    return src.text()


@template(KvRmsNormRope)
def pypto_kv_rms_norm_rope(spec: KernelSpec) -> str:
    """kv = rope((ka·inv)·gamma), one bf16 rounding (nope and rope parts assembled separately). Blocks of whole
    rows as one forced subgraph each: rank-2 math (`pto_rms_norm_block`; the pair swap by a gather on whole
    8-row blocks, else `pto_rope_rows`). Flash TP4 cost model 9.9 → 4.4 µs alone."""
    ka, gamma, cos_il, sin_signed = spec.operands
    out = spec.results[0]
    n = ka.shape[1]
    rd = cos_il.shape[1]
    nope = n - rd
    eps = float(spec.attrs.get("eps", 1e-6))
    src = Src(spec.signature())
    for r, r0 in pto_block_loops(src, ka, _PTO_NORM_ROWS):
        pto_scope(src, 1)
        pto_rms_norm_block(src, ka, gamma, r, r0, eps, "kn")
        if nope:
            src(f"np_ = {cast_expr(f'pypto.view(kn, [{r}, {nope}], [0, 0])', 'f32', out.dtype)}")
            src(f"pypto.assemble(np_, [{r0}, 0], {out.name})")
        src(f"pypto.set_vec_tile_shapes({r}, {pto_align(rd)})")
        for name, t in (("cb", cos_il), ("sb", sin_signed)):
            src(f"{name} = {cast_expr(f'pypto.view({t.name}, [{r}, {rd}], [{r0}, 0])', t.dtype, 'f32')}")
        src(f"rp = pypto.view(kn, [{r}, {rd}], [0, {nope}])")
        if r % 8 == 0 and nope % 8 == 0:   # the pair swap by a gather (the transposed row swap goes through GM)
            pto_swap_index(src, rd, "sji")
            src(f"pypto.set_vec_tile_shapes({r}, {pto_align(rd)})")
            src(f"si = pypto.expand_clone(pypto.reshape(sji, [1, {rd}]), [{r}, {rd}])")
            src("ro = pypto.add(pypto.mul(rp, cb), pypto.mul(pypto.gather(rp, 1, si), sb))")
        else:
            pto_rope_rows(src, "rp", r, rd, "cb", "sb", "ro")
        src(f"ro_ = {cast_expr('ro', 'f32', out.dtype)}")
        src(f"pypto.assemble(ro_, [{r0}, {nope}], {out.name})")
        pto_scope(src, -1)
    return src.text()
