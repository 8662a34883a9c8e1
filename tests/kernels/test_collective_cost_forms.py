"""The collectives' cost forms (kernels/collective.py) are one rank's own part, not tp times it: the all-to-all's
put reads every element of this rank's packed O groups once and writes its window once; the reduce-scatter
reads the tp partial row slices of this rank's rows once (tp·T·D) and writes its T rows once; the CP all-gather
push (decode_cp_allgather: every rank's window gets this rank's rows, its own included) writes this rank's rows
once per rank of the group, and the typed push the same window bytes. Checked on the generated source's views
and assembles (no pypto run)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from kernels.collective import (
    pypto_cp_allgather_local,
    pypto_cp_typed_allgather_local,
    pypto_o_group_a2a_local,
    pypto_tp_o_reduce_scatter_local,
)
from kernels.pto import KernelSpec, TensorArg

REGION = r"\[([0-9, ]+)\], \[([0-9, ]+)\]"


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def _count(shape, regions) -> np.ndarray:
    """How many times each element of a tensor of `shape` is covered by the (shape, offset) regions."""
    seen = np.zeros(shape, dtype=int)
    for size, offset in regions:
        seen[tuple(slice(o, o + n) for o, n in zip(offset, size))] += 1
    return seen


def _views(src: str, name: str):
    return [(_ints(s), _ints(o)) for s, o in re.findall(rf"pypto\.view\({name}, {REGION}\)", src)]


@pytest.mark.parametrize("tp, groups, tokens, width", [(4, 8, 4, 16), (2, 4, 3, 8), (8, 8, 2, 4)])
def test_the_all_to_all_cost_form_moves_this_ranks_groups_once(tp, groups, tokens, width):
    lg = groups // tp
    spec = KernelSpec("k", "o_group_a2a", (TensorArg("packed", (groups, tokens, width), "bf16"),),
                      (TensorArg("out", (lg, tp * tokens, width), "bf16"),), {"tp": tp, "t_pad": 1})
    src = pypto_o_group_a2a_local(spec)
    reads = _views(src, "packed")
    assert (_count((groups, tokens, width), reads) == 1).all()
    writes = [(size, _ints(o)) for (size, _), o in zip(reads, re.findall(r"pypto\.assemble\(y, \[([0-9, ]+)\], out\)",
                                                                        src))]
    assert len(writes) == tp and (_count((lg, tp * tokens, width), writes) == 1).all()


@pytest.mark.parametrize("tp, rows, hidden", [(4, 4, 8), (2, 3, 16), (8, 2, 4)])
def test_the_reduce_scatter_cost_form_reads_tp_slices_of_this_ranks_rows_once(tp, rows, hidden):
    spec = KernelSpec("k", "tp_o_reduce_scatter", (TensorArg("partial", (tp * rows, hidden), "f32"),),
                      (TensorArg("out", (rows, hidden), "bf16"),), {"tp": tp, "out": "bf16"})
    src = pypto_tp_o_reduce_scatter_local(spec)
    reads = _views(src, "partial")
    assert len(reads) == tp and all(size == (rows, hidden) for size, _ in reads)
    assert (_count((tp * rows, hidden), reads) == 1).all()
    assert len(re.findall(r"pypto\.assemble\(", src)) == 1 and "[0, 0], out)" in src


def _assembled(src: str, out: str, spans: dict[str, int]) -> list[tuple[tuple[int, int], tuple[int, ...]]]:
    """(size, offset) of every assemble into `out`, its size that of the view cloned just before it, in `out`'s
    columns (`spans`: bf16 columns per column of each source, 2 for an f32 read as its bit pairs)."""
    out_regions, last = [], None
    for line in src.splitlines():
        view = re.search(rf"pypto\.view\((\w+), {REGION}\)", line)
        if view:
            last = view.group(1), _ints(view.group(2))
        put = re.search(rf"pypto\.assemble\(.*, \[([0-9, ]+)\], {out}\)", line)
        if put:
            name, (rows, cols) = last
            out_regions.append(((rows, cols * spans.get(name, 1)), _ints(put.group(1))))
    return out_regions


@pytest.mark.parametrize("tp, rows, cols", [(4, 4, 16), (2, 3, 8), (8, 2, 32)])
def test_the_cp_push_cost_form_writes_this_ranks_rows_into_every_ranks_window_once(tp, rows, cols):
    spec = KernelSpec("k", "cp_allgather", (TensorArg("payload", (rows, cols), "bf16"),),
                      (TensorArg("window", (tp * rows, cols), "bf16"),), {"tp": tp})
    src = pypto_cp_allgather_local(spec)
    assert all(r == ((rows, cols), (0, 0)) for r in _views(src, "payload"))
    assert (_count((tp * rows, cols), _assembled(src, "window", {})) == 1).all()


@pytest.mark.parametrize("tp, rows, width, kv", [(4, 4, 8, 16), (2, 3, 16, 0), (8, 2, 4, 8)])
def test_the_typed_cp_push_cost_form_writes_the_same_window_bytes_as_the_untyped_one(tp, rows, width, kv):
    ins = (TensorArg("values", (rows, width), "f32"), TensorArg("scores", (rows, width), "f32"))
    ins += (TensorArg("kv", (rows, kv), "bf16"),) if kv else ()
    window = TensorArg("window", (tp * rows, 4 * width + kv), "bf16")
    src = pypto_cp_typed_allgather_local(KernelSpec("k", "cp_typed_allgather", ins, (window,), {"tp": tp}))
    regions = _assembled(src, "window", {"values": 2, "scores": 2})
    assert (_count(window.shape, regions) == 1).all()
    assert src.count("dtype=pypto.DT_BF16") == 2 * tp         # the f32 parts go as their bits, the kv as it is
