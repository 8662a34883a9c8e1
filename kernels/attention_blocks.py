"""pypto 0.2.0 building blocks shared by the attention templates (kernels/attention.py for SWA, kernels/sparse.py
for CSA and HCA): the key-major tile partial of one token's key tile with 2-D cube matmuls and the window
partials built on it (`PtoWindowAttn`), and the head-group merge, sink normalisation, inverse RoPE and
group-major pack (`PtoGroupMerge`). The numerics they emit are those of kernels/sparse.py's module docstring
(dsv4-math §6.2); the cost reasoning is in the class docstrings and in kernels/sparse.py's template section.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from dspark_ir.hardware import HARDWARE

from .pto import L0A_BYTES, L0B_BYTES, L0C_BYTES, Src, cast_expr
from .vector import pto_divisor, pto_namer, pto_pairwise_tree, pto_scope, pto_set_tile, pto_swap_index

PTO_NEG_ATTN = -1.0e20   # NEG_INF_ATTN
PTO_TILE_ELEMS = 8192   # 32 KiB of f32 per operand tile
_PTO_QK_ROWS = 4         # tokens per loop iteration of the window partials (SWA, HCA raw window): two pairs
PTO_CSA_QK_ROWS = 4     # tokens per loop iteration of the CSA partials


def pto_head_tile(rows: int, heads: int, width: int, elems: int = PTO_TILE_ELEMS) -> list[int]:
    """[rows, a divisor of heads, width]: the whole block's rows, as many heads as `elems` allows."""
    return [rows, pto_divisor(heads, max(1, elems // max(1, rows * width))), width]


_PTO_L1_BYTES = HARDWARE.l1_bytes * 3 // 4  # the L1 share of one cube tile's A and B slices (L1 is 512 KiB)


def pto_cube_wide(m: int, k: int, n: int, deep: bool = False, tm_max: int = 128) -> str:
    """bf16 cube tiles for an [m, k]·[k, n] product: m ≤ 128, n up to 512 (a whole output row of ≤ 128 KiB in one
    L0C tile), k as deep as L0A / L0B (64 KiB each) allow. pypto makes one task per output tile (whatever the k
    steps), so wide tiles mean few tasks. `deep`: the L1 k tile as many L0 k steps as the A and B slices fit in
    L1 (each L1 step is a fixed-latency reload from global memory in pypto's cost model); `tm_max`: more rows of m
    in one L0C tile (up to 512 for a narrow n)."""
    tm = min(tm_max, max(16, -(-m // 16) * 16))
    tn = min(512, max(16, -(-n // 16) * 16))
    while tm * tn * 4 > L0C_BYTES and tn > 16:
        tn //= 2
    while tm * tn * 4 > L0C_BYTES and tm > 16:
        tm //= 2
    tk = min(512, max(16, -(-k // 16) * 16))
    while (tm * tk * 2 > L0A_BYTES or tk * tn * 2 > L0B_BYTES) and tk > 16:
        tk = max(16, tk // 32 * 16)  # halved, kept a multiple of 16 (pypto: "kL0 … must be aligned to 16")
    tk1 = tk
    while deep and tk1 * 2 <= -(-k // tk) * tk and (tm + tn) * tk1 * 4 <= _PTO_L1_BYTES:
        tk1 *= 2
    return f"[{tm}, {tm}], [{tk}, {tk1}], [{tn}, {tn}]"


def pto_key_tile(heads: int, width: int) -> list[int]:
    """The [width, H] tile of the key-major softmax: every key row (its reductions run over them), as many heads
    as PTO_TILE_ELEMS allows (a 32-byte last dim at least)."""
    cols = heads if width * heads <= PTO_TILE_ELEMS else pto_divisor(heads, max(8, PTO_TILE_ELEMS // width))
    return [width, max(cols, 8)]


def pto_row_to_col(src: Src, row: str, n: int, col: str) -> None:
    """`col` [n, 1] = the f32 [1, n] row `row` as a column: broadcast to [8, n], transposed, its first column
    (inside the UB: a view of a row block, unlike a reshape of [1, n] to [n, 1])."""
    pto_set_tile(src, [8, max(n, 8)])
    src(f"{col}8 = pypto.transpose(pypto.expand_clone({row}, [8, {n}]), 0, 1)")
    pto_set_tile(src, [n, 8])
    src(f"{col} = pypto.view({col}8, [{n}, 1], [0, 0])")


def pto_key_softmax(src: Src, st: str, heads: int, width: int, scale: float, tile, pb: str) -> None:
    """The key-major softmax of one token's key tile: (mr [1, H], lr [1, H], `pb` bf16 [width, H]) from the scores
    `st` = K·qᵀ [width, H] (f32), valid where vc [width, 1] ≥ 0: ·scale → −1e20 where not valid, m = the max over
    the key rows, p = exp(s − m) (0 where not valid), l = numpy's pairwise Σp over the key rows (adds of aligned
    row views: nothing goes through global memory), bf16(p) for the P·V matmul. m and l come out as [1, H]
    rows, the layout of the m, l outputs."""
    pto_set_tile(src, tile)
    src(f"ok = pypto.ge(pypto.expand_clone(vc, [{width}, {heads}]), 0.0)")
    src(f"st = pypto.where(ok, pypto.mul({st}, {scale!r}), {PTO_NEG_ATTN!r})")
    src("mr = pypto.amax(st, 0, keepdim=True)")
    src("pt = pypto.where(ok, pypto.exp(pypto.sub(st, mr)), 0.0)")
    pto_set_tile(src, [8, tile[1]])
    rows = pto_pairwise_tree(src, pto_namer("ps"), lambda t, off, k: f"pypto.view({t}, [{k}, {heads}], [{off}, 0])",
                              "pt", 0, width)
    src(f"lr = {rows}")
    pto_set_tile(src, tile)
    src(f"{pb} = pypto.cast(pt, pypto.DT_BF16, pypto.CastMode.CAST_RINT)")


class PtoWindowAttn:
    """The per-token attention partials (m, l [T, H], o [T, H, HD]) of q [T, H, HD] over each token's own key rows
    rows [T, W, HD] (SWA qk_pv, the HCA raw window), in k_tile-wide tiles merged in order, as 2-D cube matmuls
    on in-place 2-D reshapes of q and rows (a view reshaped to another rank is a copy through global memory),
    key-major: sᵀ = K·qᵀ [W, H], so the softmax reduces over rows and m, l are [1, H] rows of the outputs, then
    o = bf16(p)ᵀ·K. `valid_row(tok, a, n, rows)` emits `vr` [rows, n] (f32, ≥ 0 where key a + j of token tok + r is
    valid).

    The kernel is static in T (callers pass `spec.static()`): pypto 0.2.0 mis-aligns an in-place reshape that
    merges a dynamic axis (its SplitReshape pass reads past its aligned shape; the compile-only pipeline fails
    at random). Cost (pypto's cost model): a task costs its core about one AICPU polling round (~2–4 µs) and a
    dependency edge 390 AICPU cycles, so the loop body has no per-token `if` (blocks of _PTO_QK_ROWS tokens, then
    single tokens), each token's validity is read inside its softmax task, and a single-tile window pairs two
    tokens in one q·Kᵀ task ([2W, HD]·[2H, HD]ᵀ, one L0C tile whose diagonal blocks are the two tokens' scores;
    the off-diagonal products are never read) and one softmax task (their validity rows are one op). o goes
    through a 2-D workspace reshaped in place to 3-D (reshaping the matmul result itself costs a copy task;
    assembling into an in-place reshape of the output is dropped by pypto).

    `lookahead` (pypto-lib #1187's QK look-ahead across queries, set by hca-attn-dual-aiv): within one loop
    iteration's unrolled units (a pair or a token), the q·Kᵀ of the unit `lookahead` queries ahead is emitted
    before the softmax and P·V of the current one (upstream issues query i + 2's QK before query i's PV). Every
    unit keeps its own score tile (st{u}), so the values are those of the plain order. pypto 0.2.0 has no
    cross-core events or transfer slots: the emitted order is the program order its graph partitioning sees, and
    its runtime still dispatches the tasks by their data dependencies; the look-ahead cannot reach across loop
    iterations (each iteration is its own subgraph set), so it spans the _PTO_QK_ROWS tokens of one iteration."""

    def __init__(self, src: Src, q, rows, outs, k_tile: int, scale: float, valid_row, lookahead: int = 0):
        self.src, self.q, self.rows, self.valid_row = src, q, rows, valid_row
        self.m_out, self.l_out, self.o_out = outs
        self.ntok, self.heads, self.hd = q.shape
        self.window = rows.shape[1]
        self.k_tile, self.scale = k_tile, scale
        self.tiles = list(range(0, self.window, k_tile))
        w, h = self.window, self.heads
        self.pair = len(self.tiles) == 1 and h % 8 == 0 and 2 * w <= 256 and 4 * w * h * 4 <= L0C_BYTES
        self.tile = pto_key_tile(h, k_tile)
        self.o_tile = pto_head_tile(1, h, self.hd, 2 * PTO_TILE_ELEMS)[1:]
        self.scope = 0
        self.score_rows = 128    # key rows of one L0C tile of the q·Kᵀ scores (tm_max of pto_cube_wide)
        self.lookahead = lookahead

    def emit(self) -> None:
        src, n, br = self.src, self.ntok, _PTO_QK_ROWS
        if n >= br:
            with src.block(f'for blk in pypto.loop(0, {n // br}, 1, name="tok_loop", idx_name="blk"):'):
                self._flat()
                step = 2 if self.pair else 1
                unit = self._pair if self.pair else self._token
                self.issue([(self._pair_qk if self.pair else self._token_qk, unit, f"blk * {br} + {t}")
                            for t in range(0, br, step)], step)
        if n % br:
            with src.block(f'for r1 in pypto.loop({n // br * br}, {n}, 1, name="tail_loop", idx_name="r1"):'):
                self._flat()
                self._token("r1")

    def key_row(self, tok: str) -> str:
        """The first row of token `tok`'s keys in kf (the rows reshaped to 2-D): its own W rows."""
        return f"({tok}) * {self.window}"

    def _flat(self) -> None:
        """qf, kf = q, rows reshaped in place to 2-D, in the loop body (at the top of the kernel the reshape's
        dependency fan-out to every task delays them)."""
        for t, name in ((self.q, "qf"), (self.rows, "kf")):
            self.src(f"{name} = pypto.reshape({t.name}, [{t.shape[0] * t.shape[1]}, {t.shape[2]}], inplace=True)")

    def _validity(self, tok: str, a: int, rows: int) -> None:
        """vr [rows, k_tile] = the validity rows of tokens tok … tok + rows − 1 (one op: a pair's two softmax
        chains share it, which makes them one task)."""
        pto_set_tile(self.src, [rows, max(self.k_tile, 8)])
        self.valid_row(tok, a, self.k_tile, rows)

    def _softmax(self, row: int, st: str, pb: str) -> None:
        """The softmax of row `row` of vr: its validity column vc, then `pto_key_softmax`."""
        src, n = self.src, self.k_tile
        pto_set_tile(src, [1, max(n, 8)])
        src(f"vr1 = pypto.view(vr, [1, {n}], [{row}, 0])")
        pto_row_to_col(src, "vr1", n, "vc")
        pto_key_softmax(src, st, self.heads, n, self.scale, self.tile, pb)

    def _store_ml(self, tok: str, m: str, l: str) -> None:
        pto_set_tile(self.src, [1, max(self.heads, 8)])
        for name, t in ((m, self.m_out), (l, self.l_out)):
            self.src(f"pypto.assemble({name}, [{tok}, 0], {t.name})")

    def _pv(self, tok: str, a: int, pb: str) -> None:
        """oi [H, HD] = bf16(p)ᵀ·K of key tile a of token tok."""
        src, n, hd = self.src, self.k_tile, self.hd
        src(f"pypto.set_cube_tile_shapes({pto_cube_wide(self.heads, n, hd, deep=True)})")
        src(f"oi = pypto.matmul({pb}, pypto.view(kf, [{n}, {hd}], [{self.key_row(tok)} + {a}, 0]), pypto.DT_FP32, "
            "a_trans=True)")

    def _store_o(self, tok: str, parts) -> None:
        """Assemble the [H, HD] partials `parts` (consecutive tokens from tok) into o [T, H, HD]: through a 2-D
        workspace reshaped in place to 3-D (no copy; reshaping the matmul result itself costs one)."""
        src, h, hd, n = self.src, self.heads, self.hd, len(parts)
        pto_set_tile(src, self.o_tile)
        src(f'ow = pypto.tensor([{n * h}, {hd}], {self.o_out.pto}, "ow")')
        for i, p in enumerate(parts):
            src(f"pypto.assemble({p}, [{i * h}, 0], ow)")
        pto_set_tile(src, [1] + self.o_tile)
        src(f"pypto.assemble(pypto.reshape(ow, [{n}, {h}, {hd}], inplace=True), [{tok}, 0, 0], {self.o_out.name})")

    def issue(self, units, queries: int) -> None:
        """Emit the units (qk, rest, tok) of one loop iteration, each of `queries` queries: in order (qk then rest
        of each) without a look-ahead; else the q·Kᵀ of the unit ceil(lookahead / queries) ahead before the rest
        of the current one, each unit's scores in a tile of its own (st{u}, the rest reading them)."""
        if not self.lookahead:
            for _qk, rest, tok in units:
                rest(tok)
            return
        ahead = -(-self.lookahead // queries)
        scores = [f"st{u}" for u in range(len(units))]
        for u in range(min(ahead, len(units))):
            units[u][0](units[u][2], scores[u])
        for u, (_qk, rest, tok) in enumerate(units):
            if u + ahead < len(units):
                units[u + ahead][0](units[u + ahead][2], scores[u + ahead])
            rest(tok, scores[u])

    def _token_qk(self, tok: str, scores: str) -> None:
        """The q·Kᵀ of every key tile of token tok, tile i into `scores`_i."""
        for i, a in enumerate(self.tiles):
            self._score(tok, a, f"{scores}_{i}")

    def _score(self, tok: str, a: int, st: str) -> None:
        src, h, hd, n = self.src, self.heads, self.hd, self.k_tile
        src(f"pypto.set_cube_tile_shapes({pto_cube_wide(n, hd, h, deep=True, tm_max=self.score_rows)})")
        src(f"{st} = pypto.matmul(pypto.view(kf, [{n}, {hd}], [{self.key_row(tok)} + {a}, 0]), "
            f"pypto.view(qf, [{h}, {hd}], [({tok}) * {h}, 0]), pypto.DT_FP32, b_trans=True)")

    def _token(self, tok: str, scores: str | None = None) -> None:
        """Token tok's partials; `scores`: its tiles' q·Kᵀ already issued (`_token_qk`), else each is issued here."""
        src, h = self.src, self.heads
        for i, a in enumerate(self.tiles):
            if scores is None:
                self._score(tok, a, "st1")
            self.scope += 1
            pto_scope(src, self.scope)
            self._validity(tok, a, 1)
            self._softmax(0, "st1" if scores is None else f"{scores}_{i}", "pb")
            pto_scope(src, -1)
            self._pv(tok, a, "pb")
            if i == 0:
                src("m_acc, l_acc, o_acc = mr, lr, oi")
                continue
            pto_set_tile(src, [1, max(h, 8)])  # the running merge: m, l rows; o by [H, 1] columns
            src("big = pypto.maximum(m_acc, mr)")
            src("ea = pypto.exp(pypto.sub(m_acc, big))")
            src("eb = pypto.exp(pypto.sub(mr, big))")
            src("l_acc = pypto.add(pypto.mul(ea, l_acc), pypto.mul(eb, lr))")
            src("m_acc = big")
            pto_row_to_col(src, "ea", h, "eac")
            pto_row_to_col(src, "eb", h, "ebc")
            pto_set_tile(src, self.o_tile)
            src("o_acc = pypto.add(pypto.mul(eac, o_acc), pypto.mul(ebc, oi))")
        self._store_ml(tok, "m_acc", "l_acc")
        self._store_o(tok, ["o_acc"])

    def _pair_qk(self, tok: str, scores: str = "st2") -> None:
        """The one q·Kᵀ task of tokens tok and tok + 1 into `scores`."""
        src, h, hd, w = self.src, self.heads, self.hd, self.window
        src(f"pypto.set_cube_tile_shapes({pto_cube_wide(2 * w, hd, 2 * h, deep=True, tm_max=256)})")
        src(f"{scores} = pypto.matmul(pypto.view(kf, [{2 * w}, {hd}], [({tok}) * {w}, 0]), "
            f"pypto.view(qf, [{2 * h}, {hd}], [({tok}) * {h}, 0]), pypto.DT_FP32, b_trans=True)")

    def _pair(self, tok: str, scores: str | None = None) -> None:
        """Tokens tok and tok + 1 (single-tile window): one q·Kᵀ task (issued here unless `scores` names its
        result), then per token its softmax and P·V."""
        src, h, w = self.src, self.heads, self.window
        if scores is None:
            self._pair_qk(tok)
            scores = "st2"
        self.scope += 1
        pto_scope(src, self.scope)
        self._validity(tok, 0, 2)
        for u in range(2):
            self._softmax(u, f"pypto.view({scores}, [{w}, {h}], [{u * w}, {u * h}])", f"pb{u}")
            self._store_ml(f"{tok} + {u}", "mr", "lr")
        pto_scope(src, -1)
        for u in range(2):
            self._pv(f"{tok} + {u}", 0, f"pb{u}")
            src(f"oi{u} = oi")
        self._store_o(tok, ["oi0", "oi1"])


_PTO_GROUP_TOKENS = 32   # tokens per task of a one-stream head-group pack (flash: 4 blocks × 8 groups = 32 tasks)
PTO_VECTOR_CORES = HARDWARE.vector_cores


class PtoGroupMerge:
    """Merges, sink normalisation and inverse-RoPE packs on tasks of (head group g, block of n tokens): one forced
    subgraph per loop iteration over the flattened (block, group) index. Per-head quantities (m, l, the merge
    factors, the denominator) are [n, hg] boxes; each head j of the group is an [n, HD] box of the heads flattened
    to [T, H·HD] (in place, at the top), its factors broadcast over HD by a `pypto.gather` with the all-j index
    (a column view at an unaligned offset would go through global memory). A packed head is assembled straight
    into out [G, T, hg·HD] at [g, t0, j·HD] (its [n, HD] block with a leading unit axis, a free reshape in the UB).
    Static T; when n does not divide T, the last block is moved back to end at T (it rewrites rows of the block
    before it with the same values).

    Cost (pypto's cost model): the copy-in pipe is the bound, ~1.4 k cycles fixed per copy, so a task reads each
    small operand once (its [n, hg] boxes and [n, rd] tables) and each head in ≤ 32 KiB tiles (larger ones spill
    the UB); at most one task per vector core."""

    def __init__(self, src: Src, ntok: int, heads: int, hd: int, groups: int, streams: int = 1,
                 tokens: int | None = None):
        self.src, self.ntok, self.heads, self.hd, self.groups = src, ntok, heads, hd, groups
        self.hg = heads // groups
        # tokens per task: a task's time is about its number of 32 KiB copies; one stream of heads (pack only):
        # 32-token tasks; more streams (state and items): as many tasks as vector cores, each shorter; `tokens`:
        # the caller's tile (a publish tile)
        n = tokens or (_PTO_GROUP_TOKENS if streams == 1 else -(-ntok * groups // PTO_VECTOR_CORES))
        self.n = max(1, min(ntok, n))
        self.tr = pto_divisor(self.n, max(1, PTO_TILE_ELEMS // hd))
        self.items = 0

    @contextmanager
    def blocks(self) -> Iterator[None]:
        """The loop over (token block, group), one forced subgraph per iteration; sets t0, gg, h0."""
        src, n, g = self.src, self.n, self.groups
        nb = -(-self.ntok // n)
        with src.block(f'for blk in pypto.loop(0, {nb * g}, 1, name="grp_loop", idx_name="blk"):'):
            t0 = f"blk // {g} * {n}"
            src(f"t0 = {t0 if nb * n == self.ntok else f'pypto.min({t0}, {self.ntok - n})'}")
            src(f"gg = blk % {g}")
            src(f"h0 = gg * {self.hg}")
            pto_scope(src, 1)
            yield
            pto_scope(src, -1)

    def cols(self, t, col: str = "h0", row: str = "t0") -> str:
        """The [n, hg] box of the 2-D per-head tensor t at column `col`."""
        return f"pypto.view({t}, [{self.n}, {self.hg}], [{row}, {col}])"

    def head(self, t, col: str) -> str:
        """An [n, HD] box of a flattened [T, ··HD] tensor at column `col`."""
        return f"pypto.view({t}, [{self.n}, {self.hd}], [t0, {col}])"

    def _col_tile(self) -> None:
        pto_set_tile(self.src, [self.n, max(self.hg, 8)])

    def load_state(self, m: str, l: str) -> None:
        """(m_acc, l_acc) [n, hg] = the [n, hg] boxes m, l (of the state, or of the first item)."""
        self._col_tile()
        self.src(f"m_acc = {m}")
        self.src(f"l_acc = {l}")

    def merge_item(self, mi: str, li: str) -> int:
        """Fold one item's (m, l) boxes into (m_acc, l_acc) in the reference's f32 order (merge_into); keeps its
        factors as ea{i}, eb{i} for the heads. Returns i."""
        src, i = self.src, self.items
        self.items += 1
        self._col_tile()
        src(f"big = pypto.maximum(m_acc, {mi})")
        src(f"ea{i} = pypto.exp(pypto.sub(m_acc, big))")
        src(f"eb{i} = pypto.exp(pypto.sub({mi}, big))")
        src(f"l_acc = pypto.add(pypto.mul(ea{i}, l_acc), pypto.mul(eb{i}, {li}))")
        src("m_acc = big")
        return i

    def denominator(self, sink2: str) -> None:
        """den [n, hg] = l_acc + exp(sink[h] − m_acc) (f32; a fully masked token gives 0 / inf = 0); sink2 is the
        sink as a [1, H] row."""
        self._col_tile()
        self.src(f"den = pypto.add(l_acc, pypto.exp(pypto.sub(pypto.view({sink2}, [1, {self.hg}], [0, h0]), m_acc)))")

    def spread(self, col: str) -> str:
        """The column j of the [n, hg] box `col` as an aligned [n, 1] column (broadcast over HD by its consumer):
        the first column of its gather with the all-j index idx [n, 8] (a view at column j would go through
        global memory)."""
        return f"pypto.view(pypto.gather({col}, 1, idx), [{self.n}, 1], [0, 0])"

    def head_loop(self):
        """Per head j of the group (yields j), with idx = the all-j index [n, 8] and the [n, HD] tile set."""
        for j in range(self.hg):
            self._col_tile()
            self.src(f"idx = pypto.full([{self.n}, 8], {j}, pypto.DT_INT32)")
            pto_set_tile(self.src, [self.tr, self.hd])
            yield j

    def merge_head(self, i: int, oi: str) -> None:
        """o_acc ← ea·o_acc + eb·oi for item i (the factors spread over HD)."""
        ea, eb = self.spread(f"ea{i}"), self.spread(f"eb{i}")
        self.src(f"o_acc = pypto.add(pypto.mul({ea}, o_acc), pypto.mul({eb}, {oi}))")

    def normalize_head(self) -> None:
        self.src(f"y = pypto.div(o_acc, {self.spread('den')})")

    def tables(self, cos_il, sin_signed, swap: str | None) -> None:
        """cb, sb [n, rd] f32 = the block's rows of the RoPE tables; si [n, rd] i32 = the lane permutation (the swap
        input, or j ^ 1 when `swap` is None) broadcast over the rows."""
        src, n = self.src, self.n
        rd = cos_il.shape[1]
        if swap is None:
            pto_swap_index(src, rd, "swi")
            swap = "swi"
        pto_set_tile(src, [n, max(rd, 8)])
        src(f"si = pypto.expand_clone(pypto.reshape({swap}, [1, {rd}]), [{n}, {rd}])")
        for name, t in (("cb", cos_il), ("sb", sin_signed)):
            src(f"{name} = {cast_expr(f'pypto.view({t.name}, [{n}, {rd}], [t0, 0])', t.dtype, 'f32')}")

    def pack_head(self, j: int, rd: int, out, window_groups: int | None = None) -> None:
        """Inverse RoPE of y's last rd lanes (r·c − r[swap]·s), one bf16 rounding of each part, the head assembled
        into out [G, T, hg·HD] at [g, t0, j·HD]; with `window_groups` = LG, into the exchange window out
        [LG, tp·T_PAD, hg·HD] at [g mod LG, (g div LG)·T + t0, j·HD] (group g's owner rank g div LG, its row block of
        this rank's tokens; pypto-lib #1170 (b): the tile goes from the UB to the window, no packed tensor)."""
        src, n, hd, tr = self.src, self.n, self.hd, self.tr
        nope = hd - rd
        pto_set_tile(src, [tr, max(rd, 8)])
        src(f"rp = pypto.view(y, [{n}, {rd}], [0, {nope}])")
        src("ro = pypto.sub(pypto.mul(rp, cb), pypto.mul(pypto.gather(rp, 1, si), sb))")
        pto_set_tile(src, [tr, hd])
        rob = cast_expr("ro", "f32", out.dtype)
        if nope:
            ynb = cast_expr(f"pypto.view(y, [{n}, {nope}], [0, 0])", "f32", out.dtype)
            src(f"z = pypto.concat([{ynb}, {rob}], -1)")
        else:
            src(f"z = {rob}")
        pto_set_tile(src, [1, tr, hd])
        at = ("gg, t0" if window_groups is None
              else f"gg % {window_groups}, gg // {window_groups} * {self.ntok} + t0")
        src(f"pypto.assemble(pypto.reshape(z, [1, {n}, {hd}]), [{at}, {j * hd}], {out.name})")

    def stage_head(self, j: int) -> None:
        """y into the f32 scratch hs{j} [n, HD] (a workspace: written here, read back by `unstage_head` in the next
        subgraph, so it goes through global memory)."""
        self.src(f'hs{j} = pypto.tensor([{self.n}, {self.hd}], pypto.DT_FP32, "hs{j}")')
        self.src(f"pypto.assemble(y, [0, 0], hs{j})")

    def unstage_head(self, j: int) -> None:
        self.src(f"y = pypto.view(hs{j}, [{self.n}, {self.hd}], [0, 0])")

    def next_subgraph(self) -> None:
        """Close the block's forced subgraph and open a second one (the staged heads cross between them)."""
        pto_scope(self.src, -1)
        pto_scope(self.src, 2)

    def store_head(self, j: int, out) -> None:
        """y into out [T, H, HD] at [t0, h0 + j, 0]: through an [n, HD] workspace reshaped in place to [n, 1, HD]."""
        src, n, hd, tr = self.src, self.n, self.hd, self.tr
        src(f'ow = pypto.tensor([{n}, {hd}], {out.pto}, "ow")')
        src("pypto.assemble(y, [0, 0], ow)")
        pto_set_tile(src, [tr, 1, hd])
        src(f"pypto.assemble(pypto.reshape(ow, [{n}, 1, {hd}], inplace=True), [t0, h0 + {j}, 0], {out.name})")
