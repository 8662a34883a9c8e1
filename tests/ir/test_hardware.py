"""The one description of the modelled chip (dspark_ir/hardware.py) against its sources."""
from __future__ import annotations

import configparser
from importlib import util
from pathlib import Path

import pytest

from dspark_ir.hardware import HARDWARE, ITEMSIZE
from dspark_ir.types import DType


def _a2a3() -> configparser.ConfigParser:
    spec = util.find_spec("pypto")
    if spec is None or spec.origin is None:
        pytest.skip("pypto is not installed (its A2A3.ini is the source of these figures)")
    path = Path(spec.origin).parent / "lib" / "configs" / "A2A3.ini"
    if not path.exists():
        pytest.skip(f"{path} is missing")
    ini = configparser.ConfigParser(strict=False, interpolation=None)
    ini.read(path)
    return ini


def test_buffers_cores_and_rates_are_pyptos_platform_file():
    ini = _a2a3()
    core, soc = ini["AICoreSpec"], ini["SoCInfo"]
    assert (HARDWARE.cube_cores, HARDWARE.vector_cores) == (int(soc["cube_core_cnt"]), int(soc["vector_core_cnt"]))
    assert HARDWARE.l0a_bytes == int(core["l0_a_size"]) and HARDWARE.l0b_bytes == int(core["l0_b_size"])
    assert HARDWARE.l0c_bytes == int(core["l0_c_size"]) and HARDWARE.l1_bytes == int(core["l1_size"])
    assert HARDWARE.ub_bytes == int(core["ub_size"]) and HARDWARE.ub_block_bytes == int(core["ubblock_size"])
    assert HARDWARE.core_gm_bytes_per_cycle == int(ini["AICoreMemoryRates"]["ddr_rate"])
    m, k, n = (int(x) for x in ini["DtypeMKN"]["DT_INT8"].split(","))
    assert HARDWARE.cube_int8_ops_per_cycle == 2 * m * k * n and HARDWARE.min_k_tile(1) == k
    m, k, n = (int(x) for x in ini["DtypeMKN"]["Default"].split(","))
    assert HARDWARE.cube_flops_per_cycle == 2 * m * k * n and HARDWARE.min_k_tile(2) == k == HARDWARE.cube_fractal


def test_derived_figures():
    assert HARDWARE.clock_mhz == 1800 and HARDWARE.us(HARDWARE.clock_mhz) == 1.0
    assert HARDWARE.core_groups == HARDWARE.cores("mix") == 24
    assert HARDWARE.cores("none") == 0
    assert HARDWARE.with_(vector_cores=16).core_groups == 8


def test_dtype_sizes_are_the_irs():
    assert ITEMSIZE == {d.value: d.itemsize for d in DType if d is not DType.token}
    assert ITEMSIZE["bf16"] == 2 and ITEMSIZE["f32"] == 4 and ITEMSIZE["i8"] == 1 and "token" not in ITEMSIZE


def test_perf_and_the_harness_read_the_one_description():
    import kernels.pypto_rt.cycles as cycles
    import perf

    assert perf.HARDWARE is HARDWARE and cycles.CLOCK_MHZ == HARDWARE.clock_mhz
