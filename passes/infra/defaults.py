"""The default pipeline: one Entry per pass, in order, each with the reason it sits where it does.

To add a pass: write `passes/<snake_name>.py` (it registers `<kebab-name>`) and add one Entry below, in
the marked section. `enabled=False` keeps an entry in place but off until `--enable NAME` (or
`PassContext(enabled=[NAME])`) turns it on. `spec` is pipeline text, so options go there: "x{ways=4}"; the
values a pass takes by default (its policy, passes/infra/policy.py) are not repeated here.
`dspark opt --print-pipeline` prints this table (with toggles applied).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    spec: str
    why: str
    enabled: bool = True


DEFAULT_PIPELINE: tuple[Entry, ...] = (
    Entry("canonicalize",
          "first: folds reshape/cast/slice chains, drops identity ops and redundant deps, so every later "
          "matcher sees one form of each pattern"),
    Entry("cse",
          "after canonicalize: duplicates only compare equal once their operands are canonical; merging "
          "them before the DSpark passes lets each rewrite fire once per distinct value"),
    # ---- DSpark optimisation passes: one Entry per pass, in pipeline order -------------------------
    Entry("retiled-cse",
          "first DSpark pass, after cse whose exact duplicates it extends to tiling-only differences: it removes "
          "the second RoPE table task of each attention layer before any pass looks at tiles (widen-tile then "
          "widens the one kept with kv_rms_norm_rope, as before). Off by default: the default pipeline and "
          "generated sources stay those of the seed's task list",
          enabled=False),
    Entry("topk-merge-stage",
          "a correctness repair (dspark-model 6(h)) before topk-bypass, whose guarded form keeps the top-k as its "
          "fallback and so needs it right: it only widens the sort of a staged (prefill) top-k, attributes "
          "only; decode top-ks sort once in full and are left alone, so the generated sources do not move"),
    Entry("topk-bypass",
          "first DSpark pass: it removes work (the static form leaves idx.score, the indexer q side and the "
          "head weights dead for dce) that the re-tiling/fusion passes below would otherwise rewrite, and it "
          "must match the plain idx_score -> idx_topk -> plan chain before lowering-oriented passes reshape "
          "it; after canonicalize/cse so that chain is in one form"),
    Entry("split-writeback-bias",
          "fission before the re-tiling passes: it creates the tasks (swa_cache_writeback with its own clamped "
          "row tile, swa_valid_bias) that later passes see as they will be lowered, and it only rewires edges "
          "around the fused SWA task, so nothing before it depends on its output"),
    Entry("split-m-fanout",
          "after the fission passes, before widen-tile: it re-grids kv_proj (M tiles fanned out across "
          "KV_OM× the blocks, attributes only, edges unchanged); it must see the atomic matmul form, so it "
          "stays ahead of any pass that rewrites atomic matmuls into partials"),
    Entry("widen-tile",
          "after split-m-fanout: the other half of the kv_proj re-tiling (dspark-model 6(d)); it widens "
          "kv_rms_norm_rope and its rope-row materialiser together, last among the re-tiling passes so no "
          "later rewrite changes the tile it sized against the UB budget"),
    Entry("tile-choice",
          "after the re-tiling passes that fix grids: it needs split-m-fanout's final m_split (a larger M tile "
          "must still give every M part a tile) and touches only matmul M tiles, none of which widen-tile "
          "sizes; before deterministic-split-k, whose reduce task takes its row tile from the split-K task's "
          "final tile. The cost model shows the seed's 16-row tiles re-streaming qr_proj's weight 8x "
          "(perf: qr_proj_matmul 138 -> 42 us, qproj_matmul 90 -> 60 us)"),
    Entry("pool-fanout",
          "with the other re-gridding passes, after tile-choice: it turns the compressor pool's one `pl.at` "
          "block into an SPMD grid over request pairs (policy.POOL_REQUESTS; attributes only, edges "
          "unchanged), which no earlier pass looks at; it must see the one-block form the layer builds"),
    Entry("quant-workers",
          "next to pool-fanout, for the same reason: the TP O path's one-block tp_o_a_quant tasks become "
          "cyclic workers over row tiles (policy.QUANT_WORKERS, QUANT_ROWS; attributes only); before "
          "a2a-direct-read, which rewires the O path's exchange but never the quant tasks"),
    Entry("dequant-workers",
          "with the other re-gridding passes: the q side's fused dequant + RMSNorm + RoPE from H/4 = 16 blocks "
          "to one cyclic worker per vector core (policy.DEQUANT_WORKERS; attributes only); after tile-choice "
          "and before a2a-direct-read, neither of which looks at it"),
    Entry("kv-score-token-groups",
          "with the other re-gridding passes (attributes only, edges unchanged): the compressors' kv_score_proj "
          "grid from one block per (token tile, output tile) to one per (2-token-tile group, output tile), "
          "pypto-lib #1155; no other pass looks at kv_score_proj. Off: bitwise, but the model's gain is marginal "
          "(perf/cases/post-seed-hca-attn.toml: CSA 16x256 layer 755.8 -> 750.9 us, -0.6 %; HCA TP4 layer and "
          "stage +0.0 %: our template already runs all rows of an output tile in one matmul, so only the grid "
          "moves) and turning it on changes the calibrated HCA graph (perf/calibration inputs digest)",
          enabled=False),
    Entry("hca-cmp-gather-pages",
          "with the other re-gridding passes: hca_cmp_work_gather from one block per (request, work item) to "
          "blocks of 8 cache pages (pypto-lib #1227; attributes only); before hca-attn-dual-aiv, which never "
          "touches the gather. Off: the model's TP4 8K gain (compressed branch 106.9 -> 103.7 us, -3.0 %) is "
          "flagged F (the gather kernel is > 10x over its roofline) and its TP1 figure is a roofline estimate",
          enabled=False),
    Entry("hca-attn-dual-aiv",
          "with the other re-gridding passes: the HCA raw attention on 64-head tiles and the compressed QK/PV on "
          "24 cyclic workers whose softmax is split over both AIVs (pypto-lib #1187; grid attributes and one "
          "template option); after hca-cmp-gather-pages and before fuse-merge-rope-pack, which reads neither "
          "task's grid. Off: the model says it hurts (TP4 sparse-attention stage 272.8 -> 318.0 us, +16.6 %: the "
          "split softmax is 576 instead of 256 pypto tasks, hca_cmp_qk_pv 73.7 -> 115.4 us; the re-grids alone "
          "move the layer by +0.1 %); its QK look-ahead (lookahead = 2, a raw-attention template option) changes "
          "only the kernel's program order, which the cost model does not see (the case predicts the same with "
          "lookahead = 0)",
          enabled=False),
    Entry("o-dequant-workers",
          "with the other re-gridding passes (attributes only, edges unchanged): the TP O path's f32 O-B dequant "
          "from one block per [8, 512] tile (512 at flash TP4) to the later public decode_o_proj's cyclic workers "
          "(12 per reduce-scatter owner, policy.O_DEQUANT_WORKERS for all owners); before "
          "dequant-into-owner-windows, which replaces the dequant when it is on. On: the captured code of the chip "
          "swimlane (fa5bf7e) runs the dequant per owner on 12 workers, not 512 blocks. Its Δ is flagged I: "
          "alone it costs 1.2-1.3 % per flash TP4 layer under the chip model's `cores` issue rule and gains "
          "6.8-7.9 % under `grid` (512 logical blocks issued), and no figure decides between the two"),
    Entry("o-proj-valid-rows",
          "with the other re-gridding passes (#1226, TP1): shrinks each O group's padded quant + int8 proj_b to "
          "the step's valid rows; it needs the quant -> proj_b -> dequant chain the layer builds (no pass before "
          "it touches the TP1 O path) and fires only on graphs built with a token capacity above T, so the "
          "default pipeline's generated sources do not change"),
    Entry("hca-cmp-wide-k-tile",
          "with the other re-gridding passes (#1228, TP1): widens HCA's compressed work items to a 128-row K tile "
          "(the template option work_rows and the work counts); before fuse-merge-rope-pack, whose fused merge "
          "then folds the fewer partials; it fires only on graphs whose items are narrower than the tile (the "
          "layer's cmp_pages_per_work = 1, the seed's TP1 form), so the default pipeline's sources do not change"),
    Entry("deterministic-split-k",
          "after the re-tiling passes: split-m-fanout must still see kv_proj's atomic matmul (with "
          "targets=all it would become partials), and the reduce task takes its row tile from the split-K "
          "task's final tile; default targets=hc as in the seed PR (deterministic qkv was reverted for its "
          "prefill cost); dce is not needed for the zero seed, the pass removes it"),
    Entry("fuse-mix-x-rms-norm",
          "an hc_pre rewrite beside deterministic-split-k (which rewrites the linear, not the mix): no other pass "
          "touches mix_x or the attention input norm, so its place only has to precede dce; the captured code of "
          "the HCA swimlane (pypto-lib fa5bf7e) runs the pair as one task, so the swimlane's pipeline keeps it"),
    Entry("hca-raw-kv-no-transpose",
          "an HCA attention-side rewrite (pypto-lib #1035), independent of the re-tiling passes above (it keeps the "
          "raw attention's tile and grid); before fuse-merge-rope-pack and the O-path exchanges so those see the "
          "final raw-stream producer; it drops hca_raw_transpose itself (dce is not needed). Bitwise; the cost model "
          "(pypto-simulated kernels) puts HCA sparse attention at flash TP4 at 272.8 -> 255.4 us (-6.4 %)"),
    Entry("raw-kv-gather-per-request",
          "right after hca-raw-kv-no-transpose, whose direct raw attention it needs (the per-request rows have no "
          "transposed form); it replaces the HCA window gather and the raw attention, both of which no other pass "
          "touches, and it runs before fuse-merge-rope-pack so the merge sees the final raw-stream producer. On: it "
          "holds its contract and the model predicts a gain on the HCA stage (perf/cases/post-seed-hca-raw.toml); "
          "the captured code of the chip swimlane gathers per request too (16 blocks at 16x8)"),
    Entry("hca-attn-workers",
          "after raw-kv-gather-per-request, so it re-grids the final raw attention, and after hca-attn-dual-aiv, "
          "whose compressed workers it leaves alone: the raw attention on 20 cyclic token workers and the "
          "compressed QK/PV one block per request (attributes only); before fuse-merge-rope-pack, which reads "
          "neither grid. On: it is what the captured code of the chip swimlane (pypto-lib fa5bf7e) runs (20 raw "
          "and 16 compressed AIC records in the capture), and the kernels are unchanged"),
    Entry("fuse-merge-rope-pack",
          "fusion into a worker pool (dspark-model 6(c)) after the fission/re-tiling passes, none of which "
          "touches the HCA merge/pack pair; it needs the two-op form the layer builds, with the merge's f32 "
          "stream heads read only by the pack, and it runs before a2a-direct-read so the O-path exchange already "
          "reads the final packed producer"),
    Entry("typed-gather",
          "comm-consumer fusion (dspark-model 6(b)) on the context-parallel all-gathers: the CSA/HCA "
          "compressor-payload steps become the seed's typed step (no pack / unpack wave), the token gathers' "
          "consumers read the window; after every attention-side rewrite, so each exchange's producer and "
          "consumers are final (topk-bypass and the compressor re-tilings leave the payload chain as built); it "
          "orders its window_release before every later rendezvous collective, so it must run after any pass "
          "that adds collectives; no-op at TP1"),
    Entry("a2a-direct-read",
          "typed-gather's rewrite on the O path's all-to-all (not a seed PR's: docs/seed-baselines.md), right "
          "after it for the same reasons: the packed-heads producer and the tp_o_a consumers are final, and its "
          "release is ordered before the reduce-scatter; no-op at TP1"),
    Entry("hca-merge-pack-publish",
          "after fuse-merge-rope-pack (it needs the fused merge-pack) and a2a-direct-read (the exchange's readers are "
          "final: the O-A tiles read the window, the release follows them), before dequant-into-owner-windows, "
          "which never touches the all-to-all: it fuses the HCA merge-pack with the O path's all-to-all put "
          "(pypto-lib #1170 (b)); no-op at TP1. Off: the model says upstream's 4-token tiles hurt (flash TP4 merge + "
          "publish stage 172.3 -> 562.9 us: pypto partitions the 4-token local part into 2304 tasks instead of "
          "48; with publish_tokens = 22, the merge-pack's own block, 172.3 -> 120.9 us, -30 %), there is no "
          "hardware figure to check either against (held back), and turning it on changes the HCA TP > 1 sources",
          enabled=False),
    Entry("dequant-into-owner-windows",
          "the O path's last rewrite, after a2a-direct-read (whose window release it keeps ordered before the "
          "fused reduce-scatter: it takes over the reduce-scatter's deps) and after quant-workers, which it "
          "never touches: it fuses the f32 O-B dequant into the reduce-scatter (pypto-lib #980 / #998); no-op at "
          "TP1. Off by default: bitwise, and the chip model's gain rests on an assumption no figure checks (held "
          "back): with the collectives' link transfers (perf/schedule.py rule 10) the flash TP4 CSA O-B tail "
          "goes 104.8 -> 82.3 us (-21 %, perf/cases/post-seed-csa.toml) only while the fused publish's link "
          "transfer hides under its local part; read serially it loses (trust flag L)",
          enabled=False),
    Entry("early-resolve-csa-producers",
          "scheduling hints only (pypto-lib #915: aer on six CSA decode producers), after every rewrite that "
          "creates or re-grids those tasks, so the hint lands on their final form; independent of the other "
          "passes (no values, no edges). On by default: #915 is in the seeds' base (pypto-lib 634e77bd), and "
          "the schedule model stages a flagged producer's consumers early (perf/schedule.py rule 9)"),
    Entry("moe-handshake-deps",
          "edge insertion + scheduling hints only (dspark-model 6(g)), independent of the other rewrites; "
          "last among the DSpark passes: it checks each wait's expected count against its notifier's final "
          "grid (epoch x blocks) before folding the combine notifies into one barrier notify"),
    # ---- end of DSpark optimisation passes -----------------------------------------------------------
    Entry("dce",
          "last: removes the nodes the rewrites above left without users, so dumps and the lowering see "
          "only live tasks"),
)
