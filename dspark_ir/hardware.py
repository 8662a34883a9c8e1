"""The modelled chip, Ascend 910B2, described once: every stage (passes, kernel templates, lowering, perf) reads it.

Nothing here is fitted to make an estimate come out: every number is a published, pypto-configured or
cost-model-observed figure, with its source below. `A2A3.ini` is pypto 0.2.0's `lib/configs/A2A3.ini`, the
platform file of its ASCEND_910B2 cost model.

| constant | value | source |
|---|---|---|
| clock | 1.8 GHz | the harness's cycles → µs (`kernels/pypto_rt/cycles.py`): pypto's merged swimlane converts cycles to µs at 1.8 GHz (notes pypto-0.2.0-on-cpu §4). `A2A3.ini` says `cube_freq=1850`; we keep 1.8 GHz so every µs here equals the harness's µs |
| AIC / AIV cores | 24 / 48 | `A2A3.ini [SoCInfo] cube_core_cnt=24, vector_core_cnt=48`; the cost model's stat report (`Cube Count 24`, `Vector Count 48`) |
| core groups | 24 | one group = 1 AIC + 2 AIV (`cube_vector_combine=split`): min(24, 48 / 2); a `mix` task's block takes one |
| L0A / L0B / L0C | 64 / 64 / 128 KiB | `A2A3.ini [AICoreSpec] l0_a_size=65536, l0_b_size=65536, l0_c_size=131072` (L0C holds the f32/i32 accumulator tile) |
| L1 | 512 KiB | `A2A3.ini l1_size=524288` |
| UB | 192 KiB, 32-byte blocks | `A2A3.ini ub_size=196608, ubblock_size=32`: a vector tile's last dim spans a multiple of 32 bytes |
| cube fractal | 16·16·16 (16-bit), 16·32·16 (int8) | `A2A3.ini cube_m/k/n_size=16`, `[DtypeMKN] Default=16,16,16, DT_INT8=16,32,16`; the narrowest K step per itemsize |
| HBM bandwidth | 1.6 TB/s | 910B2 HBM2e data sheet figure (also the public `HWConf` table of an Ascend modelling project: `local_memory_bandwidth=1.6 TB/s` for 910B2) |
| per-core GM rate | 32 B/cycle | `A2A3.ini [AICoreMemoryRates] ddr_rate=32`: one core cannot pull more than 57.6 GB/s |
| cube peak | 2·16·16·16 FLOP/cycle/AIC (int8 2·16·32·16) | the fractal above; 24 AICs × 8192 FLOP × 1.8 GHz = 353.9 TFLOPS, the published 910B2 figure (353.8) |
| vector peak | 64 fp32 (128 × 16-bit) lanes/cycle/AIV | `A2A3.ini vec_calc_size=128`; 48 AIVs × 128 × 2 (FMA) × 1.8 GHz = 22 TFLOPS fp16, the published figure |
| inter-chip link | 196 GB/s per chip | public `HWConf` 910B2 `intra_node_bandwidth=196 GB/s` (HCCS); the collectives' remote bytes only: the roofline's link term and the schedule model's rule 10 (perf/schedule.py) |
| AICPU dispatch | 930 cycles per task | pypto's cost-model parameters (`_simulate.config.ini` of every SIM run): `AICPU.completionCycles=240` + `resolveCycles=390` + `schedulerCycles=200` + `Device.submitLatency=100`: completion of a predecessor → resolve → schedule → submit |
| AICPU scheduler threads | 3 | the chip's AICPU runs 3 scheduler threads that dispatch the AICore blocks (pypto-lib public tuning notes of the DSpark decode layers; perf/calibration/facts.toml); the schedule model's block dispatchers |
| copy into L1 / UB | 1400 cycles + bytes / 95 B/cycle | read from the cost model's per-pipe logs: one MTE_IN pipe per core runs the copies one after the other (kernels/qkv.py, kernels/compressor.py notes) |
| task round | 4500 cycles | the cost model's gap before a core's next pypto task (dispatch and start latency), read from its swimlanes |
| AICPU scheduling | 270 cycles per pypto task | the cost model's serial scheduling of a kernel's pypto tasks, read from its swimlanes |
| dtype sizes | bf16/fp16 2, f32 4, fp8/i8/bool 1, i32 4, i64 8 | `dspark_ir.types.DType.itemsize` (`ITEMSIZE` below indexes it by dtype name) |

Vector "ops" are element operations at fp32 width (64 per cycle per AIV); cube "FLOPs" count a
multiply-add as 2. fp32 matmuls are bounded at the 16-bit cube rate (optimistic: the bound stays a bound).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .types import DType

KIB = 1024

# Bytes per element by dtype name (the names kernel specs and task arguments carry).
ITEMSIZE: dict[str, int] = {d.value: d.itemsize for d in DType if d is not DType.token}


@dataclass(frozen=True)
class Hardware:
    name: str = "ASCEND_910B2"
    clock_hz: float = 1.8e9
    cube_cores: int = 24                                    # AICs
    vector_cores: int = 48                                  # AIVs
    # ---- on-core buffers (bytes) ------------------------------------------------------------------
    l0a_bytes: int = 64 * KIB                               # a cube tile of the left operand
    l0b_bytes: int = 64 * KIB                               # a cube tile of the right operand
    l0c_bytes: int = 128 * KIB                              # the f32/i32 accumulator tile
    l1_bytes: int = 512 * KIB
    ub_bytes: int = 192 * KIB                               # the vector unit's buffer
    ub_block_bytes: int = 32                                # a vector tile's last dim spans a multiple of it
    cube_fractal: int = 16                                  # M, K and N step of a 16-bit cube op
    int8_k_fractal: int = 32                                # the K step of an int8 cube op
    # ---- rates ----------------------------------------------------------------------------------
    hbm_bytes_per_s: float = 1.6e12
    core_gm_bytes_per_cycle: float = 32.0
    cube_flops_per_cycle: float = 2 * 16 * 16 * 16          # per AIC, bf16/fp16 (and fp32, optimistic)
    cube_int8_ops_per_cycle: float = 2 * 16 * 32 * 16       # per AIC
    vector_ops_per_cycle: float = 64.0                      # per AIV, fp32 element ops
    link_bytes_per_s: float = 196e9
    # ---- dispatch and the cost model's per-task charges (cycles) ------------------------------------
    dispatch_cycles: int = 240 + 390 + 200 + 100            # AICPU: completion + resolve + schedule + submit
    copy_in_cycles: int = 1400                              # fixed cost of one copy into L1 / UB ...
    copy_in_bytes_per_cycle: int = 95                       # ... plus its bytes at this rate
    task_round_cycles: int = 4500                           # the gap before a core's next pypto task
    task_schedule_cycles: int = 270                         # the AICPU's scheduling per pypto task (serial)
    aicpu_schedulers: int = 3                               # AICPU threads that dispatch AICore blocks

    # ---- derived --------------------------------------------------------------------------------
    @property
    def clock_mhz(self) -> int:
        """Cycles per µs."""
        return round(self.clock_hz / 1e6)

    @property
    def core_groups(self) -> int:
        """1 AIC + 2 AIV each: the blocks of a `mix` task that run at once."""
        return min(self.cube_cores, self.vector_cores // 2)

    def min_k_tile(self, itemsize: int) -> int:
        """The narrowest cube K step for operands of `itemsize` bytes (DtypeMKN)."""
        return self.int8_k_fractal if itemsize == 1 else self.cube_fractal

    # ---- chip peaks -----------------------------------------------------------------------------
    @property
    def cube_peak_flops(self) -> float:
        return self.cube_cores * self.cube_flops_per_cycle * self.clock_hz

    @property
    def cube_peak_int8(self) -> float:
        return self.cube_cores * self.cube_int8_ops_per_cycle * self.clock_hz

    @property
    def vector_peak_ops(self) -> float:
        return self.vector_cores * self.vector_ops_per_cycle * self.clock_hz

    def cores(self, kind: str) -> int:
        """How many blocks of this core kind run at once: cube → AICs, vector → AIVs, mix → core groups."""
        if kind == "cube":
            return self.cube_cores
        if kind == "vector":
            return self.vector_cores
        if kind == "mix":
            return self.core_groups
        return 0

    def gm_bytes_per_s(self, cores: int) -> float:
        """GM bandwidth `cores` cores can draw: their per-core rate, capped by HBM."""
        return min(self.hbm_bytes_per_s, max(cores, 1) * self.core_gm_bytes_per_cycle * self.clock_hz)

    def us(self, cycles: float) -> float:
        return cycles / self.clock_hz * 1e6

    def cycles(self, seconds: float) -> float:
        return seconds * self.clock_hz

    def with_(self, **changes) -> "Hardware":
        return replace(self, **changes)

    def table(self) -> list[tuple[str, str]]:
        """(constant, value) rows for reports."""
        return [
            ("platform", self.name),
            ("clock", f"{self.clock_hz / 1e9:g} GHz"),
            ("cores", f"{self.cube_cores} AIC + {self.vector_cores} AIV"),
            ("HBM bandwidth", f"{self.hbm_bytes_per_s / 1e12:g} TB/s"),
            ("per-core GM rate", f"{self.core_gm_bytes_per_cycle:g} B/cycle"),
            ("cube peak bf16", f"{self.cube_peak_flops / 1e12:.1f} TFLOPS"),
            ("cube peak int8", f"{self.cube_peak_int8 / 1e12:.1f} TOPS"),
            ("vector peak fp32", f"{self.vector_peak_ops / 1e12:.2f} Tops/s"),
            ("inter-chip link", f"{self.link_bytes_per_s / 1e9:g} GB/s"),
            ("dispatch", f"{self.dispatch_cycles} cycles/task"),
        ]


HARDWARE = Hardware()
