"""Compile-speed benchmark of our pipeline: parse → passes → lowering → pypto source.

Cases (perf/bench.py): each attention layer kind and the MoE sublayer alone, one decoder layer (CSA attention
+ MoE), the whole model as one graph (FLASH: 43 decoder layers per goldens.config.layer_kinds) and the
model twice over (the doubled graph) and the prefill model (the 43 layers as prefill-swa/csa/hca on a 512-token
chunk, + MoE on its tokens; --no-prefill skips it). Every stage is timed (best of --repeat); the ratios model / decoder
layer and doubled / model come from the same run. Times are CPU seconds of this process by default
(`--wall` for wall-clock), so other load on a shared machine does not count against us.
"""
from __future__ import annotations

import argparse
import json

from dspark_ir.fsutil import write_file_atomic

NAME = "bench"
HELP = "compile-speed benchmark: one layer, the full model, the doubled model (ratios from one run)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="flash", help="model config (default: flash)")
    p.add_argument("--repeat", type=int, default=3, help="runs per case; the best is reported (default 3)")
    p.add_argument("--no-model", action="store_true", help="skip the full-model cases")
    p.add_argument("--no-doubled", action="store_true", help="skip the doubled model")
    p.add_argument("--no-prefill", action="store_true", help="skip the prefill model")
    p.add_argument("--no-kinds", action="store_true", help="skip the single-layer-kind cases")
    p.add_argument("--verify-each", action=argparse.BooleanOptionalAction, default=False,
                   help="verify after every pass (default: off, one verification at the end, as in production)")
    p.add_argument("--wall", action="store_true", help="report wall-clock instead of process CPU time")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")


def run(args: argparse.Namespace) -> int:
    from passes import PassContext
    from perf.bench import bench_table, run_bench

    verify_each = bool(args.verify_each)
    result = run_bench(args.config, repeat=max(1, args.repeat), model=not args.no_model,
                       doubled=not args.no_doubled, kinds=not args.no_kinds, prefill=not args.no_prefill,
                       cpu=not args.wall,
                       ctx_factory=lambda: PassContext(use_env=False, verify_each=verify_each),
                       progress=lambda name: print(f"… {name}", flush=True))
    clock = "wall-clock" if args.wall else "CPU"
    print(f"\npasses: default pipeline, verify after each pass: {'yes' if verify_each else 'no (once at the end)'}; "
          f"{clock} seconds")
    print(bench_table(result))
    if args.json:
        doc = result.to_json()
        doc.update(verify_each=verify_each, clock=clock)
        write_file_atomic(args.json, json.dumps(doc, indent=1) + "\n")
    return 0
