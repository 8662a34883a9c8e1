"""pypto 0.2.0 templates of the compressor kernel family.

The ops' numpy semantics: dspark_ir/semantics/compressor.py.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generators for the lowering (see kernels/pto.py), mirroring the references above. Two pypto 0.2.0
# idioms for the data-dependent parts (positions, ring tables, slot mappings), both verified on CPU (full mode,
# pass-verify clean):
# * runtime scalars: int32 inputs read as scalars (`positions[t]`, `table[b, i]`: GetTensorData), scalar
#   arithmetic (+ − * // % == < >= pypto.min/max) giving row offsets for `pypto.view` / `pypto.assemble`, and a
#   `pypto.loop` body that writes a row only `if <scalar> >= 0` (the cache writes: a few rows per step);
# * vector index arithmetic: positions and tables as f32 tensors (exact integers < 2^23), floors as
#   trunc((x + ½)/d), table lookups by `pypto.gather`, rows read by `index_select` and written by chained
#   `scatter_update`s (cmp_scatter_softmax_pool: every token at once, so a handful of large tasks instead of a
#   few per token).
# What pypto 0.2.0's cost model charges (read from its per-op logs): a vector op costs ~45 cycles plus its
# elements per leading-dim slice (so the large ops run on [1, X, Y] slabs), a copy into UB ~1.4 k cycles plus
# ~95 B/cycle, an `index_select` from GM next to nothing; a reshape of a parameter is a HUB task that delays the
# first core task by ~3 µs (so the templates reshape local tensors instead).
# `pypto.full` with a SymbolicScalar value is NOT computed on CPU (it reads 0), and a view of a local tensor at a
# loop-variable offset is copied piecewise (tens of tasks): neither is used for masks.
# The helpers shared with the indexer / top-k-bypass templates (ramp, column views, token tables) and the
# row-norm and RoPE pieces (numpy's pairwise mean order, pair swap by data movement) are in kernels/vector.py.
from dspark_ir.ops.compressor import (
    CmpKvHadamard,
    CmpKvScoreProj,
    CmpRmsnormRope,
    CmpRmsnormRopeCacheWrite,
    CmpScatterSoftmaxPool,
    IdxKvCacheWrite,
    PrefillCmpFinishWrite,
    PrefillCmpPool,
    RopeGatherRows,
    RopeInterleave,
    RopeSwapIdx,
)

from .cube import pto_cube_shapes_spread
from .pto import KernelSpec, RowLoop, Src, cast_expr, cube_shapes, row_block, vec_tile
from .registry import template
from .vector import (
    PTO_NEG_INF,
    PtoBlock,
    pto_align,
    pto_block_loops,
    pto_rms_norm_block,
    pto_rope_rows,
    pto_scope,
    pto_set_tile,
    pto_tile,
)


def _pto_pool_token(src: Src, positions: str, b: str, seq: int, ratio: int, tag: str = "") -> tuple[str, str, str]:
    """Emit request b's pooling token like `pool_token`: the first of its seq tokens with (pos+1) % r == 0.
    Returns the scalar names (has: 0/1, tsel: its token index (clamped to the request), psel: its position)."""
    keys = []
    for i in range(seq):
        src(f"pk{tag}{i} = {i} + (1 - (({positions}[{b} * {seq} + {i}] + 1) % {ratio} == 0)) * {seq}")
        keys.append(f"pk{tag}{i}")
    sel = keys[0]
    for k in keys[1:]:
        sel = f"pypto.min({sel}, {k})"
    src(f"sel{tag} = {sel}")
    src(f"has{tag} = sel{tag} < {seq}")
    src(f"tsel{tag} = {b} * {seq} + pypto.min(sel{tag}, {seq - 1})")
    src(f"psel{tag} = {positions}[tsel{tag}]")
    return f"has{tag}", f"tsel{tag}", f"psel{tag}"


@template(RopeSwapIdx)
def pypto_rope_swap_idx(spec: KernelSpec) -> str:
    """j ^ 1 = j + 1 − 2·(j − 2·floor(j/2)) on an f32 arange (exact), cast to i32."""
    out = spec.results[0]
    rd = out.shape[0]
    src = Src(spec.signature())
    pto_set_tile(src, [max(rd, 8)] if rd <= 4096 else [4096])
    src(f"j = pypto.cast(pypto.arange({rd}), pypto.DT_FP32)")
    src("odd = pypto.sub(j, pypto.mul(pypto.floor(pypto.mul(j, 0.5)), 2.0))")
    src("y = pypto.sub(pypto.add(j, 1.0), pypto.mul(odd, 2.0))")
    src(f"pypto.assemble({cast_expr('y', 'f32', 'i32')}, [0], {out.name})")
    return src.text()


_PTO_ROPE_ROWS = 32   # rows per forced subgraph of rope_interleave


@template(RopeInterleave)
def pypto_rope_interleave(spec: KernelSpec) -> str:
    """cos_il[j] = c[j >> 1], sin_signed[j] = ±s[j >> 1] (− for even j): per block of R rows (one forced
    subgraph), the halves transposed to [half, R], placed side by side as [c | c] / [−s | s] ([half, 2R], which
    is the interleaved [rd, R] read row-major) and transposed back; pure data movement and a negation (exact).
    Flash TP4 cost model (hca.rope_interleave, one block): 36 → 2 tasks, 38.2 → 3.9 µs of work."""
    spec = spec.static()
    cos, sin = spec.operands
    cos_il, sin_signed = spec.results
    rows, half = cos.shape
    src = Src(spec.signature())
    for r0 in range(0, rows, _PTO_ROPE_ROWS):
        r = min(_PTO_ROPE_ROWS, rows - r0)
        pto_scope(src, 1 + r0 // _PTO_ROPE_ROWS)
        src(f"pypto.set_vec_tile_shapes({r}, {pto_align(half, 8)})")
        for name, t in (("c", cos), ("s", sin)):
            src(f"{name}f = {cast_expr(f'pypto.view({t.name}, [{r}, {half}], [{r0}, 0])', t.dtype, 'f32')}")
        targets = (cos_il, sin_signed)

        def store(name: str, k: int, rows_f32: str, r0: int = r0) -> None:
            src(f"{name}o = {cast_expr(rows_f32, 'f32', targets[k].dtype)}")
            src(f"pypto.assemble({name}o, [{r0}, 0], {targets[k].name})")

        _pto_interleave_rows(src, r, half, store)
        pto_scope(src, -1)
    return src.text()


@template(RopeGatherRows)
def pypto_rope_gather_rows(spec: KernelSpec) -> str:
    """Per request b: p = positions[b·seq] (at = boundary: r·floor(p / r); a negative p reads row P + p like
    numpy's indexing), rows [B, half] of both tables at p: the first tokens' positions by `index_select` at
    0, seq, 2·seq, …, the rows by `index_select` of the tables' first halves, in one forced subgraph (flash TP4
    cost model, hca.cmp_rope_rows: 32 → 1 task, 30.5 → 1.0 µs of work)."""
    cos_t, sin_t, pos = spec.operands
    cos, sin = spec.results
    batch, half = cos.shape
    n_rows = cos_t.shape[0]
    seq, ratio = int(spec.attrs["seq"]), int(spec.attrs.get("ratio", 1))
    src = Src(spec.signature())
    pto_scope(src, 1)
    pto_set_tile(src, [max(batch, 8)])
    src(f"tok = pypto.cast(pypto.cast(pypto.arange(0, {batch * seq}, {seq}), pypto.DT_FP32), {_PTO_I32})")
    src(f"pf = pypto.cast(pypto.index_select({pos.name}, 0, tok), pypto.DT_FP32)")
    if spec.attrs["at"] == "boundary" and ratio > 1:
        src(f"pf = pypto.mul({_pto_floor('pf', ratio, signed=True)}, {float(ratio)!r})")
    src(f"pi = pypto.cast(pypto.where(pypto.lt(pf, 0.0), pypto.add(pf, {float(n_rows)!r}), pf), {_PTO_I32})")
    pto_set_tile(src, [batch, pto_align(half, 16 if cos.itemsize == 2 else 8)])
    for table, out in ((cos_t, cos), (sin_t, sin)):
        rows = f"pypto.index_select(pypto.view({table.name}, [{n_rows}, {half}], [0, 0]), 0, pi)"
        src(f"pypto.assemble({cast_expr(rows, table.dtype, out.dtype)}, [0, 0], {out.name})")
    pto_scope(src, -1)
    return src.text()


@template(CmpKvScoreProj)
def pypto_cmp_kv_score_proj(spec: KernelSpec) -> str:
    """kvp = x @ wkv.T, scp = x @ wgate.T (cube, f32 accumulation): all rows in one loop iteration (every tile
    task dispatched at once), the cube tiles of `pto_cube_shapes_spread` (deep L1 k tiles, the output tile
    that spreads the two products over the cube cores). Flash TP4 cost model (alone µs): HCA 42.9 → 24.0,
    CSA 80.4 → 33.6, CSA inner 42.9 → 20.8."""
    x, wkv, wgate = spec.operands
    kv, score = spec.results
    width, out_dim = x.shape[1], wkv.shape[0]
    src = Src(spec.signature())
    loop = RowLoop(src, x, x.shape[0])
    br = loop.shape(x)[0]
    with loop.loop():
        src(f"pypto.set_cube_tile_shapes({pto_cube_shapes_spread(br, width, out_dim, x.dtype, matmuls=2)})")
        src(f"xa = {loop.view(x)}")
        src(f"kvb = pypto.matmul(xa, {wkv.name}, pypto.DT_FP32, b_trans=True)")
        src(f"scb = pypto.matmul(xa, {wgate.name}, pypto.DT_FP32, b_trans=True)")
        pto_tile(src, (br, out_dim))
        loop.store("kvb", kv)
        loop.store("scb", score)
    return src.text()


_PTO_I32 = "pypto.DT_INT32, pypto.CastMode.CAST_RINT"


def _pto_floor(x: str, d: int, signed: bool = False) -> str:
    """floor(x / d) of an integer-valued f32 tensor x (x ≥ 0, or x ≥ −2^20 when `signed`): trunc((x + ½) / d),
    exact even under an approximate division (the quotient stays ½/d away from an integer); a signed x is shifted
    by a multiple of d first. Values stay below 2^23."""
    off = -(-(1 << 20) // d) if signed else 0
    shifted = f"pypto.add({x}, {float(off * d) + 0.5!r})"
    q = (f"pypto.cast(pypto.cast(pypto.div({shifted}, {float(d)!r}), pypto.DT_INT32, pypto.CastMode.CAST_TRUNC), "
         "pypto.DT_FP32)")
    return f"pypto.sub({q}, {float(off)!r})" if off else q


def _pto_arange(src: Src, n: int, name: str) -> str:
    """`name` = f32 [1, n] holding 0 … n−1 (built under a 1-D tile: a rank-2 tile mis-lowers arange); returns
    `name`."""
    pto_set_tile(src, [max(8, min(n, 4096))])
    src(f"{name}1 = pypto.cast(pypto.arange({n}), pypto.DT_FP32)")
    pto_set_tile(src, vec_tile((1, n), 4))
    src(f"{name} = pypto.reshape({name}1, [1, {n}])")
    return name


@template(CmpScatterSoftmaxPool)
def pypto_cmp_scatter_softmax_pool(spec: KernelSpec) -> str:
    """Vectorised over tokens and requests (static T), integer arithmetic in f32 (< 2^23, exact); a handful of
    forced subgraphs (each pypto task costs dispatch and ~1.4 k cycles per copy-in).

    Scatter: row(t) = table[t // seq, (max(pos,0) // BS) % pages]·BS + max(pos,0) % BS (the table entry by
    `pypto.gather` on the flat table), valid iff pos ≥ 0 and the page is mapped. "Later tokens win" and
    "−1 skipped" are made order-free for the `scatter_update`s: token t writes the row of its winner w(t) = the
    last valid token with the same row (amax over a [T, T] match matrix), so duplicate rows carry identical data
    (the winner's rows `index_select`ed from kv / score / ape); an invalid token writes row 0 with row 0's final
    content (its winner's, else state_in[0]). The written state is then read back for the pool.
    Pool: per request, the pooling token (first with (pos+1) % r == 0: amin of the flagged token indices), its
    entry j = floor(pos / r) and the window positions give [B, rows] physical rows (the page by `pypto.gather`
    on the request's table row) and a validity mask (all rows invalid without an entry: the pool is then 0);
    then `_PtoPool` per chunk of channels. Flash TP4 cost-model µs (span / busy), per-request pool subgraphs →
    these: HCA 54 / 341 → 152 / 219, CSA 48 / 106 → 24 / 34, CSA inner 45 / 50 → 15 / 17."""
    spec = spec.static()
    kv, sc, ape, state_in, table, pos = spec.operands
    state, pooled = spec.results
    t_n, out_dim = kv.shape
    width = state.shape[1]
    src = Src(spec.signature())
    # ---- per token: its state row, validity and winner; then the scatter (one forced subgraph)
    pto_scope(src, 1)
    tok = _pto_token_rows(src, spec)
    pto_set_tile(src, [t_n, 8])
    src(f"effc = pypto.transpose({tok.row_or_zero}, 0, 1)")
    sq = vec_tile((t_n, t_n), 4)
    pto_set_tile(src, sq)
    # the winner of token t: the last valid token with t's row (−1: none), and its ape row
    src(f"mc = pypto.eq(pypto.expand_clone(effc, [{t_n}, {t_n}]), "
        f"pypto.expand_clone({tok.row_or_neg}, [{t_n}, {t_n}]))")
    src(f"winc = pypto.amax(pypto.where(mc, pypto.expand_clone({tok.index}, [{t_n}, {t_n}]), -1.0), -1, "
        "keepdim=True)")
    pto_set_tile(src, [t_n, 8])
    src("wc = pypto.maximum(winc, 0.0)")
    src("hasw = pypto.ge(winc, 0.0)")
    src(f"wci = pypto.cast(wc, {_PTO_I32})")
    pto_set_tile(src, sq)
    src(f"awc = pypto.gather(pypto.expand_clone({tok.amod}, [{t_n}, {t_n}]), 1, wci)")
    pto_set_tile(src, [t_n, 8])
    src(f"awi = pypto.cast(awc, {_PTO_I32})")
    pto_set_tile(src, [max(t_n, 8)])
    src(f"widx = pypto.reshape(wci, [{t_n}])")
    src(f"aidx = pypto.reshape(awi, [{t_n}])")
    pto_set_tile(src, [1, max(t_n, 8)])
    src(f"ridx = pypto.cast({tok.row_or_zero}, {_PTO_I32})")
    # A scatter_update tile spans whole rows and is staged through UB, and one whose source rows span several
    # tiles keeps only one tile's rows after ExpandFunction (pass-verify FAILS): chained calls of ≤ 32 KiB of
    # rows, each source in one tile (duplicates carry identical data, so the chunking cannot reorder a result).
    # Their row indices are the rows of an [calls, rows] tensor (a view of fewer than 8 i32 at an offset that is
    # not a multiple of 8 goes through GM).
    # A token's row data is its winner's [kv | score + ape[pos % r]], else (no valid token writes its row: an
    # invalid token, row 0) state_in[0].
    chunk = max(1, min(t_n, (32 * 1024) // (width * 4)))
    src(f"pypto.set_vec_tile_shapes(1, {out_dim})")
    src(f"fbk = pypto.view({state_in.name}, [1, {out_dim}], [0, 0])")
    src(f"fbs = pypto.view({state_in.name}, [1, {out_dim}], [0, {out_dim}])")
    by_rows = chunk % 8 != 0 and t_n % chunk == 0
    if by_rows:
        pto_set_tile(src, [t_n // chunk, 8])
        src(f"ridx = pypto.reshape(ridx, [{t_n // chunk}, {chunk}])")

    def chunk_rows(a: int, n: int) -> str:
        at = f"[{a // chunk}, 0]" if by_rows else f"[0, {a}]"
        return f"pypto.view(ridx, [1, {n}], {at})"

    cur = state.name  # in place: the state output starts as state_in (the caller passes one buffer)
    for a in range(0, t_n, chunk):
        n = min(chunk, t_n - a)
        pto_set_tile(src, [max(n, 8)])
        src(f"wi = pypto.view(widx, [{n}], [{a}])")
        src(f"ai = pypto.view(aidx, [{n}], [{a}])")
        pto_set_tile(src, [n, out_dim])
        src(f"hw = pypto.view(hasw, [{n}, 1], [{a}, 0])")
        src(f"kvw = pypto.where(hw, pypto.index_select({kv.name}, 0, wi), fbk)")
        src(f"scw = pypto.where(hw, pypto.add(pypto.index_select({sc.name}, 0, wi), "
            f"pypto.index_select({ape.name}, 0, ai)), fbs)")
        pto_set_tile(src, [n, width])
        src("dat = pypto.concat([kvw, scw], -1)")
        call = f"pypto.scatter_update({cur}, -2, {chunk_rows(a, n)}, dat)"
        if a + n < t_n:
            src(f"st{a} = {call}")
            cur = f"st{a}"
        else:
            src(f"{state.name}[:] = {call}")
    pto_scope(src, -1)
    tiles = _pto_request_tiles(spec)
    if tiles is None:
        _pto_pool_windows(src, spec)
    else:  # a loop over the whole tiles (a root function each: three or more independent tasks of one root
        # function start behind a HUB task, ~3 µs), then the short one
        tile, whole, rest = tiles
        if whole:
            with src.block(f"for tb in pypto.loop(0, {whole}, 1, name=\"tile_loop\", idx_name=\"tb\"):"):
                src(f"b0 = tb * {tile}")
                _pto_pool_tile(src, spec, tile)
        if rest:
            src(f"b0 = {whole * tile}")
            _pto_pool_tile(src, spec, rest)
    return src.text()


class _TokenRows(NamedTuple):
    """Names of the per-token f32 rows [1, T] defined by `_pto_token_rows_of`."""

    index: str          # t
    row: str            # the state row table[t // seq, (p // BS) % pages]·BS + p % BS, p = max(pos, 0)
    row_or_neg: str     # row where valid (pos ≥ 0 and the page mapped), else −1
    row_or_zero: str    # row where valid, else 0
    amod: str           # p % r


def _pto_token_rows(src: Src, spec: KernelSpec) -> _TokenRows:
    """Every token's state row and validity (see `_TokenRows`), from the op's table and positions."""
    table, pos = spec.operands[4:6]
    batch, pages = table.shape
    t_n = pos.shape[0]
    index = _pto_arange(src, t_n, "tidr")
    pto_set_tile(src, [batch, max(pages, 8)])
    src(f"tbf = {cast_expr(table.name, table.dtype, 'f32')}")
    pto_set_tile(src, [1, max(batch * pages, 8)])
    src(f"tabf = pypto.reshape(tbf, [1, {batch * pages}])")
    pto_set_tile(src, [max(t_n, 8)])
    src(f"pf1 = {cast_expr(pos.name, pos.dtype, 'f32')}")
    return _pto_token_rows_of(src, spec, t_n, index, "pf1", "tabf")


def _pto_token_rows_of(src: Src, spec: KernelSpec, t_n: int, index: str, positions: str,
                       flat_table: str) -> _TokenRows:
    """`_pto_token_rows` of t_n tokens from `index` (their index, f32 [1, t_n]), `positions` (f32 [t_n]) and
    `flat_table` (their requests' table rows, flat f32 [1, ·]). Also writes the temporaries pfr … pg."""
    ratio, bs, seq = int(spec.attrs["ratio"]), int(spec.attrs["block_size"]), int(spec.attrs["seq"])
    pages = spec.operands[4].shape[1]
    pto_set_tile(src, [1, max(t_n, 8)])
    src(f"pfr = pypto.reshape({positions}, [1, {t_n}])")
    src("pc = pypto.maximum(pfr, 0.0)")
    src(f"pq = {_pto_floor('pc', bs)}")
    src(f"pcol = pypto.sub(pq, pypto.mul({_pto_floor('pq', pages)}, {float(pages)!r}))")
    src(f"prem = pypto.sub(pc, pypto.mul(pq, {float(bs)!r}))")
    src(f"amodr = pypto.sub(pc, pypto.mul({_pto_floor('pc', ratio)}, {float(ratio)!r}))")
    src(f"fidx = pypto.cast(pypto.add(pypto.mul({_pto_floor(index, seq)}, {float(pages)!r}), pcol), {_PTO_I32})")
    src(f"pg = pypto.gather({flat_table}, 1, fidx)")
    src("ok = pypto.where(pypto.ge(pfr, 0.0), pypto.where(pypto.ge(pg, 0.0), 1.0, 0.0), 0.0)")
    src(f"row = pypto.add(pypto.mul(pg, {float(bs)!r}), prem)")
    src("rowvr = pypto.where(pypto.ge(ok, 0.5), row, -1.0)")
    src("effr = pypto.where(pypto.ge(ok, 0.5), row, 0.0)")
    return _TokenRows(index, "row", "rowvr", "effr", "amodr")


class _RequestEntries(NamedTuple):
    """Names defined by `_pto_request_entries` for requests [b0, b0 + nb)."""

    table: str          # their table rows, f32 [nb, pages]
    positions: str      # their tokens' positions, f32 [nb·seq]
    has: str            # 1 with an entry, f32 [nb, 1]
    j0: str             # the window's first position: r·floor(pos / r), less r with the overlap, f32 [nb, 1]


def _pto_request_entries(src: Src, spec: KernelSpec, b0: str, nb: int) -> _RequestEntries:
    """Requests [b0, b0 + nb): their table rows and positions in f32, the pooling token (first with
    (pos+1) % r == 0: amin of the flagged token indices), whether it exists and the window's first position
    (see `_RequestEntries`)."""
    table, pos = spec.operands[4], spec.operands[5]
    ratio = int(spec.attrs["ratio"])
    overlap, seq = bool(spec.attrs["overlap"]), int(spec.attrs["seq"])
    batch, pages = table.shape
    whole = nb == batch
    tab = table.name if whole else f"pypto.view({table.name}, [{nb}, {pages}], [{b0}, 0])"
    posv = pos.name if whole else f"pypto.view({pos.name}, [{nb * seq}], [{b0} * {seq}])"
    pto_set_tile(src, [nb, max(pages, 8)])
    src(f"tbf = {cast_expr(tab, table.dtype, 'f32')}")
    pto_set_tile(src, [max(nb * seq, 8)])
    src(f"pf1 = {cast_expr(posv, pos.dtype, 'f32')}")
    pto_set_tile(src, [nb, max(seq, 8)])
    src(f"pb = pypto.reshape(pf1, [{nb}, {seq}])")
    src("m1 = pypto.add(pb, 1.0)")
    src(f"fl = pypto.sub(m1, pypto.mul({_pto_floor('m1', ratio, signed=True)}, {float(ratio)!r}))")
    _pto_arange(src, seq, "si")
    pto_set_tile(src, [nb, max(seq, 8)])
    src(f"six = pypto.expand_clone(si, [{nb}, {seq}])")
    src(f"sel = pypto.amin(pypto.where(pypto.eq(fl, 0.0), six, {float(seq)!r}), -1, keepdim=True)")
    src(f"psel = pypto.sum(pypto.where(pypto.eq(six, pypto.expand_clone(sel, [{nb}, {seq}])), pb, 0.0), -1, "
        "keepdim=True)")
    pto_set_tile(src, [nb, 8])
    src(f"has = pypto.where(pypto.lt(sel, {float(seq)!r}), 1.0, 0.0)")
    src(f"j0 = pypto.sub(pypto.mul({_pto_floor('psel', ratio, signed=True)}, {float(ratio)!r}), "
        f"{float(ratio if overlap else 0)!r})")
    return _RequestEntries("tbf", "pf1", "has", "j0")


class _WindowRows(NamedTuple):
    """Names of a window's rows defined by `_pto_window_rows` (request-major, [nb, rows]) or `_pto_window_slots`
    (slot-major, [1, rows·nb]: slot s = r·nb + b is window row r of request b)."""

    index: str          # i32: the physical state rows, 0 where invalid
    ok: str             # f32: 1 for a valid row; all 0 for a request without an entry (whose pool is then 0)
    row: str            # f32: the physical state rows, whether valid or not


def _pto_window_rows(src: Src, spec: KernelSpec, b0: str, nb: int) -> _WindowRows:
    """Requests [b0, b0 + nb) (`_pto_request_entries`), their window rows request-major ([nb, rows]; the page by
    `pypto.gather` on the request's table row)."""
    table = spec.operands[4]
    ratio = int(spec.attrs["ratio"])
    overlap, bs = bool(spec.attrs["overlap"]), int(spec.attrs["block_size"])
    pages = table.shape[1]
    rows = (2 if overlap else 1) * ratio
    req = _pto_request_entries(src, spec, b0, nb)
    wi = _pto_arange(src, rows, "wi")
    pto_set_tile(src, [nb, max(rows, 8)])
    src(f"ws = pypto.add(pypto.expand_clone({req.j0}, [{nb}, {rows}]), pypto.expand_clone({wi}, [{nb}, {rows}]))")
    src("wc = pypto.maximum(ws, 0.0)")
    src(f"wq = {_pto_floor('wc', bs)}")
    src(f"wcol = pypto.sub(wq, pypto.mul({_pto_floor('wq', pages)}, {float(pages)!r}))")
    src(f"wpg = pypto.gather({req.table}, 1, pypto.cast(wcol, {_PTO_I32}))")
    src(f"wok = pypto.where(pypto.ge(ws, 0.0), pypto.where(pypto.ge(wpg, 0.0), pypto.expand_clone({req.has}, "
        f"[{nb}, {rows}]), 0.0), 0.0)")
    src(f"wrow = pypto.add(pypto.mul(wpg, {float(bs)!r}), pypto.sub(wc, pypto.mul(wq, {float(bs)!r})))")
    src(f"widx2 = pypto.cast(pypto.where(pypto.ge(wok, 0.5), wrow, 0.0), {_PTO_I32})")
    return _WindowRows("widx2", "wok", "wrow")


def _pto_pool_windows(src: Src, spec: KernelSpec) -> None:
    """The pool of one block (see pypto_cmp_scatter_softmax_pool), after the scatter: every request's window rows
    and their validity (one forced subgraph), then `_PtoPool` per chunk of channels."""
    ratio, hd = int(spec.attrs["ratio"]), int(spec.attrs["head_dim"])
    overlap = bool(spec.attrs["overlap"])
    batch = spec.operands[4].shape[0]
    rows = (2 if overlap else 1) * ratio
    # ---- per request: pooling token, entry, window rows (one forced subgraph)
    pto_scope(src, 2)
    win = _pto_window_rows(src, spec, "0", batch)
    # the same, slot-major ([rows, B]): the layout of the pool's sums
    pto_set_tile(src, [max(rows, 8), max(batch, 8)])
    src(f"widxt = pypto.transpose({win.index}, 0, 1)")
    src(f"wokt = pypto.transpose({win.ok}, 0, 1)")
    pto_set_tile(src, [batch, rows, 8])
    src(f"ok3 = pypto.reshape({win.ok}, [{batch}, {rows}, 1])")
    pto_set_tile(src, [rows, batch, 8])
    src(f"okt3 = pypto.reshape(wokt, [{rows}, {batch}, 1])")
    pto_scope(src, -1)
    # ---- the pool (see _PtoPool)
    halves = [(0, ratio, 0), (ratio, ratio, hd)] if overlap else [(0, ratio, 0)]
    pool = _PtoPool(src, spec, halves, _PoolWindows(win.index, "widxt", "ok3", "okt3"))
    cd = _pto_pool_chunk(batch, hd, _PTO_POOL_DEN_SLAB_ELEMS if rows >= _PTO_POOL_SPLIT_ROWS else
                         _PTO_POOL_SLAB_ELEMS)
    cp = _pto_pool_chunk(batch, cd, _PTO_POOL_SLAB_ELEMS)
    scope = 3
    for d0 in range(0, hd, cd):
        pto_scope(src, scope)
        mx, nd = pool.max_den(d0, cd, f"{d0 // cd}")
        for p0 in range(d0, d0 + cd, cp):
            if cp < cd:  # each Σ kv·w chunk its own subgraph
                pto_scope(src, -1)
                scope += 1
                pto_scope(src, scope)
            pool.weighted_sum(p0, cp, mx, nd, p0 - d0, keep_e=cp == cd)
        pto_scope(src, -1)
        scope += 1


_PTO_POOL_DEN_SLAB_ELEMS = 8192  # elements of one [1, B, c] slab of the row max and den (32 KiB of f32)
_PTO_POOL_SPLIT_ROWS = 32        # windows from this many rows run max + den on wider slabs than Σ kv·w (a short
                                 # window saves less than the extra subgraph and read-back cost)
_PTO_POOL_SLAB_ELEMS = 4096      # the same for Σ kv·w (16 KiB: its subgraph holds six slabs at once)
_PTO_POOL_BLOCK_ELEMS = 4096     # elements of one block of window rows read at once for the sums ([k, B, c])
_PTO_POOL_MAX_ELEMS = 8192       # the same for the row max ([1, k, c]: few live tensors)
_PTO_POOL_TILE_BLOCK_ELEMS = 4096  # the same for the sums of a request tile ([k·nb, c] masked, [k, nb·c])
_PTO_POOL_MASK_ELEMS = 512       # (request, row) validity flags read into UB at once ([.., 1] f32: 32 bytes each)


def _pto_pool_chunk(batch: int, hd: int, slab: int) -> int:
    """Channels per pool subgraph: the largest divisor of `hd` (a multiple of 8, or `hd`) whose [1, B, c] slab
    holds at most `slab` elements."""
    cap = max(8, slab // max(batch, 1))
    return next((c for c in range(min(hd, cap), 0, -1) if hd % c == 0 and (c % 8 == 0 or c == hd)), hd)


def _pto_groups(blocks, size: int):
    """Consecutive runs of `blocks` ((r0, n, col), rows ascending) covering at least `size` rows each (the last
    may be shorter): (first row, rows, blocks)."""
    run: list = []
    for blk in blocks:
        run.append(blk)
        if sum(n for _r, n, _c in run) >= size:
            yield run[0][0], sum(n for _r, n, _c in run), run
            run = []
    if run:
        yield run[0][0], sum(n for _r, n, _c in run), run


class _PoolWindows(NamedTuple):
    """Names of the window rows `_PtoPool` reads (0 validity for every row of a request without an entry)."""

    index: str          # i32 [B, rows]: the physical state rows
    index_t: str        # i32 [rows, B]: the same, slot-major
    ok: str             # f32 [B, rows, 1]: validity
    ok_t: str           # f32 [rows, B, 1]: the same, slot-major


class _PtoPool:
    """Emitter of the pool of cmp_scatter_softmax_pool from the written state, the window rows and their validity
    (`_PoolWindows`: a request without an entry has no valid row, so its pool is Σ 0·w = 0, the reference's zero
    row), over a chunk of c channels. Rows are
    read by `index_select` from the state (the front / back column halves of the ratio-4 overlap: a block never
    straddles them) and masked (kv 0 / score FP32_NEG_INF); the flags are read a few hundred at a time (a copy-in
    costs ~1.4 k cycles, a [.., 1] tensor pads to 32 bytes per flag in UB).
    1. The row max (order-free) per request: [1, k, c] blocks reduced over the rows (cheap in the cost model),
       concatenated to mx [1, B, c].
    2. den = Σ_rows e with e = exp(masked score − mx), 3. Σ_rows kv·(e / den): [k, B, c] blocks (slot-major) whose
       rows are [1, B, c] slabs, so every add of the row sums covers all requests at once (a [B, 1, c] view of a
       request-major block costs one op per request). Both sums run row after row like numpy's axis-0 sum, as
       subtractions of negated sums (−(−a − b) = a + b exactly; a SUB costs ~¾ of an ADD in the cost model):
       nd = −den, q = e / nd = −w, t = kv·q = −kv·w, pw = pw − t. Bitwise the reference's up to the calculator's
       exp. A block is gathered again per pass (a gather costs next to nothing in the cost model, a kept block
       UB); a window of one block keeps its e. Steps 1–2 and 3 may run on different chunks (3 needs twice the
       live slabs): 3 then reads mx and nd back once."""

    def __init__(self, src: Src, spec: KernelSpec, halves, windows: _PoolWindows):
        self.src, self.halves, self.win = src, halves, windows
        self.state, self.pooled = spec.results
        self.out_dim = spec.operands[0].shape[1]
        self.batch = self.pooled.shape[0]
        self.rows = sum(n for _a, n, _c in halves)

    def blocks(self, k: int):
        return [(r0, min(k, a + n - r0), col) for a, n, col in self.halves for r0 in range(a, a + n, k)]

    def cols(self, c0: int, c: int, col: int) -> str:
        return f"pypto.view({self.state.name}, [{self.state.shape[0]}, {c}], [0, {col + c0}])"

    def max_den(self, c0: int, c: int, tag: str) -> tuple[str, str]:
        """Steps 1 and 2 for channels [c0, c0 + c): returns the names of mx and nd ([1, B, c])."""
        src, batch, rows = self.src, self.batch, self.rows
        maxes = []
        group = max(1, min(batch, _PTO_POOL_MASK_ELEMS // rows))
        mblocks = self.blocks(max(1, min(rows, _PTO_POOL_MAX_ELEMS // c)))
        for b in range(batch):
            if b % group == 0:
                g = min(group, batch - b)
                src(f"pypto.set_vec_tile_shapes({g}, {rows}, 8)")
                src(f"okr = pypto.ge(pypto.view({self.win.ok}, [{g}, {rows}, 1], [{b}, 0, 0]), 0.5)")
            parts = []
            for j, (r0, n, col) in enumerate(mblocks):
                src(f"pypto.set_vec_tile_shapes(1, {n}, {c})")
                src(f"sb = pypto.index_select({self.cols(c0, c, self.out_dim + col)}, 0, "
                    f"pypto.view({self.win.index}, [1, {n}], [{b}, {r0}]))")
                src(f"msb = pypto.where(pypto.view(okr, [1, {n}, 1], [{b % group}, {r0}, 0]), sb, {PTO_NEG_INF!r})")
                src(f"mb{j} = pypto.amax(msb, 1, keepdim=True)")
                parts.append(f"mb{j}")
            if len(parts) == 1:
                src(f"mr{b} = mb0")
            else:  # one amax over the block maxima (a chain of `maximum` costs ~20× an add in the cost model)
                src(f"pypto.set_vec_tile_shapes(1, {len(parts)}, {c})")
                src(f"mr{b} = pypto.amax(pypto.concat([{', '.join(parts)}], 1), 1, keepdim=True)")
            maxes.append(f"mr{b}")
        mx, nd = f"mx{tag}", f"nd{tag}"
        src(f"pypto.set_vec_tile_shapes(1, {batch}, {c})")
        src(f"{mx} = {maxes[0]}" if batch == 1 else f"{mx} = pypto.concat([{', '.join(maxes)}], 1)")
        self.mx = mx
        for g0, g, run in self._groups(c):
            self._flags(g0, g)
            for r0, n, col in run:
                self._exp_score(c0, c, r0, n, col, self._ok(g0, r0, n))
                self._sub_rows(nd, "eb", c, r0, n)
        return mx, nd

    def weighted_sum(self, c0: int, c: int, mx: str, nd: str, off: int, keep_e: bool) -> None:
        """Step 3 for channels [c0, c0 + c) (columns [off, off + c) of mx and nd) into pooled; `keep_e`: in the
        subgraph of steps 1–2 (a window of one block reuses their e)."""
        src, batch = self.src, self.batch
        if not keep_e:  # read back once (a product by 1 is a copy; an op on the GM view copies it in per use)
            src(f"pypto.set_vec_tile_shapes(1, {batch}, {c})")
            src(f"mxc = pypto.mul(pypto.view({mx}, [1, {batch}, {c}], [0, 0, {off}]), 1.0)")
            src(f"ndc = pypto.mul(pypto.view({nd}, [1, {batch}, {c}], [0, 0, {off}]), 1.0)")
            mx, nd = "mxc", "ndc"
        self.mx = mx
        groups = list(self._groups(c))
        one = keep_e and len(groups) == 1 and len(groups[0][2]) == 1
        for g0, g, run in groups:
            if not one:
                self._flags(g0, g)
            for r0, n, col in run:
                cond = self._ok(g0, r0, n)
                if not one:  # the flags broadcast once for both masks
                    src(f"pypto.set_vec_tile_shapes({n}, {batch}, {c})")
                    src(f"okb = pypto.expand_clone({cond}, [{n}, {batch}, {c}])")
                    cond = "okb"
                    self._exp_score(c0, c, r0, n, col, cond)
                src(f"pypto.set_vec_tile_shapes({n}, {batch}, {c})")
                src(f"qb = pypto.div(eb, {nd})")
                self._gather(c0, c, r0, n, col, "kb")
                src(f"tb = pypto.mul(pypto.where({cond}, kb, 0.0), qb)")
                self._sub_rows("pw", "tb", c, r0, n)
        src(f"pypto.set_vec_tile_shapes({batch}, {c})")
        src(f"pypto.assemble(pypto.reshape(pw, [{batch}, {c}]), [0, {c0}], {self.pooled.name})")

    def _groups(self, c: int):
        k = max(1, min(self.rows, _PTO_POOL_BLOCK_ELEMS // (self.batch * c)))
        return _pto_groups(self.blocks(k), max(1, _PTO_POOL_MASK_ELEMS // self.batch))

    def _gather(self, c0: int, c: int, r0: int, n: int, col: int, name: str) -> None:
        self.src(f"pypto.set_vec_tile_shapes({n}, {self.batch}, {c})")
        self.src(f"{name} = pypto.index_select({self.cols(c0, c, col)}, 0, "
                 f"pypto.view({self.win.index_t}, [{n}, {self.batch}], [{r0}, 0]))")

    def _flags(self, g0: int, g: int) -> None:
        self.src(f"pypto.set_vec_tile_shapes({g}, {self.batch}, 8)")
        self.src(f"okc = pypto.ge(pypto.view({self.win.ok_t}, [{g}, {self.batch}, 1], [{g0}, 0, 0]), 0.5)")

    def _ok(self, g0: int, r0: int, n: int) -> str:
        return f"pypto.view(okc, [{n}, {self.batch}, 1], [{r0 - g0}, 0, 0])"

    def _exp_score(self, c0: int, c: int, r0: int, n: int, col: int, cond: str) -> None:
        self._gather(c0, c, r0, n, self.out_dim + col, "sb")
        self.src(f"msb = pypto.where({cond}, sb, {PTO_NEG_INF!r})")
        self.src(f"eb = pypto.exp(pypto.sub(msb, {self.mx}))")

    def _sub_rows(self, acc: str, terms: str, c: int, r0: int, n: int) -> None:
        self.src(f"pypto.set_vec_tile_shapes(1, {self.batch}, {c})")
        for i in range(n):
            row = f"pypto.view({terms}, [1, {self.batch}, {c}], [{i}, 0, 0])"
            self.src(f"{acc} = pypto.mul({row}, -1.0)" if r0 + i == 0 else f"{acc} = pypto.sub({acc}, {row})")


def _pto_request_tiles(spec: KernelSpec):
    """The request tiles of an SPMD grid (blocks > 1, `tile` = [requests per block]): (requests per tile, whole
    tiles, requests of a last short one (`tail = clamp`) or 0); None for one block."""
    tile = spec.attrs.get("tile")
    if spec.blocks <= 1 or not tile:
        return None
    batch, n = spec.operands[4].shape[0], int(tile[0])
    return n, batch // n, batch % n


def _pto_pool_tile(src: Src, spec: KernelSpec, nb: int) -> None:
    """The pool of requests [b0, b0 + nb) (one block of the grid; `b0` a scalar of the generated code) in a forced
    subgraph of its own, beside the scatter: the window rows slot-major (`_pto_window_slots`), the ones this
    step's tokens write (`_pto_window_news`), then `_PtoTilePool` per chunk of channels."""
    ratio, hd = int(spec.attrs["ratio"]), int(spec.attrs["head_dim"])
    halves = [(0, ratio, 0), (ratio, ratio, hd)] if bool(spec.attrs["overlap"]) else [(0, ratio, 0)]
    pto_scope(src, 2)
    req, slots = _pto_window_slots(src, spec, nb)
    pool = _PtoTilePool(src, spec, nb, halves, slots, _pto_window_news(src, spec, nb, req, slots))
    c = _pto_pool_chunk(nb, hd, _PTO_POOL_SLAB_ELEMS)
    for c0 in range(0, hd, c):
        pool.chunk(c0, c)
    pto_scope(src, -1)


class _WindowNews(NamedTuple):
    """Names defined by `_pto_window_news`: the window slots of a request tile that this step's tokens write."""

    written: str        # bool [rows·nb, 1]: the slot's row is written this step
    token: str          # i32 [1, rows·nb]: the token that writes it, counted from the tile's first
    scores: str         # f32 [nt, OUT]: the tile's tokens' score rows plus their ape


def _pto_window_news(src: Src, spec: KernelSpec, nb: int, req: _RequestEntries, slots: _WindowRows) -> _WindowNews:
    """Which window slots of requests [b0, b0 + nb) hold a row this step writes, so that their pool reads the
    state as the scatter leaves it without waiting for it: a slot's row is written by the last valid token of
    the tile with that row (`_pto_token_rows_of`; tokens of other requests never write the tile's pages), with
    [kv | score + ape[pos % r]] of that token. `req` and `slots`: the tile's `_pto_window_slots`."""
    kv, sc, ape = spec.operands[:3]
    seq, out_dim = int(spec.attrs["seq"]), kv.shape[1]
    rows = (2 if bool(spec.attrs["overlap"]) else 1) * int(spec.attrs["ratio"])
    nt, n = nb * seq, rows * nb
    index = _pto_arange(src, nt, "tidr")
    tok = _pto_token_rows_of(src, spec, nt, index, req.positions, slots.flat_table)
    pto_set_tile(src, [max(nt, 8), 8])   # tokens × slots: the winner reduces over the rows into a [1, n] row
    src(f"tidc = pypto.transpose({tok.index}, 0, 1)")
    src(f"rowc = pypto.transpose({tok.row_or_neg}, 0, 1)")
    pto_set_tile(src, vec_tile((nt, n), 4))
    src(f"mn = pypto.eq(pypto.expand_clone(rowc, [{nt}, {n}]), "
        f"pypto.expand_clone(pypto.where(pypto.ge({slots.ok}, 0.5), {slots.row}, -2.0), [{nt}, {n}]))")
    src(f"wn = pypto.amax(pypto.where(mn, pypto.expand_clone(tidc, [{nt}, {n}]), -1.0), 0, keepdim=True)")
    pto_set_tile(src, [1, max(n, 8)])
    src(f"nidx = pypto.cast(pypto.maximum(wn, 0.0), {_PTO_I32})")
    pto_set_tile(src, [n, 8])
    src("nwc = pypto.ge(pypto.transpose(wn, 0, 1), 0.0)")
    pto_set_tile(src, [1, max(nt, 8)])
    src(f"ai = pypto.cast({tok.amod}, {_PTO_I32})")
    pto_set_tile(src, vec_tile((1, nt, out_dim), 4))
    src(f"ag = pypto.index_select({ape.name}, 0, ai)")
    pto_set_tile(src, vec_tile((nt, out_dim), 4))
    src(f"sn = pypto.add(pypto.view({sc.name}, [{nt}, {out_dim}], [b0 * {seq}, 0]), "
        f"pypto.reshape(ag, [{nt}, {out_dim}]))")
    return _WindowNews("nwc", "nidx", "sn")


class _WindowSlots(NamedTuple):
    """`_WindowRows` of a request tile, slot-major, with what the tile pool and `_pto_window_news` read too."""

    index: str          # i32 [1, rows·nb]: the physical state rows, 0 where invalid
    ok: str             # f32 [1, rows·nb]: 1 for a valid row
    row: str            # f32 [1, rows·nb]: the physical state rows
    ok_col: str         # bool [rows·nb, 1]: `ok` as a column
    flat_table: str     # f32 [1, nb·pages]: the tile's table rows, flat


def _pto_window_slots(src: Src, spec: KernelSpec, nb: int) -> tuple[_RequestEntries, _WindowSlots]:
    """The window rows of requests [b0, b0 + nb) slot-major (slot s = r·nb + b: window row r of request b),
    like `_pto_window_rows` but computed per slot (the request's entry and table row by `pypto.gather` of
    b = s mod nb). Returns the tile's `_pto_request_entries` and its slots."""
    ratio, bs = int(spec.attrs["ratio"]), int(spec.attrs["block_size"])
    pages = spec.operands[4].shape[1]
    rows = (2 if bool(spec.attrs["overlap"]) else 1) * ratio
    n = rows * nb
    req = _pto_request_entries(src, spec, "b0", nb)
    pto_set_tile(src, [max(nb, 8), 8])
    src(f"j0r = pypto.transpose({req.j0}, 0, 1)")
    src(f"hasr = pypto.transpose({req.has}, 0, 1)")
    pto_set_tile(src, [1, max(nb * pages, 8)])
    src(f"tabf = pypto.reshape({req.table}, [1, {nb * pages}])")
    sl = _pto_arange(src, n, "sl")
    src(f"sr = {_pto_floor(sl, nb)}")
    src(f"sq = pypto.sub({sl}, pypto.mul(sr, {float(nb)!r}))")
    src(f"sqi = pypto.cast(sq, {_PTO_I32})")
    src("ws = pypto.add(pypto.gather(j0r, 1, sqi), sr)")
    src("wc = pypto.maximum(ws, 0.0)")
    src(f"wq = {_pto_floor('wc', bs)}")
    src(f"wcol = pypto.sub(wq, pypto.mul({_pto_floor('wq', pages)}, {float(pages)!r}))")
    src(f"wpg = pypto.gather(tabf, 1, pypto.cast(pypto.add(pypto.mul(sq, {float(pages)!r}), wcol), {_PTO_I32}))")
    src("wok = pypto.where(pypto.ge(ws, 0.0), pypto.where(pypto.ge(wpg, 0.0), pypto.gather(hasr, 1, sqi), 0.0), 0.0)")
    src(f"wrow = pypto.add(pypto.mul(wpg, {float(bs)!r}), pypto.sub(wc, pypto.mul(wq, {float(bs)!r})))")
    src(f"sidx = pypto.cast(pypto.where(pypto.ge(wok, 0.5), wrow, 0.0), {_PTO_I32})")
    pto_set_tile(src, [n, 8])
    src("okc = pypto.ge(pypto.transpose(wok, 0, 1), 0.5)")
    return req, _WindowSlots("sidx", "wok", "wrow", "okc", "tabf")


class _PtoTilePool:
    """Emitter of the pool of one request tile (nb requests) in the subgraph that computed its window slots
    (`_WindowSlots`) and the rows this step writes into them (`_WindowNews`): as `_PtoPool` (masking, the row
    max, both sums row after row as subtractions of negated sums), on the state as the scatter leaves it
    (state_in, the rows this step writes from the tokens), on rank-2 blocks (the cost model charges a rank-3 op
    per leading-dim slice): k window rows of all nb requests are gathered as [k·nb, c] (slot-major: row r of
    request b at r·nb + b) and masked by a [k·nb, 1] flag column (a rank-2 broadcast), then read as [k, nb·c]
    (the same UB tile: request b at columns [b·c, (b+1)·c)), so that the row max and den broadcast as [1, nb·c] rows
    and every row of a sum is one
    [1, nb·c] op for the whole tile."""

    def __init__(self, src: Src, spec: KernelSpec, nb: int, halves, slots: _WindowSlots, news: _WindowNews):
        self.src, self.nb, self.halves, self.slots, self.news = src, nb, halves, slots, news
        kv, self.state_in = spec.operands[0], spec.operands[3]
        self.pooled = spec.results[1]
        self.out_dim = kv.shape[1]
        self.nt = nb * int(spec.attrs["seq"])
        self.kv_new = f"pypto.view({kv.name}, [{self.nt}, {self.out_dim}], [b0 * {self.nt // nb}, 0])"
        self.rows = sum(n for _a, n, _c in halves)

    def chunk(self, c0: int, c: int) -> None:
        """The pool of channels [c0, c0 + c) into pooled[b0:b0+nb, c0:c0+c]."""
        src, nb, w = self.src, self.nb, self.nb * c
        self._row_max(c0, c)
        blocks = self._blocks(_PTO_POOL_TILE_BLOCK_ELEMS // w)
        for r0, n, col in blocks:
            ok, new = self._flags(self.slots.ok_col, r0, n), self._flags(self.news.written, r0, n)
            self._exp_score(c0, c, r0, n, col, ok, new)
            self._sub_rows("nd", "eb", w, r0, n)
        for r0, n, col in blocks:  # the flags broadcast once for the score and kv
            src(f"pypto.set_vec_tile_shapes({n * nb}, {c})")
            src(f"okb = pypto.expand_clone({self._flags(self.slots.ok_col, r0, n)}, [{n * nb}, {c}])")
            src(f"nwb = pypto.expand_clone({self._flags(self.news.written, r0, n)}, [{n * nb}, {c}])")
            self._exp_score(c0, c, r0, n, col, "okb", "nwb")
            src("qb = pypto.div(eb, nd)")
            self._rows(c0, c, r0, n, col, self.kv_new, "nwb", "kb")
            src("kbm = pypto.where(okb, kb, 0.0)")
            src(f"pypto.set_vec_tile_shapes({n}, {w})")
            src(f"tb = pypto.mul(pypto.reshape(kbm, [{n}, {w}]), qb)")
            self._sub_rows("pw", "tb", w, r0, n)
        src(f"pypto.set_vec_tile_shapes({nb}, {c})")
        src(f"pypto.assemble(pypto.reshape(pw, [{nb}, {c}]), [b0, {c0}], {self.pooled.name})")

    def _blocks(self, k: int):
        k = max(1, min(self.rows, k))
        return [(r0, min(k, a + n - r0), col) for a, n, col in self.halves for r0 in range(a, a + n, k)]

    def _row_max(self, c0: int, c: int) -> None:
        """mx [1, nb·c]: the max over the window rows of the masked score (order-free), per block then once more
        over the block maxima."""
        src, w = self.src, self.nb * c
        parts = []
        for j, (r0, n, col) in enumerate(self._blocks(_PTO_POOL_MAX_ELEMS // w)):
            new = self._flags(self.news.written, r0, n)
            self._rows(c0, c, r0, n, self.out_dim + col, self.news.scores, new, "sb", new_col=col)
            src(f"msb = pypto.where({self._flags(self.slots.ok_col, r0, n)}, sb, {PTO_NEG_INF!r})")
            src(f"pypto.set_vec_tile_shapes({n}, {w})")
            src(f"mb{j} = pypto.amax(pypto.reshape(msb, [{n}, {w}]), 0, keepdim=True)")
            parts.append(f"mb{j}")
        group = max(2, _PTO_POOL_TILE_BLOCK_ELEMS // w)   # block maxima concatenated at once (a UB tile)
        while len(parts) > 1:
            runs = [parts[i:i + group] for i in range(0, len(parts), group)]
            parts = []
            for j, run in enumerate(runs):
                src(f"pypto.set_vec_tile_shapes({len(run)}, {w})")
                src(f"mg{j} = {run[0]}" if len(run) == 1 else
                    f"mg{j} = pypto.amax(pypto.concat([{', '.join(run)}], 0), 0, keepdim=True)")
                parts.append(f"mg{j}")
        src(f"mx = {parts[0]}")

    def _rows(self, c0: int, c: int, r0: int, n: int, col: int, new: str, nw: str, name: str,
              new_col: int | None = None) -> None:
        """`name` = [n·nb, c]: window slots r0·nb … (r0 + n)·nb − 1 of state columns col + c0 …: state_in's rows,
        or where `nw` (the slots' new-row flags) the tokens' rows of `new` (columns new_col + c0 …, default
        col)."""
        src, m, s0 = self.src, n * self.nb, r0 * self.nb
        nc = (col if new_col is None else new_col) + c0
        src(f"pypto.set_vec_tile_shapes(1, {m}, {c})")
        src(f"o3 = pypto.index_select(pypto.view({self.state_in.name}, [{self.state_in.shape[0]}, {c}], "
            f"[0, {col + c0}]), 0, pypto.view({self.slots.index}, [1, {m}], [0, {s0}]))")
        src(f"n3 = pypto.index_select(pypto.view({new}, [{self.nt}, {c}], [0, {nc}]), 0, "
            f"pypto.view({self.news.token}, [1, {m}], [0, {s0}]))")
        src(f"pypto.set_vec_tile_shapes({m}, {c})")
        src(f"{name} = pypto.where({nw}, pypto.reshape(n3, [{m}, {c}]), pypto.reshape(o3, [{m}, {c}]))")

    def _flags(self, name: str, r0: int, n: int) -> str:
        return f"pypto.view({name}, [{n * self.nb}, 1], [{r0 * self.nb}, 0])"

    def _exp_score(self, c0: int, c: int, r0: int, n: int, col: int, ok: str, nw: str) -> None:
        """eb = exp(masked score − mx) of the block ([n, nb·c])."""
        src = self.src
        self._rows(c0, c, r0, n, self.out_dim + col, self.news.scores, nw, "sb", new_col=col)
        src(f"msb = pypto.where({ok}, sb, {PTO_NEG_INF!r})")
        src(f"pypto.set_vec_tile_shapes({n}, {self.nb * c})")
        src(f"eb = pypto.exp(pypto.sub(pypto.reshape(msb, [{n}, {self.nb * c}]), mx))")

    def _sub_rows(self, acc: str, terms: str, w: int, r0: int, n: int) -> None:
        src = self.src
        src(f"pypto.set_vec_tile_shapes(1, {w})")
        for i in range(n):
            row = f"pypto.view({terms}, [1, {w}], [{i}, 0])"
            src(f"{acc} = pypto.mul({row}, -1.0)" if r0 + i == 0 else f"{acc} = pypto.sub({acc}, {row})")


_PTO_FINISH_ROWS = 16   # pooled rows per forced subgraph of the finish templates (whole blocks, then single rows)


def _pto_finish_blocks(src: Src, pooled):
    """The row blocks of the finish templates (`pto_block_loops`: whole blocks of up to _PTO_FINISH_ROWS rows,
    then single rows): yields (block rows, row offset expression)."""
    rows = _PTO_FINISH_ROWS if pooled.is_dynamic(0) else max(1, min(_PTO_FINISH_ROWS, pooled.shape[0]))
    yield from pto_block_loops(src, pooled, rows)


def _pto_finish_y(src: Src, spec: KernelSpec, r: int, r0: str) -> tuple[str, str]:
    """y = rope((pooled · inv) · norm_w) (f32) of the r rows at r0 with the rank-2 row-norm helpers of
    kernels.vector (numpy's pairwise mean order; the pair swap by transposes): returns the expressions of its
    nope part [r, HD − rd] (None without one) and rope part [r, rd]."""
    pooled, norm_w, cos_il, sin_signed = spec.operands[:4]
    hd, rd = pooled.shape[1], cos_il.shape[1]
    nope = hd - rd
    eps = float(spec.attrs.get("eps", 1e-6))
    pto_rms_norm_block(src, pooled, norm_w, r, r0, eps, "yn")
    src(f"pypto.set_vec_tile_shapes({r}, {pto_align(rd)})")
    for name, t in (("cb", cos_il), ("sb", sin_signed)):
        src(f"{name} = {cast_expr(f'pypto.view({t.name}, [{r}, {rd}], [{r0}, 0])', t.dtype, 'f32')}")
    src(f"rp = pypto.view(yn, [{r}, {rd}], [0, {nope}])")
    pto_rope_rows(src, "rp", r, rd, "cb", "sb", "ro")
    return (f"pypto.view(yn, [{r}, {nope}], [0, 0])" if nope else None), "ro"


@template(CmpRmsnormRope)
def pypto_cmp_rmsnorm_rope(spec: KernelSpec) -> str:
    """y = rope((pooled · 1/sqrt(mean(pooled²) + eps)) · norm_w), f32; numpy's pairwise mean order (bitwise).
    Blocks of whole rows, each one forced subgraph of rank-2 math (flash TP4 cost model, CSA inner: 42.6 →
    6.3 µs)."""
    pooled = spec.operands[0]
    out = spec.results[0]
    src = Src(spec.signature())
    for r, r0 in _pto_finish_blocks(src, pooled):
        pto_scope(src, 1)
        nope, ro = _pto_finish_y(src, spec, r, r0)
        width = pooled.shape[1] - spec.operands[2].shape[1]
        if nope:  # a view of a subgraph's tensor stored as is would be its own task (· 1: an exact copy)
            src(f"pypto.set_vec_tile_shapes({r}, {pto_align(width)})")
            src(f"pypto.assemble(pypto.mul({nope}, 1.0), [{r0}, 0], {out.name})")
        src(f"pypto.assemble({ro}, [{r0}, {width}], {out.name})")
        pto_scope(src, -1)
    return src.text()


def _pto_store_rows(src: Src, spec: KernelSpec, n: str, r0: str, positions, slots, stores) -> None:
    """For each of the n request rows at r0: if it pooled an entry (first (pos+1) % r == 0 token) whose slot is
    mapped, `stores(row_index, slot)` emits the row writes (inside the `if`)."""
    seq, ratio = int(spec.attrs["seq"]), int(spec.attrs["ratio"])
    with src.block(f'for i in pypto.loop(0, {n}, 1, name="store_loop", idx_name="i"):'):
        src(f"b = {r0} + i")
        has, tsel, _psel = _pto_pool_token(src, positions.name, "b", seq, ratio)
        src(f"slot = {slots.name}[{tsel}]")
        with src.block(f"if pypto.min({has} - 1, slot) >= 0:"):
            stores("i", "slot")


@template(CmpRmsnormRopeCacheWrite)
def pypto_cmp_rmsnorm_rope_cache_write(spec: KernelSpec) -> str:
    """y as cmp_rmsnorm_rope, rounded to the cache dtype, then per request: row b stored at
    slot_mapping[pooling token] when the request pooled an entry and the slot is mapped (flash TP4 cost model:
    48.5 → 10.3 µs; the row stores do not run on the zero inputs of the cost model)."""
    pooled, _w, _c, _s, _cache_in, slots, pos = spec.operands
    cache = spec.results[0]
    hd = pooled.shape[1]
    src = Src(spec.signature())
    for r, r0 in _pto_finish_blocks(src, pooled):
        pto_scope(src, 1)
        nope, ro = _pto_finish_y(src, spec, r, r0)
        src(f"pypto.set_vec_tile_shapes({r}, {pto_align(hd)})")
        y = f"pypto.concat([{nope}, {ro}], -1)" if nope else ro
        src(f"yb = {cast_expr(y, 'f32', cache.dtype)}")
        pto_scope(src, -1)
        pto_set_tile(src, vec_tile((1, hd), cache.itemsize))

        def store(i, slot):
            src(f"pypto.assemble(pypto.clone(pypto.view(yb, [1, {hd}], [{i}, 0])), [{slot}, 0], {cache.name})")

        _pto_store_rows(src, spec, str(r), r0, pos, slots, store)
    return src.text()


@template(CmpKvHadamard)
def pypto_cmp_kv_hadamard(spec: KernelSpec) -> str:
    """k = rb(rb(y) @ H): y rounded to bf16, cube matmul with f32 accumulation, rounded to bf16."""
    y, had = spec.operands
    out = spec.results[0]
    src = Src(spec.signature())
    loop = RowLoop(src, y, row_block(spec, default=16))
    br, ihd = loop.shape(y)
    n = had.shape[1]
    with loop.loop():
        pto_tile(src, (br, ihd))
        src(f"yb = {cast_expr(loop.view(y), y.dtype, 'bf16')}")
        mm_dtype = "bf16"
        if had.dtype != "bf16":  # f32/fp16 Hadamard: the rounded y goes back to f32 (exact) for an f32 matmul
            src(f"yb = {cast_expr('yb', 'bf16', 'f32')}")
            src(f"hm = {cast_expr(had.name, had.dtype, 'f32')}")
            mm_dtype = "f32"
        src(f"pypto.set_cube_tile_shapes({cube_shapes(br, ihd, n, mm_dtype)})")
        src(f"kk = pypto.matmul(yb, {had.name if mm_dtype == 'bf16' else 'hm'}, pypto.DT_FP32)")
        pto_tile(src, (br, n))
        src(f"ko = {cast_expr('kk', 'f32', out.dtype)}")
        loop.store("ko", out)
    return src.text()


@template(IdxKvCacheWrite)
def pypto_idx_kv_cache_write(spec: KernelSpec) -> str:
    """q8 of every row of k (amax, k = 127/amax true division, rint through int32 → fp16 → int8, scale 1/k), then
    per request the int8 row and its scale stored at slot_mapping[pooling token] (skipped like the reference)."""
    k, _cache_in, _scale_in, slots, pos = spec.operands
    cache, scale = spec.results
    src = Src(spec.signature())
    loop = RowLoop(src, k, row_block(spec, default=16))
    blk = PtoBlock(loop, k)
    br, ihd = blk.rows, k.shape[1]
    with loop.loop():
        wide = pto_tile(src, (br, ihd))
        src(f"kf = {cast_expr(loop.view(k), k.dtype, 'f32')}")
        src("amax = pypto.maximum(pypto.amax(pypto.abs(kf), -1, keepdim=True), 0.0001)")
        pto_set_tile(src, [br, 8])
        src(f"kq = pypto.div(pypto.full([{br}, 1], 127.0, pypto.DT_FP32{blk.valid(1)}), amax)")
        src(f"ks = pypto.div(pypto.full([{br}, 1], 1.0, pypto.DT_FP32{blk.valid(1)}), kq)")
        pto_set_tile(src, wide)
        src(f"qv = {cast_expr('pypto.mul(kf, kq)', 'f32', 'i8')}")
        pto_set_tile(src, vec_tile((1, ihd), 1))

        def store(i, slot):
            src(f"pypto.assemble(pypto.clone(pypto.view(qv, [1, {ihd}], [{i}, 0])), [{slot}, 0], {cache.name})")
            src(f"sv = pypto.reshape(pypto.clone(pypto.view(ks, [1, 1], [{i}, 0])), [1])")
            src(f"pypto.assemble(sv, [{slot}], {scale.name})")

        _pto_store_rows(src, spec, "valid" if blk.partial else str(blk.rows), blk.r0, pos, slots, store)
    return src.text()


# ---- prefill: every boundary of one request's chunk pools its entry ----------------------------------------------
def _pto_tile_f32(shape: tuple[int, ...]) -> list[int]:
    """An f32 vector tile for `shape` whose last dim is whole 32-byte blocks (pypto's reductions require it)."""
    tile = vec_tile(shape, 4)
    return tile[:-1] + [pto_align(tile[-1], 8)]


def _pto_column(src: Src, row: str, n: int, name: str) -> str:
    """`name` = the f32 row `row` [1, n] as a column [n, 1]; returns `name`."""
    pto_set_tile(src, [n, 8])
    src(f"{name} = pypto.transpose({row}, 0, 1)")
    return name


@template(PrefillCmpPool)
def pypto_prefill_cmp_pool(spec: KernelSpec) -> str:
    """One request's chunk (static T, ascending contiguous positions), integer arithmetic in f32 (exact < 2^23).

    Sources: `allr` = [state as received ; the chunk's rows [kv | score + ape[pos % r]]] ([S + T, 2·OUT]). Token
    t's window position w sits in the chunk at w − start = w − pos[t] + t when that is ≥ 0, else in the state at
    its ring row (table[(w // BS) % pages]·BS + w % BS; valid iff w ≥ 0 and the page is mapped; otherwise kv 0 /
    score FP32_NEG_INF). Per window half (the ratio-4 overlap reads the front / back column halves) the rows are
    `index_select`ed as [T, r, HD], then the softmax pool over the window rows; a token closing no window
    pools 0. The new state: ring row s takes the chunk row of the last token writing it (amax over an [S, T]
    match), else keeps its row; it is computed from `allr`, so the store of the state (in place) follows every
    read of the state as received."""
    spec = spec.static()
    kv, sc, ape, state_in, table, pos = spec.operands
    state, pooled = spec.results
    ratio, hd = int(spec.attrs["ratio"]), int(spec.attrs["head_dim"])
    overlap, bs = bool(spec.attrs["overlap"]), int(spec.attrs["block_size"])
    t_n, out_dim = kv.shape
    s_n, width = state.shape
    pages = table.shape[1]
    rows = (2 if overlap else 1) * ratio
    src = Src(spec.signature())
    # ---- per token: position, ring row, ape row, window-closing flag
    tidx = _pto_arange(src, t_n, "tidr")
    pto_set_tile(src, [1, pto_align(pages, 8)])
    src(f"tabf = {cast_expr(table.name, table.dtype, 'f32')}")
    pto_set_tile(src, [pto_align(t_n, 8)])
    src(f"pf1 = {cast_expr(pos.name, pos.dtype, 'f32')}")
    pto_set_tile(src, [1, pto_align(t_n, 8)])
    src(f"pfr = pypto.reshape(pf1, [1, {t_n}])")
    src("pc = pypto.maximum(pfr, 0.0)")
    src(f"pq = {_pto_floor('pc', bs)}")
    src(f"pcol = pypto.sub(pq, pypto.mul({_pto_floor('pq', pages)}, {float(pages)!r}))")
    src(f"pg = pypto.gather(tabf, 1, pypto.cast(pcol, {_PTO_I32}))")
    src(f"prow = pypto.add(pypto.mul(pg, {float(bs)!r}), pypto.sub(pc, pypto.mul(pq, {float(bs)!r})))")
    src("prowv = pypto.where(pypto.ge(pfr, 0.0), pypto.where(pypto.ge(pg, 0.0), prow, -1.0), -1.0)")
    src(f"amodr = pypto.sub(pc, pypto.mul({_pto_floor('pc', ratio)}, {float(ratio)!r}))")
    src("m1 = pypto.add(pfr, 1.0)")
    src(f"flr = pypto.sub(m1, pypto.mul({_pto_floor('m1', ratio, signed=True)}, {float(ratio)!r}))")
    src(f"j0r = pypto.sub(pypto.mul({_pto_floor('pfr', ratio, signed=True)}, {float(ratio)!r}), "
        f"{float(ratio if overlap else 0)!r})")
    src(f"offr = pypto.sub(pfr, {tidx})")  # start − 0 = pos[t] − t for a contiguous chunk
    j0c = _pto_column(src, "j0r", t_n, "j0c")
    offc = _pto_column(src, "offr", t_n, "offc")
    flc = _pto_column(src, "flr", t_n, "flc")
    pto_set_tile(src, [1, pto_align(t_n, 8)])
    src(f"aidx = pypto.reshape(pypto.cast(amodr, {_PTO_I32}), [{t_n}])")
    # ---- the chunk's state rows and the sources of every window row
    pto_set_tile(src, _pto_tile_f32((t_n, out_dim)))
    src(f"scw = pypto.add({sc.name}, pypto.index_select({ape.name}, 0, aidx))")
    pto_set_tile(src, _pto_tile_f32((t_n, width)))
    src(f"rowsn = pypto.concat([{kv.name}, scw], -1)")
    pto_set_tile(src, _pto_tile_f32((s_n + t_n, width)))
    src(f"allr = pypto.concat([{state_in.name}, rowsn], 0)")
    # ---- window rows [T, rows]: the chunk row (S + w − start) or the ring row, and their validity
    wi = _pto_arange(src, rows, "wi")
    pto_set_tile(src, [t_n, pto_align(rows, 8)])
    src(f"ws = pypto.add(pypto.expand_clone({j0c}, [{t_n}, {rows}]), pypto.expand_clone({wi}, [{t_n}, {rows}]))")
    src(f"cix = pypto.sub(ws, pypto.expand_clone({offc}, [{t_n}, {rows}]))")
    src("wc = pypto.maximum(ws, 0.0)")
    src(f"wq = {_pto_floor('wc', bs)}")
    src(f"wcol = pypto.sub(wq, pypto.mul({_pto_floor('wq', pages)}, {float(pages)!r}))")
    pto_set_tile(src, [t_n, pto_align(pages, 8)])
    src(f"tabx = pypto.expand_clone(tabf, [{t_n}, {pages}])")
    pto_set_tile(src, [t_n, pto_align(rows, 8)])
    src(f"wpg = pypto.gather(tabx, 1, pypto.cast(wcol, {_PTO_I32}))")
    src(f"wrow = pypto.add(pypto.mul(wpg, {float(bs)!r}), pypto.sub(wc, pypto.mul(wq, {float(bs)!r})))")
    src("ring = pypto.where(pypto.ge(ws, 0.0), pypto.where(pypto.ge(wpg, 0.0), 1.0, 0.0), 0.0)")
    src("inch = pypto.ge(cix, 0.0)")
    src("wok = pypto.where(inch, 1.0, ring)")
    # (a token closing no window reads past the chunk's end: clamped, its pool is discarded)
    src(f"widx = pypto.cast(pypto.where(inch, pypto.minimum(pypto.add(cix, {float(s_n)!r}), "
        f"{float(s_n + t_n - 1)!r}), pypto.where(pypto.ge(ring, 0.5), wrow, 0.0)), {_PTO_I32})")
    # ---- the pool: per window half [T, r, HD] rows (masked), softmax over the window rows
    halves = [(0, 0), (ratio, hd)] if overlap else [(0, 0)]
    kparts, sparts = [], []
    for h, (a, col) in enumerate(halves):
        pto_set_tile(src, [t_n, ratio, 8])
        src(f"ok{h} = pypto.ge(pypto.reshape(pypto.view(wok, [{t_n}, {ratio}], [0, {a}]), [{t_n}, {ratio}, 1]), 0.5)")
        pto_set_tile(src, [t_n, pto_align(ratio, 8)])
        src(f"ix{h} = pypto.view(widx, [{t_n}, {ratio}], [0, {a}])")
        pto_set_tile(src, _pto_tile_f32((t_n, ratio, hd)))
        for name, c0, fill, parts in (("k", col, 0.0, kparts), ("s", out_dim + col, PTO_NEG_INF, sparts)):
            src(f"{name}g{h} = pypto.index_select(pypto.view(allr, [{s_n + t_n}, {hd}], [0, {c0}]), 0, ix{h})")
            src(f"{name}m{h} = pypto.where(pypto.expand_clone(ok{h}, [{t_n}, {ratio}, {hd}]), {name}g{h}, {fill!r})")
            parts.append(f"{name}m{h}")
    pto_set_tile(src, _pto_tile_f32((t_n, rows, hd)))
    for name, parts in (("kw", kparts), ("sw", sparts)):
        src(f"{name} = {parts[0]}" if len(parts) == 1 else f"{name} = pypto.concat([{', '.join(parts)}], 1)")
    src("mx = pypto.amax(sw, 1, keepdim=True)")
    src(f"ew = pypto.exp(pypto.sub(sw, pypto.expand_clone(mx, [{t_n}, {rows}, {hd}])))")
    src("den = pypto.sum(ew, 1, keepdim=True)")
    src(f"pw = pypto.sum(pypto.mul(kw, pypto.div(ew, pypto.expand_clone(den, [{t_n}, {rows}, {hd}]))), 1, "
        "keepdim=True)")
    pto_set_tile(src, _pto_tile_f32((t_n, hd)))
    src(f"pw2 = pypto.reshape(pw, [{t_n}, {hd}])")
    src(f"pypto.assemble(pypto.where(pypto.expand_clone(pypto.eq({flc}, 0.0), [{t_n}, {hd}]), pw2, 0.0), [0, 0], "
        f"{pooled.name})")
    # ---- the new state: ring row s takes the chunk row of the last token writing it
    sidx = _pto_arange(src, s_n, "sir")
    sc_col = _pto_column(src, sidx, s_n, "sic")
    pto_set_tile(src, _pto_tile_f32((s_n, t_n)))
    src(f"mt = pypto.eq(pypto.expand_clone({sc_col}, [{s_n}, {t_n}]), pypto.expand_clone(prowv, [{s_n}, {t_n}]))")
    src(f"wn = pypto.amax(pypto.where(mt, pypto.expand_clone({tidx}, [{s_n}, {t_n}]), -1.0), -1, keepdim=True)")
    pto_set_tile(src, [s_n, 8])
    src("hw = pypto.ge(wn, 0.0)")
    src(f"wni = pypto.cast(pypto.maximum(wn, 0.0), {_PTO_I32})")
    pto_set_tile(src, [pto_align(s_n, 8)])
    src(f"wn1 = pypto.reshape(wni, [{s_n}])")
    pto_set_tile(src, _pto_tile_f32((s_n, width)))
    src(f"newr = pypto.where(pypto.expand_clone(hw, [{s_n}, {width}]), pypto.index_select(rowsn, 0, wn1), "
        f"pypto.view(allr, [{s_n}, {width}], [0, 0]))")
    src(f"pypto.assemble(newr, [0, 0], {state.name})")
    return src.text()


@template(PrefillCmpFinishWrite)
def pypto_prefill_cmp_finish_write(spec: KernelSpec) -> str:
    """Per block of tokens: the RoPE rows at each token's entry start max(pos + 1 − r, 0) (`index_select` of the
    tables' first halves, rounded to bf16 like the reference, interleaved as rope_interleave), y as
    cmp_rmsnorm_rope (numpy's pairwise mean order), rounded to the cache dtype; then per token: stored at
    slot_mapping[t] when t closes a window ((pos + 1) % r == 0) and the slot is mapped."""
    spec = spec.static()
    pooled, _w, cos_t, sin_t, _cache_in, slots, pos = spec.operands
    cache = spec.results[0]
    ratio, eps = int(spec.attrs["ratio"]), float(spec.attrs.get("eps", 1e-6))
    hd = pooled.shape[1]
    p_n, rd = cos_t.shape
    half = rd // 2
    nope = hd - rd
    src = Src(spec.signature())
    for r, r0 in _pto_finish_blocks(src, pooled):
        pto_scope(src, 1)
        pto_set_tile(src, [pto_align(r, 8)])
        src(f"pfb = {cast_expr(f'pypto.view({pos.name}, [{r}], [{r0}])', pos.dtype, 'f32')}")
        src(f"fi = pypto.cast(pypto.maximum(pypto.add(pfb, {float(1 - ratio)!r}), 0.0), {_PTO_I32})")
        src(f"pypto.set_vec_tile_shapes({r}, {pto_align(half, 8)})")
        for name, t in (("c", cos_t), ("s", sin_t)):
            rows = cast_expr(f"pypto.index_select(pypto.view({t.name}, [{p_n}, {half}], [0, 0]), 0, fi)", t.dtype,
                             "bf16")
            src(f"{name}f = {cast_expr(rows, 'bf16', 'f32')}")
        _pto_interleave_rows(src, r, half, lambda _name, k, rows_f32: src(f"{('cb', 'sb')[k]} = {rows_f32}"))
        pto_rms_norm_block(src, pooled, spec.operands[1], r, r0, eps, "yn")
        src(f"pypto.set_vec_tile_shapes({r}, {pto_align(rd)})")
        src(f"rp = pypto.view(yn, [{r}, {rd}], [0, {nope}])")
        pto_rope_rows(src, "rp", r, rd, "cb", "sb", "ro")
        src(f"pypto.set_vec_tile_shapes({r}, {pto_align(hd)})")
        y = f"pypto.concat([pypto.view(yn, [{r}, {nope}], [0, 0]), ro], -1)" if nope else "ro"
        src(f"yb = {cast_expr(y, 'f32', cache.dtype)}")
        pto_scope(src, -1)
        pto_set_tile(src, vec_tile((1, hd), cache.itemsize))
        with src.block(f'for i in pypto.loop(0, {r}, 1, name="store_loop", idx_name="i"):'):
            src(f"t = {r0} + i")
            src(f"slot = {slots.name}[t]")
            with src.block(f"if pypto.min((({pos.name}[t] + 1) % {ratio} == 0) - 1, slot) >= 0:"):
                src(f"pypto.assemble(pypto.clone(pypto.view(yb, [1, {hd}], [i, 0])), [slot, 0], {cache.name})")
    return src.text()


def _pto_interleave_rows(src: Src, r: int, half: int, store: Callable[[str, int, str], None]) -> None:
    """The interleaved tables [r, 2·half] f32 of the f32 halves `cf` / `sf` [r, half] (cos_il[j] = c[j >> 1],
    sin_signed[j] = ±s[j >> 1], − for even j: data movement and a negation, exact); `store(name, k, expr)` emits
    what becomes of table k (0: cos, 1: sin), `expr` being its rows."""
    rd, w = 2 * half, pto_align(r, 8)
    src(f"pypto.set_vec_tile_shapes({half}, {w})")
    src("ct = pypto.transpose(cf, 0, 1)")
    src("st = pypto.transpose(sf, 0, 1)")
    src(f"pypto.set_vec_tile_shapes({half}, {pto_align(2 * r, 8)})")
    src("cc = pypto.concat([ct, ct], -1)")
    src("ss = pypto.concat([pypto.neg(st), st], -1)")
    for k, name in enumerate(("cc", "ss")):
        src(f"pypto.set_vec_tile_shapes({rd}, {w})")
        src(f"{name}2 = pypto.reshape({name}, [{rd}, {r}])")
        src(f"pypto.set_vec_tile_shapes({r}, {pto_align(rd, 8)})")
        store(name, k, f"pypto.transpose({name}2, 0, 1)")
