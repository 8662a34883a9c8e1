"""hca-attn-workers and o-dequant-workers change grids only: the kernels they re-grid are generated to the same
source (the cost cache's key, so the same pypto cost and values) with and without them, and only the task's
block count differs (decode-hca, tiny TP2 and flash TP4, the default pipeline)."""
from __future__ import annotations

import pytest

from lowering import codegen, compile
from passes import PassContext

GRID_ONLY = ("hca-attn-workers", "o-dequant-workers")
FLASH_BLOCKS = {"hca.hca_raw_attn_request": 20, "hca.hca_cmp_qk_pv": 16, "o.tp_o_b_dequant": 48}   # flash TP4, after


def _tasks(config: str, tp: int, disabled: tuple[str, ...]):
    tg = compile("decode-hca", config=config, tp=tp, pipeline="default",
                 ctx=PassContext(use_env=False, disabled=list(disabled)), sources=False).tg
    return {t.name: (t, tg) for t in tg.kernels if t.name in FLASH_BLOCKS}


@pytest.mark.parametrize("config, tp", [("tiny", 2), ("flash", 4)])
def test_regridded_kernels_generate_the_same_source(config, tp):
    before, after = _tasks(config, tp, GRID_ONLY), _tasks(config, tp, ())
    assert set(before) == set(after) == set(FLASH_BLOCKS)
    for name, (t, tg) in after.items():
        was, was_tg = before[name]
        assert codegen.generate(t, codegen.template_of(t, tg), name="kernel") == codegen.generate(
            was, codegen.template_of(was, was_tg), name="kernel"), name
        assert t.blocks < was.blocks, name
        if config == "flash":
            assert t.blocks == FLASH_BLOCKS[name], name
