"""The context-parallel all-gather of a compressor's payload (seed decode_cp_allgather), in its untyped form:
the seeds' base at TP > 1 (docs/seed-baselines.md "CSA", "HCA").

    pack (values f32, scores f32[, kv bf16] → bf16 wire rows) → cp_allgather (push + payload wait)
    → window_copy_out (read-back + read-back wait + retire) → unpack (wire rows → the group's typed rows)
    → cp_rank_rows (modelling glue: the rank's own rows, see ops/collective.py CpRankRows)

The `typed-gather` pass turns the first four into the seed's typed step (cp_typed_allgather + cp_typed_readback:
no pack or unpack wave).
"""
from __future__ import annotations

from ..dims import ceildiv
from ..graph import Value
from .builder import GraphBuilder

# seed decode_cp_allgather: PUSH_WORKERS / READBACK_WORKERS (main and HCA), CSA_AUX_*_WORKERS (aux)
MAIN_WORKERS, AUX_WORKERS = 16, 8
# The pack and unpack waves' row tiles: the seed's COMM_ROW_TILE (push bands) and READBACK_ROW_TILE. Their worker
# counts: HCA's are in the code (decode_hca.py: hca_projection_pack / hca_projection_unpack are pl.spmd(16), rows
# cyclic over the workers); CSA's are not in the public code we read: one block per row tile (an assumption,
# docs/seed-baselines.md).
PACK_ROW_TILE, UNPACK_ROW_TILE = 8, 16
HCA_WIRE_WORKERS = 16


def cp_payload_gather(b: GraphBuilder, name: str, values: Value, scores: Value, kv: Value | None = None, *,
                      workers: int = MAIN_WORKERS, wire_workers: int | None = None,
                      after: Value | None = None) -> tuple[Value, ...]:
    """This rank's (values, scores[, kv]) after the untyped CP all-gather of [values | scores | kv] over the TP
    group: bitwise the operands (the wire form is lossless), but only after the exchange, as in the seed's base.
    `wire_workers`: the pack and unpack waves' cyclic workers (None: one block per row tile). `after`: a value
    that must be ready before the push (rendezvous collectives meet in one order on every rank). Returns the
    operands' stand-ins; the last one is also the chain point for a later gather."""
    T, rows = b.T, b.tp * b.T
    typed = [values, scores] + ([kv] if kv is not None else [])
    width = b.value(values.type.shape[1])
    kv_cols = b.value(kv.type.shape[1]) if kv is not None else 0
    wire = b.op("cp_wire_pack", *typed, name=f"{name}.pack", tile=[PACK_ROW_TILE],
                blocks=wire_workers or ceildiv(T, PACK_ROW_TILE), **b.clamp(T, PACK_ROW_TILE))
    window = b.op("cp_allgather", wire, name=name, tp=b.tp, blocks=workers, core="vector",
                  deps=[after] if after is not None else ())
    group = b.op("window_copy_out", window, name=f"{name}.copy_out", axis=0, rows=rows, blocks=workers,
                 core="vector")
    parts = ["values", "scores"] + (["kv"] if kv is not None else [])
    unpacked = b.op("cp_wire_unpack", group, names=[f"{name}.unpack"] + [f"{name}.unpack.{p}" for p in parts[1:]],
                    width=width, kv=kv_cols, tile=[UNPACK_ROW_TILE],
                    blocks=wire_workers or ceildiv(rows, UNPACK_ROW_TILE), **b.clamp(rows, UNPACK_ROW_TILE))
    own = b.op("cp_rank_rows", *unpacked, names=[f"{name}.own_rows"] + [f"{name}.own_rows.{p}" for p in parts[1:]],
               tp=b.tp)
    return own


class CompressorGathers:
    """A layer's compressor-payload all-gathers, as `compressor(payload=…)` callbacks: each gather's push waits for
    the previous gather's last task (every rank meets its peers in one order); at TP1 they pass the rows through.
    `kv`: the gathered kv rows (this rank's) of the gather that carried them."""

    def __init__(self, b: GraphBuilder):
        self.b, self.last, self.kv = b, None, None

    def payload(self, name: str, kv: Value | None = None, workers: int = MAIN_WORKERS,
                wire_workers: int | None = None):
        def gather(values: Value, scores: Value) -> tuple[Value, Value]:
            if self.b.tp == 1:
                return values, scores
            own = cp_payload_gather(self.b, name, values, scores, kv, workers=workers, wire_workers=wire_workers,
                                    after=self.last)
            self.last = own[-1]
            if kv is not None:
                self.kv = own[2]
            return own[0], own[1]
        return gather
