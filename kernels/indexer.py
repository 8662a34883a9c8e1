"""pypto 0.2.0 templates of the indexer kernel family (the ops' numpy semantics: dspark_ir/semantics/indexer.py)."""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generators for the lowering (see kernels/pto.py); mirror the references above.
from dspark_ir.errors import DsparkError
from dspark_ir.ops.indexer import (
    IdxHadamardMatmul,
    IdxQQuant,
    IdxQrDequant,
    IdxQrRope,
    IdxScore,
    IdxTopk,
    IdxTopkBounded,
    IdxWeightsProj,
    IdxWeightsReduce,
    unsorted_prefix,
)

from .cube import pto_split_bounds
from .pto import WIDE_VEC_TILE_BYTES, KernelSpec, RowLoop, Src, cast_expr, cube_shapes, row_block, vec_tile
from .registry import template
from .vector import PTO_NEG_INF, PtoBlock, pto_cols_of, pto_ramp, pto_set_tile, pto_tile


@template(IdxWeightsReduce)
def pypto_idx_weights_reduce(spec: KernelSpec) -> str:
    """(Σ_k partials[k], ascending) · scale over [k, T, IH] partials, block by block over T."""
    p = spec.operands[0]
    out = spec.results[0]
    splits, _, width = p.shape
    scale = float(spec.attrs["scale"])
    src = Src(spec.signature())
    loop = RowLoop(src, out, row_block(spec, default=16))
    br = loop.shape(out)[0]
    r0 = "r0" if loop.looped else "0"
    partial = loop.looped and loop.partial
    tile2d = vec_tile((br, width), 4)
    with loop.loop():
        for k in range(splits):
            src(f"pypto.set_vec_tile_shapes(1, {tile2d[0]}, {tile2d[1]})")
            valid3 = f", valid_shape=[1, valid, {width}]" if partial else ""
            valid2 = f", valid_shape=[valid, {width}]" if partial else ""
            src(f"pk = pypto.reshape(pypto.view({p.name}, [1, {br}, {width}], [{k}, {r0}, 0]{valid3}), "
                f"[{br}, {width}]{valid2})")
            src(f"pypto.set_vec_tile_shapes({', '.join(map(str, tile2d))})")
            src("acc = pk" if k == 0 else "acc = pypto.add(acc, pk)")
        src(f"y = pypto.mul(acc, {scale!r})")
        loop.store("y", out)
    return src.text()


# Templates of the query side, head weights, score and top-k (see kernels/compressor.py's template section for the
# runtime-scalar idioms; the helpers shared with it are in kernels/vector.py).


def _pto_divisor(n: int, cap: int) -> int:
    """The largest divisor of n that is ≤ cap (≥ 1)."""
    for d in range(max(1, min(n, cap)), 0, -1):
        if n % d == 0:
            return d
    return 1


@template(IdxQrDequant)
def pypto_idx_qr_dequant(spec: KernelSpec) -> str:
    """q = (f32(acc) · qr_scale[t]) · wq_b_scale[n] → [rows, heads, head_dim] (the reference's order: bitwise).
    tile = [rows, n]: upstream's per-step tile (pypto-lib decode_indexer.py, idx_qr_proj_dequant: DEQUANT_T_TILE
    token rows × Q_OUT_TILE columns, one spmd block per column tile): the loop walks the token tiles and every
    vector op runs on [rows, n] tiles (n a whole number of heads)."""
    acc, sa, sw = spec.operands
    out = spec.results[0]
    _, heads, hd = out.shape
    n = acc.shape[1]
    tile = spec.attrs.get("tile") or [max(1, min(32, 16384 // n)), n]
    cols = int(tile[1])
    src = Src(spec.signature())
    loop = RowLoop(src, acc, int(tile[0]))
    blk = PtoBlock(loop, acc)
    br = blk.rows
    with loop.loop():
        pto_set_tile(src, [br, cols])
        src(f"sav = {blk.reshape(loop.view(sa), [br, 1])}")
        src(f"swv = pypto.reshape({sw.name}, [1, {n}])")
        src(f"q2 = pypto.mul(pypto.mul({cast_expr(loop.view(acc), 'i32', 'f32')}, sav), swv)")
        pto_set_tile(src, [br, max(1, cols // hd), hd])
        src(f"q3 = {blk.reshape('q2', [br, heads, hd])}")
        loop.store("q3", out)
    return src.text()


@template(IdxQrRope)
def pypto_idx_qr_rope(spec: KernelSpec) -> str:
    """Per block of requests: the rope lanes of every (token, head) row swapped with `gather` by the swap operand
    (index expanded over the rows), out = r·cos_il + swapped·sin_signed with the request's table row broadcast over
    its seq tokens and heads, then one bf16 rounding (nope lanes rounded as they are)."""
    q, cos_il, sin_signed, swap = spec.operands
    out = spec.results[0]
    _, heads, hd = q.shape
    batch, rd = cos_il.shape
    seq = int(spec.attrs["seq"])
    nope = hd - rd
    src = Src(spec.signature())
    nb = _pto_divisor(batch, max(1, WIDE_VEC_TILE_BYTES // (seq * heads * hd * 4)))
    rows = nb * seq
    with src.block(f'for rb in pypto.loop(0, {batch // nb}, 1, name="req_loop", idx_name="rb"):'):
        src(f"t0 = rb * {rows}")
        pto_tile(src, (rows, heads, hd))
        src(f"x = pypto.view({q.name}, [{rows}, {heads}, {hd}], [t0, 0, 0])")
        src(f"rp = pypto.clone(pypto.view(x, [{rows}, {heads}, {rd}], [0, 0, {nope}]))")
        pto_tile(src, (rows * heads, rd))
        src(f"r2 = pypto.reshape(rp, [{rows * heads}, {rd}])")
        src(f"ix = pypto.expand_clone(pypto.reshape({swap.name}, [1, {rd}]), [{rows * heads}, {rd}])")
        src("s2 = pypto.gather(r2, 1, ix)")
        pto_tile(src, (nb, seq * heads, rd))
        src(f"r3 = pypto.reshape(r2, [{nb}, {seq * heads}, {rd}])")
        src(f"s3 = pypto.reshape(s2, [{nb}, {seq * heads}, {rd}])")
        for name, t in (("cb", cos_il), ("sb", sin_signed)):
            pto_tile(src, (nb, rd))
            src(f"{name}2 = {cast_expr(f'pypto.view({t.name}, [{nb}, {rd}], [rb * {nb}, 0])', t.dtype, 'f32')}")
            pto_tile(src, (nb, seq * heads, rd))
            src(f"{name} = pypto.reshape({name}2, [{nb}, 1, {rd}])")
        src("ro = pypto.add(pypto.mul(r3, cb), pypto.mul(s3, sb))")
        pto_tile(src, (rows, heads, rd))
        src(f"ro3 = {cast_expr(f'pypto.reshape(ro, [{rows}, {heads}, {rd}])', 'f32', out.dtype)}")
        src(f"pypto.assemble(ro3, [t0, 0, {nope}], {out.name})")
        if nope:
            pto_tile(src, (rows, heads, nope))
            src(f"np3 = {cast_expr(f'pypto.view(x, [{rows}, {heads}, {nope}], [0, 0, 0])', 'f32', out.dtype)}")
            src(f"pypto.assemble(np3, [t0, 0, 0], {out.name})")
    return src.text()


@template(IdxHadamardMatmul)
def pypto_idx_hadamard_matmul(spec: KernelSpec) -> str:
    """qh = q @ H per (token, head) row: [rows·IH, IHD] × [IHD, IHD] on the cube, f32 accumulation. The op's tile
    counts (token, head) rows: each step multiplies that many rows (whole tokens), upstream's per-block tile
    (pypto-lib decode_indexer.py, qr_hadamard_matmul: QH_MM_TILE = 64 rows per spmd block)."""
    q, had = spec.operands
    out = spec.results[0]
    _, heads, hd = q.shape
    n = had.shape[1]
    src = Src(spec.signature())
    loop = RowLoop(src, q, max(1, row_block(spec, default=512) // heads))
    blk = PtoBlock(loop, q)
    br = blk.rows
    mixed = q.dtype != had.dtype
    with loop.loop():
        pto_tile(src, (br, heads, hd), q.itemsize)
        x = loop.view(q)
        if mixed:  # f32 × bf16 (or the like): both operands in f32 (exact promotion)
            x = cast_expr(x, q.dtype, "f32")
        valid = ", valid_shape=[valid * " + str(heads) + f", {hd}]" if blk.partial else ""
        src(f"x2 = pypto.reshape({x}, [{br * heads}, {hd}]{valid})")
        hm = had.name
        if mixed:
            src(f"hm = {cast_expr(had.name, had.dtype, 'f32')}")
            hm = "hm"
        src(f"pypto.set_cube_tile_shapes({cube_shapes(br * heads, hd, n, 'f32' if mixed else q.dtype)})")
        src(f"y2 = pypto.matmul(x2, {hm}, pypto.DT_FP32)")
        pto_tile(src, (br, heads, n))
        src(f"y3 = {blk.reshape('y2', [br, heads, n])}")
        loop.store("y3", out)
    return src.text()


@template(IdxQQuant)
def pypto_idx_q_quant(spec: KernelSpec) -> str:
    """q8 per (token, head) row: amax = max(max|x|, 1e-4), k = 127/amax (true division), rint through int32 →
    fp16 → int8, scale = 1/k (the goldens' q8 op for op: bitwise). The op's tile counts (token, head) rows: each
    step quantises that many rows (whole tokens), upstream's per-block tile (pypto-lib decode_indexer.py,
    qr_hadamard_quant: QH_QUANT_TILE = 64 rows per spmd block); without one, 8 tokens per step."""
    qh = spec.operands[0]
    qo, so = spec.results
    _, heads, hd = qh.shape
    src = Src(spec.signature())
    loop = RowLoop(src, qh, max(1, row_block(spec, default=8 * heads) // heads))
    blk = PtoBlock(loop, qh)
    br = blk.rows
    with loop.loop():
        wide = [br, _pto_divisor(heads, max(1, 8192 // (br * hd))), hd]
        pto_set_tile(src, wide)
        src(f"x = {loop.view(qh)}")
        src("amax = pypto.maximum(pypto.amax(pypto.abs(x), -1, keepdim=True), 0.0001)")
        narrow = [br, _pto_divisor(heads, max(1, 8192 // (br * 8))), 8]
        pto_set_tile(src, narrow)
        src(f"kq = pypto.div(pypto.full([{br}, {heads}, 1], 127.0, pypto.DT_FP32{blk.valid(heads, 1)}), amax)")
        src(f"ks = pypto.div(pypto.full([{br}, {heads}, 1], 1.0, pypto.DT_FP32{blk.valid(heads, 1)}), kq)")
        pto_set_tile(src, wide)
        src(f"qv = {cast_expr('pypto.mul(x, kq)', 'f32', 'i8')}")
        loop.store("qv", qo)
        pto_set_tile(src, [narrow[0], max(8, heads)])
        src(f"s2 = {blk.reshape('ks', [br, heads])}")
        loop.store("s2", so)
    return src.text()


@template(IdxWeightsProj)
def pypto_idx_weights_proj(spec: KernelSpec) -> str:
    """Partial k = x[:, K_k] @ weights_proj[K_k] (contiguous linspace slices like the reference), f32 accumulation
    on the cube, assembled at [k, rows, 0]."""
    x, w = spec.operands
    out = spec.results[0]
    splits = pto_split_bounds(x.shape[1], int(spec.attrs["k_split"]))
    ih = w.shape[1]
    src = Src(spec.signature())
    loop = RowLoop(src, x, 64 if x.is_dynamic(0) or x.shape[0] > 64 else x.shape[0])
    blk = PtoBlock(loop, x)
    br = blk.rows
    with loop.loop():
        for s, (lo, hi) in enumerate(splits):
            src(f"pypto.set_cube_tile_shapes({cube_shapes(br, hi - lo, ih, x.dtype)})")
            src(f"xa = pypto.view({x.name}, [{br}, {hi - lo}], [{blk.r0}, {lo}]{blk.valid(hi - lo)})")
            src(f"wa = pypto.view({w.name}, [{hi - lo}, {ih}], [{lo}, 0])")
            src("pk = pypto.matmul(xa, wa, pypto.DT_FP32)")
            pto_set_tile(src, [1] + vec_tile((br, ih), 4))
            valid = f", valid_shape=[1, valid, {ih}]" if blk.partial else ""
            src(f"pk3 = pypto.reshape(pk, [1, {br}, {ih}]{valid})")
            src(f"pypto.assemble(pk3, [{s}, {blk.r0}, 0], {out.name})")
    return src.text()


def _pto_floor_div(src: Src, x: str, r: int, out: str) -> None:
    """out = floor(x / r) for integer-valued f32 x in [0, 2^23): a power-of-two r multiplies by 1/r (exact), any
    other r divides (IEEE division; the quotient cannot round across an integer below 2^23)."""
    if r & (r - 1) == 0:
        src(f"{out} = pypto.floor(pypto.mul({x}, {1.0 / r!r}))")
    else:
        src(f"{out} = pypto.floor(pypto.div({x}, {float(r)!r}))")


def _pto_visible_rows(src: Src, spec: KernelSpec, positions, kv_len, req0: str, nreq: int, name: str,
                      cap: int | None = None) -> None:
    """`name` = f32 [nreq·seq, 1]: visible[t] = min(kv_seq_len[b(t)] // r, (pos[t] + 1) // r, score_len) (≥ 0;
    then min(·, cap)) for the tokens of requests req0 … req0+nreq−1, in tensor form: positions and kv_seq_len
    (repeated over each request's seq tokens by expand_clone) as exact f32 integers."""
    r, seq, score_len = int(spec.attrs["ratio"]), int(spec.attrs["seq"]), int(spec.attrs["score_len"])
    rows = nreq * seq
    pto_set_tile(src, [max(8, rows)])
    src(f"vp = pypto.cast(pypto.view({positions.name}, [{rows}], [({req0}) * {seq}]), pypto.DT_FP32)")
    pto_set_tile(src, [max(8, nreq)])
    src(f"vk = pypto.cast(pypto.view({kv_len.name}, [{nreq}], [{req0}]), pypto.DT_FP32)")
    pto_set_tile(src, [nreq, max(8, seq)])
    src(f"vk2 = pypto.expand_clone(pypto.reshape(vk, [{nreq}, 1]), [{nreq}, {seq}])")
    pto_set_tile(src, [rows, 8])
    src(f"vk3 = pypto.reshape(vk2, [{rows}, 1])")
    src(f"vp2 = pypto.maximum(pypto.add(pypto.reshape(vp, [{rows}, 1]), 1.0), 0.0)")
    _pto_floor_div(src, "vk3", r, "vcl")
    _pto_floor_div(src, "vp2", r, "vpr")
    lim = f"pypto.minimum(pypto.minimum(vcl, vpr), {float(score_len)!r})"
    src(f"{name} = pypto.maximum({lim}, 0.0)")
    if cap is not None:
        src(f"{name}_cap = pypto.minimum({name}, {float(cap)!r})")


def _pto_request_block(batch: int, seq: int, rows_cap: int = 32) -> int:
    """Requests per loop iteration: a divisor of B with at most `rows_cap` token rows."""
    return _pto_divisor(batch, max(1, rows_cap // seq))


@template(IdxScore)
def pypto_idx_score(spec: KernelSpec) -> str:
    """Per block of nb requests (a pypto.loop) and chunk of cp pages (unrolled: static offsets, the chunks' tasks
    side by side): the chunk's physical rows max(page, 0)·bs + j as ONE index (the table row's cp pages broadcast
    over bs plus a column ramp) for an index_select of the keys (int8 → fp16, exact) and of the key scales
    (kscale viewed [pages, bs], gathered by page), dots = q [nb, seq·IH, IHD] · keysᵀ as a fp16 cube matmul with
    f32 accumulation (exact: int8 products, integer sums < 2^24), then relu(dots · qIs) · w, the heads summed by
    ONE reduction (`pypto.sum` over the head axis, as upstream's one row_sum per page tile; its order is the
    op's open summation order, not the reference's ascending chain), · k_s; entries at or beyond visible[t] of the
    chunks read (the chunk's column numbers are static aranges: a view of a ramp at a loop offset is copied
    piecewise, ~50 tasks per chunk) and on unmapped pages (read at page 0, masked) → FP32_NEG_INF, as upstream's
    fillpad of its last tile. The columns past the pages read are not written (open entries: upstream's "no
    score_init", the top-k masks by visible). (No sg_set_scope here: fusing these full-width chains into one
    subgraph serialises them, 3× the cost-model cycles.) With `max_visible` below the table's span (a case's
    context bound), only the pages holding entries 0 … max_visible − 1 are read and written and visible[t] is
    capped at max_visible (the op's semantics), so the kernel's work follows the case's data, as upstream's
    ceil(visible / tile) loop does."""
    q, qs, w, cache, kscale, table, pos, kv_len = spec.operands
    out = spec.results[0]
    _, heads, hd = q.shape
    seq, bs, score_len = int(spec.attrs["seq"]), int(spec.attrs["block_size"]), int(spec.attrs["score_len"])
    batch, pages = table.shape
    n_rows = cache.shape[0]
    span = pages * bs
    if span > score_len:
        raise NotImplementedError(f"idx_score template: table span {span} > score_len {score_len}")
    if n_rows % bs:
        raise NotImplementedError(f"idx_score template: {n_rows} cache rows are not whole pages of {bs}")
    bound = spec.attrs.get("max_visible")
    if bound is None or int(bound) >= span:
        bound = None
    else:   # the case's extent: no entry at or past max_visible is visible, so only its pages are read
        bound = int(bound)
        pages = -(-bound // bs)
        span = pages * bs
    nb = _pto_divisor(batch, max(1, 512 // (seq * heads)))
    cp = _pto_divisor(pages, max(1, 512 // (nb * bs)))
    width, rows = cp * bs, nb * seq

    def cat(xs, axis):
        return xs[0] if len(xs) == 1 else f"pypto.concat([{', '.join(xs)}], {axis})"

    src = Src(spec.signature())
    for c in range(pages // cp):
        pto_set_tile(src, [max(8, min(width, 4096))])
        src(f"cl{c} = pypto.reshape(pypto.cast(pypto.arange({c * width}, {(c + 1) * width}), pypto.DT_FP32), "
            f"[1, {width}])")
    pto_set_tile(src, [batch, max(pages, 8)])
    src(f"tbf = pypto.cast({table.name}, pypto.DT_FP32)")
    pto_set_tile(src, [max(8, min(bs, 4096))])
    src(f"jb1 = pypto.cast(pypto.arange({bs}), pypto.DT_FP32)")
    pto_set_tile(src, [cp, max(bs, 8)])
    src(f"jb = pypto.expand_clone(pypto.reshape(jb1, [1, {bs}]), [{cp}, {bs}])")
    pto_set_tile(src, [max(8, min(n_rows // bs, 64)), bs])
    src(f"ks2 = pypto.reshape({kscale.name}, [{n_rows // bs}, {bs}])")
    with src.block(f'for rb in pypto.loop(0, {batch // nb}, 1, name="req_loop", idx_name="rb"):'):
        src(f"t0 = rb * {rows}")
        _pto_visible_rows(src, spec, pos, kv_len, f"rb * {nb}", nb, "lim", cap=bound)
        lim = "lim" if bound is None else "lim_cap"
        pto_tile(src, (rows, heads, hd), 2)
        src(f"q3 = pypto.cast(pypto.view({q.name}, [{rows}, {heads}, {hd}], [t0, 0, 0]), pypto.DT_FP16)")
        pto_tile(src, (nb, seq * heads, hd), 2)
        src(f"qb = pypto.reshape(q3, [{nb}, {seq * heads}, {hd}])")
        pto_set_tile(src, vec_tile((rows, heads, 8), 4))
        src(f"qsb = pypto.reshape(pypto.view({qs.name}, [{rows}, {heads}], [t0, 0]), [{rows}, {heads}, 1])")
        src(f"wb = pypto.reshape(pypto.view({w.name}, [{rows}, {heads}], [t0, 0]), [{rows}, {heads}, 1])")
        for c in range(pages // cp):
            keys, oks, kss = [], [], []
            for i in range(nb):
                pto_set_tile(src, [1, max(cp, 8)])
                src(f"pgr{i} = pypto.view(tbf, [1, {cp}], [rb * {nb} + {i}, {c * cp}])")
                src(f"pgc{i} = pypto.maximum(pgr{i}, 0.0)")
                src(f"pgi{i} = pypto.reshape(pypto.cast(pgc{i}, pypto.DT_INT32, pypto.CastMode.CAST_RINT), [{cp}])")
                src(f"oc{i} = pypto.where(pypto.ge(pgr{i}, 0.0), 1.0, 0.0)")
                pto_set_tile(src, [cp, max(bs, 8)])
                src(f"rw{i} = pypto.add(pypto.expand_clone(pypto.reshape(pypto.mul(pgc{i}, {float(bs)!r}), "
                    f"[{cp}, 1]), [{cp}, {bs}]), jb)")
                src(f"ok2{i} = pypto.expand_clone(pypto.reshape(oc{i}, [{cp}, 1]), [{cp}, {bs}])")
                src(f"ri{i} = pypto.reshape(pypto.cast(rw{i}, pypto.DT_INT32, pypto.CastMode.CAST_RINT), [{width}])")
                pto_tile(src, (width, hd), 2)
                src(f"kr{i} = pypto.reshape(pypto.cast(pypto.index_select({cache.name}, 0, ri{i}), pypto.DT_FP16), "
                    f"[1, {width}, {hd}])")
                pto_set_tile(src, [cp, max(bs, 8)])
                src(f"sc{i} = pypto.reshape(pypto.index_select(ks2, 0, pgi{i}), [1, {width}])")
                src(f"ov{i} = pypto.reshape(ok2{i}, [1, {width}])")
                keys.append(f"kr{i}")
                oks.append(f"ov{i}")
                kss.append(f"sc{i}")
            pto_tile(src, (nb, width, hd), 2)
            src(f"keys = {cat(keys, 0)}")
            pto_tile(src, (nb, width))
            src(f"okm = pypto.reshape({cat(oks, 0)}, [{nb}, 1, {width}])")
            src(f"ksm = pypto.reshape({cat(kss, 0)}, [{nb}, 1, {width}])")
            src(f"pypto.set_cube_tile_shapes({cube_shapes(seq * heads, hd, width, 'fp16')})")
            src("dots = pypto.matmul(qb, keys, pypto.DT_FP32, b_trans=True)")
            pto_tile(src, (rows, heads, width))
            src(f"d3 = pypto.reshape(dots, [{rows}, {heads}, {width}])")
            src("ph = pypto.mul(pypto.maximum(pypto.mul(d3, qsb), 0.0), wb)")
            src("acc = pypto.sum(ph, 1, keepdim=True)")
            pto_tile(src, (nb, seq, width))
            src(f"sc3 = pypto.mul(pypto.reshape(acc, [{nb}, {seq}, {width}]), ksm)")
            src(f"ok3 = pypto.add(pypto.full([{nb}, {seq}, {width}], 0.0, pypto.DT_FP32), okm)")
            pto_tile(src, (rows, width))
            src(f"cz = pypto.add(pypto.full([{rows}, {width}], 0.0, pypto.DT_FP32), cl{c})")
            src(f"keep = pypto.logical_and(pypto.lt(cz, {lim}), pypto.ge(pypto.reshape(ok3, [{rows}, {width}]), 0.5))")
            src(f"res = pypto.where(keep, pypto.reshape(sc3, [{rows}, {width}]), {PTO_NEG_INF!r})")
            src(f"pypto.assemble(res, [t0, {c * width}], {out.name})")
    return src.text()


@template(IdxTopk)
def pypto_idx_topk(spec: KernelSpec) -> str:
    """Per block of requests: the score rows with the entries at or beyond visible[t] set to −inf (so
    FP32_NEG_INF entries inside the visible range still rank before them), `pypto.topk` (k largest, descending),
    ranks ≥ visible[t] → −1, the tail columns [k, score_len) → −1. Ties among equal scores come out in pypto's sort
    order, not the reference's lower-index-first rule (dsv4-math §5.3: ties are unpinned). With `max_visible` (a
    context bound) the sort covers only the first max(k, max_visible) entries: every later one is −inf.
    `pypto.topk` sorts the whole row, which is the staged sort of `sort_stages` whenever its widest stage covers
    the score prefix (dspark-model.md §6(h)); a top-k whose stages do not is refused (the reference would pick
    other keys than this kernel): the `topk-merge-stage` pass repairs it."""
    why = unsorted_prefix(spec.attrs)
    if why is not None:
        raise DsparkError(f"idx_topk template: {why}; run topk-merge-stage first", f"kernel {spec.name}")
    score, pos, kv_len = spec.operands
    out = spec.results[0]
    k, seq, score_len = int(spec.attrs["k"]), int(spec.attrs["seq"]), int(spec.attrs["score_len"])
    batch = kv_len.shape[0]
    nb = _pto_request_block(batch, seq)
    rows = nb * seq
    bound = spec.attrs.get("max_visible")
    width = score_len if bound is None else max(k, int(bound))
    if width >= score_len:
        width, bound = score_len, None
    vis = "vis" if bound is None else "vis_cap"
    src = Src(spec.signature())
    pto_ramp(src, width)
    with src.block(f'for rb in pypto.loop(0, {batch // nb}, 1, name="req_loop", idx_name="rb"):'):
        src(f"t0 = rb * {rows}")
        _pto_visible_rows(src, spec, pos, kv_len, f"rb * {nb}", nb, "vis", cap=bound)
        pto_cols_of(src, "ramp", "0", width, "cols")
        pto_set_tile(src, [1, width])
        src(f"cz = pypto.add(pypto.full([{rows}, {width}], 0.0, pypto.DT_FP32), cols)")
        src(f"x = pypto.where(pypto.lt(cz, {vis}), pypto.view({score.name}, [{rows}, {width}], [t0, 0]), "
            f"float(\"-inf\"))")
        src(f"tv, ti = pypto.topk(x, {k}, -1, True)")
        pto_set_tile(src, [rows, max(8, k)] if rows * max(8, k) <= 4096 else [1, max(8, k)])
        src(f"rk = pypto.view(cz, [{rows}, {k}], [0, 0])")
        src(f"o = pypto.where(pypto.lt(rk, {vis}), pypto.cast(ti, pypto.DT_FP32), -1.0)")
        src(f"pypto.assemble({cast_expr('o', 'f32', 'i32')}, [t0, 0], {out.name})")
        if score_len > k:
            pto_tile(src, (rows, score_len - k))
            src(f"pypto.assemble(pypto.full([{rows}, {score_len - k}], -1, pypto.DT_INT32), [t0, {k}], "
                f"{out.name})")
    return src.text()


@template(IdxTopkBounded)
def pypto_idx_topk_bounded(spec: KernelSpec) -> str:
    """Column c of token t is c where c < min(visible[t], k), else −1 (f32 compare, exact)."""
    pos, kv_len = spec.operands
    out = spec.results[0]
    return pto_bounded_topk(spec, pos, kv_len, out, None)


def pto_bounded_topk(spec: KernelSpec, pos, kv_len, out, fallback) -> str:
    """The bounded rows (and, with `fallback`, the per-token select of idx_topk_select: bounded where
    visible ≤ k, else the fallback row), per block of requests, in tensor form."""
    k, seq, score_len = int(spec.attrs["k"]), int(spec.attrs["seq"]), int(spec.attrs["score_len"])
    batch = kv_len.shape[0]
    nb = _pto_request_block(batch, seq)
    rows = nb * seq
    src = Src(spec.signature())
    pto_ramp(src, score_len)
    with src.block(f'for rb in pypto.loop(0, {batch // nb}, 1, name="req_loop", idx_name="rb"):'):
        src(f"t0 = rb * {rows}")
        _pto_visible_rows(src, spec, pos, kv_len, f"rb * {nb}", nb, "vis", cap=k)
        pto_cols_of(src, "ramp", "0", score_len, "cols")
        pto_tile(src, (rows, score_len))
        src(f"cz = pypto.add(pypto.full([{rows}, {score_len}], 0.0, pypto.DT_FP32), cols)")
        src("o = pypto.where(pypto.lt(cz, vis_cap), cz, -1.0)")
        if fallback is not None:
            fb = cast_expr(f"pypto.view({fallback.name}, [{rows}, {score_len}], [t0, 0])", fallback.dtype, "f32")
            src(f"o = pypto.where(pypto.le(pypto.add(pypto.full([{rows}, {score_len}], 0.0, pypto.DT_FP32), vis), "
                f"{float(k)!r}), o, {fb})")
        src(f"pypto.assemble({cast_expr('o', 'f32', 'i32')}, [t0, 0], {out.name})")
    return src.text()
