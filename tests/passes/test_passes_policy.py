"""Policy (passes/infra/policy.py) apart from the rewrites: pass options default to it, no pass names a config."""
from __future__ import annotations

import ast
from pathlib import Path

import passes
from dspark_ir import parse_graph
from dspark_ir.hardware import HARDWARE
from passes import get_pass
from passes.infra import policy
from passes.infra.registry import pass_modules

CONFIG_NAMES = {"flash", "tiny"}


def test_no_pass_module_chooses_by_config_name():
    package = Path(passes.__file__).parent
    for name in pass_modules():
        path = package / f"{name.replace('-', '_')}.py"
        strings = {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)}
        assert not strings & CONFIG_NAMES, f"{path.name} names a config: move the choice to passes/infra/policy.py"


def test_options_default_to_the_policy():
    assert get_pass("split-m-fanout")().ways == policy.SPLIT_M_WAYS
    assert get_pass("split-m-fanout")().cores == HARDWARE.cube_cores
    assert get_pass("quant-workers")().workers == policy.QUANT_WORKERS
    assert get_pass("dequant-workers")().workers == get_pass("fuse-merge-rope-pack")().workers == HARDWARE.vector_cores
    assert get_pass("widen-tile")().max_ub_bytes == HARDWARE.ub_bytes
    assert get_pass("pool-fanout")().requests == policy.POOL_REQUESTS


def test_writeback_tile_rows_by_config():
    def graph(config: str) -> str:
        return f'graph @g(%x: f32[4]) attributes {{config = "{config}"}} {{\n  return %x\n}}\n'

    assert policy.writeback_tile_rows(parse_graph(graph("tiny"))) == 8
    assert policy.writeback_tile_rows(parse_graph(graph("flash"))) == 32
    assert policy.writeback_tile_rows(parse_graph(graph("other"))) == policy.WRITEBACK_TILE_ROWS_OTHER
