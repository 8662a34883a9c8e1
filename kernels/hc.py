"""Hyper-connection kernels (hc_pre stages and hc_post): numpy references (dsv4-math §2.1, §2.2).

Every function follows the rounding points of dsv4-math exactly: the residual stream, mixes, pre/post/comb are
f32; x_mixed is rounded once to bf16 after the pairwise stream sum.
"""
from __future__ import annotations

import numpy as np

from ._np import f32, to_bf16

F32 = np.float32
MAD_GROUP = 4  # the A2/A3 cube MAD sums 4 consecutive products before rounding (dsv4-math §2.1)


def _rows(x) -> np.ndarray:
    """x_hc [T, N, D] (or already flat [T, K]) as f32 [T, N·D]."""
    x = f32(x)
    return x.reshape(x.shape[0], -1)


def hc_pre_rms(x_hc, *, tile=None, eps=1e-6, **_):
    """inv_rms[t] = 1/sqrt(ss/K + eps); ss = Σ over K-chunks (tile[1] wide, in order) of rowsum(chunk²)."""
    x = _rows(x_hc)
    k = x.shape[1]
    chunk = tile[1] if tile else k
    ss = np.zeros(x.shape[0], dtype=F32)
    for k0 in range(0, k, chunk):
        xc = x[:, k0:k0 + chunk]
        ss = ss + np.sum(xc * xc, axis=1)
    return F32(1.0) / np.sqrt(ss / F32(k) + F32(eps))


def _cube_splits(x, w, k_split: int) -> np.ndarray:
    """Per-split results [k_split, T, N] of x[T,K] @ w[N,K].T in the cube MAD order: inside a split, groups of
    4 consecutive products are summed exactly (f64) and accumulated as acc = f32(acc + group), in k order."""
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    m, k = x64.shape
    n = w64.shape[0]
    groups = k // (k_split * MAD_GROUP)
    xg = x64.reshape(m, k_split, groups, MAD_GROUP)
    wg = w64.reshape(n, k_split, groups, MAD_GROUP)
    group_sums = np.einsum("msgc,nsgc->gmns", xg, wg)
    acc = np.zeros((m, n, k_split), dtype=F32)
    for g in range(groups):
        acc = (acc + group_sums[g]).astype(F32)
    return np.moveaxis(acc, 2, 0)


def hc_pre_linear(x_hc, hc_fn, acc=None, *, accumulate="atomic", k_split=1, split_order=None, **_):
    """mixes_raw = X @ hc_fn.T (no 1/rms) over `k_split` contiguous K splits in the cube MAD order.

    atomic: each split's result is added in f32 into the seeded `acc` (ascending unless `split_order`);
    ordered: the disjoint partials, row s·T + t for split s; none: the splits summed in ascending order.
    """
    x = _rows(x_hc)
    parts = _cube_splits(x, f32(hc_fn), k_split)
    if accumulate == "ordered":
        return parts.reshape(k_split * x.shape[0], -1)
    total = f32(acc).copy() if acc is not None else None
    for s in (split_order if split_order is not None else range(k_split)):
        total = parts[s].copy() if total is None else total + parts[s]
    return total


def hc_pre_linear_reduce(partials, *, k_split, **_):
    """Σ of the `k_split` row-blocks of partials [k_split·T, N], in ascending split order (f32)."""
    p = f32(partials)
    t = p.shape[0] // k_split
    out = p[:t].copy()
    for s in range(1, k_split):
        out = out + p[s * t:(s + 1) * t]
    return out


def _mix(mixes, inv_rms) -> np.ndarray:
    return f32(mixes) * f32(inv_rms)[:, None]


def _sigmoid(x) -> np.ndarray:
    with np.errstate(over="ignore"):
        return F32(1.0) / (F32(1.0) + np.exp(-f32(x)))


def split_pre_post(mixes, inv_rms, hc_scale, hc_base, *, hc_mult=4, eps=1e-6, **_):
    """pre = sigmoid(mix[:, :n]·s0 + base) + eps;  post = 2·sigmoid(mix[:, n:2n]·s1 + base)  (f32 [T, n] each)."""
    n = hc_mult
    mix, s, base = _mix(mixes, inv_rms), f32(hc_scale), f32(hc_base)
    pre = _sigmoid(mix[:, :n] * s[0] + base[:n]) + F32(eps)
    post = F32(2.0) * _sigmoid(mix[:, n:2 * n] * s[1] + base[n:2 * n])
    return pre, post


def comb_sinkhorn(mixes, inv_rms, hc_scale, hc_base, *, hc_mult=4, iters=20, eps=1e-6, **_):
    """C[t, in, out] = mix[:, 2n:]·s2 + base; softmax over out + eps, column-normalise, then (iters−1) × (row,
    column) normalisations, each with + eps in the denominator (f32 [T, n, n])."""
    n = hc_mult
    mix, s, base = _mix(mixes, inv_rms), f32(hc_scale), f32(hc_base)
    c = (mix[:, 2 * n:] * s[2] + base[2 * n:]).reshape(-1, n, n)
    e = F32(eps)
    x = np.exp(c - np.max(c, axis=2, keepdims=True))
    c = x / np.sum(x, axis=2, keepdims=True) + e
    c = c / (np.sum(c, axis=1, keepdims=True) + e)
    for _ in range(iters - 1):
        c = c / (np.sum(c, axis=2, keepdims=True) + e)
        c = c / (np.sum(c, axis=1, keepdims=True) + e)
    return c


def mix_x(x_hc, pre, **_):
    """x_mixed = rb((x0·pre0 + x1·pre1) + (x2·pre2 + x3·pre3))  (bf16 [T, D])."""
    x, p = f32(x_hc), f32(pre)
    s = [x[:, i, :] * p[:, i:i + 1] for i in range(x.shape[1])]
    return to_bf16((s[0] + s[1]) + (s[2] + s[3]))


def hc_post(x_attn, x_hc, post, comb, **_):
    """y[:, o] = f32(x_attn)·post[:, o], then += x_hc[:, i]·C[:, i, o] for i ascending (f32 [T, n, D])."""
    a, res, post, comb = f32(x_attn), f32(x_hc), f32(post), f32(comb)
    y = a[:, None, :] * post[:, :, None]
    for i in range(res.shape[1]):
        y = y + res[:, i:i + 1, :] * comb[:, i, :, None]
    return y


# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generators for the lowering (see kernels/_pypto.py). They mirror the references above: stream
# and column views instead of reshapes of the whole residual, the same summation order over K chunks,
# splits and streams. Row sums and the cube accumulate in pypto's own order inside a chunk/split, so f32
# results agree to rounding (not bit for bit) where the reference fixes an order pypto cannot express.
from ._pypto import KernelSpec, RowLoop, Src, cast_expr, cube_shapes, py_list, row_block, vec_tile  # noqa: E402


def _pto_valid(loop: RowLoop, *rest) -> str:
    """`, valid_shape=[valid, ...]` for a block view/reshape when the block may be partial."""
    if not (loop.looped and loop.partial):
        return ""
    return f", valid_shape={py_list(['valid'] + [str(r) for r in rest])}"


def _pto_r0(loop: RowLoop) -> str:
    return "r0" if loop.looped else "0"


def _pto_tile(src: Src, shape) -> None:
    src(f"pypto.set_vec_tile_shapes({', '.join(map(str, shape))})")


def _pto_stream_cols(loop: RowLoop, var: str, x, stream: int, start: int, width: int, tile2d) -> None:
    """`var` = columns [start, start+width) of stream `stream` of x[T, n, D] for the block, as [rows, width].

    pypto 0.2.0 needs the view and the 3-D → 2-D reshape under a rank-3 vec tile, then the rank-2 tile back.
    """
    br = loop.shape(x)[0]
    _pto_tile(loop.src, (tile2d[0], 1, tile2d[1]))
    view = (f"pypto.view({x.name}, [{br}, 1, {width}], [{_pto_r0(loop)}, {stream}, {start}]"
            f"{_pto_valid(loop, 1, width)})")
    loop.src(f"{var} = pypto.reshape({view}, [{br}, {width}]{_pto_valid(loop, width)})")
    _pto_tile(loop.src, tile2d)


def _pto_k_cols(loop: RowLoop, var: str, x, k0: int, width: int, tile2d) -> None:
    """`var` = columns [k0, k0+width) of the flattened row x[t, :] (n·D wide), as [rows, width]."""
    d = x.shape[2]
    first, last = k0 // d, (k0 + width - 1) // d
    if first == last:
        _pto_stream_cols(loop, var, x, first, k0 % d, width, tile2d)
        return
    assert k0 % d == 0 and width % d == 0, "a K slice must cover whole streams or lie inside one"
    names = []
    for s in range(first, last + 1):
        _pto_stream_cols(loop, f"{var}_{s}", x, s, 0, d, tile2d)
        names.append(f"{var}_{s}")
    loop.src(f"{var} = pypto.concat([{', '.join(names)}], -1)")


def _pto_col(loop: RowLoop, var: str, t, index: tuple[int, ...], tile2d) -> None:
    """`var` = one column t[:, i] (or t[:, i, j]) for the block, as [rows, 1]."""
    br = loop.shape(t)[0]
    shape = [br] + [1] * len(index)
    view = (f"pypto.view({t.name}, {py_list(shape)}, {py_list([_pto_r0(loop)] + list(index))}"
            f"{_pto_valid(loop, *([1] * len(index)))})")
    if len(index) == 1:
        loop.src(f"{var} = {view}")
        return
    _pto_tile(loop.src, (tile2d[0], 1, 8))
    loop.src(f"{var} = pypto.reshape({view}, [{br}, 1]{_pto_valid(loop, 1)})")
    _pto_tile(loop.src, tile2d)


def _pto_store_rows(loop: RowLoop, value: str, out, br: int) -> None:
    """Write a [rows, 1] block result into a rank-1 output [T]."""
    loop.src(f"flat = pypto.reshape({value}, [{br}]{_pto_valid(loop)})")
    loop.src(f"pypto.set_vec_tile_shapes({max(br, 8)})")
    loop.store("flat", out)


def pypto_hc_pre_rms(spec: KernelSpec) -> str:
    x = spec.operands[0]
    out = spec.results[0]
    _, n, d = x.shape
    k = n * d
    tile = spec.attrs.get("tile") or (8, k)
    chunk = int(tile[1])
    eps = float(spec.attrs.get("eps", 1e-6))
    src = Src(spec.signature())
    loop = RowLoop(src, x, int(tile[0]))
    br = loop.shape(x)[0]
    tile2d = vec_tile((br, min(chunk, 2048)), 4)
    with loop.loop():
        _pto_tile(src, tile2d)
        for j, k0 in enumerate(range(0, k, chunk)):
            _pto_k_cols(loop, "xc", x, k0, min(chunk, k - k0), tile2d)
            src("sq = pypto.sum(pypto.mul(xc, xc), -1, keepdim=True)")
            src("ss = sq" if j == 0 else "ss = pypto.add(ss, sq)")
        valid = "valid" if loop.looped and loop.partial else str(br)
        src(f"one = pypto.full([{br}, 1], 1.0, pypto.DT_FP32, valid_shape=[{valid}, 1])")
        src(f"inv = pypto.div(one, pypto.sqrt(pypto.add(pypto.div(ss, {float(k)!r}), {eps!r})))")
        _pto_store_rows(loop, "inv", out, br)
    return src.text()


def _pto_split_bounds(k: int, splits: int) -> list[tuple[int, int]]:
    step = k // splits
    return [(s * step, (s + 1) * step) for s in range(splits)]


def pypto_hc_pre_linear(spec: KernelSpec) -> str:
    x, fn = spec.operands[:2]
    acc = spec.operands[2] if len(spec.operands) > 2 else None
    out = spec.results[0]
    _, n, d = x.shape
    k, mix = n * d, fn.shape[0]
    mode = spec.attrs.get("accumulate", "atomic")
    splits = _pto_split_bounds(k, int(spec.attrs.get("k_split", 1)))
    src = Src(spec.signature())
    tile = spec.attrs.get("tile") or (16, k)
    loop = RowLoop(src, x, int(tile[0]))
    br = loop.shape(x)[0]
    width = splits[0][1] - splits[0][0]
    tile2d = vec_tile((br, min(width, 2048)), 4)
    with loop.loop():
        _pto_tile(src, tile2d)
        src(f"pypto.set_cube_tile_shapes({cube_shapes(br, width, mix, 'f32')})")
        for s, (lo, hi) in enumerate(splits):
            _pto_k_cols(loop, "xs", x, lo, hi - lo, tile2d)
            src(f"p{s} = pypto.matmul(xs, pypto.view({fn.name}, [{mix}, {hi - lo}], [0, {lo}]), "
                f"pypto.DT_FP32, b_trans=True)")
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile((br, mix), 4)))})")
        if mode == "ordered":
            rows = f"{x.name}.shape[0]" if x.is_dynamic(0) else str(x.shape[0])
            for s in range(len(splits)):
                src(f"pypto.assemble(p{s}, [{s} * {rows} + {_pto_r0(loop)}, 0], {out.name})")
            return src.text()
        terms = [f"p{s}" for s in range(len(splits))]
        if acc is not None:
            src(f"total = {loop.view(acc)}")
        else:
            src(f"total = {terms.pop(0)}")
        for term in terms:
            src(f"total = pypto.add(total, {term})")
        loop.store("total", out)
    return src.text()


def pypto_hc_pre_linear_reduce(spec: KernelSpec) -> str:
    p = spec.operands[0]
    out = spec.results[0]
    splits = int(spec.attrs["k_split"])
    mix = out.shape[1]
    src = Src(spec.signature())
    loop = RowLoop(src, out, row_block(spec, default=16))
    br = loop.shape(out)[0]
    rows = f"{out.name}.shape[0]" if out.is_dynamic(0) else str(out.shape[0])
    with loop.loop():
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile((br, mix), 4)))})")
        for s in range(splits):
            view = f"pypto.view({p.name}, [{br}, {mix}], [{s} * {rows} + {_pto_r0(loop)}, 0]{_pto_valid(loop, mix)})"
            src(f"total = {view}" if s == 0 else f"total = pypto.add(total, {view})")
        loop.store("total", out)
    return src.text()


def pypto_mix_x(spec: KernelSpec) -> str:
    x, pre = spec.operands
    out = spec.results[0]
    _, n, d = x.shape
    src = Src(spec.signature())
    loop = RowLoop(src, x, row_block(spec, default=8))
    br = loop.shape(x)[0]
    tile2d = vec_tile((br, d), 4)
    with loop.loop():
        _pto_tile(src, tile2d)
        for i in range(n):
            _pto_stream_cols(loop, f"x{i}", x, i, 0, d, tile2d)
            _pto_col(loop, f"p{i}", pre, (i,), tile2d)
            src(f"s{i} = pypto.mul(x{i}, p{i})")
        src("y = pypto.add(pypto.add(s0, s1), pypto.add(s2, s3))")
        src(f"yb = {cast_expr('y', 'f32', out.dtype)}")
        loop.store("yb", out)
    return src.text()


def pypto_hc_post(spec: KernelSpec) -> str:
    a, x, post, comb = spec.operands
    out = spec.results[0]
    _, n, d = x.shape
    src = Src(spec.signature())
    loop = RowLoop(src, x, row_block(spec, default=8))
    br = loop.shape(x)[0]
    tile2d = vec_tile((br, d), 4)
    with loop.loop():
        _pto_tile(src, tile2d)
        src(f"af = {cast_expr(loop.view(a), a.dtype, 'f32')}")
        for i in range(n):
            _pto_stream_cols(loop, f"x{i}", x, i, 0, d, tile2d)
        for o in range(n):
            _pto_col(loop, "po", post, (o,), tile2d)
            src("y = pypto.mul(af, po)")
            for i in range(n):
                _pto_col(loop, "c", comb, (i, o), tile2d)
                src(f"y = pypto.add(y, pypto.mul(x{i}, c))")
            src(f"y3 = pypto.reshape(y, [{br}, 1, {d}]{_pto_valid(loop, 1, d)})")
            _pto_tile(src, (tile2d[0], 1, tile2d[1]))
            src(f"pypto.assemble(y3, [{_pto_r0(loop)}, {o}, 0], {out.name})")
            _pto_tile(src, tile2d)
    return src.text()


def _pto_mix_columns(loop: RowLoop, spec: KernelSpec, cols, tile2d) -> None:
    """Emit `m<j> = mixes[:, j]·inv_rms·hc_scale[g] + hc_base[j]` ([rows, 1] each) for j in `cols`, where g
    is the column's group (0: pre, 1: post, 2: comb), as the reference computes it: (mix·s) + b."""
    mixes, inv, scale, base = spec.operands
    n = int(spec.attrs.get("hc_mult", 4))
    br = loop.shape(mixes)[0]
    src = loop.src
    src(f"inv_v = pypto.reshape({loop.view(inv)}, [{br}, 1]{_pto_valid(loop, 1)})")
    src(f"sc = pypto.reshape({scale.name}, [1, {scale.shape[0]}])")
    src(f"bs = pypto.reshape({base.name}, [1, {base.shape[0]}])")
    for j in cols:
        group = 0 if j < n else 1 if j < 2 * n else 2
        _pto_col(loop, "mc", mixes, (j,), tile2d)
        src(f"m{j} = pypto.add(pypto.mul(pypto.mul(mc, inv_v), pypto.view(sc, [1, 1], [0, {group}])), "
            f"pypto.view(bs, [1, 1], [0, {j}]))")


def _pto_sigmoid(x: str) -> str:
    """1/(1 + exp(-x)) as the reference writes it (pypto.sigmoid breaks CPU numerics on partial tiles)."""
    return f"pypto.reciprocal(pypto.add(pypto.exp(pypto.neg({x})), 1.0))"


def pypto_split_pre_post(spec: KernelSpec) -> str:
    mixes = spec.operands[0]
    pre, post = spec.results
    n = int(spec.attrs.get("hc_mult", 4))
    eps = float(spec.attrs.get("eps", 1e-6))
    src = Src(spec.signature())
    loop = RowLoop(src, mixes, row_block(spec, default=8))
    br = loop.shape(mixes)[0]
    tile2d = [br, 8]
    with loop.loop():
        _pto_tile(src, tile2d)
        _pto_mix_columns(loop, spec, range(2 * n), tile2d)
        for j in range(2 * n):
            value = f"pypto.add({_pto_sigmoid(f'm{j}')}, {eps!r})" if j < n else f"pypto.mul({_pto_sigmoid(f'm{j}')}, 2.0)"
            target, col = (pre, j) if j < n else (post, j - n)
            src(f"pypto.assemble({value}, [{_pto_r0(loop)}, {col}], {target.name})")
    return src.text()


def pypto_comb_sinkhorn(spec: KernelSpec) -> str:
    """Softmax over `out` then Sinkhorn row/column normalisations, on the n·n columns [rows, 1] (the small
    axes are never a tile's last dim: pypto 0.2.0 reductions need 32-byte last axes)."""
    mixes = spec.operands[0]
    out = spec.results[0]
    n = int(spec.attrs.get("hc_mult", 4))
    iters = int(spec.attrs.get("iters", 20))
    eps = float(spec.attrs.get("eps", 1e-6))
    src = Src(spec.signature())
    loop = RowLoop(src, mixes, row_block(spec, default=8))
    br = loop.shape(mixes)[0]
    tile2d = [br, 8]
    c = [[f"c{i}_{o}" for o in range(n)] for i in range(n)]

    def row_sum(i):
        return _pto_chain("pypto.add", c[i])

    def col_sum(o):
        return _pto_chain("pypto.add", [c[i][o] for i in range(n)])

    with loop.loop():
        _pto_tile(src, tile2d)
        _pto_mix_columns(loop, spec, range(2 * n, 2 * n + n * n), tile2d)
        for i in range(n):
            src(f"mx = {_pto_chain('pypto.maximum', [f'm{2 * n + i * n + o}' for o in range(n)])}")
            for o in range(n):
                src(f"{c[i][o]} = pypto.exp(pypto.sub(m{2 * n + i * n + o}, mx))")
            src(f"den = {row_sum(i)}")
            for o in range(n):
                src(f"{c[i][o]} = pypto.add(pypto.div({c[i][o]}, den), {eps!r})")
        _pto_normalise_columns(src, c, col_sum, eps)
        for _ in range(iters - 1):
            for i in range(n):
                src(f"den = pypto.add({row_sum(i)}, {eps!r})")
                for o in range(n):
                    src(f"{c[i][o]} = pypto.div({c[i][o]}, den)")
            _pto_normalise_columns(src, c, col_sum, eps)
        _pto_tile(src, (br, 1, 8))
        for i in range(n):
            for o in range(n):
                src(f"pypto.assemble(pypto.reshape({c[i][o]}, [{br}, 1, 1]{_pto_valid(loop, 1, 1)}), "
                    f"[{_pto_r0(loop)}, {i}, {o}], {out.name})")
    return src.text()


def _pto_normalise_columns(src: Src, c, col_sum, eps: float) -> None:
    n = len(c)
    for o in range(n):
        src(f"den = pypto.add({col_sum(o)}, {eps!r})")
        for i in range(n):
            src(f"{c[i][o]} = pypto.div({c[i][o]}, den)")


def _pto_chain(fn: str, terms) -> str:
    """((t0 op t1) op t2) op ...: numpy's order for a sum of fewer than 8 elements."""
    expr = terms[0]
    for t in terms[1:]:
        expr = f"{fn}({expr}, {t})"
    return expr


PYPTO_TEMPLATES = {
    "split_pre_post": pypto_split_pre_post, "comb_sinkhorn": pypto_comb_sinkhorn,
    "hc_pre_rms": pypto_hc_pre_rms, "hc_pre_linear": pypto_hc_pre_linear,
    "hc_pre_linear_reduce": pypto_hc_pre_linear_reduce, "mix_x": pypto_mix_x, "hc_post": pypto_hc_post,
}
