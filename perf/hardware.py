"""Ascend 910B2 constants used by the roofline and the schedule model, each with its source.

Nothing here is fitted to make an estimate come out: every number is a published or pypto-configured
figure (sources beside each constant), and `HARDWARE` is the one object the rest of `perf` reads.

| constant | value | source |
|---|---|---|
| clock | 1.8 GHz | kernels/pypto_rt/cycles.py (`CLOCK_MHZ`): pypto's merged swimlane converts cycles to µs at 1.8 GHz (notes pypto-0.2.0-on-cpu §4). pypto's A2A3.ini says `cube_freq=1850`; we keep the harness's 1.8 GHz so every µs here equals the harness's µs |
| AIC / AIV cores | 24 / 48 | cost-model stat report (`Cube Count 24`, `Vector Count 48`) and pypto `lib/configs/A2A3.ini` `[SoCInfo]` |
| HBM bandwidth | 1.6 TB/s | 910B2 HBM2e data sheet figure (also the public `HWConf` table of an Ascend modelling project: `local_memory_bandwidth=1.6 TB/s` for 910B2) |
| per-core GM rate | 32 B/cycle | pypto `A2A3.ini` `[AICoreMemoryRates] ddr_rate=32`: one core cannot pull more than 57.6 GB/s |
| cube MACs / cycle / AIC | 16·16·16 (16-bit), 16·32·16 (int8) | `A2A3.ini` `cube_m/k/n_size=16`, `[DtypeMKN] DT_INT8=16,32,16`; 24 AICs × 8192 FLOP × 1.8 GHz = 353.9 TFLOPS, the published 910B2 figure (353.8) |
| vector lanes / cycle / AIV | 128 × 16-bit = 64 × fp32 | `A2A3.ini` `vec_calc_size=128`; 48 AIVs × 128 × 2 (FMA) × 1.8 GHz = 22 TFLOPS fp16, the published figure |
| inter-chip link | 196 GB/s per chip | public `HWConf` 910B2 `intra_node_bandwidth=196 GB/s` (HCCS); used only for the collectives' remote bytes |
| AICPU dispatch | 930 cycles per task | pypto's own cost-model parameters (`_simulate.config.ini` of every SIM run): `AICPU.completionCycles=240` + `resolveCycles=390` + `schedulerCycles=200` + `Device.submitLatency=100`: completion of a predecessor → resolve → schedule → submit |

Vector "ops" are element operations at fp32 width (64 per cycle per AIV); cube "FLOPs" count a
multiply-add as 2. fp32 matmuls are bounded at the 16-bit cube rate (optimistic: the bound stays a bound).
"""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Hardware:
    name: str = "ASCEND_910B2"
    clock_hz: float = 1.8e9
    cube_cores: int = 24
    vector_cores: int = 48
    hbm_bytes_per_s: float = 1.6e12
    core_gm_bytes_per_cycle: float = 32.0
    cube_flops_per_cycle: float = 2 * 16 * 16 * 16          # per AIC, bf16/fp16 (and fp32, optimistic)
    cube_int8_ops_per_cycle: float = 2 * 16 * 32 * 16       # per AIC
    vector_ops_per_cycle: float = 64.0                      # per AIV, fp32 element ops
    link_bytes_per_s: float = 196e9
    dispatch_cycles: int = 240 + 390 + 200 + 100            # pypto cost model: completion + resolve + schedule + submit

    # ---- chip peaks -------------------------------------------------------------------------------
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
            return min(self.cube_cores, self.vector_cores // 2)
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
