"""pypto 0.2.0 templates of the moe kernel family (the ops' numpy semantics: dspark_ir/semantics/moe.py)."""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generators for the lowering (see kernels/pto.py), mirroring the references above op for op.
# * ffn_norm: the row sum of squares in numpy's pairwise order (kernels.vector helper), /D, 1/sqrt; xg = x·w;
#   q8 as goldens.numerics.q8 (true divisions 127/amax and 1/k). Bitwise, except that the CPU calculator's f32
#   sqrt (torch's) is 1 ulp off the correctly rounded root on ~0.6 % of arguments: inv_rms / x_scale ≤ 2 ulps.
# * x_norm_quant: rint(xg·q_scale) through the documented f32 → i32 (rint) → f16 → i8 casts — bitwise.
# * gate: one f32 cube matmul xg·gate_wᵀ, then inv_rms·z and the stable sqrt(softplus). The reference rounds
#   the exact (f64) dot product once; the cube accumulates in f32, so scores agree to f32 summation rounding.
# * route_hash / route_sort: the expert ids come from `index_select(tid2eid, 0, input_ids)` (an input index)
#   or from K rounds of "row max → lowest expert id holding it (amin over where(x == max, arange, big)) →
#   mask it": exactly the stable top-k with ties → lower id, no topk/BITSORT (whose tie order differs).
#   (A chosen expert is masked with the f32 lowest value, so a biased score of exactly −FLT_MAX, or a NaN
#   score, would not be ordered like np.argsort; scores are sqrt(softplus) ≥ 0 and the bias is finite.)
#   The chosen scores are Σ where(arange == id, scores, 0) (one non-zero term: exact), the denominator the
#   K-term sum in numpy's sequential order (K < 8) — bitwise.
# * expert_shared / expert_routed: exact int8·int8 → int32 cube matmuls, then the reference's f32 chain
#   (acc·x_scale·s, limits, g·(1/(exp(−g)+1))·u, q8, acc·row_scale·s2, bf16). Routed experts loop over the
#   local experts and over row blocks of the first recv_count[e] rows only (a runtime loop bound read from
#   recv_count with GetTensorData); rows ≥ recv_count[e] are written with zeros. Only exp can differ from
#   numpy (≤ 1 ulp), which can move an int8 code by one at a rounding tie of the A8 requant.
# * dispatch_gather: per local expert, per source rank (ascending), the recv_meta[src, e] lanes are copied
#   (runtime loop bound, runtime destination offset = running sum) and the rest zero-filled — bitwise.
# * shared_routed: sh + routed_y[t·K + k] for k ascending in f32, one bf16 rounding — bitwise.
# * Small row blocks run their vector chain as one forced subgraph (sg_set_scope, kernels.vector's rule): tiny
#   ffn_norm 45 k → 27 k cycles, route_sort 32 k → 10 k, route_hash 30 k → 18 k, shared_routed 27 k → 10 k;
#   not the experts' chains (fusing them cost cycles).
# * One-rank forms (`@one_rank_template`): dispatch_meta, dispatch_push and combine at one rank (no peer: every
#   route local, notify/wait no-ops), not `@template`s because at EP > 1 they are cross-rank collectives; the pypto
#   executor (lowering.pypto_exec.placement) uses them when the task graph runs on one rank. dispatch_push's
#   lane slots (a running per-expert count, no loop-carried state in pypto 0.2.0) come from a triangular
#   prefix-count matmul and per-expert selection matrices — bitwise, lanes no route reaches keep the window.
# pypto 0.2.0 on CPU: a broadcasting binary op must take the broadcast ([rows, 1] / [1, n]) operand
# *second*: `mul(col, mat)` is misread by the tensor-graph interpreter (wrong values), `mul(mat, col)` is
# right (IEEE products commute, so the order costs nothing).
# Unsupported at EP > 1: see the `unsupported` declarations at the end.
from dspark_ir.ops.moe import (
    Combine,
    DispatchGather,
    DispatchMeta,
    DispatchPush,
    ExpertRouted,
    ExpertShared,
    FfnNorm,
    Gate,
    RouteHash,
    RouteSort,
    SharedRouted,
    XNormQuant,
)

from .pto import KernelSpec, RowLoop, Src, cast_expr, cube_shapes, py_list, row_block, vec_tile
from .registry import one_rank_template, template, unsupported
from .vector import PtoBlock, pto_fusible, pto_pairwise_sum, pto_scope, pto_set_tile

_PTO_BIG_ID = 1.0e9            # "no expert" in the lowest-id search (above any expert id)
_PTO_TAKEN = -3.4028234663852886e38  # a chosen expert's biased score (f32 lowest) in route_sort
_PTO_AMAX_EPS = 1e-4           # goldens.numerics INT8_AMAX_EPS


def _pto_full(blk: PtoBlock, var: str, shape, value: float) -> None:
    """`var` = an f32 block-local constant [rows, *shape[1:]] (valid rows only when the block is partial)."""
    blk.src(f"{var} = pypto.full({py_list(shape)}, {value!r}, pypto.DT_FP32{blk.valid(*shape[1:])})")


def _pto_q8(src: Src, valid, x: str, rows: int, out_i8: str | None, out_scale: str, one: str) -> None:
    """goldens.numerics.q8 on the block's f32 rows `x`: amax = max(max|x|, 1e-4), k = 127/amax (a true
    division), out_i8 = rint(x·k) (i8; skipped when None), out_scale = 1/k ([rows, 1]). `valid(*rest)` is the
    valid_shape suffix of block-local tensors."""
    src(f"c127 = pypto.full([{rows}, 1], 127.0, pypto.DT_FP32{valid(1)})")
    src(f"am = pypto.maximum(pypto.amax(pypto.abs({x}), -1, keepdim=True), {_PTO_AMAX_EPS!r})")
    src("kq = pypto.div(c127, am)")
    if out_i8 is not None:
        src(f"{out_i8} = {cast_expr(f'pypto.mul({x}, kq)', 'f32', 'i8')}")
    src(f"{out_scale} = pypto.div({one}, kq)")


@template(FfnNorm)
def pypto_ffn_norm(spec: KernelSpec) -> str:
    x, w = spec.operands
    xg, inv_rms, x_scale, q_scale = spec.results
    d = x.shape[1]
    eps = float(spec.attrs.get("eps", 1e-6))
    src = Src(spec.signature())
    loop = RowLoop(src, x, row_block(spec, default=8))
    blk = PtoBlock(loop, x)
    br = blk.rows
    wide = vec_tile((br, d), 4)
    fuse = pto_fusible(br * d)
    with loop.loop():
        pto_scope(src, 1, fuse)  # the row block's vector chain as one subgraph when small
        pto_set_tile(src, wide)
        src(f"xf = {cast_expr(loop.view(x), x.dtype, 'f32')}")
        src(f"wf = {cast_expr(f'pypto.reshape({w.name}, [1, {d}])', w.dtype, 'f32')}")
        src("sq = pypto.mul(xf, xf)")
        pto_pairwise_sum(blk, "sq", [br], d, "ss", wide)
        _pto_full(blk, "one", [br, 1], 1.0)
        src(f"inv = pypto.div(one, pypto.sqrt(pypto.add(pypto.div(ss, {float(d)!r}), {eps!r})))")
        src("xgv = pypto.mul(xf, wf)")
        _pto_q8(src, blk.valid, "xgv", br, None, "sdq", "one")
        src("xs = pypto.mul(sdq, inv)")
        src("qs = pypto.div(one, sdq)")
        loop.store("xgv", xg)
        loop.store("inv", inv_rms)
        loop.store("xs", x_scale)
        loop.store("qs", q_scale)
        pto_scope(src, -1, fuse)
    return src.text()


@template(XNormQuant)
def pypto_x_norm_quant(spec: KernelSpec) -> str:
    xg, qs = spec.operands
    out = spec.results[0]
    src = Src(spec.signature())
    loop = RowLoop(src, xg, row_block(spec, default=8))
    with loop.loop():
        pto_set_tile(src, vec_tile(tuple(loop.shape(xg)), 4))
        src(f"q = {cast_expr(f'pypto.mul({loop.view(xg)}, {loop.view(qs)})', 'f32', 'i8')}")
        loop.store("q", out)
    return src.text()


@template(Gate)
def pypto_gate(spec: KernelSpec) -> str:
    xg, inv, w = spec.operands
    out = spec.results[0]
    d = xg.shape[1]
    e = w.shape[0]
    src = Src(spec.signature())
    loop = RowLoop(src, xg, row_block(spec, default=16))
    br = loop.shape(xg)[0]
    with loop.loop():
        src(f"pypto.set_cube_tile_shapes({cube_shapes(br, d, e, 'f32')})")
        src(f"mm = pypto.matmul({loop.view(xg)}, {w.name}, pypto.DT_FP32, b_trans=True)")
        pto_set_tile(src, vec_tile((br, e), 4))
        fuse = pto_fusible(br * e)
        pto_scope(src, 1, fuse)  # the epilogue chain as one subgraph when small
        src(f"z = pypto.mul(mm, {loop.view(inv)})")  # broadcast operand second (see the note above)
        src("sc = pypto.sqrt(pypto.add(pypto.relu(z), pypto.log1p(pypto.exp(pypto.neg(pypto.abs(z))))))")
        loop.store("sc", out)
        pto_scope(src, -1, fuse)
    return src.text()


def _pto_expert_ids(src: Src, e: int) -> None:
    """`io` = [[0, 1, …, e−1]] (f32 [1, e])."""
    pto_set_tile(src, [max(e, 8)])
    src(f"io1 = pypto.arange(0.0, {float(e)!r}, 1.0)")


def _pto_route_weights(blk: PtoBlock, scores: str, ids, weights, r0: str, scale: float) -> None:
    """weights[:, k] = c_k / (c_0 + … + c_{K−1}) · scale with c_k = scores[t, ids_k[t]] (ids_k: f32 [rows, 1])."""
    src = blk.src
    for k, ident in enumerate(ids):
        src(f"c{k} = pypto.sum(pypto.where(pypto.eq(io, {ident}), {scores}, 0.0), -1, keepdim=True)")
    den = "c0"
    for k in range(1, len(ids)):
        den = f"pypto.add({den}, c{k})"
    src(f"den = {den}")
    for k in range(len(ids)):
        src(f"pypto.assemble(pypto.mul(pypto.div(c{k}, den), {scale!r}), [{r0}, {k}], {weights.name})")


def _pto_route_setup(spec: KernelSpec, scores, default_rows: int = 8):
    src = Src(spec.signature())
    loop = RowLoop(src, scores, row_block(spec, default=default_rows))
    blk = PtoBlock(loop, scores)
    return src, loop, blk


@template(RouteHash)
def pypto_route_hash(spec: KernelSpec) -> str:
    scores, table, ids = spec.operands
    indices, weights = spec.results
    e = scores.shape[1]
    k = table.shape[1]
    scale = float(spec.attrs.get("routed_scale", 1.5))
    src, loop, blk = _pto_route_setup(spec, scores)
    br = blk.rows
    fuse = pto_fusible(br * e)
    with loop.loop():
        pto_set_tile(src, [br, max(k, 8)])
        src(f"idx = pypto.index_select({table.name}, 0, {loop.view(ids)})")
        pto_scope(src, 1, fuse)  # the weights chain as one subgraph when small
        _pto_expert_ids(src, e)
        pto_set_tile(src, [br, max(e, 8)])
        src(f"io = pypto.reshape(io1, [1, {e}])")
        src(f"sc = {loop.view(scores)}")
        src(f"idf = {cast_expr('idx', 'i32', 'f32')}")
        cols = []
        for j in range(k):
            src(f"id{j} = {blk.sub('idf', [br], [0, j], 1)}")
            cols.append(f"id{j}")
        _pto_route_weights(blk, "sc", cols, weights, blk.r0, scale)
        pto_scope(src, -1, fuse)
        loop.store("idx", indices)
    return src.text()


@template(RouteSort)
def pypto_route_sort(spec: KernelSpec) -> str:
    scores, bias = spec.operands
    indices, weights = spec.results
    e = scores.shape[1]
    k = int(spec.attrs["topk"])
    scale = float(spec.attrs.get("routed_scale", 1.5))
    src, loop, blk = _pto_route_setup(spec, scores)
    br = blk.rows
    fuse = pto_fusible(br * e)
    with loop.loop():
        pto_scope(src, 1, fuse)  # the K selection rounds and the weights as one subgraph when small
        _pto_expert_ids(src, e)
        pto_set_tile(src, [br, max(e, 8)])
        src(f"io = pypto.reshape(io1, [1, {e}])")
        src(f"sc = {loop.view(scores)}")
        src(f"work = pypto.add(sc, pypto.reshape({bias.name}, [1, {e}]))")
        cols = []
        for j in range(k):
            src("mx = pypto.amax(work, -1, keepdim=True)")
            src(f"id{j} = pypto.amin(pypto.where(pypto.eq(work, mx), io, {_PTO_BIG_ID!r}), -1, keepdim=True)")
            if j + 1 < k:
                src(f"work = pypto.where(pypto.eq(io, id{j}), {_PTO_TAKEN!r}, work)")
            src(f"pypto.assemble({cast_expr(f'id{j}', 'f32', 'i32')}, [{blk.r0}, {j}], {indices.name})")
            cols.append(f"id{j}")
        _pto_route_weights(blk, "sc", cols, weights, blk.r0, scale)
        pto_scope(src, -1, fuse)
    return src.text()


def _pto_swiglu(src: Src, blk_valid, xv: str, xs: str, rw: str | None, w1: str, s1: str, w3: str, s3: str,
                w2: str, s2: str, rows: int, inter: int, hidden: int, limit: float, y: str) -> None:
    """The reference `swiglu_expert` on one row block: xv i8 [rows, D], xs/rw f32 [rows, 1], weights i8
    [I, D] / [D, I], scales f32 [1, I] / [1, D]; leaves `y` bf16 [rows, D]. `blk_valid(*rest)` gives the
    valid_shape suffix of block-local tensors."""
    src(f"pypto.set_cube_tile_shapes({cube_shapes(rows, hidden, inter, 'i8')})")
    src(f"ga = pypto.matmul({xv}, {w1}, pypto.DT_INT32, b_trans=True)")
    src(f"ua = pypto.matmul({xv}, {w3}, pypto.DT_INT32, b_trans=True)")
    pto_set_tile(src, vec_tile((rows, inter), 4))
    src(f"g = pypto.mul(pypto.mul(pypto.cast(ga, pypto.DT_FP32), {xs}), {s1})")
    src(f"u = pypto.mul(pypto.mul(pypto.cast(ua, pypto.DT_FP32), {xs}), {s3})")
    if limit > 0:
        src(f"g = pypto.minimum(g, {limit!r})")
        src(f"u = pypto.minimum(pypto.maximum(u, {-limit!r}), {limit!r})")
    src("h = pypto.mul(pypto.mul(g, pypto.reciprocal(pypto.add(pypto.exp(pypto.neg(g)), 1.0))), u)")
    src(f"one = pypto.full([{rows}, 1], 1.0, pypto.DT_FP32{blk_valid(1)})")
    _pto_q8(src, blk_valid, "h", rows, "hq", "hs", "one")
    src(f"rs = pypto.mul(hs, {rw})" if rw is not None else "rs = pypto.mul(hs, 1.0)")
    src(f"pypto.set_cube_tile_shapes({cube_shapes(rows, inter, hidden, 'i8')})")
    src(f"ya = pypto.matmul(hq, {w2}, pypto.DT_INT32, b_trans=True)")
    pto_set_tile(src, vec_tile((rows, hidden), 4))
    src(f"{y} = {cast_expr(f'pypto.mul(pypto.mul(pypto.cast(ya, pypto.DT_FP32), rs), {s2})', 'f32', 'bf16')}")


@template(ExpertShared)
def pypto_expert_shared(spec: KernelSpec) -> str:
    x, xs, w1, s1, w3, s3, w2, s2 = spec.operands
    out = spec.results[0]
    inter, hidden = w1.shape
    limit = float(spec.attrs.get("swiglu_limit", 0.0))
    src = Src(spec.signature())
    loop = RowLoop(src, x, row_block(spec, default=32))
    blk = PtoBlock(loop, x)
    br = blk.rows
    with loop.loop():
        pto_set_tile(src, vec_tile((br, hidden), 4))
        src(f"s1r = pypto.reshape({s1.name}, [1, {inter}])")
        src(f"s3r = pypto.reshape({s3.name}, [1, {inter}])")
        src(f"s2r = pypto.reshape({s2.name}, [1, {hidden}])")
        _pto_swiglu(src, blk.valid, loop.view(x), loop.view(xs), None, w1.name, "s1r", w3.name, "s3r",
                    w2.name, "s2r", br, inter, hidden, limit, "y")
        loop.store("y", out)
    return src.text()


def _pto_valid3(rows: str, *rest) -> str:
    return f", valid_shape={py_list(['1', rows] + [str(r) for r in rest])}"


@template(ExpertRouted)
def pypto_expert_routed(spec: KernelSpec) -> str:
    x, xs, xw, count, w1, s1, w3, s3, w2, s2 = spec.operands
    out = spec.results[0]
    n_local, rm, hidden = x.shape
    inter = w1.shape[1]
    limit = float(spec.attrs.get("swiglu_limit", 0.0))
    br = min(32, rm)
    src = Src(spec.signature())

    def valid2(*rest):
        return f", valid_shape={py_list(['valid'] + [str(r) for r in rest])}"

    with src.block(f'for e in pypto.loop(0, {n_local}, 1, name="expert_loop", idx_name="e"):'):
        src(f"n = {count.name}[e]")
        pto_set_tile(src, [1] + vec_tile((inter, hidden), 1))
        src(f"w1e = pypto.reshape(pypto.view({w1.name}, [1, {inter}, {hidden}], [e, 0, 0]), [{inter}, {hidden}])")
        src(f"w3e = pypto.reshape(pypto.view({w3.name}, [1, {inter}, {hidden}], [e, 0, 0]), [{inter}, {hidden}])")
        src(f"w2e = pypto.reshape(pypto.view({w2.name}, [1, {hidden}, {inter}], [e, 0, 0]), [{hidden}, {inter}])")
        with src.block(f'for blk in pypto.loop(0, (n + {br - 1}) // {br}, 1, name="row_loop", idx_name="blk"):'):
            src(f"r0 = blk * {br}")
            src(f"valid = pypto.min(n - r0, {br})")
            pto_set_tile(src, [1] + vec_tile((br, hidden), 1))
            src(f"xv = pypto.reshape(pypto.view({x.name}, [1, {br}, {hidden}], [e, r0, 0]"
                f"{_pto_valid3('valid', hidden)}), [{br}, {hidden}]{valid2(hidden)})")
            pto_set_tile(src, [1, max(br, 8)])
            src(f"xs_r = pypto.view({xs.name}, [1, {br}], [e, r0], valid_shape=[1, valid])")
            src(f"xw_r = pypto.view({xw.name}, [1, {br}], [e, r0], valid_shape=[1, valid])")
            src(f"s1r = pypto.view({s1.name}, [1, {inter}], [e, 0])")
            src(f"s3r = pypto.view({s3.name}, [1, {inter}], [e, 0])")
            src(f"s2r = pypto.view({s2.name}, [1, {hidden}], [e, 0])")
            pto_set_tile(src, [br, 8])
            src(f"xsc = pypto.reshape(xs_r, [{br}, 1]{valid2(1)})")
            src(f"xwc = pypto.reshape(xw_r, [{br}, 1]{valid2(1)})")
            _pto_swiglu(src, valid2, "xv", "xsc", "xwc", "w1e", "s1r", "w3e", "s3r", "w2e", "s2r",
                        br, inter, hidden, limit, "y")
            pto_set_tile(src, [1] + vec_tile((br, hidden), 4))
            src(f"y3 = pypto.reshape(y, [1, {br}, {hidden}]{_pto_valid3('valid', hidden)})")
            src(f"pypto.assemble(y3, [e, r0, 0], {out.name})")
        _pto_zero_rows(src, out, "n", br)
    return src.text()


def _pto_zero_rows(src: Src, out, start: str, br: int, lead: str = "e") -> None:
    """Zero-fill rows [start, RM) of out[lead] (out: [NL, RM, ...] or [NL, RM])."""
    rm = out.shape[1]
    rest = list(out.shape[2:])
    fill = "pypto.DT_INT32" if out.dtype in ("i8", "i32") else "pypto.DT_FP32"
    value = "0" if fill == "pypto.DT_INT32" else "0.0"
    with src.block(f'for zb in pypto.loop(0, ({rm} - {start} + {br - 1}) // {br}, 1, name="zero_loop", '
                   f'idx_name="zb"):'):
        src(f"z0 = {start} + zb * {br}")
        src(f"zv = pypto.min({rm} - z0, {br})")
        shape = [1, br] + rest
        pto_set_tile(src, [1] + vec_tile(tuple([br] + rest), 4))
        valid = py_list(["1", "zv"] + [str(r) for r in rest])
        src(f"z = pypto.full({py_list(shape)}, {value}, {fill}, valid_shape={valid})")
        src(f"zc = {cast_expr('z', 'i32' if value == '0' else 'f32', out.dtype)}")
        src(f"pypto.assemble(zc, {py_list([lead, 'z0'] + ['0'] * len(rest))}, {out.name})")


@template(DispatchGather)
def pypto_dispatch_gather(spec: KernelSpec) -> str:
    rx, raux, rroute, meta = spec.operands
    ox, oscale, oweight, oroute = spec.results
    n_local, rm, hidden = rx.shape
    ranks = meta.shape[0]
    per_src = rm // ranks
    br = min(32, rm)
    src = Src(spec.signature())
    with src.block(f'for e in pypto.loop(0, {n_local}, 1, name="expert_loop", idx_name="e"):'):
        for s in range(ranks):
            src(f"n{s} = {meta.name}[{s}, e]")
            base = "0" if s == 0 else f"b{s}"
            with src.block(f'for blk in pypto.loop(0, (n{s} + {br - 1}) // {br}, 1, name="lane_loop{s}", '
                           f'idx_name="blk"):'):
                src(f"r0 = blk * {br}")
                src(f"valid = pypto.min(n{s} - r0, {br})")
                lane = f"{s * per_src} + r0" if s else "r0"
                dst = f"{base} + r0" if s else "r0"
                pto_set_tile(src, [1] + vec_tile((br, hidden), 1))
                src(f"xv = pypto.clone(pypto.view({rx.name}, [1, {br}, {hidden}], [e, {lane}, 0], "
                    f"valid_shape=[1, valid, {hidden}]))")
                src(f"pypto.assemble(xv, [e, {dst}, 0], {ox.name})")
                pto_set_tile(src, [1, max(br, 8)])
                src(f"rt = pypto.clone(pypto.view({rroute.name}, [1, {br}], [e, {lane}], valid_shape=[1, valid]))")
                src(f"pypto.assemble(rt, [e, {dst}], {oroute.name})")
                for c, target in ((0, oscale), (1, oweight)):
                    pto_set_tile(src, [1, br, 8])  # view and 3-D → 2-D reshape under the rank-3 tile
                    src(f"a{c} = pypto.view({raux.name}, [1, {br}, 1], [e, {lane}, {c}], valid_shape=[1, valid, 1])")
                    src(f"a{c}r = pypto.reshape(a{c}, [1, {br}], valid_shape=[1, valid])")
                    pto_set_tile(src, [1, max(br, 8)])
                    src(f"pypto.assemble(pypto.clone(a{c}r), [e, {dst}], {target.name})")
            src(f"b{s + 1} = {base} + n{s}" if s else "b1 = n0")
        for target in (ox, oscale, oweight, oroute):
            _pto_zero_rows(src, target, f"b{ranks}", br)
    return src.text()


@template(SharedRouted)
def pypto_shared_routed(spec: KernelSpec) -> str:
    sh, routed = spec.operands
    out = spec.results[0]
    tokens, hidden = sh.shape
    k = routed.shape[0] // tokens
    src = Src(spec.signature())
    loop = RowLoop(src, sh, row_block(spec, default=8))
    blk = PtoBlock(loop, sh)
    br = blk.rows
    wide = vec_tile((br, hidden), 4)
    fuse = pto_fusible(br * hidden)
    with loop.loop():
        pto_scope(src, 1, fuse)  # the K adds as one subgraph when small
        pto_set_tile(src, vec_tile((br * k, hidden), 2))
        valid = f", valid_shape=[valid * {k}, {hidden}]" if blk.partial else ""
        src(f"rv = pypto.view({routed.name}, [{br * k}, {hidden}], [{blk.r0} * {k}, 0]{valid})")
        pto_set_tile(src, vec_tile((br, k * hidden), 2))
        src(f"rr = {blk.reshape('rv', [br, k * hidden])}")
        pto_set_tile(src, wide)
        src(f"acc = {cast_expr(loop.view(sh), sh.dtype, 'f32')}")
        for j in range(k):
            src(f"acc = pypto.add(acc, {cast_expr(blk.sub('rr', [br], [0, j * hidden], hidden), routed.dtype, 'f32')})")
        src(f"y = {cast_expr('acc', 'f32', out.dtype)}")
        loop.store("y", out)
        pto_scope(src, -1, fuse)
    return src.text()


@one_rank_template(DispatchMeta)
def pypto_dispatch_meta_ep1(spec: KernelSpec) -> str:
    """EP1 only (recv_meta has one source row): recv_meta[0, e] = recv_count[e] = #routes to expert e.
    Counts are Σ over (t, k) of where(indices == e, 1, 0) (exact in f32); `arrived` is not touched (no peer)."""
    spec = spec.static()
    idx, _meta_in, _arrived_in = spec.operands
    meta, count = spec.results
    ranks, n_local = meta.shape
    assert ranks == 1, "moe_dispatch_meta has a pypto form at EP1 only"
    tokens, k = idx.shape
    src = Src(spec.signature())
    _pto_expert_ids(src, n_local)
    pto_set_tile(src, vec_tile((tokens, n_local), 4))
    src(f"io = pypto.reshape(io1, [1, {n_local}])")
    src(f"idf = {cast_expr(idx.name, 'i32', 'f32')}")
    for j in range(k):
        src(f"hit = pypto.where(pypto.eq(io, pypto.view(idf, [{tokens}, 1], [0, {j}])), 1.0, 0.0)")
        src("per = pypto.sum(hit, 0, keepdim=True)")
        src("cnt = per" if j == 0 else "cnt = pypto.add(cnt, per)")
    src(f"ci = {cast_expr('cnt', 'f32', 'i32')}")
    src(f"pypto.assemble(ci, [0, 0], {meta.name})")
    pto_set_tile(src, [max(n_local, 8)])
    src(f"pypto.assemble(pypto.reshape(ci, [{n_local}]), [0], {count.name})")
    return src.text()


@one_rank_template(Combine)
def pypto_combine_ep1(spec: KernelSpec) -> str:
    """EP1 only: routed_y[recv_route[e, b]] = recv_y[e, b] for b < recv_meta[0, e] (every route row once, so
    the rows are unique); a runtime loop per expert over its rows, the destination row read as a scalar.
    Other rows of the in-place buffer are not touched; `combine_arrived` neither (no peer)."""
    y, route, meta, _out_in, _sig_in = spec.operands
    out = spec.results[0]
    n_local, rm, hidden = y.shape
    assert meta.shape[0] == 1, "moe_combine has a pypto form at EP1 only"
    src = Src(spec.signature())
    pto_set_tile(src, [1, 1, hidden])
    with src.block(f'for e in pypto.loop(0, {n_local}, 1, name="expert_loop", idx_name="e"):'):
        src(f"n = {meta.name}[0, e]")
        with src.block('for b in pypto.loop(0, n, 1, name="row_loop", idx_name="b"):'):
            src(f"row = {route.name}[e, b]")
            src(f"yr = pypto.reshape(pypto.view({y.name}, [1, 1, {hidden}], [e, b, 0]), [1, {hidden}])")
            pto_set_tile(src, [1, hidden])
            src(f"pypto.assemble(pypto.clone(yr), [row, 0], {out.name})")
            pto_set_tile(src, [1, 1, hidden])
    return src.text()


@one_rank_template(DispatchPush)
def pypto_dispatch_push_ep1(spec: KernelSpec) -> str:
    """EP1 only (every route local, lanes [0, RM) of source 0): route (t, k) → expert e = indices[t, k], lane
    slot = #routes before it (in (t, k) order) to e; recv_x[e, slot] = x_i8[t], recv_aux[e, slot] =
    (x_scale[t], weights[t, k]), recv_route[e, slot] = t·K + k; other lanes keep their contents.

    No loop-carried counter: hit_k[t, e] = (indices[t, k] == e), the exclusive prefix over tokens
    P = L·Σ_k hit_k (L strictly lower triangular, an f32 cube matmul of 0/1 counts: exact), the slot of route
    (t, k) for e is S_k = P + Σ_{k'<k} hit_k' where hit_k, else −1. Per expert (a runtime loop), the selection
    sel_k[b, t] = (S_k[t, e] == b) picks each lane's route: x rows by an f32 matmul sel·x (one 1 per row:
    exact), the f32 payloads by Σ_t sel_k·value (one non-zero term: exact); lanes no route reaches keep
    the window's value (where). `data_arrived` is not touched (no peer)."""
    spec = spec.static()
    idx, wts, x, xs, rx_in, ra_in, rr_in, _sig_in = spec.operands
    rx, ra, rr = spec.results
    tokens, k = idx.shape
    n_local, rm, hidden = rx.shape
    assert rm == tokens, "moe_dispatch_push has a pypto form at EP1 only (RECV_MAX = T lanes of one source)"
    src = Src(spec.signature())
    _pto_expert_ids(src, n_local)
    pto_set_tile(src, [max(tokens, 8)])
    src(f"ti1 = pypto.arange(0.0, {float(tokens)!r}, 1.0)")
    pto_set_tile(src, [max(rm, 8)])
    src(f"bi1 = pypto.arange(0.0, {float(rm)!r}, 1.0)")
    pto_set_tile(src, vec_tile((tokens, max(n_local, tokens)), 4))
    src(f"io = pypto.reshape(io1, [1, {n_local}])")
    src(f"idf = {cast_expr(idx.name, 'i32', 'f32')}")
    for j in range(k):
        src(f"hit{j} = pypto.where(pypto.eq(io, pypto.view(idf, [{tokens}, 1], [0, {j}])), 1.0, 0.0)")
    per_token = "hit0"
    for j in range(1, k):
        per_token = f"pypto.add({per_token}, hit{j})"
    src(f"hsum = {per_token}")
    src(f"tr = pypto.reshape(ti1, [1, {tokens}])")
    src(f"tc = pypto.reshape(ti1, [{tokens}, 1])")
    src("low = pypto.where(pypto.lt(tr, tc), 1.0, 0.0)")
    src(f"pypto.set_cube_tile_shapes({cube_shapes(tokens, tokens, n_local, 'f32')})")
    src("pre = pypto.matmul(low, hsum, pypto.DT_FP32)")
    pto_set_tile(src, vec_tile((tokens, max(n_local, tokens)), 4))
    src("before = pre")
    for j in range(k):
        src(f"s{j} = pypto.where(pypto.eq(hit{j}, 1.0), before, -1.0)")
        if j + 1 < k:
            src(f"before = pypto.add(before, hit{j})")
    src(f"xf = {cast_expr(x.name, 'i8', 'f32')}")
    src(f"rid = pypto.mul(tc, {float(k)!r})")
    src(f"bc = pypto.reshape(bi1, [{rm}, 1])")
    with src.block(f'for e in pypto.loop(0, {n_local}, 1, name="expert_loop", idx_name="e"):'):
        pto_set_tile(src, vec_tile((rm, tokens), 4))
        for j in range(k):
            src(f"row{j} = pypto.reshape(pypto.view(s{j}, [{tokens}, 1], [0, e]), [1, {tokens}])")
            src(f"sel{j} = pypto.where(pypto.eq(bc, row{j}), 1.0, 0.0)")
        sel = "sel0"
        for j in range(1, k):
            sel = f"pypto.add({sel}, sel{j})"
        src(f"sel = {sel}")
        src("got = pypto.sum(sel, -1, keepdim=True)")
        src("hitrow = pypto.eq(got, 1.0)")
        xs_row = f"pypto.reshape({xs.name}, [1, {tokens}])"
        scale_terms, weight_terms, route_terms = [], [], []
        for j in range(k):
            src(f"w{j} = pypto.reshape(pypto.view({wts.name}, [{tokens}, 1], [0, {j}]), [1, {tokens}])")
            src(f"r{j} = pypto.reshape(pypto.add(rid, {float(j)!r}), [1, {tokens}])")
            scale_terms.append(f"pypto.sum(pypto.mul(sel{j}, {xs_row}), -1, keepdim=True)")
            weight_terms.append(f"pypto.sum(pypto.mul(sel{j}, w{j}), -1, keepdim=True)")
            route_terms.append(f"pypto.sum(pypto.mul(sel{j}, r{j}), -1, keepdim=True)")
        for name, terms in (("sc", scale_terms), ("wt", weight_terms), ("ro", route_terms)):
            expr = terms[0]
            for term in terms[1:]:
                expr = f"pypto.add({expr}, {term})"
            src(f"{name} = {expr}")
        src(f"old_s = pypto.reshape(pypto.view({ra_in.name}, [1, {rm}, 1], [e, 0, 0]), [{rm}, 1])")
        src(f"old_w = pypto.reshape(pypto.view({ra_in.name}, [1, {rm}, 1], [e, 0, 1]), [{rm}, 1])")
        old_r = f"pypto.reshape(pypto.view({rr_in.name}, [1, {rm}], [e, 0]), [{rm}, 1])"
        src(f"old_r = {cast_expr(old_r, 'i32', 'f32')}")
        src("new_s = pypto.where(hitrow, sc, old_s)")
        src("new_w = pypto.where(hitrow, wt, old_w)")
        src(f"new_r = {cast_expr('pypto.where(hitrow, ro, old_r)', 'f32', 'i32')}")
        pto_set_tile(src, [1, rm, 8])
        src(f"pypto.assemble(pypto.reshape(new_s, [1, {rm}, 1]), [e, 0, 0], {ra.name})")
        src(f"pypto.assemble(pypto.reshape(new_w, [1, {rm}, 1]), [e, 0, 1], {ra.name})")
        pto_set_tile(src, [1, max(rm, 8)])
        src(f"pypto.assemble(pypto.reshape(new_r, [1, {rm}]), [e, 0], {rr.name})")
        src(f"pypto.set_cube_tile_shapes({cube_shapes(rm, tokens, hidden, 'f32')})")
        src("xe = pypto.matmul(sel, xf, pypto.DT_FP32)")
        pto_set_tile(src, vec_tile((rm, hidden), 4))
        old_x = f"pypto.reshape(pypto.view({rx_in.name}, [1, {rm}, {hidden}], [e, 0, 0]), [{rm}, {hidden}])"
        src(f"old_x = {cast_expr(old_x, 'i8', 'f32')}")
        src(f"new_x = {cast_expr('pypto.where(hitrow, xe, old_x)', 'f32', 'i8')}")
        pto_set_tile(src, [1] + vec_tile((rm, hidden), 4))
        src(f"pypto.assemble(pypto.reshape(new_x, [1, {rm}, {hidden}]), [e, 0, 0], {rx.name})")
    return src.text()


_PTO_CROSS_RANK = ("pypto 0.2.0 expresses remote stores and signals only with pypto.distributed / shmem ops, which "
                   "compile but SIGSEGV in the CPU cost-model simulation and which the host calculator cannot "
                   "interpret (no numbers on CPU); the lowering runs collective tasks on numpy")
unsupported(DispatchMeta, "collective: remote_store of this rank's lane counts into row [my_rank] of every "
                          "destination's recv_meta window, notify `arrived` on every peer, spin-wait for every peer's "
                          "meta, then the column sums; " + _PTO_CROSS_RANK + ". At EP1 it degenerates to a local "
                          "histogram of the indices (notify/wait have no peer): its one-rank template")
unsupported(DispatchPush, "collective: one-sided puts of each route's row into its lane on the destination rank, then "
                          "every SPMD block notifies `data_arrived` on every peer; " + _PTO_CROSS_RANK + ". At EP1 the "
                          "lane of route (t, k) is a running per-expert count over the routes in (t, k) order, all "
                          "local (notify has no peer): its one-rank template computes it without loop-carried state "
                          "(prefix counts by a triangular matmul, lanes filled by selection matmuls)")
unsupported(Combine, "collective: puts every compact expert row back to its origin rank (row t·K + k of that rank's "
                     "routed_y window), each SPMD block notifying `combine_arrived` on every peer; " + _PTO_CROSS_RANK
                     + ". At EP1 it is a local row scatter by recv_route (unique rows), notify has no peer: "
                     "its one-rank "
                     "template")
