"""pypto 0.2.0 templates of the sparse kernel family (the ops' numpy semantics: dspark_ir/semantics/sparse.py)."""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generators for the lowering (see kernels/pto.py), mirroring the references above op for op.
# * Tile partials (csa_qk_pv, hca_raw_attn, hca_cmp_qk_pv): cube matmuls for q·Kᵀ (key-major K·qᵀ in csa_qk_pv
#   and hca_raw_attn, kernels/attention_blocks.py) and bf16(p)·K (f32 accumulation, where the reference rounds an f64
#   sum once: s, m, l, o agree to f32 rounding, not bitwise), the reference's mask (−1e20) / max / exp / where
#   order, l in numpy's pairwise order (kernels/vector.py helpers).
# * Merges and packs (csa_merge_norm, hca_stream_merge[_pack], hca_stream_pack): kernels/attention_blocks.py
#   `PtoGroupMerge` (one task per head group and token block, static T): the reference's f32 merge_into /
#   sink_normalize order; the only difference is libm: pypto's CPU calculator evaluates exp with torch (1 f32 ulp
#   from numpy's on a few % of arguments). The inverse RoPE partner r[swap] is a `pypto.gather` on the last axis
#   with the op's swap input (hca) or the in-kernel j ^ 1 (csa, whose op has no swap input); one bf16 rounding;
#   each head assembled straight into its place of the group-major pack.
# * Index work is exact: integer arithmetic in f32 (< 2^24), comparisons against scalars, floors as
#   trunc((x + ½)/d) (exact even under an approximate division), −1 never reaches index_select and
#   kv_cache_writeback never uses scatter_update (a per-token `if slot >= 0` assemble instead).
# Cost (pypto's cost model, per kernel): a core runs one task at a time and gets the next one only at the end of
# its AICPU's polling round (12 cores × 240 cycles, plus 390 per dependency edge resolved and 200 per task
# dispatched), so every task costs its core ~2–4 µs besides its own time; a copy into the UB costs ~1.4 k cycles
# plus its bytes. So the templates make few, large tasks (one forced subgraph joins only ops linked by data),
# large tiles, avoid batched matmuls (every batch slice is copied in and out) in favour of 2-D matmuls on
# in-place 2-D reshapes of whole parameters, and avoid reshaping views to another rank (a copy).
# pypto 0.2.0 lowering traps met here (tensor graph right, post-pass verify FAILS; each avoided below):
# * a 1-D op (arange) under a rank-2 tile is mis-lowered by InferParamIndex → 1-D ops get 1-D tiles (_pto_iota);
# * a view is materialised under the tile of the op that consumes it: reshaping a rank-3 view needs a rank-3 tile
#   (else ExpandFunction: "Tile shape size 2 is not matched the output shape size 3"); an index_select whose
#   in-kernel index spans several tiles is mis-lowered (the whole index in one tile);
# * rank-3 tiles that split the rows of a partial block break InferDynShape (tiles span the block's rows,
#   `pto_head_tile`, and tile rows dividing the block, `_pto_big_tile`).
# On partial row blocks, a batched matmul, a concat and a where of two scalars produce the FULL block as their
# valid shape (the CPU interpreter then fails on the next op): re-viewed, or avoided.
from dspark_ir.ops.collective import HcaStreamMergePackPublish
from dspark_ir.ops.sparse import (
    CsaMergeNorm,
    CsaQkPv,
    CsaSlotsBuildValidQkPlan,
    HcaCmpQkPv,
    HcaCmpWorkGather,
    HcaRawAttn,
    HcaRawAttnDirect,
    HcaRawAttnRequest,
    HcaRawTranspose,
    HcaRequestKvGather,
    HcaStreamMerge,
    HcaStreamMergePack,
    HcaStreamPack,
    KvCacheWriteback,
    KvTouch,
    OLocalBridge,
)

from .attention import pto_scatter_slots
from .attention_blocks import (
    PTO_CSA_QK_ROWS,
    PTO_NEG_ATTN,
    PTO_TILE_ELEMS,
    PTO_VECTOR_CORES,
    PtoGroupMerge,
    PtoWindowAttn,
    pto_cube_wide,
    pto_head_tile,
    pto_key_softmax,
    pto_key_tile,
    pto_row_to_col,
)
from .cube import pto_cube_shapes
from .elementwise import pypto_copy
from .pto import L0B_BYTES, KernelSpec, Src, cast_expr, row_block, vec_tile
from .registry import cost_template, template, unsupported
from .vector import pto_divisor, pto_namer, pto_pairwise_tree, pto_scope, pto_set_tile, pto_token_table_rows

_PTO_BIG = 3.0e38    # "never valid" threshold (> any position)


def _pto_big_tile(shape, itemsize: int = 4) -> list[int]:
    """`vec_tile` with a 32 KiB budget per operand (fewer, larger tasks for whole-tensor element-wise work), every
    leading entry a divisor of its extent (tile rows dividing the block)."""
    tile = vec_tile(tuple(shape), itemsize, 4 * PTO_TILE_ELEMS)
    return [pto_divisor(e, t) for e, t in zip(shape[:-1], tile[:-1])] + tile[-1:]


def _pto_iota(src: Src, n: int, name: str, restore) -> None:
    """`name` = [[0, 1, …, n−1]] f32 [1, n]. The 1-D arange gets a 1-D tile: created under a rank-2 tile it
    computes right in the tensor graph but pypto 0.2.0's InferParamIndex mis-lowers it (pass-verify FAILS)."""
    pto_set_tile(src, [max(n, 8)])
    src(f"{name}1 = pypto.arange(0.0, {float(n)!r}, 1.0)")
    pto_set_tile(src, [1, max(n, 8)])
    src(f"{name} = pypto.reshape({name}1, [1, {n}])")
    pto_set_tile(src, restore)


# ---- cache writeback, WAR marker ----------------------------------------------------------------------------
@template(KvTouch)
def pypto_kv_touch(spec: KernelSpec) -> str:
    """The WAR marker as the smallest in-place touch pypto allows: the cache's first row copied onto itself (one
    32-byte-aligned tile, one task). The caller passes the same buffer as kv_cache_in and kv_cache (an in-place
    output starts as its input), so every other row is already the input's: the identity, like the reference."""
    cache = spec.results[0]
    rest = list(cache.shape[1:])
    src = Src(spec.signature())
    pto_set_tile(src, [1] + rest)
    zeros = [0] * cache.rank
    src(f"y = pypto.clone(pypto.view({spec.operands[0].name}, {[1] + rest}, {zeros}))")
    src(f"pypto.assemble(y, {zeros}, {cache.name})")
    return src.text()


@template(KvCacheWriteback)
def pypto_kv_cache_writeback(spec: KernelSpec) -> str:
    """kv_cache[slot[t]] = kv[t] in token order: a pypto.loop over tokens reads the slot as a runtime scalar and
    assembles the row only `if slot >= 0` (−1 skipped, later tokens win on duplicates, like the reference).
    `scatter_update` is not used: with −1 it writes the last row, and its order on duplicates is unspecified.
    Only the written rows are stored: the caller passes the same buffer as kv_cache_in and kv_cache."""
    kv, _cache_in, slots = spec.operands
    cache = spec.results[0]
    src = Src(spec.signature())
    pto_scatter_slots(src, kv, slots, cache, "wb_loop")
    return src.text()


# ---- tile partials ----------------------------------------------------------------------------------------


def _pto_store_item(blk, item: int, heads: int, hd: int, m_out, l_out, o_out) -> None:
    """Assemble the tile partial (mi, li, oi) as item `item` of m, l [T, n, H] and o [T, n, H, HD]."""
    src, br = blk.src, blk.rows
    pto_set_tile(src, [br, 1, max(heads, 8)])
    for name, t in (("mi", m_out), ("li", l_out)):
        src(f"{name}3 = {blk.reshape(name, [br, 1, heads])}")
        src(f"pypto.assemble({name}3, [{blk.r0}, {item}, 0], {t.name})")
    o_tile = pto_head_tile(br, heads, hd, 2 * PTO_TILE_ELEMS)
    pto_set_tile(src, [o_tile[0], 1] + o_tile[1:])
    src(f"oi4 = {blk.reshape('oi', [br, 1, heads, hd])}")
    src(f"pypto.assemble(oi4, [{blk.r0}, {item}, 0, 0], {o_out.name})")


def _pto_csa_keys(src: Src, spec: KernelSpec, tok: str, k: int) -> None:
    """kw [W, HD], kc [k, HD] = the token's window rows of kv_cache and its first k top-k rows of cmp_kv (none for
    k = 0) as the reference's `_gather` (−1 rows zero: clamped index_select, then where(idx ≥ 0, row, 0)), and
    va [1, W+k] = where(idx ≥ 0, bias, −1) (f32; ≥ 0 where valid). Both gathers read views of one index row (one
    forced subgraph); the where is written in f32 (pypto puts the implicit casts of a bf16 where outside the
    subgraph, a copy task per tile)."""
    q, cache, swa, cmp_kv, cidx, bias, _order = spec.operands
    hd = q.shape[2]
    w = swa.shape[1]
    pto_set_tile(src, [1, max(w + k, 8)])
    parts = [cast_expr(f"pypto.view({t.name}, [1, {n}], [{tok}, 0])", t.dtype, "f32")
             for t, n in ((swa, w), (cidx, k)) if n]
    src(f"ixa = pypto.concat([{', '.join(parts)}], 1)" if len(parts) > 1 else f"ixa = {parts[0]}")
    src(f"va = pypto.where(pypto.ge(ixa, 0.0), pypto.view({bias.name}, [1, {w + k}], [{tok}, 0]), -1.0)")
    for name, pool, lo, n in (("kw", cache, 0, w), ("kc", cmp_kv, w, k)):
        if not n:
            continue
        d_tile = hd  # a where with a broadcast condition must stay on ≤ 32 KiB tiles
        while n * d_tile * 2 > 32 * 1024 and d_tile % 2 == 0 and d_tile > 16:
            d_tile //= 2
        pto_set_tile(src, [1, max(n, 8)])
        src(f"ix = pypto.view(ixa, [1, {n}], [0, {lo}])")
        src(f"ci = pypto.reshape({cast_expr('pypto.maximum(ix, 0.0)', 'f32', 'i32')}, [{n}])")
        pto_row_to_col(src, "ix", n, "okc")
        pto_set_tile(src, [n, d_tile])  # the whole index in one tile (see the template notes)
        src(f"g = pypto.index_select({pool.name}, 0, ci)")
        where = f"pypto.where(pypto.ge(okc, 0.0), {cast_expr('g', pool.dtype, 'f32')}, 0.0)"
        src(f"{name} = {cast_expr(where, 'f32', pool.dtype)}")


def _pto_csa_rows(t: dict, a: int, n: int, width: int) -> str:
    """Rows a … a + n − 1 of the window | top-k concatenation of the [W, width] and [K, width] tensors t["w"],
    t["c"]: a view, or the concat of two views for a block straddling the two lists."""
    w = t["nw"]
    pieces = [f"pypto.view({t[s]}, [{e - b}, {width}], [{b - lo}, 0])"
              for s, lo, hi in (("w", 0, w), ("c", w, w + t["nc"])) for b, e in [(max(a, lo), min(a + n, hi))]
              if b < e]
    return pieces[0] if len(pieces) == 1 else f"pypto.concat([{', '.join(pieces)}], 0)"


@template(CsaQkPv)
def pypto_csa_qk_pv(spec: KernelSpec) -> str:
    """Per (token, block) tile partials over [window rows of kv_cache | top-k rows of cmp_kv] in k_tile-wide blocks
    (static T): per token one gather task (`_pto_csa_keys`: the key rows and the validity row), sᵀ = K·qᵀ per list
    (2-D cube matmuls on q reshaped in place, one L0C tile of up to 512 key rows), one softmax task for all blocks
    (kernels/attention_blocks.py `pto_key_softmax` per block: key-major, m, l as rows), and per block o = bf16(p)ᵀ·K
    assembled
    through a per-token workspace reshaped in place to [1, n, H, HD]. A block straddling the two lists concatenates
    their rows. An invalid row is a zero row (the reference's `_gather`), so a block without any valid row gives
    o = +0 like the reference. qk_order only orders the work on the NPU (every item writes its own partial), so
    the values do not depend on it. With `live_blocks` (the case's extent) only those blocks are computed and only
    the top-k rows they cover are gathered."""
    spec = spec.static()
    q, _cache, swa, _cmp, cidx, _bias, _order = spec.operands
    m_out, l_out, o_out = spec.results
    ntok, heads, hd = q.shape
    w = swa.shape[1]
    kt = int(spec.attrs["k_tile"])
    nb = m_out.shape[1]                   # every block, or the first live_blocks
    k = min(cidx.shape[1], nb * kt - w)   # the top-k rows those blocks cover (none if only the window's)
    scale = float(spec.attrs["scale"])
    tile = pto_key_tile(heads, kt)
    br = PTO_CSA_QK_ROWS
    src = Src(spec.signature())

    def token(tok: str) -> None:
        pto_scope(src, 1)
        _pto_csa_keys(src, spec, tok, k)
        pto_scope(src, -1)
        for name, kn, n in (("sw", "kw", w), ("sc", "kc", k)):
            if not n:
                continue
            src(f"pypto.set_cube_tile_shapes({pto_cube_wide(n, hd, heads, deep=True, tm_max=512)})")
            src(f"{name} = pypto.matmul({kn}, pypto.view(qf, [{heads}, {hd}], [({tok}) * {heads}, 0]), "
                "pypto.DT_FP32, b_trans=True)")
        pto_scope(src, 2)
        mls = []
        for j in range(nb):
            pto_set_tile(src, [1, max(kt, 8)])
            src(f"vr1 = pypto.view(va, [1, {kt}], [0, {j * kt}])")
            pto_row_to_col(src, "vr1", kt, "vc")
            pto_set_tile(src, tile)
            scores = _pto_csa_rows({"w": "sw", "c": "sc", "nw": w, "nc": k}, j * kt, kt, heads)
            pto_key_softmax(src, scores, heads, kt, scale, tile, f"pb{j}")
            src(f"mr{j}, lr{j} = mr, lr")
            mls.append(j)
        for name, t in (("mr", m_out), ("lr", l_out)):
            pto_set_tile(src, [1, max(heads, 8)])
            src(f'{name}w = pypto.tensor([{nb}, {heads}], {t.pto}, "{name}w")')
            for j in mls:
                src(f"pypto.assemble({name}{j}, [{j}, 0], {name}w)")
            pto_set_tile(src, [1, nb, max(heads, 8)])
            src(f"pypto.assemble(pypto.reshape({name}w, [1, {nb}, {heads}], inplace=True), [{tok}, 0, 0], {t.name})")
        pto_scope(src, -1)
        o_tile = pto_head_tile(1, heads, hd, 2 * PTO_TILE_ELEMS)[1:]
        src(f'ow = pypto.tensor([{nb * heads}, {hd}], {o_out.pto}, "ow")')
        for j in range(nb):
            keys = _pto_csa_rows({"w": "kw", "c": "kc", "nw": w, "nc": k}, j * kt, kt, hd)
            if keys.startswith("pypto.concat"):
                pto_set_tile(src, [kt, min(hd, 64)])
                src(f"kb = {keys}")
                keys = "kb"
            src(f"pypto.set_cube_tile_shapes({pto_cube_wide(heads, kt, hd, deep=True)})")
            src(f"oi = pypto.matmul(pb{j}, {keys}, pypto.DT_FP32, a_trans=True)")
            pto_set_tile(src, o_tile)
            src(f"pypto.assemble(oi, [{j * heads}, 0], ow)")
        pto_set_tile(src, [1, 1] + o_tile)
        src(f"pypto.assemble(pypto.reshape(ow, [1, {nb}, {heads}, {hd}], inplace=True), [{tok}, 0, 0, 0], "
            f"{o_out.name})")

    def flat() -> None:
        src(f"qf = pypto.reshape({q.name}, [{ntok * heads}, {hd}], inplace=True)")

    if ntok >= br:
        with src.block(f'for blk in pypto.loop(0, {ntok // br}, 1, name="tok_loop", idx_name="blk"):'):
            flat()
            for u in range(br):
                token(f"blk * {br} + {u}")
    if ntok % br:
        with src.block(f'for r1 in pypto.loop({ntok // br * br}, {ntok}, 1, name="tail_loop", idx_name="r1"):'):
            flat()
            token("r1")
    return src.text()


@template(HcaRawAttn)
def pypto_hca_raw_attn(spec: KernelSpec) -> str:
    """The raw-window stream as ONE tile per token (kernels/attention_blocks.py `PtoWindowAttn`, static T),
    valid where index ≥ 0; q·Kᵀ on the rows themselves (the transposed copy rows_t holds the same values)."""
    spec = spec.static()
    q, rows, _rows_t, idx = spec.operands
    return _pto_raw_window_attn(spec, q, rows, idx)


@template(HcaRawAttnDirect)
def pypto_hca_raw_attn_direct(spec: KernelSpec) -> str:
    """hca_raw_attn without the Kᵀ operand (pypto-lib #1035): the key-major cube matmul K·qᵀ reads the rows it
    loads, i.e. q·Kᵀ on a transposed view of the one copy; the body is hca_raw_attn's."""
    spec = spec.static()
    q, rows, idx = spec.operands
    return _pto_raw_window_attn(spec, q, rows, idx)


def _pto_raw_window_attn(spec: KernelSpec, q, rows, idx) -> str:
    src = Src(spec.signature())

    def valid_row(tok: str, a: int, n: int, r: int) -> None:
        src(f"vr = {cast_expr(f'pypto.view({idx.name}, [{r}, {n}], [{tok}, {a}])', idx.dtype, 'f32')}")

    PtoWindowAttn(src, q, rows, spec.results, rows.shape[1], float(spec.attrs["scale"]), valid_row,
                  int(spec.attrs.get("lookahead") or 0)).emit()
    return src.text()


# ---- per-request raw window (pypto-lib #1098, #1170 (a)) ---------------------------------------------------------
def _pto_row_extent(src: Src, idx, tok: str, width: int, name: str) -> None:
    """`name`v f32 [1, W] = token tok's index row, `name` f32 [1, 1] = its extent e (1 + the last column that holds
    an index, 0 for a row of −1 only): the largest (c + 1)·[index ≥ 0], exact in f32. Needs `jw` = [[1 … W]]."""
    pto_set_tile(src, [1, _pto_lanes(width)])
    src(f"{name}v = {cast_expr(f'pypto.view({idx.name}, [1, {width}], [{tok}, 0])', idx.dtype, 'f32')}")
    src(f"{name} = pypto.amax(pypto.where(pypto.ge({name}v, 0.0), jw, 0.0), -1, keepdim=True)")


def _pto_lanes(n: int) -> int:
    """A tile's last extent for an f32 row of n: n rounded up to whole 32-byte blocks."""
    return -(-n // 8) * 8


def _pto_request_iotas(src: Src, width: int, n: int) -> None:
    """jn = [[0 … n − 1]] (request row columns) and jw = [[1 … W]] (window columns + 1), f32."""
    _pto_iota(src, n, "jn", [1, _pto_lanes(n)])
    _pto_iota(src, width, "jw0", [1, _pto_lanes(width)])
    src("jw = pypto.add(jw0, 1.0)")


@template(HcaRequestKvGather)
def pypto_hca_request_kv_gather(spec: KernelSpec) -> str:
    """One task per request (static T): its row list ridx [1, W + S − 1] built in f32 from the S index rows (the
    first token's row up to its extent e_0, then token k's newest index at column e_0 + k − 1, −1 elsewhere: the
    extents and newest indices as row maxima, exact), then ONE `index_select` of the cache rows by the clamped
    list (the whole list in one tile, see the notes above), zero where ridx = −1, stored at out[b].
    `contiguous` (pypto-lib #1170 (a)): first a runtime check on scalars read from `indices` (the first token's W
    indices are first … first + W − 1 with first ≥ 0, and token k's last column holds first + W − 1 + k: exactly
    when the row list is first … first + W + S − 2), and when it holds one copy of that cache run instead; the
    values are the reference's either way."""
    spec = spec.static()
    cache, idx = spec.operands
    out = spec.results[0]
    seq = int(spec.attrs["seq"])
    ntok, width = idx.shape
    n, d = width + seq - 1, cache.shape[1]
    d_tile = d
    while n * d_tile * 2 > 32 * 1024 and d_tile % 2 == 0 and d_tile > 16:
        d_tile //= 2
    src = Src(spec.signature())
    with src.block(f'for b in pypto.loop(0, {ntok // seq}, 1, name="req_loop", idx_name="b"):'):
        if spec.attrs.get("contiguous"):
            _pto_request_run_check(src, idx, seq, width)
            with src.block("if run == 1:"):
                pto_scope(src, 2)  # a bf16 copy: 4x the row path's f32 tile width (fewer, larger tasks)
                pto_set_tile(src, [1, n, min(d, 4 * d_tile)])
                src(f"c3 = pypto.reshape({cache.name}, [1, {cache.shape[0]}, {d}], inplace=True)")
                src(f"y = pypto.view(c3, [1, {n}, {d}], [0, first, 0])")
                src(f"pypto.assemble(y, [b, 0, 0], {out.name})")
                pto_scope(src, -1)
            with src.block("else:"):
                _pto_request_row_gather(src, cache, idx, out, seq, d_tile)
        else:
            _pto_request_row_gather(src, cache, idx, out, seq, d_tile)
    return src.text()


def _pto_request_run_check(src: Src, idx, seq: int, width: int) -> None:
    """run (a scalar) = 1 when request b's row list is the cache run first … first + W + S − 2 (first ≥ 0): index
    scalars of the input, compared one by one (like upstream's bulk check)."""
    src(f"first = {idx.name}[b * {seq}, 0]")
    src("run = pypto.min(pypto.max(first + 1, 0), 1)")
    for j in range(1, width):
        src(f"run = run * ({idx.name}[b * {seq}, {j}] == first + {j})")
    for k in range(1, seq):
        src(f"run = run * ({idx.name}[b * {seq} + {k}, {width - 1}] == first + {width - 1 + k})")


def _pto_request_row_gather(src: Src, cache, idx, out, seq: int, d_tile: int) -> None:
    """The row-run form: request b's row list built in f32, one index_select of it, zero where it is −1."""
    width = idx.shape[1]
    n, lanes = width + seq - 1, _pto_lanes(width + seq - 1)
    pto_scope(src, 1)
    _pto_request_iotas(src, width, n)
    for k in range(seq):
        _pto_row_extent(src, idx, f"b * {seq} + {k}", width, f"e{k}")
        pto_set_tile(src, [1, lanes])
        if k == 0:
            src("e0x = pypto.expand_clone(e0, [1, " + str(n) + "])")
            src(f"hi = {cast_expr(f'pypto.minimum(jn, {float(width - 1)!r})', 'f32', 'i32')}")
            src("ridx = pypto.where(pypto.lt(jn, e0x), pypto.gather(e0v, 1, hi), -1.0)")
            continue
        pto_set_tile(src, [1, _pto_lanes(width)])
        src(f"nk = pypto.amax(pypto.where(pypto.eq(jw, pypto.expand_clone(e{k}, [1, {width}])), e{k}v, -1.0), "
            "-1, keepdim=True)")
        pto_set_tile(src, [1, lanes])
        src(f"ridx = pypto.where(pypto.eq(jn, pypto.add(e0x, {float(k - 1)!r})), "
            f"pypto.expand_clone(nk, [1, {n}]), ridx)")
    src(f"ci = {cast_expr('pypto.maximum(ridx, 0.0)', 'f32', 'i32')}")
    pto_set_tile(src, [1, n, 8])
    src(f"ok = pypto.reshape(ridx, [1, {n}, 1])")
    pto_set_tile(src, [1, n, d_tile])  # the whole row list in one tile
    src(f"g = pypto.index_select({cache.name}, 0, ci)")
    where = f"pypto.where(pypto.ge(ok, 0.0), {cast_expr('g', cache.dtype, 'f32')}, 0.0)"
    src(f"y = {cast_expr(where, 'f32', out.dtype)}")
    src(f"pypto.assemble(y, [b, 0, 0], {out.name})")
    pto_scope(src, -1)


class _PtoRequestWindowAttn(PtoWindowAttn):
    """`PtoWindowAttn` over the per-request rows: one loop iteration per request, its S tokens in turn, each
    token's scores over all W + S − 1 rows of its request (one key tile), valid at row j where column j − d_t of
    its index row holds an index (d_t = clip(e_{t0} + k − e_t, 0, S − 1), the reference's window offset): a
    masked row adds exactly 0 to l and o, so this is the reference's sum over the token's W keys."""

    def __init__(self, src: Src, q, rows, idx, outs, seq: int, scale: float, lookahead: int = 0):
        self.idx, self.seq, self.width = idx, seq, idx.shape[1]
        super().__init__(src, q, rows, outs, rows.shape[1], scale, self._valid_row, lookahead)
        self.pair, self.iotas = False, False
        # all W + S − 1 key rows in one L0C tile: scores split over two tiles are assembled by an op that pypto
        # 0.2.0's GraphPartition merges with the vector scope ("different OpCoreType in building SuperNode")
        self.score_rows = -(-self.window // 16) * 16

    def emit(self) -> None:
        src, seq = self.src, self.seq
        with src.block(f'for b in pypto.loop(0, {self.ntok // seq}, 1, name="req_loop", idx_name="b"):'):
            self._flat()
            units = [(self._request_pair_qk, self._request_pair, k) for k in range(0, seq - 1, 2)]
            if seq % 2:
                units.append((self._last_token_qk, self._last_token, seq - 1))
            self.issue(units, 2)

    def _last_token_qk(self, k: int, scores: str) -> None:
        self._token_qk(f"b * {self.seq} + {k}", scores)

    def _last_token(self, k: int, scores: str | None = None) -> None:
        self.k, self.iotas = k, False
        self._token(f"b * {self.seq} + {k}", scores)

    def _request_pair_qk(self, k: int, scores: str = "st2") -> None:
        """The one q·Kᵀ task of tokens k and k + 1 of request b over the request's rows into `scores`."""
        src, h, hd, n, seq = self.src, self.heads, self.hd, self.k_tile, self.seq
        tok = f"b * {seq} + {k}"
        src(f"pypto.set_cube_tile_shapes({pto_cube_wide(n, hd, 2 * h, deep=True, tm_max=self.score_rows)})")
        src(f"{scores} = pypto.matmul(pypto.view(kf, [{n}, {hd}], [{self.key_row(tok)}, 0]), "
            f"pypto.view(qf, [{2 * h}, {hd}], [({tok}) * {h}, 0]), pypto.DT_FP32, b_trans=True)")

    def _request_pair(self, k: int, scores: str | None = None) -> None:
        """Tokens k and k + 1 of request b: one q·Kᵀ task over the request's rows ([W + S − 1, HD]·[2H, HD]ᵀ, both
        tokens' scores side by side; issued here unless `scores` names it), one softmax task (each token's validity
        row, softmax, m and l), two P·V."""
        src, h, n, seq = self.src, self.heads, self.k_tile, self.seq
        tok = f"b * {seq} + {k}"
        if scores is None:
            self._request_pair_qk(k)
            scores = "st2"
        self.scope += 1
        pto_scope(src, self.scope)
        self.iotas = False
        for u in range(2):
            self.k = k + u
            self._validity(f"b * {seq} + {k + u}", 0, 1)
            self._softmax(0, f"pypto.view({scores}, [{n}, {h}], [0, {u * h}])", f"pb{u}")
            self._store_ml(f"{tok} + {u}", "mr", "lr")
        pto_scope(src, -1)
        for u in range(2):
            self._pv(f"{tok} + {u}", 0, f"pb{u}")
            src(f"oi{u} = oi")
        self._store_o(tok, ["oi0", "oi1"])

    def key_row(self, tok: str) -> str:
        return f"b * {self.window}"

    def _valid_row(self, tok: str, a: int, n: int, r: int) -> None:
        """vr [1, n]: column j − d_t of the token's index row where 0 ≤ j − d_t < W, else −1 (a gather along the
        row; d_t = 0 for the request's first token)."""
        src, w, k, seq = self.src, self.width, self.k, self.seq
        if not self.iotas:  # once per softmax task (outside it, each iota op would be a task of its own)
            _pto_request_iotas(src, w, n)
            self.iotas = True
        _pto_row_extent(src, self.idx, tok, w, "et")
        if k:
            _pto_row_extent(src, self.idx, f"b * {seq}", w, "e0")
        pto_set_tile(src, [1, _pto_lanes(n)])
        if k:
            src(f"dt = pypto.maximum(pypto.minimum(pypto.add(pypto.sub(pypto.expand_clone(e0, [1, {n}]), "
                f"pypto.expand_clone(et, [1, {n}])), {float(k)!r}), {float(seq - 1)!r}), 0.0)")
            src("js = pypto.sub(jn, dt)")
        else:
            src("js = jn")
        src(f"jc = {cast_expr(f'pypto.maximum(pypto.minimum(js, {float(w - 1)!r}), 0.0)', 'f32', 'i32')}")
        src("vr = pypto.where(pypto.ge(js, 0.0), pypto.gather(etv, 1, jc), -1.0)")
        src(f"vr = pypto.where(pypto.lt(js, {float(w)!r}), vr, -1.0)")


@template(HcaRawAttnRequest)
def pypto_hca_raw_attn_request(spec: KernelSpec) -> str:
    """The raw-window stream on the per-request rows (pypto-lib #1098): `_PtoRequestWindowAttn`, static T."""
    spec = spec.static()
    q, rows, idx = spec.operands
    src = Src(spec.signature())
    _PtoRequestWindowAttn(src, q, rows, idx, spec.results, int(spec.attrs["seq"]), float(spec.attrs["scale"]),
                          int(spec.attrs.get("lookahead") or 0)).emit()
    return src.text()


def _pto_cmp_mask(src: Src, phys, kvlen, pos, heads: int, ntok: int, ratio: int, max_rows: int) -> None:
    """The visibility operands of the `ntok` tokens from r0 (of request `req`), one forced subgraph: nt [L, 8] f32,
    whose column 0 is the threshold (c+1)·R of compressed row c where the row can be visible (c < max_rows,
    (c+1)·R ≤ kv_seq_len[b], phys[b, c] ≥ 0), else _PTO_BIG (the row broadcast to 8 rows and transposed);
    limr [1, ntok·H] = pos[t] + 1 repeated over token t's H heads. Token t sees row c ⇔ limr − nt ≥ 0
    (integers in f32, all < 2^24: exact)."""
    n_rows = phys.shape[1]
    row = [1, max(n_rows, 8)]
    pto_scope(src, 1)
    pto_set_tile(src, [8])
    src(f"klf = {cast_expr(f'pypto.view({kvlen.name}, [1], [req])', kvlen.dtype, 'f32')}")
    pto_set_tile(src, [1, 8])
    src("klc = pypto.reshape(klf, [1, 1])")
    pto_set_tile(src, row)
    src(f"klx = pypto.expand_clone(klc, [1, {n_rows}])")
    _pto_iota(src, n_rows, "col", row)
    src(f"need = pypto.mul(pypto.add(col, 1.0), {float(ratio)!r})")
    if n_rows > max_rows:
        src(f"need = pypto.where(pypto.lt(col, {float(max_rows)!r}), need, {_PTO_BIG!r})")
    src(f"pvr = {cast_expr(f'pypto.view({phys.name}, [1, {n_rows}], [req, 0])', phys.dtype, 'f32')}")
    src(f"need = pypto.where(pypto.ge(pypto.sub(klx, need), 0.0), need, {_PTO_BIG!r})")
    src(f"need = pypto.where(pypto.ge(pvr, 0.0), need, {_PTO_BIG!r})")
    pto_set_tile(src, [8, max(n_rows, 8)])
    src(f"need8 = pypto.expand_clone(need, [8, {n_rows}])")
    pto_set_tile(src, [max(n_rows, 8), 8])
    src("nt = pypto.transpose(need8, 0, 1)")
    pto_set_tile(src, [max(ntok, 8)])
    src(f"pf = {cast_expr(f'pypto.view({pos.name}, [{ntok}], [r0])', pos.dtype, 'f32')}")
    pto_set_tile(src, [ntok, 8])
    src(f"lim = pypto.add(pypto.reshape(pf, [{ntok}, 1]), 1.0)")
    pto_set_tile(src, [ntok, max(heads, 8)])
    src(f"limx = pypto.expand_clone(lim, [{ntok}, {heads}])")
    pto_set_tile(src, [1, max(ntok * heads, 8)])
    src(f"limr = pypto.reshape(limx, [1, {ntok * heads}])")
    pto_scope(src, -1)


def _pto_cmp_group_tokens(heads: int, wr: int, ntok: int) -> int:
    """Tokens per softmax task: as many as one f32 [work_rows, tokens·H] tile of 64 KiB holds (fewer, larger
    tasks; a 128 KiB tile overflows the UB)."""
    return max(1, min(ntok, 2 * PTO_TILE_ELEMS // max(1, wr * heads)))


def _pto_cmp_softmax_t(src: Src, cols: int, width: int, scale: float, tile) -> None:
    """The vector part of a group's tile partials in the transposed layout (keys × (token, head)):
    s [width, cols] → s·scale, −1e20 where not ok; mi [1, cols] = the max over the keys; p = exp(s − mi)
    (0 where not ok); li [1, cols] = numpy's pairwise Σp over the keys, bitwise (its accumulators are row
    blocks); pb = bf16(p)."""
    src(f"s = pypto.where(ok, pypto.mul(s, {scale!r}), {PTO_NEG_ATTN!r})")
    src("mi = pypto.amax(s, 0, keepdim=True)")
    src("p = pypto.where(ok, pypto.exp(pypto.sub(s, mi)), 0.0)")

    def rows(t: str, off: int, k: int) -> str:
        return f"pypto.view({t}, [{k}, {cols}], [{off}, 0])"

    pto_set_tile(src, [8, tile[1]])
    total = pto_pairwise_tree(src, pto_namer("ps"), rows, "p", 0, width)
    src(f"li = {total}")
    pto_set_tile(src, tile)
    src("pb = pypto.cast(p, pypto.DT_BF16, pypto.CastMode.CAST_RINT)")


def _pto_cmp_store_row(src: Src, name: str, out, heads: int, n: int, t0: int, w: int) -> None:
    """Store the row `name` [1, n·H] of tokens r0+t0 … (m or l of a group) as their item w of out [T, works, H]:
    token by token (a reshape to [1, 1, H] is free in the forced subgraph), or as one [n, 1, H] reshape when a
    token's [1, H] view would be narrower than 32 bytes."""
    pto_set_tile(src, [1, 1, max(heads, 8)])
    if n > 1 and heads % 8:
        src(f"pypto.assemble(pypto.reshape({name}, [{n}, 1, {heads}]), [r0 + {t0}, {w}, 0], {out.name})")
        return
    for i in range(n):
        part = f"pypto.view({name}, [1, {heads}], [0, {i * heads}])" if n > 1 else name
        src(f"pypto.assemble(pypto.reshape({part}, [1, 1, {heads}]), [r0 + {t0 + i}, {w}, 0], {out.name})")


def _pto_cmp_tokens(src: Src, spec: KernelSpec, ntok: int) -> None:
    """The hca_cmp_qk_pv partials of the `ntok` tokens from r0, all of request `req`: the mask operands, then per
    work item w one sᵀ = K·qᵀ [work_rows, ntok·H] cube matmul and, per group of tokens, one forced subgraph (the
    masked softmax; m and l stored from it, as rows) and one rb(p)ᵀ·K cube matmul [tokens·H, HD] stored into o
    through an in-place reshape (the cube writes o; no copy). `aiv_split` (hca-attn-dual-aiv) divides each group
    into that many smaller ones: independent subgraphs the runtime can place on both AIVs of a core group (the
    columns are independent (token, head) softmaxes, so the values are the same)."""
    q, krows, phys, pos, kvlen = spec.operands
    m_out, l_out, o_out = spec.results
    _, heads, hd = q.shape
    n_rows = krows.shape[1]
    wr = int(spec.attrs["work_rows"])
    scale = float(spec.attrs["scale"])
    g = _pto_cmp_group_tokens(heads, wr, ntok)
    g = max(1, -(-g // int(spec.attrs.get("aiv_split", 1))))   # the group's softmax over aiv_split subgraphs
    _pto_cmp_mask(src, phys, kvlen, pos, heads, ntok, int(spec.attrs["ratio"]), int(spec.attrs["max_rows"]))
    o_tile = pto_head_tile(1, heads, hd, 2 * PTO_TILE_ELEMS)[1:]
    pto_set_tile(src, o_tile)
    src(f"q2 = pypto.view(qf, [{ntok * heads}, {hd}], [r0 * {heads}, 0])")
    scope = 2
    for w in range(n_rows // wr):
        pto_set_tile(src, pto_head_tile(1, wr, hd, 2 * PTO_TILE_ELEMS)[1:])
        src(f"k2 = pypto.view(kf, [{wr}, {hd}], [req * {n_rows} + {w * wr}, 0])")
        src(f"pypto.set_cube_tile_shapes({pto_cube_shapes(wr, hd, ntok * heads, 'bf16')})")
        src("st = pypto.matmul(k2, q2, pypto.DT_FP32, b_trans=True)")
        for t0 in range(0, ntok, g):
            n = min(g, ntok - t0)
            cols = n * heads
            tile = [wr, max(cols, 8)]
            pto_set_tile(src, tile)
            pto_scope(src, scope)
            scope += 1
            src(f"s = pypto.view(st, [{wr}, {cols}], [0, {t0 * heads}])")
            src(f"lt = pypto.expand_clone(pypto.view(limr, [1, {cols}], [0, {t0 * heads}]), [{wr}, {cols}])")
            src(f"nc = pypto.expand_clone(pypto.view(nt, [{wr}, 1], [{w * wr}, 0]), [{wr}, {cols}])")
            src("ok = pypto.ge(pypto.sub(lt, nc), 0.0)")
            _pto_cmp_softmax_t(src, cols, wr, scale, tile)
            for name, out in (("mi", m_out), ("li", l_out)):
                _pto_cmp_store_row(src, name, out, heads, n, t0, w)
            pto_scope(src, -1)
            src(f"pypto.set_cube_tile_shapes({pto_cube_shapes(cols, wr, hd, 'bf16')})")
            src("oi = pypto.matmul(pb, k2, pypto.DT_FP32, a_trans=True)")
            pto_set_tile(src, [1, 1] + o_tile)
            src(f"pypto.assemble(pypto.reshape(oi, [{n}, 1, {heads}, {hd}], inplace=True), [r0 + {t0}, {w}, 0, 0], "
                f"{o_out.name})")


@template(HcaCmpQkPv)
def pypto_hca_cmp_qk_pv(spec: KernelSpec) -> str:
    """Per (token, work item) tile partials over the token's request rows (`_pto_cmp_tokens`), in the transposed
    layout sᵀ = K·qᵀ (keys × (token, head)): the softmax reduces over rows, so m and l come out as rows, and
    numpy's pairwise sum runs on row blocks. One request (seq tokens) per iteration of the main loop; the tokens
    of a last, incomplete request (T not a multiple of seq) one per iteration of a tail loop, so that every
    group of tokens is whole (no valid_shape, no per-token branches: each `if` doubles pypto's compiled paths).
    q and cmp_rows are flattened once (in-place reshapes) and read through 2-D views (a reshaped view is a
    copy). valid[t, c] ⇔ (c+1)·R ≤ min(pos[t]+1, kv_seq_len[b]) ∧ c < max_rows ∧ phys[b, c] ≥ 0, which is
    c < n[t] exactly in integers (`_pto_cmp_mask`); items past the visible rows come out neutral (m = −1e20,
    l = 0, o = 0) as in the reference."""
    q, krows = spec.operands[:2]
    _, heads, hd = q.shape
    b_n, n_rows, _ = krows.shape
    seq = int(spec.attrs["seq"])
    src = Src(spec.signature())
    tok = f"{q.name}.shape[0]" if q.is_dynamic(0) else str(q.shape[0])
    src(f"tok = {tok}")
    src(f"qf = pypto.reshape({q.name}, [tok * {heads}, {hd}], inplace=True)")
    src(f"kf = pypto.reshape({krows.name}, [{b_n * n_rows}, {hd}], inplace=True)")
    with src.block(f"for req in pypto.loop(0, tok // {seq}, 1, name=\"req_loop\", idx_name=\"req\"):"):
        src(f"r0 = req * {seq}")
        _pto_cmp_tokens(src, spec, seq)
    if q.is_dynamic(0) or q.shape[0] % seq:
        with src.block(f"for r0 in pypto.loop(tok // {seq} * {seq}, tok, 1, name=\"tail_loop\", idx_name=\"r0\"):"):
            src(f"req = tok // {seq}")
            _pto_cmp_tokens(src, spec, 1)
    return src.text()


# ---- HCA data movement ------------------------------------------------------------------------------------
@template(HcaRawTranspose)
def pypto_hca_raw_transpose(spec: KernelSpec) -> str:
    """rows [T, W, HD] → [T, HD, W]: `pypto.transpose` of the last two axes (exact), tiles of ≤ 32 KiB and at most
    128 × 128 (a transpose holds several tile-sized UB buffers; the flash [128, 128] bf16 tile compiles and
    costs a quarter of the [64, 64] one). Static T, one forced subgraph per block of tokens, as many blocks as
    vector cores (each pypto task costs its core an AICPU round: one task per token tile made 512 tasks on
    flash); the last block is moved back to end at T (rewriting rows of the block before with the same values).
    A subgraph merges only ops joined by data, and the tiles of one transpose are not: each tile subtracts the
    same +0 tensor (in f32, exact, −0 stays −0) to join them."""
    spec = spec.static()
    rows = spec.operands[0]
    out = spec.results[0]
    ntok, w, hd = rows.shape
    tw, th = min(w, 128), min(hd, 128)
    tr = max(1, min(8, (32 * 1024) // (tw * th * rows.itemsize)))
    n = max(1, min(ntok, -(-ntok // PTO_VECTOR_CORES)))
    n = -(-n // tr) * tr if n >= tr else n  # whole tiles of rows
    n = min(n, ntok)
    tr = pto_divisor(n, tr)
    nb = -(-ntok // n)
    src = Src(spec.signature())
    with src.block(f'for blk in pypto.loop(0, {nb}, 1, name="tok_loop", idx_name="blk"):'):
        src(f"t0 = {f'blk * {n}' if nb * n == ntok else f'pypto.min(blk * {n}, {ntok - n})'}")
        pto_scope(src, 1)
        pto_set_tile(src, [tr, tw, th])
        src(f"x = pypto.view({rows.name}, [{n}, {w}, {hd}], [t0, 0, 0])")
        pto_set_tile(src, [n, 1, tw])
        src(f"zero = pypto.full([{n}, 1, {tw}], 0.0, pypto.DT_FP32)")
        pto_set_tile(src, [tr, th, tw])
        src("y = pypto.transpose(x, 1, 2)")
        y32 = cast_expr("y", rows.dtype, "f32")
        src(f"y = {cast_expr(f'pypto.sub({y32}, zero)', 'f32', out.dtype)}")
        src(f"pypto.assemble(y, [t0, 0, 0], {out.name})")
        pto_scope(src, -1)
    return src.text()


@template(HcaCmpWorkGather)
def pypto_hca_cmp_work_gather(spec: KernelSpec) -> str:
    """phys[b, i] = table[b, i // bs]·bs + i % bs (−1 past the table or unmapped): the page of column i is static,
    so each page is one table column broadcast over its bs columns plus an iota. The whole table's part (phys,
    the clamped index max(phys, 0) and the mask phys ≥ 0 as [B, L, 1]) is one forced subgraph; then per request
    rows = cmp_kv[index] (−1 → 0) by index_select and where on [1, L, ·] tiles of 64 KiB (one index row per
    index_select)."""
    cache, table = spec.operands
    rows_out, phys_out = spec.results
    b_n, pages = table.shape
    hd = cache.shape[1]
    bs, wr, works = (int(spec.attrs[k]) for k in ("block_size", "work_rows", "works"))
    n = wr * works
    src = Src(spec.signature())
    pto_scope(src, 1)
    parts = []
    for p in range(-(-n // bs)):
        cols = min(bs, n - p * bs)
        name = f"ph{p}"
        tile = [b_n, max(cols, 8)]
        if p < pages:
            pto_set_tile(src, [b_n, 8])
            src(f"tb = {cast_expr(f'pypto.view({table.name}, [{b_n}, 1], [0, {p}])', table.dtype, 'f32')}")
            pto_set_tile(src, tile)
            src(f"tbx = pypto.expand_clone(tb, [{b_n}, {cols}])")
            _pto_iota(src, cols, "jr", tile)
            src(f"{name} = pypto.where(pypto.ge(tbx, 0.0), pypto.add(pypto.mul(tbx, {float(bs)!r}), jr), -1.0)")
        else:
            pto_set_tile(src, tile)
            src(f"{name} = pypto.full([{b_n}, {cols}], -1.0, pypto.DT_FP32)")
        parts.append(name)
    pto_set_tile(src, [b_n, max(n, 8)])
    src(f"phf = {parts[0] if len(parts) == 1 else 'pypto.concat([' + ', '.join(parts) + '], -1)'}")
    src(f"phi = {cast_expr('phf', 'f32', 'i32')}")
    src(f"pypto.assemble(phi, [0, 0], {phys_out.name})")
    src("cia = pypto.maximum(phi, 0)")
    pto_set_tile(src, [1, n, 8])
    src(f"oka = pypto.ge(pypto.reshape(phf, [{b_n}, {n}, 1]), 0.0)")
    pto_scope(src, -1)
    d_tile = hd
    while n * d_tile * 2 > L0B_BYTES and d_tile % 2 == 0 and d_tile > 16:
        d_tile //= 2
    for b in range(b_n):
        pto_set_tile(src, [1, max(n, 8)])
        src(f"ci = pypto.view(cia, [1, {n}], [{b}, 0])")
        pto_set_tile(src, [1, n, 8])
        src(f"okr = pypto.view(oka, [1, {n}, 1], [{b}, 0, 0])")
        pto_set_tile(src, [1, n, d_tile])
        src(f"g = pypto.index_select({cache.name}, 0, ci)")
        src(f"y = {cast_expr('pypto.where(okr, g, 0.0)', 'f32', rows_out.dtype)}")
        src(f"pypto.assemble(y, [{b}, 0, 0], {rows_out.name})")
    return src.text()


# ---- merges, sink, inverse RoPE, pack -----------------------------------------------------------------------


def _pto_numel(t) -> int:
    n = 1
    for e in t.shape:
        n *= e
    return n


def _pto_group_merge_kernel(spec: KernelSpec, *, csa: bool, merge: bool, pack: bool, publish: bool = False) -> str:
    """csa_merge_norm (csa: the items merged in order from the first), hca_stream_merge (merge: the raw stream
    state, then the work items ascending; f32 out), hca_stream_merge_pack (the same, then the pack) and
    hca_stream_pack (pack only), on kernels/attention_blocks.py `PtoGroupMerge` tasks; static T. The heads, the items'
    heads and
    the items' m, l are flattened in place to 2-D [T, ·] (item i, head h at column i·H + h). `publish`
    (hca_stream_merge_pack_publish's local part): tasks of `publish_tokens` tokens, each packed head assembled
    into the exchange window (out [G/tp, tp·T_PAD, hg·HD]) instead of a packed tensor."""
    spec = spec.static()
    ops = spec.operands
    out = spec.results[0]
    swap, state, items, sink = None, None, None, None
    if csa:
        m, l, o, sink, cos_il, sin_signed = ops
        ntok, n_items, heads, hd = o.shape
        items = (m, l, o)
    elif merge:
        m, l, hs, cm, cl, co, sink = ops[:7]
        cos_il, sin_signed, swap = ops[7:10] if pack else (None, None, None)
        ntok, heads, hd = hs.shape
        n_items = cm.shape[1]
        state, items = (m, l, hs), (cm, cl, co)
    else:
        hs, cos_il, sin_signed, swap = ops
        ntok, heads, hd = hs.shape
        state = (None, None, hs)
    groups = int(spec.attrs["o_groups"]) if pack else max(1, heads // 8)
    src = Src(spec.signature())
    flat = {}
    for t in ([state[2]] if state else []) + (list(items) if items else []) + ([sink] if sink else []):
        lead = 1 if t is sink else ntok
        flat[t.name] = f"{t.name}2"
        src(f"{t.name}2 = pypto.reshape({t.name}, [{lead}, {_pto_numel(t) // lead}], inplace=True)")
    lg = groups // int(spec.attrs["tp"]) if publish else None
    mg = PtoGroupMerge(src, ntok, heads, hd, groups, 1 + (n_items - (1 if csa else 0) if items else 0),
                       tokens=int(spec.attrs["publish_tokens"]) if publish else None)
    with mg.blocks():
        factors = []
        if items:
            im, il, io = (flat[t.name] for t in items)
            first = 1 if csa else 0
            if csa:
                mg.load_state(mg.cols(im), mg.cols(il))
            else:
                mg.load_state(mg.cols(state[0].name), mg.cols(state[1].name))
            for i in range(first, n_items):
                factors.append((i, mg.merge_item(mg.cols(im, f"{i * heads} + h0"), mg.cols(il, f"{i * heads} + h0"))))
            mg.denominator(flat[sink.name])
        stage = bool(spec.attrs.get("stage_heads")) and pack and merge
        if pack and not stage:
            mg.tables(cos_il, sin_signed, None if swap is None else swap.name)
        for j in mg.head_loop():
            if csa:
                src(f"o_acc = {mg.head(flat[items[2].name], f'(h0 + {j}) * {hd}')}")
            else:
                src(f"o_acc = {mg.head(flat[state[2].name], f'(h0 + {j}) * {hd}')}")
            for i, f in factors:
                mg.merge_head(f, mg.head(flat[items[2].name], f"({i * heads} + h0 + {j}) * {hd}"))
            if items:
                mg.normalize_head()
            else:
                src("y = o_acc")
            if stage:
                mg.stage_head(j)
            elif pack:
                mg.pack_head(j, cos_il.shape[1], out, lg)
            else:
                mg.store_head(j, out)
        if stage:   # the seed's form (before pypto-lib #1229): the read-back is a new subgraph, through GM
            mg.next_subgraph()
            mg.tables(cos_il, sin_signed, None if swap is None else swap.name)
            for j in mg.head_loop():
                mg.unstage_head(j)
                mg.pack_head(j, cos_il.shape[1], out)
    return src.text()


@template(CsaMergeNorm)
def pypto_csa_merge_norm(spec: KernelSpec) -> str:
    return _pto_group_merge_kernel(spec, csa=True, merge=True, pack=True)


@template(HcaStreamMerge)
def pypto_hca_stream_merge(spec: KernelSpec) -> str:
    return _pto_group_merge_kernel(spec, csa=False, merge=True, pack=False)


@template(HcaStreamMergePack)
def pypto_hca_stream_merge_pack(spec: KernelSpec) -> str:
    return _pto_group_merge_kernel(spec, csa=False, merge=True, pack=True)


@template(HcaStreamPack)
def pypto_hca_stream_pack(spec: KernelSpec) -> str:
    return _pto_group_merge_kernel(spec, csa=False, merge=False, pack=True)


unsupported(HcaStreamMergePackPublish, "rendezvous publish: each worker puts its packed tiles into the owners' "
                                       "exchange windows, then the notify and barrier 1; pypto 0.2.0 expresses "
                                       "remote stores and signals only with pypto.distributed / shmem ops, which "
                                       "compile but SIGSEGV in the CPU cost-model simulation; the lowering runs it on "
                                       "numpy. Its local part is the cost form below")


@cost_template(HcaStreamMergePackPublish)
def pypto_hca_stream_merge_pack_publish_local(spec: KernelSpec) -> str:
    """The publish workers of one rank (pypto-lib #1170 (b)): the merge-pack on `publish_tokens`-token tiles, each
    packed head assembled from the UB straight into a window-shaped tensor standing in for the owners' windows
    (group g at [g mod LG, (g div LG)·T + t, ·], the row block this rank's tokens take in owner g div LG's window;
    the link transfer, the notify and barrier 1 are not in it). Pad rows are zero-filled by the host, not
    written."""
    return _pto_group_merge_kernel(spec, csa=False, merge=True, pack=True, publish=True)


# ---- CSA plan ---------------------------------------------------------------------------------------------
@template(CsaSlotsBuildValidQkPlan)
def pypto_csa_slots_build_valid_qk_plan(spec: KernelSpec) -> str:
    """The CSA plan on whole [T, ·] tensors (static T: qk_order sorts the items of all tokens at once).
    keep ⇔ raw ≥ 0 ∧ (raw+1)·r ≤ pos+1 (≡ raw < (pos+1)//r in integers); page = trunc((raw + ½)/bs), rem =
    raw − page·bs; block = table[b(t), page] by `pypto.gather` on the token's table row (the page clamped into
    the table, pages past it invalid); all integer arithmetic in f32 (< 2^24), exact. qk_order = the items
    sorted by the key (1 − nonempty)·N + item by `pypto.topk` of −key over all N items: keys are distinct, so
    the tie order of the sort cannot matter, and the result is the reference's stable partition.
    With a `tile` (rows), the [T, ·] element-wise work runs on tiles of that many tokens: upstream's token tile
    (pypto-lib decode_sparse_attn_csa.py, csa_slots_build_valid_qk_plan: BIAS_T_TILE = min(T, 8) rows of the
    [T, IDX_TOPK] and [T, WIN] masks per step)."""
    spec = spec.static()
    topk, pos, table, swa = spec.operands
    cidx_out, vmask_out, bias_out, order_out = spec.results
    t_n = pos.shape[0]
    w = swa.shape[1]
    b_n, pages = table.shape
    ratio, seq, bs = int(spec.attrs["ratio"]), int(spec.attrs["seq"]), int(spec.attrs["block_size"])
    k, kt = int(spec.attrs["idx_topk"]), int(spec.attrs["k_tile"])
    blocks = (w + k) // kt
    n_items = t_n * blocks
    tile_rows = pto_divisor(t_n, row_block(spec, default=t_n))

    def token_tile(shape) -> list[int]:
        tile = _pto_big_tile(shape)
        return [min(tile[0], tile_rows)] + tile[1:]

    src = Src(spec.signature())
    pto_set_tile(src, [max(t_n, 8)])
    src(f"pf = {cast_expr(pos.name, pos.dtype, 'f32')}")
    pto_set_tile(src, [t_n, 8])
    src(f"lim = pypto.add(pypto.reshape(pf, [{t_n}, 1]), 1.0)")
    wide = token_tile((t_n, k))
    pto_set_tile(src, wide)
    src(f"rf = {cast_expr(f'pypto.view({topk.name}, [{t_n}, {k}], [0, 0])', topk.dtype, 'f32')}")
    src(f"need = pypto.mul(pypto.add(rf, 1.0), {float(ratio)!r})")
    src("keep = pypto.where(pypto.ge(rf, 0.0), pypto.where(pypto.le(pypto.sub(need, lim), 0.0), 1.0, 0.0), 0.0)")
    src("rc = pypto.where(pypto.ge(keep, 0.5), rf, 0.0)")
    src(f"pg = pypto.cast(pypto.cast(pypto.div(pypto.add(rc, 0.5), {float(bs)!r}), pypto.DT_INT32, "
        f"pypto.CastMode.CAST_TRUNC), pypto.DT_FP32)")
    src(f"rem = pypto.sub(rc, pypto.mul(pg, {float(bs)!r}))")
    src(f"keep = pypto.where(pypto.lt(pg, {float(pages)!r}), keep, 0.0)")
    src(f"pgi = pypto.cast(pypto.minimum(pg, {float(pages - 1)!r}), pypto.DT_INT32, pypto.CastMode.CAST_RINT)")
    token_tables = pto_token_table_rows(src, table, b_n, seq)
    pto_set_tile(src, wide)
    src(f"bv = pypto.gather({token_tables}, 1, pgi)")
    src("keep = pypto.where(pypto.ge(bv, 0.0), keep, 0.0)")
    src(f"physf = pypto.where(pypto.ge(keep, 0.5), pypto.add(pypto.mul(bv, {float(bs)!r}), rem), -1.0)")
    src(f"ci = {cast_expr('physf', 'f32', 'i32')}")
    src(f"pypto.assemble(ci, [0, 0], {cidx_out.name})")
    src("vc = pypto.where(pypto.ge(physf, 0.0), 1.0, 0.0)")
    pto_set_tile(src, token_tile((t_n, w)))
    src(f"vw = pypto.where(pypto.ge({cast_expr(swa.name, swa.dtype, 'f32')}, 0.0), 1.0, 0.0)")
    pto_set_tile(src, token_tile((t_n, w + k)))
    src("va = pypto.concat([vw, vc], -1)")
    src(f"bias = pypto.where(pypto.ge(va, 0.5), 0.0, {PTO_NEG_ATTN!r})")
    src(f"pypto.assemble(bias, [0, 0], {bias_out.name})")
    pto_set_tile(src, token_tile((t_n, blocks, kt)))
    src(f"va3 = pypto.reshape(va, [{t_n}, {blocks}, {kt}])")
    src("ne3 = pypto.amax(va3, -1, keepdim=True)")
    src(f"ne = pypto.reshape(ne3, [{t_n}, {blocks}])")
    pto_set_tile(src, [t_n, max(blocks, 8)])
    src(f"vm = {cast_expr('ne', 'f32', 'i32')}")
    src(f"pypto.assemble(vm, [0, 0], {vmask_out.name})")
    src(f"ne1 = pypto.reshape(ne, [1, {n_items}])")
    _pto_iota(src, n_items, "item", [1, n_items])
    src(f"key = pypto.add(pypto.mul(ne1, {float(n_items)!r}), pypto.neg(item))")
    src(f"vals, idx = pypto.topk(key, {n_items}, -1, True)")
    pto_set_tile(src, [n_items])
    src(f"pypto.assemble(pypto.reshape(idx, [{n_items}]), [0], {order_out.name})")
    return src.text()

template(OLocalBridge)(pypto_copy)

