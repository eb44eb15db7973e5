"""Validation: the shipped cost model (ops.py + shipped profile) against every row of the
public measured kernel tables, as absolute-percentage-error statistics.

``disaggsim calibrate validate [--gpu a100-80gb h100-sxm] [--data DIR] [--write-doc]``.
Rows are read by :mod:`calibration.public`; each table is reported per framework (and
dtype), per op and per size bucket (GEMM: m ≤ 16, 17–256, > 256). The accuracy targets
apply to the rows the shipped profile was fitted to (``target`` column); the other
frameworks' rows are reported beside them to show how far a profile transfers between
kernel libraries.

Targets: GEMM and decode attention median APE ≤ 10% and mean ≤ 15%; prefill attention
median ≤ 20%; all-reduce median ≤ 15%.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from calibration import engines, public, throughput
from calibration.fit_public import (
    ATTENTION_FRAMEWORK,
    BACKEND_FRAMEWORKS,
    CONTEXT_FIT_MAX_TOKENS,
    CONTEXT_TEST_MIN_TOKENS,
    DYNAMIC_SCALE_FRAMEWORKS,
    FP8_FRAMEWORK,
    FP8_KV_PREFILL_BACKENDS,
    GEMM_FRAMEWORK,
    MINOR_KERNELS,
    NUM_SMS,
    PRIORS,
    REPO,
    TILE_KERNELS,
    TRTLLM_PER_QUERY_HEAD_BACKEND,
    WAVE_BACKENDS,
    _decode_backend_rows,
    decode_backend_of_rows,
    fit_gemm_fp8,
    fit_tiled_fp8_kernel,
    fp8_row_s,
    peaks_of,
    predict_decode_rows,
    prior_from,
    quant_s,
    refit_decode_predict,
)
from disaggsim.catalog import dtype_bytes, get_gpu, get_model
from disaggsim.costmodel import ops
from disaggsim.costmodel.step import ACT_BYTES, build_worker_cost
from disaggsim.errors import UserError
from disaggsim.hardware.engines import ENGINE_NAMES, PARAM_KEYS, load_engines
from disaggsim.hardware.profile import (
    GemmParams,
    HardwareProfile,
    load_profile,
    profile_from_dict,
)

TARGETS = {  # target key: (median_ape max, mean_ape max or None, p90 max or None)
    "gemm": (0.10, 0.15, None),
    "decode_attention": (0.10, 0.15, None),
    "prefill_attention": (0.20, None, None),
    "allreduce": (0.15, None, None),
    # issue 13: a GPU held out of the kernel fits, and engine step / batch latencies
    "held_gemm": (0.10, None, None),
    "held_decode": (0.10, None, None),
    "held_prefill": (0.20, None, None),
    "engine": (0.05, None, 0.15),
    # Hopper rule: memory-bound decode step ratio within 10% of the bandwidth ratio
    "hopper": (0.10, None, None),
}
KERNELS_MD = """Every row of the public kernel tables (AIConfigurator: vLLM, SGLang and TensorRT-LLM
kernels replayed in CUDA graphs; Vidur `mlp.csv`; nccl-tests; Vidur all-reduce) against
`ops.py` with the shipped profile. Attention rows are predicted with their framework's
backend (`vllm-flash`, `sglang-flash`, `trtllm`; prefill rows with the backend's fit for
their KV dtype where it has one, TensorRT-LLM's FP8 context FMHA for its FP8-KV rows;
TensorRT-LLM's decode rows with the kernel it runs for their layout: XQA, the `trtllm`
fit, for 2-32 query heads per KV head, masked MHA, the `trtllm-mmha` fit, for vanilla MHA
and larger groups); FP8 GEMM rows with the GEMM plus its
activation-quantisation kernel (every framework's FP8 row holds one), the GEMM being the
framework's own kernel where its engine profile names one the hardware profile fits
(SGLang: `sglang-fp8`, vLLM: `vllm-fp8`), else the shared `ops.gemm.fp8` (TensorRT-LLM's
cuBLASLt GEMM), and TensorRT-LLM's rows with the dynamic per-tensor activation scale they
hold (AIConfigurator loads its FP8 `Linear` without an input scale: a memset and an amax
kernel before the quantisation; `ops.fp8_dynamic_scale_time_s`). Targets apply to the
rows the targets were set on: vLLM bf16 GEMMs, SGLang FP8 GEMMs (precomputed-scale path),
vLLM attention, nccl-tests (GEMM and decode attention median ≤ 10%, mean ≤ 15%; prefill
attention median ≤ 20%; all-reduce median ≤ 15%). Skipped by design: sliding-window rows,
fp8-math prefill rows, int8/int4/fp8-block GEMM rows, vLLM's FA4 and SGLang's Triton
attention rows (other kernels with few shapes)."""
EXTRAPOLATION_MD = """Whole shape families held out of a refit, to check that each formula's structure
extrapolates (the shipped fits use every family). Decode attention, per kernel (TensorRT-LLM's
XQA and masked MHA apart): fit on
≤ 8 KV heads and test on the 32-KV-head rows; fit on ≤ 2048 cached tokens per sequence
and test on > 8192; XQA also fit on ≤ 8 query heads per KV head and test on ≥ 12, on head
dim 128 and test on the others, on batches ≤ 64 and test on ≥ 256. Prefill attention: fit on prompts ≤ 2048, test on > 4096 (bf16 KV;
TensorRT-LLM's FP8-KV kernel too). GEMM: fit
on m ≤ 1024 tokens, test on m ≥ 4096. FP8 GEMM: each framework's rows refitted on their
own, in sample (with its quantisation kernel): the best the smooth GEMM form does on them;
TensorRT-LLM's (the `ops.gemm.fp8` fit, with its dynamic scale) held out by (n, k) family
and fitted on m ≤ 1024 → tested on m ≥ 4096;
SGLang's and vLLM's own kernels (the dispatch-table forms the `sglang` and `vllm` engines
run) with each row predicted by a refit without its (n, k) family. No targets: these rows say where the forms
hold and where they do not (last section)."""
HELD_OUT_GPU_MD = """The H200 profile takes every kernel parameter of the H100's (same SM architecture, the
Hopper rule of issue 13's item 5: GEMM memory efficiency included) with H200 peaks; none is
fitted to an H200 (`calibration/priors/h200_sxm.json`; the shipped profile adds only
copies and torch-SDPA attention measured on an H200). Two H200 runs check it, the first
carrying the target: `calibration/runs/h200-2026-12-04` (every GEMM replayed in CUDA
graphs, each after an L2 flush with its inputs cycled past L2: kernel time; rows ≥ 10 µs)
and `h200-2026-11-29` (each call timed between CUDA events: rows ≥ 40 µs, shorter ones
carry 5-6 µs of launch time). GEMM rows compare the same cuBLAS kernels with the H100's
parameters, first the kernel alone, then like with like: the kernel plus the run's
per-call time, measured on the same run's floor rows (GEMMs predicted within 1.2× of the
kernel floor, all shorter than the compared rows: the median of measured minus predicted;
in graphs that is the replay and the weights cold in L2, about 2 µs, timed call by call
the launch path). The rows "mem_eff fitted alone" fit each run's memory efficiency with
every other GEMM parameter the H100's (`calibration/fit.py` `fit_gemm_mem_eff_alone`; in
sample): graph-timed, the H200's weight-streaming GEMMs reach the H100's fraction of the
peak; timed call by call the same GEMMs fit about 10% less, what the eager loop costs a
weight stream, not the GPU (the shipped profile took that figure from 2026-12-03 to
2026-12-05: `docs/calibration.md`, "Hopper rule"). Attention rows compare torch's SDPA
kernels (FlashAttention-2, cuDNN, memory-efficient; FlexAttention timed call by call)
with the profile's generic vLLM FA3 kernel, other kernels, so they carry no target. Then
the Hopper rule itself: the H200/H100 time ratio of decode steps against the datasheet
bandwidth ratio 4.8 / 3.35 = 1.433 (single-GPU steps streaming > 15 GB carry the 10%
target; kernel floors, which do not scale, hold a weight-bound batch of 8 below it, and TP
steps add all-reduce latency that does not scale with bandwidth)."""
CROSS_GPU_MD = """How a GPU without its own attention table fares: the H100's AIConfigurator
attention tables (every row the kernel section compares) predicted by a profile built for
the H100 from the A100's fits alone, the way the H200's is built from the H100's
(`fit_public.prior_from`: the source's kernel efficiencies, floors and terms with the
target's datasheet peaks; the wave kernel's waves and masked MHA's resident blocks on the
target's SMs and shared memory). Carried from the A100: every decode and prefill parameter
of `vllm-flash`, `sglang-flash`, `trtllm` (XQA) and `trtllm-mmha`, its bf16 fit standing
for the FP8 cache (the A100 tables have no FP8 rows); nothing is refitted to the H100. The
H200 carries within its SM architecture (Hopper to Hopper), this check across two (Ampere's
FlashAttention-2 builds against Hopper's FA3 and XQA kernels), so it is the harder
transfer: no public table holds a second Hopper GPU's attention. No target; the H100's own
fits are the kernel section's rows. Buckets give the median measured / predicted time."""
ENGINES_MD = """Published step and batch latencies of serving engines
(`calibration/engine_data/measurements.csv`, sources in `docs/calibration.md`; the
`vllm-eager-2023` rows are DistServe's curves of 2023 vLLM on A100, Splitwise's
measurements of 2023 vLLM on DGX-A100 (held out) and on DGX-H100 (fit rows of that host's
speed only, `host_scale`)) against the step model
with each engine's shipped profile: all rows, the rows its fit used, the held-out rows
(every H200 row and NIM for vllm and trtllm; for vllm also the rows from vLLM's pull
requests and issues (PRs 10933, 11000 and 3240, issue 9471) and every MoE row (Mixtral-8x7B:
the CI's A100, H100 and H200 batches, PR 3240's A100 batches); for sglang PR 1401's rows; the
OPT-66B TP8 and OPT-13B TP4 families and every Splitwise DGX-A100 row for vllm-eager-2023), each (source, model, GPU, TP) family predicted by
a refit without it, and the kernels alone; where an engine has rows of dense and of MoE
models, each kind apart (the MoE rows run `disaggsim/costmodel/moe.py`'s kernels). Target
(issue 13): median ≤ 5% and p90 ≤ 15% per engine.

vLLM's ten Mixtral-8x7B rows (all held out) test the MoE kernel model through an engine.
Its grouped expert GEMM is fitted on the H100 only (AIConfigurator's tables) and carried to
other GPUs with its `half_sat` scaled by the machine balance (`carry_half_sat`,
`docs/costmodel.md`): below `half_sat` tokens per expert the kernel is held by its weight
stream, and where that ends follows FLOP/s per HBM byte/s. Carried unscaled (before
2026-12-03) the H100's floor outlasted the weight read on the A100 (a third of the FLOPs,
0.61× the bandwidth) and the H200 (the same FLOPs, 1.43× the bandwidth): the nine rows
erred 24.9% / 70.2% (A100 batches predicted 1.16-2.01× slow, H200 1.24×), all 18 vllm rows
8.8% / 58.0%. Carried by balance, with TensorRT-LLM's kernel fitted in one curve in tokens
per expert: 5.2% / 14.9%. Since 2026-12-03 (later) a worker runs its engine's own MoE
kernel, vLLM's fused_moe fitted to vLLM 0.24's H100 table, in the form that follows the
expert width per GPU (`docs/costmodel.md`): the CI rows hold (H100 0.95× the prediction,
was 0.94×; H200 1.03×, was 1.02×; the CI's A100 batch, added 2026-12-03, 0.95×), the A100
rows of PR 3240 do not (below, "Where targets are missed"): the {{n:vllm (shipped profile)|MoE-model rows}} MoE rows
{{vllm (shipped profile)|MoE-model rows}}, all {{n:vllm (shipped profile)|all rows}} vllm rows {{vllm (shipped profile)|all rows}}
(`python -m calibration.engines --moe-check`: shipped, uncarried and no-floor columns).
The dense rows' per-GPU residual is host time: the time a CI batch leaves over the kernels
alone is about 0 on the A100, 1.1-1.5 ms an iteration on the H100 and 1.4-2.3 ms on the
H200 (`python -m calibration.engines --rows vllm`, `implied_host_ms`), so the one shared
per-iteration cost (0.84 ms) leaves the H200's dense batches 1.09-1.11× the prediction
(the A100's 0.95-0.96×). From 2026-12-03 to 2026-12-05 the H200 profile took a GEMM memory efficiency of
its own (0.755 of the peak, fitted to the H200 GEMMs timed call by call), which put those
batches at 1.03× and their host time level with the H100's; the same GEMMs timed in CUDA
graphs reach the H100's 0.838 ("A GPU held out of the kernel fits" above), so the figure
was the eager loop's, and the H200 takes the H100's again (`docs/calibration.md`, "Hopper
rule"). TensorRT-LLM's 22 H200 rows, an engine with little host time, move from 1.008× to
1.017× (median measured over predicted).

TensorRT-LLM rows run TensorRT-LLM's own attention kernels (`attention_backend: trtllm`).
The 0.9 release measured here decoded a grouped-query layout with its grouped kernel (XQA)
only at 1 or 8 query heads per KV head (`decoderXQARunner.h` `shouldUse` of April 2024);
Mistral-7B's 4 ran the masked-MHA kernel, one thread block per query head, so each KV head
is read 4 times — once from HBM, the re-reads from L2. The step model costs that path's KV
stream as the longer of the HBM stream and 4 × the KV bytes at one re-read rate
(`per_query_head_kv_bytes_per_s`, 4.65 TB/s, fitted with the overheads on the H100 and
A100 rows; `calibration/engines.py` `RELEASE_GROUPED_DECODE`). The held-out H200 Mistral
batches — the H100's SMs and L2 with 1.43× its HBM bandwidth, measured no faster than on
the H100 — are the check: 0.96-1.15× the prediction, against 1.14-1.62× with the grouped
kernel (trtllm all rows then 6.5% / 18.9%, measured before the split-KV decode refit). A second held-out check, never fitted:
TensorRT-LLM 0.5's H200 launch table (`trtllm-0.5.0-h200-blog`, before XQA existed, so
Llama-2-70B's 8 query heads per KV head also decoded per query head, FP8 KV assumed):
its four Llama-2-70B batches are 0.99-1.14× the prediction with the re-reads, 1.17-2.30×
with a grouped kernel (with the re-reads 1.04-1.16× since TensorRT-LLM's FP8 GEMM is fitted
with its rows' dynamic scale apart and its FP8-KV prefill runs its FP8 context FMHA,
2026-12-02: these FP8 batches are mostly GEMMs and prefills, and the grouped variant
refitted on every trtllm row now fits them as well, 5.0% against 6.2% median: they no
longer tell the two decode paths apart; `tests/test_calibration_engines.py`). The kernel tables show the same path apart from the engine data:
TensorRT-LLM 1.3 runs layouts beyond its XQA (more than 32 query heads per KV head) on
masked MHA, and those rows read query-head bytes at a rate that does not depend on the
group size (48-128) or head dim: on the H100 5.9-6.5 TB/s in bf16 and 3.1-3.4 in FP8 — the
same 3.0-3.4 × 10¹² query-head elements per second, so the re-read cost is per element
(FP8 saves no time there) — and on the A100 3.2-3.55 TB/s in bf16 (`python -m
calibration.fit_public --data ../shared/data --decode-rates h100-sxm`, last table). The
engine fit's single rate in bytes (4.65 TB/s: 4.65 × 10¹² FP8 elements/s on Hopper, 2.3 ×
10¹² bf16 elements/s on the A100) follows the same per-element, per-GPU pattern (A100 ≈ half
of Hopper) at 1.4× the 1.3 kernel's rate; TensorRT-LLM 0.5/0.9 with groups of 4 and 8 are
not 1.3 with groups of 48 or more, so the shipped rate stays the one fitted on the engine
data. The hardware profiles now fit 1.3's masked MHA as its own decode kernel
(`trtllm-mmha`, per-element re-read rate included: 6.1 TB/s bf16 and 3.1 TB/s FP8 on the
H100), and the engine's per-query-head rows run that fit with the release's rate (the grid
fit still takes 4.65 TB/s; with the 1.3 kernel's own rate trtllm all rows err 5.5% / 19.1%, measured before the
split-KV decode refit).
The shipped `trtllm` profile is current TensorRT-LLM: XQA for 2 to 32 query heads per KV
head (`grouped_decode_q_per_kv: [2, …, 32]`; every dense GQA model in the catalog has at
most 16), masked MHA (`per_query_head_decode_backend: trtllm-mmha`) for vanilla MHA and
larger groups, as its `decoderXQAImplJIT` `kernelUtils.cpp` decides."""
KNOWN_LIMITS_MD = """## Where targets are missed, and why

- **vllm (median / p90 {{vllm (shipped profile)|all rows}} over its {{n:vllm (shipped profile)|all rows}} rows; the {{n:vllm (shipped profile)|dense-model rows}} dense rows meet the target,
  {{vllm (shipped profile)|dense-model rows}}, the {{n:vllm (shipped profile)|MoE-model rows}} held-out Mixtral rows {{vllm (shipped profile)|MoE-model rows}}).** Measured over predicted,
  per GPU: the CI's H100 batch 0.95×, its H200 batch 1.03×, its A100 batch 0.95×, vLLM PR
  3240's A100 TP2 batches 1-64 1.19, 1.03, 0.84, 1.04, 1.19, 1.34, 1.42×, vLLM PR 4002's
  A100 Mixtral-8x22B batches 8-32 (decode-bound: 32-token prompts) 0.91, 1.01, 1.11× at TP4
  and 1.02, 1.10, 1.15× at TP8 (`python -m calibration.engines --data ../shared/data --rows
  vllm`). The miss is the prefill-heavy A100 batches (16-64 prompts of 1,000 tokens): they
  need the expert GEMMs at about 0.46 of the A100's bf16 peak at 32k tokens an iteration,
  the rate of vLLM's March-2024 Triton fused_moe on Ampere; the kernel the step model runs
  is vLLM 0.24's fused_moe fitted on the H100 table, which runs Mixtral's experts at 0.68
  of the H100's peak (TensorRT-LLM's CUTLASS at 0.81), and no MoE table exists for the A100
  or that release to carry from. Until 2026-12-03 these rows met the target (4.6% / 11.0%)
  because one efficiency curve in tokens per expert, fitted to TensorRT-LLM's table, ran
  wide experts at 0.47 of peak: 1.6× slower than that kernel measures on the H100 (its
  Mixtral rows above 1,024 tokens 0.68× the prediction), the bias matching the 2024 A100
  kernel. The fitted form now follows the expert width (TensorRT-LLM rows above 1,024
  tokens 29.7% → 11.1% median in bf16; "MoE, MLA and expert-parallel all-to-all" below),
  and a worker runs its own engine's kernel; the A100 rows are held out and stay so. A
  tile/wave model of the kernel's A100 config (128 × 128 × 64 tiles at these token counts,
  over 500 waves) reduces to the rate one Ampere SM sustains on one Triton 2.1 tile, which
  no table here holds (`docs/calibration.md`, "Can the A100 rate be predicted from the
  tile config?").

- **vLLM's CI batches on the H200 are 1.09-1.11× the prediction (dense models).** The
  kernels follow the Hopper rule (issue 13, item 5: the H200's GEMMs timed in CUDA graphs
  reach the H100's fraction of the peak; memory-bound steps 0.93-0.98 of the datasheet
  ratio, table above), and vLLM's CI measured whole batches only 1.196× faster on its
  H200 than on its H100: per iteration the H200 runner's batches leave 1.4-2.3 ms over the
  kernels, the H100 runner's 1.1-1.5 ms and the A100 runner's about 0 (host time, which
  the engine profile holds at one figure for every host). These rows are held out; no
  per-host figure is fitted to them.

- **vllm-eager-2023 (median / p90 {{vllm-eager-2023 (shipped profile)|all rows}} over its {{n:vllm-eager-2023 (shipped profile)|all rows}} rows:
  DistServe's {{n:vllm-eager-2023: distserve-vllm|all rows}} rows {{vllm-eager-2023: distserve-vllm|all rows}}, Splitwise's {{n:vllm-eager-2023: splitwise-sim|all rows}} held-out DGX-A100 rows
  {{vllm-eager-2023: splitwise-sim|all rows}}; Splitwise's {{n:vllm-eager-2023: splitwise-sim-h100|all rows}} DGX-H100 rows {{vllm-eager-2023: splitwise-sim-h100|all rows}}, each TP family refitted
  without it 6.6% / 28.2% on 2026-12-03).** The DGX-H100 rows (added 2026-12-03) first scored 38.5% / 60.6%: the
  same runs measure 0.667x on the DGX-H100's host (launch-bound decode steps), and the
  profile's host terms were fitted on DGX-A100 hosts; the profile now carries that host's
  speed (`host_scale`, 0.630 for h100-sxm, fitted on those rows with the A100 terms held;
  `docs/calibration.md`, "2023 vLLM on another host"). Since 2026-12-02 (third session) the
  shipped profile is the overlap form: an eager engine launches each layer's kernels from
  Python while the GPU runs the previous ones, so the layers take the longer of their
  kernels and their launches (`launch_per_layer_s`, 381 µs), plus per iteration (3.24 ms),
  per token (55.9 µs) and, with TP > 1, a per-layer cost the ranks wait for (170 µs), the
  LM head outside the max. Fitted on the same fit rows as before (DistServe's OPT-13B TP 1-2
  and OPT-66B TP 2-4), it is better than the additive form it replaces on every count: all
  rows 8.0% / 26.8% → 7.0% / 22.4% (median / p90), held-out rows 15.0% / 30.5% → 10.4% /
  29.1%, each family refitted without it 12.2% / 27.5% → 8.7% / 23.3% (where no fit row
  binds the launch floor, the refit takes the largest floor those rows allow; with none
  9.5% / 23.3%: `docs/calibration.md`, "Refits that leave the floor unbound"), fit rows 7.1% / 14.9%
  → 5.8% / 15.1%. It was measured before (rows "overlapped host time") and not shipped
  because a max over host and kernel time makes a decode step non-affine in the context;
  but the launches do not depend on the context, so at a fixed batch the step is the
  longer of the kernels' line and one constant line, and the engine already takes the
  longer of two lines (`WorkerCost.decode_item_coeffs`): with the decode kernel's item
  work constant in the context (`overlap` 1, every shipped hardware profile) the item line
  and the launches merge into one constant line; with `overlap` 0 the item line is the
  stream line and the launches take the second slot. No engine change was needed; only a
  decode fit with 0 < `overlap` < 1 together with a launch floor would need a third line
  (the longest of three affine lines in the context, so up to three segments a run), and
  the step model refuses that combination with a one-line error (docs/costmodel.md,
  "Launch-bound eager engines"). A test runs every row through the step model with the
  shipped profile and gets the fit's predictions (`step_model_pred`).
  What the floor explains: DistServe's OPT-13B TP4 decode steps, 24.7% → 3.7% median
  (the steps are ~25.9 ms of launches whatever the context, kernels 8 ms); Splitwise's TP4
  and TP8 decode steps, 6.6% → 5.4% and 17.4% → 5.3% (the ~45 ms floor at 80 layers); and
  the "physically inconsistent" OPT-13B TP4 curve below: the shipped step model, every
  kernel within the HBM peak, sampled on DistServe's profiled grid and fitted with
  DistServe's own small-batch form, has a context slope implying 3.30 TB/s (1.62× peak),
  the curve 2.64 TB/s (1.30×), and every other family stays below peak (model 0.69-0.96×):
  under a floor the step is flat in the context, so an affine fit's slope falls below the
  KV stream's. The curve is what a launch-bound engine produces, not a mislabelled or
  wrong one (`python -m calibration.engines --data ../shared/data --eager-forms`, table
  "The shipped step model (launch floor) on DistServe's profiled grid").
  Where the p90 comes from now (DistServe points at or above its p90, 43): OPT-13B TP4
  prefills of 1,024-8,192 tokens 0.59-0.74× the prediction (13; the per-token host time
  does not shrink with TP, below), OPT-66B TP8 decode at batch 1-8 0.81-0.83× (14: 4.8% →
  18.8% median on that family's decode), OPT-13B TP4 and OPT-66B TP8 decode at batch
  128-256 1.26-1.61× (8), OPT-66B TP3-4 prefills of 2048-token prompts 1.36-1.44× (6);
  over both sources also Splitwise's TP2 decode 0.78-0.80× (6: the per-layer TP cost, 13.6
  ms at 80 layers, is not in Splitwise's TP2 steps, 1.4-4.0 ms above the kernels) and
  Splitwise's prefills 0.76-0.81× (9). OPT-66B TP8 is the price of the floor: every
  launch-bound fit point is OPT-13B (40 layers), so the fit cannot tell host time per
  iteration from host time per layer, and its 551 µs a layer (launch + TP cost) is right
  for OPT-13B TP4 (about (25.9 − 3.2) ms / 40 = 567 µs at batch 1) and long for OPT-66B
  TP8 (about (31.3 − 3.2) ms / 64 = 439 µs). Why the target cannot be met with these data: fitted to every one of
  the 492 rows, nothing held out, no form reaches a p90 of 15% (additive 9.9% / 21.6%,
  overlapped host time 7.1% / 20.3%, host time hidden behind the kernels 10.6% / 23.3%,
  overlapped + prefill kernel scale 6.0% / 20.8%; rows "fitted to every row of both
  sources"): the two sources and the two models disagree about the host time per layer,
  per iteration and per prompt token by more than the target allows, so the miss is the
  data's mutual consistency, not extrapolation alone. The provenance
  (`calibration/engine_data/`) shows no mislabelled quantity: DistServe's prefill and decode
  steps are wall-clock `LLMEngine.step()` times, Splitwise's are first-token latencies and
  mean times between tokens of single batches (its two TP2 batches not served as one batch
  are already left out); their host paths differ (DistServe's harness runs Ray workers
  and detokenises in the timed step), which is engine and harness, not labels.
  Checked 2026-12-02 (fourth session): what the prefill residual is made of. The shipped
  fit predicts OPT-13B TP4's prefills at 1.35× DistServe's curve (median; 35.1% APE; 1.35-1.69×
  at 1,024-8,192 tokens), OPT-66B's at 0.88-0.92× it at every TP, Splitwise's Llama-2-70B at 1.10-1.21×
  (per-family rows above; `python -m calibration.engines --data ../shared/data
  --eager-forms`, last tables). Its per-token host time (55.9 µs on every prompt token,
  the same for every model and TP) makes that pattern; it stands in for GPU time that
  grows with the model, and host time per prompt token is small: vLLM's detokeniser took
  2 ms for 4,096 tokens from October 2023 (vllm-project/vllm PR 1338, in the v0.2.3 fork
  DistServe ran), and OPT-13B TP4's prefills of 2,048-8,192 tokens are only 18.7-26.8 µs
  a token above the kernels, every cost included. Three causes checked, with numbers.
  (1) The prefill attention kernel (2023 vLLM ran xFormers' `memory_efficient_attention`;
  the kernel fitted here is FlashAttention-2): attention is 1.8%
  of the modelled prefill kernel time (median, 6.6% at most) on DistServe's grid and at
  most 8.7% on Splitwise's (8,192 tokens, TP2), so even a kernel twice as slow moves a
  step by a few percent, not the 34-40% seen. (2) All-reduces of prefill activations:
  DistServe's C++ engine on the same A100s (no Python) fits its prefill steps as the
  kernel model with every all-reduce 1.49× nccl-tests' time plus 3.5 ms a step (median /
  p90 APE 8.3% / 18.9% → 3.3% / 8.9%; OPT-66B TP8 15.5% → 3.2% median, OPT-13B TP4 11.3% →
  2.8%; each family predicted by a fit without it: factors 1.35-1.57, 4.3% / 10.4%), and
  Splitwise's prefills of up to 2,048 tokens need 2.11× (16.1% / 26.3% → 7.5% / 20.2%;
  TP8 20.5% → 7.2%, but TP2 6.7% → 12.6%): a physical cost the hardware profile's
  nccl-tests fit does not carry for these engines, the part of the residual that grows
  with TP (rows "DistServe's C++ engine, all-reduces × 1.49" and "Splitwise's
  2023 vLLM, all-reduces × 2.11"). (3) What is left is not TP-dependent: at TP1-2, where
  all-reduces are small, 2023 vLLM's prefill runs 1.34× the C++ engine's on the same grid
  (OPT-13B TP1 1.41 vs 1.05× the kernels, OPT-66B TP2 1.40 vs 1.04×), uniformly from 64
  to 8,192 tokens: GPU time in proportion to the GEMMs, which no host term can be and
  whose cause in vLLM's code path is not identified (only OPT has linear biases here, so
  a slower biased GEMM cannot be told from an OPT factor on these data). The screen
  (rows "vllm-eager-2023 screen: overlap form, …"; fitted on DistServe's fit families as
  the shipped fit): host time split into per sequence and per prompt token changes nothing
  (the fit puts 56 µs back on every prompt token: 7.1% / 22.8% all rows); the all-reduce factor fitted (3.40×) lowers all rows to 5.7% / 21.8%
  and each family refitted without it to 6.5% / 20.9% but puts the held-out families at
  12.9% / 34.2% and Splitwise at 10.8% / 45.8% (its 8,192-token prompts, per-token host
  time 38 µs); the C++ engine's factor fixed at 1.49 gives 5.9% / 22.8% (held-out families
  7.7% / 35.8%, Splitwise 11.1% / 29.4%); with a prefill factor on the biased GEMMs (1.64×,
  all-reduces 2.93×) all rows reach 4.8% / 19.4%, held-out families 6.2% / 22.1%, Splitwise 10.8% / 26.1%,
  every family in sample 5.4% / 14.8% — the best found, but an OPT factor by another name,
  so not shipped. Checked 2026-12-02 (sixth session), a cost the screens had not had: the
  block tables (one int per 16 context tokens of every sequence) that the 2023 driver
  pickles into every Ray worker's call each step, host time ∝ batch × context blocks × TP,
  largest where the p90 points sit (decode at batch 128-256 with TP 4-8). Beside the
  shipped per-token time (row "per token + per context block x tp") it takes 280 ns per
  block and rank and moves all rows from 7.0% / 22.4% to 6.9% / 22.0%, the held-out
  families from 9.6% / 35.1% to 11.8% / 29.6%, Splitwise from 11.2% / 28.1% to 11.0% /
  27.0%, every family in sample not at all (18.2% p90): a plausible cost, not the miss; not
  shipped. Checked 2026-12-03: the per-token time split into what the driver spends once
  and what each rank spends on its own shard (÷ TP: the part that would shrink OPT-13B
  TP4's prefills). Fitted on the fit families the per-rank part is zero (row "per token +
  per token / tp" is the shipped fit, 7.1% / 22.4%), and as the only per-token time (row
  "per token / tp", 68.8 µs ÷ TP) all rows go to 9.4% / 26.9% and DistServe's fit rows from
  5.9% / 15.0% to 8.1% / 20.1%: the fit families (OPT-13B at TP 1-2, OPT-66B at TP 2-4) need
  a per-token time that does not shrink with TP, OPT-13B TP4's prefills need one that
  does, so no per-token host term split by rank holds on both (`python -m
  calibration.engines --data ../shared/data --eager-forms`, the screen table). No form
  reaches a p90 of 15% on all rows. The decode half of the miss:
  OPT-66B TP8 decode at batch 1-8 measures 0.81-0.83× the prediction because its batch-1 steps
  imply 439 µs of host time a layer ((31.3 − 3.2) ms / 64) where OPT-13B TP4's imply 567
  µs ((25.9 − 3.2) ms / 40) — the same model code, more ranks, less time a layer — and
  Splitwise's TP2 decode 0.78-0.80× because its steps are 1.4-4.0 ms above the kernels
  where the per-layer sync adds 13.6 ms: one per-layer host time cannot be both.
  History, the additive form (shipped until 2026-12-02; "shipped" in the paragraphs below
  means it): on DistServe's curves the miss was one held-out family, OPT-13B TP4
  (per-family rows above); the other held-out family, OPT-66B TP8, met the targets, so it was not the
  extrapolation in TP that failed. DistServe's curves are fits (a + b·Σ + c·Σ² per family),
  not measurements, and OPT-13B TP4's is not physically consistent: the slope of its decode
  curve in context tokens means reading the KV cache at 2.64 TB/s, 1.30× the A100's HBM
  peak (the other six families: 0.16-0.90×), and OPT-66B's prefill quadratic coefficient ×
  TP, which attention FLOPs per GPU make the same at every TP, ranges from −14 to 184 ns
  over its four TPs. The fit's per-token host time (55 µs: per-sequence work in decode)
  does not shrink with TP, which puts OPT-13B TP4 prefill steps 35% above DistServe's curve
  (median). An eager engine overlaps its Python launches with the kernels; the form "per
  layer the longer of kernels and launches, plus a per-layer sync with TP > 1" fits better
  (rows "overlapped host time") but keeps the held-out p90, and being a max over host and
  kernel time it would make a decode step non-affine in the context, which the engine's
  closed-form decode runs rely on: measured, not shipped (superseded: the engine's second
  decode line takes it, first paragraph). Fitted by the same least squares
  to every family, the held-out ones included, the shipped form keeps a p90 of 20.5%
  (median 10.0%; row "additive form fitted to every family"): even in sample these curves
  do not fit it within the target, so the miss is the curves' mutual inconsistency as
  much as extrapolation (at batch 1 OPT-13B's curves give 23.5, 24.5 and 25.9 ms at TP 1, 2
  and 4, longer as the kernels shrink 4×, while OPT-66B's fall from 57.1 to 31.2 ms from
  TP 2 to 8). `python -m calibration.engines --eager-forms` prints both forms, the every-
  family fit and these curve checks.
  Checked 2026-12-01 (late night), with the harness read from DistServe's repository
  (`calibration/engine_data/distserve_harness.json`, sources with commits): the curves are
  vLLM v0.2.3 (a fork), fp16, dummy weights, Ray workers at every TP (TP1 included), each
  step timed wall clock around `LLMEngine.step()` between two `torch.cuda.synchronize()`,
  so scheduling, the Ray calls, input preparation, sampling and detokenisation are in it;
  prefill = the first step (its detokenisation converts every prompt id: host time per
  prompt token, the same for every model and TP), decode = the median of 15 steps per
  round. The same harness timed DistServe's own C++ engine on the same A100s, models and
  TPs (`profiler-a100-80g.distserve.json`), which separates the hardware from vLLM's host
  path (rows "DistServe's C++ engine ..., kernels only"; the diagnostic's same-box table).
  The C++ engine runs at the kernel model's time where TP is small — median measured /
  kernels 1.04-1.05 on prefill and 0.99-1.03 on decode at OPT-13B TP1 and OPT-66B TP2-3 —
  and 1.04-1.32× with more ranks (OPT-13B TP 2-4, OPT-66B TP 4-8: a cost growing with TP
  even without Python), so the kernel and all-reduce model is not what misses. 2023 vLLM runs 1.40-1.84× the kernels on prefill
  and 1.18-2.95× on decode. Its excess over the C++ engine at batch 1 decode is 8.0-9.3 ms
  for OPT-66B at every TP 2-8 but 3.6, 11.3 and 15.7 ms for OPT-13B at TP 1, 2 and 4: one
  engine adds a TP-independent cost on one model and a TP-growing one on the other, so no
  per-rank or per-layer-per-rank term fits both (the fit families, OPT-66B TP2-4, leave no
  room for one). On prefill its excess per prompt token at 4 × 2048 tokens is 41.0, 35.8
  and 15.5 µs (OPT-13B TP 1, 2, 4) and 49.7, 133.4, 140.4 and 54.8 µs (OPT-66B TP 2, 3, 4,
  8): host time per token would be the same in all seven, so at most ~15 µs of it is the
  prompt's detokenisation and the rest is slower prefill kernels, larger for the larger
  model and not monotone in TP. A term on that structure — a fraction of the prefill
  kernel time, fitted on the fit families (rows "+ prefill kernel scale": 0.273, per-token
  host time 23.6 µs) — lowers all rows to 6.2% / 22.4% and the held-out rows to 11.4% /
  28.1%, OPT-13B TP4 prefill to 19.5% median, but leaves its decode at 26% and every-family
  refits at 27.8% p90; its cause (which prefill kernels of the 2023 stack ran slower) is not
  identified, so it is not shipped. 135 of the 428 scored points lie outside the grid
  DistServe profiled (its 65 OPT-66B TP8 points included: that family is absent from the
  published profiling list), where a curve is its own fit's extrapolation; OPT-13B TP4's
  profiled grid is the widest (up to 250,000 tokens a batch). The miss stays: these curves
  disagree across families by more than the target, in ways the harness explains only in
  part. Checked 2026-12-02 (early morning): a cost per all-reduce growing with TP, beyond
  the all-reduce model (nccl-tests), as the C++ engine's excess suggests (rows "DistServe's
  C++ engine ..., kernels only": 22.5-24.1% median on decode at OPT-13B TP4 and OPT-66B TP8,
  1.2-3.4% at OPT-66B TP 2-3). Fitted on the C++ engine's fit families alone, two
  all-reduces a layer, as c × (tp − 1) (c = 10.1 µs) or c × log2(tp) (14.5 µs), it predicts
  that engine's held-out families (OPT-13B TP4, OPT-66B TP8) at 9.0% and 6.6% median, p90
  14.8% and 13.4% (kernels alone 22.3%, 25.4%). Carried to 2023 vLLM on the same A100s,
  its overheads refitted on the fit families, it does not hold: all rows 9.3% / 25.0% and
  9.0% / 23.0% median / p90 (shipped 7.6% / 25.5%), held-out rows 21.0% / 33.4% and 14.2% /
  34.7% (shipped 12.2% / 34.5%), every family refitted without it p90 27.9% and 26.5%
  (shipped 26.9%); fitted on vLLM's fit rows beside its six overheads, c comes out 0 under
  either form. The C++ engine's TP cost is not 2023 vLLM's (whose excess over the C++
  engine is flat in TP for OPT-66B, above), so no all-reduce term is shipped (`python -m
  calibration.engines --data ../shared/data --eager-forms`, last table).
  Checked 2026-12-02 (morning): where the p90 comes from, and nine costs of the 2023 stack.
  Of the 43 points at or above the all-rows p90, 34 are OPT-13B TP4 (held out): decode at
  batch 1-8 measured 1.35-1.40× the prediction (17 points: a step of 26 ms, CPU-bound,
  where the kernels take 8), decode at batch 128-256 1.39-1.53× (3), prefill of 1,024-8,192
  tokens 0.60-0.74× and one batch-1 64-token prefill 1.44× (14); then OPT-66B TP3-4
  prefills of 2048-token prompts 1.37-1.45× (6), OPT-66B TP8 decode at batch 128-256
  1.43-1.59× (2) and one OPT-13B TP1 decode at batch 256, 0.79×. 27 of the 43 lie inside
  DistServe's profiled grid, and the p90 over in-grid points alone is 24.0%: the curves'
  extrapolation is not the cause. Each cost the 2023 stack has and the shipped form lacks,
  added alone to the shipped overheads and fitted on the fit families (median / p90 all
  rows, then held-out rows; shipped 7.6% / 25.5%, 12.2% / 34.5%): the Ray fan-out (the fork's
  `LLMEngine._run_workers_in_batch`, interestingLSY/vllm@2257483b: one `.remote()` per
  worker with the step's arguments, then `ray.get` of every worker's output) per sequence ×
  TP gets no weight, per prompt token × TP 18.9 µs and worse rows (7.6% / 28.2%, 22.4% /
  60.7%); a per-layer synchronisation growing as tp − 1 or log2 tp and a slower decode kernel
  (2023's PagedAttention against the FlashAttention fit) get no weight; eager all-reduces
  3.1× nccl-tests' time (7.6% / 23.7%, 14.4% / 33.4%), element-wise kernels 4.85× the fit
  (6.2% / 23.8%, 10.8% / 30.6%), prefill kernels 1.27× (6.2% / 22.4%, 11.4% / 28.1%), or
  per-token work every rank repeats at 0.14 ns per token, layer and hidden element (5.8% /
  23.0%, 15.5% / 30.5%); all nine at once 5.5% / 25.0%, 18.9% / 33.0%, and 18.1% p90 even
  fitted to every family in sample. None brings all rows within the 15% p90 or the held-out
  p90 below 28%, and the only two with a known mechanism that the fit uses (all-reduce,
  element-wise) need it at 3-5× what the same A100s' kernel tables measure for it
  (nccl-tests 3-4% median APE, Vidur's element-wise rows 18%, at 1×), so none is shipped.
  Fitted on OPT-66B's fit families alone the shipped form predicts OPT-13B at a p90 of 56%
  (the best term, per-token work × layers × hidden, 37%): what one model's curves say about
  host time does not carry to the other. One form does fit every family within the target in
  sample: the overlapped host time plus a prefill kernel scale (five parameters: 6.6% /
  14.7%); fitted on the fit families it predicts the held-out rows at 10.4% / 26.1% (all rows
  5.0% / 20.4%). Its split of host time between the iteration and the layers moves from
  3.65 ms + 379 µs a layer to 5.25 ms + 308 µs when the held-out families join: every
  launch-bound fit point is OPT-13B (40 layers), so per-iteration and per-layer host time
  trade off until OPT-66B TP8 (64 layers) pins them. It is not shipped: it is not held out,
  its prefill scale has no identified cause, and a launch floor (the longer of host and
  kernel time) would need the engine's closed-form decode runs to take it (engine lane;
  superseded: they do, first paragraph).
  `python -m calibration.engines --data ../shared/data --eager-forms` prints the p90 table,
  the term screen and the form (rows "overlapped host time + prefill kernel scale" above).
  Checked 2026-12-02 (second session), with a second, independent source: Splitwise's
  measurements of 2023 vLLM on DGX-A100 (splitwise-sim's performance database: Llama-2-70B
  fp16, TP 2/4/8, five runs per configuration; another harness, another host, another
  model; 64 rows, every one held out: `docs/calibration.md`). The shipped profile predicts
  them at 16.7% median, 29.5% p90 (rows "vllm-eager-2023: llama-2-70b TP…"). Batch-1 decode
  steps after prompts of 128-8192 tokens measure 53.7-57.3 ms at TP2, 42.2-46.4 ms at TP4 and
  43.0-46.5 ms at TP8, where the kernels take 52.3-53.3, 29.8-30.3 and 19.4-19.7 ms: at TP 4
  and 8 the step is one host-bound floor (~45 ms) whatever the context, at TP2 the host
  time all but vanishes behind the kernels (1.4-4.0 ms above them). The shipped additive
  form adds its host time to the kernels at every TP: TP2 decode 70.4 ms predicted (26.8%
  median), TP8 37.5 ms (17.4%), TP4 47.8 ms (6.6%). The overlapped form (per layer the
  longer of kernels and launches, the per-layer sync added) fitted on DistServe's fit
  families predicts Splitwise's TP4 and TP8 decode steps at 5.4% and 5.3% median (p90 12.3%,
  9.9%) but TP2 decode at 24.7%: its 170 µs per-layer sync is not there. With the sync
  hidden too (per layer the longer of kernels and launch + sync: rows "host time hidden
  behind the kernels"), DistServe's fit families alone predict Splitwise's decode steps
  within the targets at every TP (median 6.7%, 5.6%, 5.4%; p90 9.3%, 12.4%, 10.0% at TP 2, 4,
  8) and its first-token latencies at 10.0-16.2% median (p90 18.1-26.3%); all 64 rows 6.6% /
  20.8%. That form does not fit DistServe better: all 428 rows 10.8% / 24.7%, held-out
  families 12.3% / 34.8% (shipped 7.6% / 25.5%, 12.2% / 34.5%). Refitted with Splitwise's
  other two TPs, no form holds the third within the p90 target (left out TP 2, 4, 8:
  additive 31.1%, 21.3%, 27.5%; overlapped 27.8%, 22.2%, 27.6%; hidden 15.3%, 16.8%, 24.1%)
  and DistServe's held-out families stay at 29.9-33.7% p90. No profile changes: no form
  meets the targets on both sources held out. What the second source adds is the
  structure: 2023 vLLM's decode is a launch floor (host time overlapped with the kernels,
  the all-reduce sync included), which the shipped additive form cannot express at once for
  TP2 (kernel-bound) and TP 4-8 (host-bound); a step that is the longer of host and kernel
  time is not affine in the context, so the engine's closed-form decode runs would have to
  take it (engine lane) before such a form could ship (superseded: they already do, first
  paragraph).
  The two sources' first-token latencies also disagree with one host-time model (the
  shipped fit's 54.6 µs per prompt token stands for what DistServe's prefill steps carry
  beyond the kernels: the prompt's detokenisation in the step it timed and slower prefill
  kernels, above; Splitwise's single 512-token prompt is 5.7 ms above the kernels at TP2,
  where the shipped profile adds 46 ms, and its prompts of 4096-8192 tokens are 213-810 ms
  above them at every TP: slower prefill kernels again). `python -m calibration.engines
  --data ../shared/data --eager-forms` prints the check ("Second source") and the batch-1
  rows.
- **vLLM FP8-KV decode: met since the split-KV form (9.8%, was 10.8%), and what is left.**
  Decode kernels split a long sequence's KV over several thread blocks (docs/costmodel.md,
  "Split-KV decode kernels"); costing few work items a fixed time instead of a bandwidth
  share took this row from 10.8% to 9.8% (mean 12.2%, p90 28.0% against 25.5%) with no
  per-head-dim term. The head-dim dependence is still there (rows "head dim" above): 7%
  at 128, 11% at 64 and 192, 20% at 256, while the bf16 rows of the same kernel stay
  within 6-8%. On reads over 500 MB vLLM's FP8-KV
  kernel streams 2.30, 2.65, 1.90 and 1.43 TB/s of FP8 bytes at head dim 64, 128, 192 and
  256 where its bf16 kernel streams 2.87-2.97 TB/s at all four; SGLang's FP8 kernel has
  the opposite trend (1.72 TB/s at 64, 2.54-2.75 at 192-256) and TensorRT-LLM's is flat
  (2.46-2.81) (`python -m calibration.fit_public --data ../shared/data --decode-rates
  h100-sxm`). Shape for shape (same batch, context and heads, FP8 reads of 500 MB or more;
  same command, third table) vLLM's FP8-KV kernel takes 0.66, 0.57, 0.80 and 1.06× the time
  of its bf16-KV kernel at head dim 64, 128, 192 and 256 — at 256 it is slower than bf16
  while reading half the bytes — where TensorRT-LLM's takes 0.48-0.61× and SGLang's
  0.57-0.83× (0.5: the bf16 rate on half the bytes). So the rate is a property of each
  framework's FP8 kernel instantiation per
  head dim, not of FP8 KV or of the GPU; the roofline form has one bandwidth per KV dtype
  and a per-head-dim bandwidth would be a lookup table fitted to the scored rows, so none
  is added. The rate does not depend on how many query heads share a KV head (vLLM FP8 at
  head dim 128: 2.64-2.67 TB/s at 1 to 8 query heads per KV head; same command, second
  table), so the FP8 path's extra work is per KV element, not per query head. FlashAttention-3's FP8 tile
  configurations differ by head dim (its `tile_size.h`: with paged KV, 160-key tiles up to
  head dim 192, 128-key tiles without intra-warpgroup overlap above), which fits the drop at
  256 but not the 64/192 dips; we found no per-element cost that follows head dim across
  all four. The margin is thin (0.2 points): a refit that moves this row by more is a
  regression to look at, not noise. Checked 2026-12-01 (evening) with no parameter fitted:
  the one physical cost head dim 256 adds in FlashAttention-3's FP8 path — above head dim
  192, with paged KV read without TMA (vLLM's decode: one query token), its tiles run
  without intra-warpgroup overlap (`tile_size.h` `tile_size_fwd_sm90`, element size 1:
  128 × 128 tiles, `IntraWGOverlap = !paged_kv_non_TMA`). Even if each KV tile's WGMMA (a
  128-row query tile, padded from the few packed query heads: 2 × 128 FLOP per K byte and
  per V byte at the FP8 peak, 0.13 ps per KV byte) ran after its load instead of under it
  (an upper bound: FA3's producer warps load the next tiles meanwhile), the stream would go
  from 2.92 TB/s (bf16) to 2.1 TB/s, while the rows run at 1.43 TB/s: at most a third of
  the 0.36 ps per byte the 256 rows cost over bf16, and none of the 64 and 192 dips
  (overlapped tiles there). FP8 V's in-kernel transpose
  through shared memory (one read and one write per V byte, ~33 TB/s of shared memory over
  132 SMs: 0.03 ps per KV byte) is smaller still. So no term is added: the only term that
  would close the 256 rows is a head-dim-256 rate fitted to them. Checked 2026-12-02
  (fourth session), the two remaining candidates. Kernel choice: the table names one
  kernel, `vllm_flash_attn_fa3`, for every head dim and both KV dtypes, so the error is
  not a dispatch to another kernel. Dequantisation and quantisation as element-wise work:
  the FP8 path's extra kernels (the query quantised to FP8, the step's one new token per
  sequence written to the FP8 cache) are per call, a few microseconds whatever the
  context, so they would show on small reads; by bytes read the head-dim-256 rows measure
  1.12-1.13× the prediction below 10 MB and 1.42-1.45× from 10 MB up (192: 1.00-1.09×, then
  1.08-1.22×; the bf16 rows 0.92-1.06× at every size and head dim): a per-byte rate of the
  kernel's FP8 instantiation, where a per-call term cannot reach, and dequantising inside
  the kernel (FP8 to bf16 in registers, no extra bytes) is part of that rate (`python -m
  calibration.fit_public --data ../shared/data --decode-rates h100-sxm`, the table before
  last). No term is added. Checked 2026-12-03, a cache-size regime (reads that fit the
  H100's 50 MB L2 served from it): by KV bytes read either side of 50 MB the head-dim-256
  FP8 rows reach 0.70 TB/s at 20-40 MB and 0.95 at 40-80 MB, 0.64× and 0.65× the
  head-dim-128 FP8 rows (1.10 and 1.46), and 0.52× above 640 MB; every FP8 and bf16 head
  dim's bandwidth rises smoothly through 50 MB (same command, last table;
  `tests/test_vllm_fp8_decode_sizes.py`). The deficit holds inside the L2 as beyond it, so
  it is not an L2 regime, and no term is added.
- **FP8 GEMM (SGLang rows): met by SGLang's own kernel.** The shared FP8 GEMM as it was
  until 2026-12-02 (`ops.gemm.fp8`: TensorRT-LLM's efficiencies, SGLang's floor) erred by a
  median 12.9% on SGLang's rows, and the smooth GEMM form refitted to those rows alone by 12.9% too
  (extrapolation section, "refit to its own rows"): SGLang's kernel (`sgl-kernel`
  `fp8_scaled_mm`, CUTLASS) picks its CTA tiles by m (`sm90_fp8_dispatch_shape`), and its
  times step where the configuration changes (median measured/predicted under that shared
  form 0.96 at m ≤ 64, 1.04 at 65-128, 1.28 at 129-256, above 256 1.05 at multiples of 256
  but 1.22 one row past them: `python -m calibration.fit_public --data ../shared/data
  --gemm-ratios h100-sxm`). The profile holds that kernel (`gemm_kernels.sglang-fp8`),
  which the `sglang` engine profile names (`fp8_gemm_kernel`) and the step model runs for an
  SGLang worker's FP8 GEMMs: the dispatch table (m ≤ 64: 64 × 64 tiles in 1 × 4 clusters;
  65-128: 64 × 64; 129-1024: 128 × 128; above: 128 × 128 in 2 × 1 clusters; its m = 1
  branch folded into m ≤ 64), tiles rounded up to whole clusters and run in whole waves over
  the SMs, one efficiency per tile configuration, a per-output epilogue time, the floor and
  the memory bound fitted to every SGLang FP8 row (`ops.tiled_gemm_time_s`,
  `calibration/fit_public.py` `fit_tiled_fp8_kernel`, `SGLANG_FP8`). Until 2026-12-01 the
  table was the source's, whose 65-256 branch runs 64 × 64 tiles (9.9% median, 12.4% mean,
  26.6% p90 in sample; 9.96% / 12.5% / 26.6% held out by (n, k) family: a 0.04-point
  margin, and m 129-256 the worst range at 19.3%). The rows themselves say which tile ran
  there: with n ≤ 1024 a GEMM has at most 64 CTAs up to m = 256 under either table, one
  wave, so its time is one CTA's, and that time doubles from m = 128 to 129 and stays level
  to m = 256 and with m 257-512 (128 × 128 by the table) — SGLang at k = 65536: 49 µs at
  m = 64, 71-75 µs at 65-128, 170-185 µs at 129-256, 188 µs at 257, 206 µs at 512; vLLM,
  whose table runs 128 × 128 from m = 129, 178-196 µs at 129-256 (`python -m
  calibration.fit_public --data ../shared/data --gemm-variants sglang`, last table; the same
  at k = 16384 and 51200). Under the source's 64 × 64 tiles a CTA's work at m 129-256 is
  the same as at 65-128, so no wave count gives that step: the timed kernel ran 128-row
  tiles there. Of the candidate tiles, 128 × 128 (the 257-1024 branch's configuration, its
  efficiency shared: no new parameter) fits and 128 × 64 or 64 × 128 do not (held out by
  (n, k) family: 9.2%, 10.0%, 10.2% median). With it, before the L2 bound (below), the
  rows erred 9.1% median, 10.9% mean, 22.1% p90 in sample (the target row), 9.2% / 11.0% /
  22.1% held out, m 129-256 9.1%; the 64 × 64 efficiency went from 0.40 to 0.52, the
  128 × 128 one from 0.81 to 0.82. Which sgl-kernel build or path the public tables timed is not
  recorded, and every public version of `sm90_fp8_dispatch_shape` found says 64 × 64 to
  m = 256: a kernel trace on a Hopper GPU (CUTLASS kernel names carry the tile shape) would
  confirm it; the source's table stays a diagnostic variant (`SGLANG_FP8_SOURCE_TABLE`).
  Other GPUs of the Hopper architecture (H200, H800, H100 PCIe) take the same table and
  efficiencies with their SM counts. vLLM's engine runs its own kernel the same way
  (`vllm-fp8`, the `vllm` engine profile's `fp8_gemm_kernel`): with per-tensor scales on
  Hopper vLLM runs CUTLASS `cutlass_scaled_mm` (FlashInfer's FP8 kernel, first in its list,
  needs compute capability 10.0), whose SM90 dispatch (`scaled_mm_sm90_fp8_dispatch.cuh`)
  depends on m, n and k and swaps the operands for m ≤ 64 (the weights as the kernel's m:
  64 × 16 × 256 tiles, 1 × 2 or 1 × 4 clusters for n ≤ 1280; 64 × 64 × 256 above at
  17-64), then 64 × 128 (65-128), a cooperative 256 × 128 for m ≥ 8192 with k ≥ 6144, else
  128 × 128 in 2 × 1 clusters; one efficiency per tile shape and schedule (five), fitted to
  every vLLM FP8 row (`VLLM_FP8`; docs/calibration.md). vLLM's FP8 rows: 21.8% → 8.4%
  median, 25.5% → 13.2% mean, 55.2% → 30.7% p90 (kernel section, with the L2 bound below),
  8.4% median held out by (n, k) family (extrapolation section); no target row (the GEMM
  target is SGLang's). The
  table is the current source's; the public tables do not record which source vLLM 0.24.0
  was built from. TensorRT-LLM's FP8 GEMM (`cublas_scaled_mm`, cuBLASLt, whose dispatch
  is cuBLAS's heuristics, not a public table) is `ops.gemm.fp8` itself since 2026-12-02,
  fitted on its own rows with the dynamic per-tensor scale they hold costed apart (29.3% →
  4.3% median, 50.5% → 15.9% p90; docs/costmodel.md). Since 2026-12-02 both kernels' tile forms carry an L2 bound (`l2_bytes_per_s`,
  docs/costmodel.md): every CTA tile loads its two operand tiles, (tm / cn + tn / cm) × k
  bytes, from L2 (TMA multicast shares the A tile over the cn CTAs of its cluster and the B
  tile over its cm), and the kernel takes the longest of its waves of tiles, its HBM bytes
  and that traffic at one fitted L2 rate. Why it is there: a 128 × 128 FP8 tile does 128 FLOP
  per operand byte it loads, so a full wave of them at the FP8 peak would draw 15.5 TB/s
  from L2, which Hopper's L2 does not serve (CUTLASS's clusters and multicast exist to cut
  that traffic). The fitted rates are 7.31 TB/s (SGLang) and 6.39 TB/s (vLLM). Held out by
  (n, k) family, median / mean / p90: SGLang 9.2% / 11.0% / 22.1% → 7.9% / 10.0% / 20.1%
  (the target row in sample 9.1% / 10.9% / 22.1% → 7.8% / 10.0% / 20.0%; m 129-256 9.1% →
  7.3%, m > 256 9.4% → 7.1%, but the m 17–256 bucket's p90 20.5% → 22.7%); vLLM 8.3% /
  13.6% / 32.0% → 8.4% / 13.2% / 30.7% (median up 0.1 point; m 129-256 15.1% → 9.5%). The bound binds on 30% of SGLang's rows and 19% of vLLM's (none at m ≤ 64,
  39-46% above m = 1024), where the median measured/predicted is 1.00 and 1.01. What it
  does not capture: the fastest large GEMMs (m > 1024 at more than 1,250 TFLOP/s: 2,344
  SGLang rows, 868 vLLM) run faster than the bound allows (median measured/predicted 0.94
  and 0.86), so the one rate is an effective rate, not the L2's peak; and with the bound
  binding on every full wave of SGLang's 2 × 1-cluster branch (m > 1024) that branch's
  compute efficiency goes to its bound, 1.0 (only partial waves see it). Under the source's
  table the bound made SGLang's rows worse (9.1% / 12.8% / 27.6%): it holds only with the
  tiles the rows ran. The H100 PCIe takes the rate times its clock ratio (0.885: FP8 peak
  per SM), the H200 and H800 the H100's. `python -m calibration.fit_public --data
  ../shared/data --gemm-variants sglang` (and `vllm`) prints both forms (rows "shipped" and
  "without the L2 bound"). Variants, not shipped (same command, each refitted with the
  bound, held out by (n, k) family): a factor on the quantisation kernel (each framework's
  own kernel, not the element-wise fit) comes out 0.98 on SGLang (no gain; 0.83 without the
  bound, where it stood in for the L2 traffic) and 1.56 on vLLM (8.4% → 7.4% median); the
  step model costs one quantisation kernel for every engine, and AIConfigurator's vLLM
  collector (`collector/vllm/collect_gemm.py`) builds its FP8 layers with static activation
  scales, one quantisation pass, so a dynamic scale's extra reduction pass does not
  explain vLLM's factor: none is shipped. A
  ping-pong schedule's epilogue under the other warp group's mainloop (each SM's epilogue
  paid once, not per wave; vLLM's cooperative branch keeps it per wave) fits worse on both
  (9.4% and 10.8% median). vLLM's rows fit its current table better than its earlier one
  (8.8% median; no swapped small-m configs, no 256 × 128 branch). Tried before and not
  kept: a wave-quantisation factor on the smooth form (13.9%), per-m-range efficiencies, a
  serial k-loop bound (12.4%), and two tile shapes with one efficiency each (12.9%).
- **Decode attention, context extrapolation (no target).** Before the split-KV form, a
  fit on ≤ 2048 tokens per sequence charged few work items a share of the bandwidth
  (`par_half_sat` 24 on TensorRT-LLM's XQA rows, H100) at every context, while the kernels
  split long sequences over several thread blocks (XQA's multi-block mode:
  `computeMultiBlockCount`, up to `sqrt(8 × L / 128)` blocks a sequence within 8 waves of
  the SMs; FlashAttention's split-KV likewise), so a one-sequence, one-KV-head read of
  131,072 tokens runs at 1.46 TB/s, not the 0.11 TB/s the share predicted. Fitted on ≤ 2048
  and tested on > 8192 tokens, median APE before → after: XQA 156.9% → 22.9% (H100),
  180.9% → 40.3% (A100); vLLM 36.3% → 9.6%, 78.4% → 17.7%; SGLang 48.8% → 9.9%, 51.7% →
  14.9%; masked MHA 38.2% → 10.4%, 16.6% → 20.8%. In sample (kernel section) the FlashAttention
  fits gain on the H100 (vLLM bf16 7.3% → 6.7%, SGLang 9.2% → 8.5%) and lose a little on
  the A100 (7.3% → 7.7%, 6.6% → 7.6%), and TensorRT-LLM's fits lose 0.2-2.5 points (H100
  XQA bf16 14.6% → 15.7%, masked MHA FP8 14.8% → 17.3%): the fixed time stands for a split
  count that grows with the context. XQA's own count (`sqrt` rule and wave cap) as the
  work items of the bandwidth share fitted better than that first split form, but not
  better than its successor, the split fill as a shortfall of the stream (2026-12-04; XQA
  bf16, count against shortfall: in sample 11.3% / 11.1% (H100) and 10.4% / 9.9% (A100);
  fitted on short contexts 17.0% / 10.1% and 27.9% / 29.0%, 90th percentile 37.8% / 94.0%
  on the A100; `python -m calibration.fit_public --data ../shared/data --xqa-split GPU`),
  and it makes a step non-affine in the context at a fixed batch (piecewise affine: the
  count changes at discrete tokens per sequence), which the engine's closed-form decode
  runs rely on, so it was not shipped. Since 2026-12-03 XQA is fitted as a multi-block wave kernel (the rule's
  count, whole waves of thread blocks over the SMs, the smallest of one line per count;
  docs/costmodel.md, "XQA's multi-block waves") and the engine ends a decode run where the
  smallest line changes: the XQA context rows above are that form (before: H100 22.0%, A100
  38.7% with the split-KV form and its item terms).
  Masked MHA on the A100 got worse (16.6% → 20.8%), and not by chance: fitted on ≤ 2048
  tokens per sequence, the split form predicts the > 8192-token rows too fast at every
  batch (median measured/predicted 1.08-1.29 at batch 1-64) and every KV-head count
  (1.06-1.31), where the bandwidth-share form erred both ways (0.74 at batch 1, 1.03-1.52 at
  8 and above) and its errors cancelled in the median (the extrapolation row's refit done
  both ways, test rows grouped by batch and KV heads: `python -m calibration.fit_public
  --data ../shared/data --context-ratios a100-80gb`, kernel `trtllm-mmha`; batch 128 has
  one row). The A100's masked MHA streams a few
  long sequences slower than many short ones of the same size (vanilla-MHA rows reading
  over 640 MB: median 1.57 TB/s over > 8192 tokens per sequence against 1.73 TB/s over
  ≤ 2048), so a long sequence split over thread blocks does not reach the bandwidth the
  short-context fit sets; on the H100 it nearly does (2.85 against 2.94 TB/s), where the
  same refit gains (38.2% → 10.4%). On the A100 vLLM's FA2 shows a small gap (1.50 against
  1.57 TB/s) and SGLang's a larger one (0.82 against 1.11), and its held-out context error is
  14.9%: the gap is the A100 kernels', not the form's (`python -m calibration.fit_public
  --data ../shared/data --decode-context-rates a100-80gb`, rows "> 640 MB"; 2026-12-01). XQA at A100 long contexts (40.3% then; 16.6%
  with the wave form since 2026-12-03) was the worst held-out row left. In KV heads (fit ≤ 8 → test 32) the change is small: SGLang 6.3% → 8.5% (H100),
  5.7% → 3.8% (A100); masked MHA 10.4% → 12.4%, 13.1% → 12.8%.
"""
COMMAND = "disaggsim calibrate validate --gpu a100-80gb h100-sxm --data ../shared/data --write-doc"


@dataclass(frozen=True, slots=True)
class Row:
    gpu: str
    op: str
    source: str
    bucket: str
    n: int
    median_ape: float
    mean_ape: float
    p90_ape: float
    target: str = ""
    met: bool | None = None


def _row(
    gpu: str, op: str, source: str, bucket: str, a: np.ndarray, target_op: str | None = None
) -> Row:
    a = np.asarray(a, float)
    target, met = "", None
    if target_op is not None and len(a):
        med_max, mean_max, p90_max = TARGETS[target_op]
        target = (
            f"median ≤ {med_max:.0%}"
            + (f", mean ≤ {mean_max:.0%}" if mean_max else "")
            + (f", p90 ≤ {p90_max:.0%}" if p90_max else "")
        )
        met = bool(
            np.median(a) <= med_max
            and (mean_max is None or np.mean(a) <= mean_max)
            and (p90_max is None or np.percentile(a, 90) <= p90_max)
        )
    if not len(a):
        return Row(gpu, op, source, bucket, 0, float("nan"), float("nan"), float("nan"))
    return Row(
        gpu,
        op,
        source,
        bucket,
        len(a),
        float(np.median(a)),
        float(np.mean(a)),
        float(np.percentile(a, 90)),
        target,
        met,
    )


def ape(pred, meas) -> np.ndarray:
    meas = np.asarray(meas, float)
    return np.abs(np.asarray(pred, float) - meas) / meas


def gemm_bucket(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, float)
    return np.where(m <= 16, "m ≤ 16", np.where(m <= 256, "m 17–256", "m > 256"))


def _backend_for(fw: str) -> str:
    """A framework's attention backend (TensorRT-LLM's: its XQA and prefill kernels)."""
    return {"vllm": "vllm-flash", "sglang": "sglang-flash", "trtllm": "trtllm"}[fw]


def validate_gpu(gpu: str, data: Path, prof: HardwareProfile) -> list[Row]:
    rows: list[Row] = []
    pk = prof.peaks
    g = public.aic_gemm(data, gpu)
    engine_profiles = load_engines()
    for key, t in g.groupby(["framework", "dtype"], sort=True):
        fw, dt = (str(x) for x in cast(tuple, key))
        if dt == "fp8" and pk.fp8_flop_per_s <= 0:
            continue
        # the framework's own GEMM kernel where its engine profile names one and the
        # hardware profile fits it (SGLang's FP8 GEMM), else the profile's ops.gemm
        eng = engine_profiles.get(fw)
        tiles = prof.gemm_kernel(eng.fp8_gemm_kernel if eng else None, dt)
        if tiles is None:
            pred = ops.gemm_time_s(pk, prof.gemm_params(dt), t["m"], t["n"], t["k"], dt)
        else:
            pred = ops.tiled_gemm_time_s(pk, tiles, t["m"], t["n"], t["k"])
        if dt == "fp8":  # every framework's FP8 row holds its activation-quantisation kernel
            pred = pred + quant_s(pk, prof.elementwise, t["m"], t["k"])
        dynamic = dt == "fp8" and fw in DYNAMIC_SCALE_FRAMEWORKS and tiles is None
        if dynamic:  # TensorRT-LLM's rows: and a dynamic per-tensor scale
            pred = pred + ops.fp8_dynamic_scale_time_s(pk, prof.gemm_params(dt), t["m"], t["k"])
        a = ape(pred, t["t_s"])
        tgt = "gemm" if GEMM_FRAMEWORK.get(dt) == fw else None
        src = f"AIC {fw} {dt}" + (f" ({eng.fp8_gemm_kernel})" if tiles is not None and eng else "")
        src += " (+ dynamic scale)" if dynamic else ""
        rows.append(_row(gpu, "gemm", src, "all", a, tgt))
        b = gemm_bucket(t["m"].to_numpy(float))
        for bucket in ("m ≤ 16", "m 17–256", "m > 256"):
            rows.append(_row(gpu, "gemm", src, bucket, a[b == bucket]))
    d = public.aic_decode_attention(data, gpu)
    d = d[~d["kernel"].isin(MINOR_KERNELS)]
    for key, t in d.groupby(["framework", "dtype"], sort=True):
        fw, dt = (str(x) for x in cast(tuple, key))
        backend = _backend_for(fw)
        if backend not in prof.attention_backends:
            continue
        a = np.full(len(t), np.nan)
        kernels = decode_backend_of_rows(t)
        if TRTLLM_PER_QUERY_HEAD_BACKEND not in prof.attention_backends:
            kernels[:] = backend  # a profile without the split: one kernel for every layout
        for kernel in sorted(set(kernels.tolist())):
            sel = kernels == kernel
            k = t[sel]  # predicted as its table timed it (fit_public.table_peaks)
            a[sel] = ape(
                predict_decode_rows(pk, prof.decode_attention_for(kernel, dt), dt, k), k["t_s"]
            )
        tgt = "decode_attention" if fw == ATTENTION_FRAMEWORK else None
        src = f"AIC {fw} kv {dt} ({backend})"
        rows.append(_row(gpu, "decode_attention", src, "all", a, tgt))
        kh = t["kv_heads"].to_numpy()
        for name, sel in (("KV heads ≤ 8", kh <= 8), ("KV heads > 8", kh > 8)):
            if sel.any() and not sel.all():
                rows.append(_row(gpu, "decode_attention", src, name, a[sel]))
        if len(set(kernels.tolist())) > 1:  # TensorRT-LLM: XQA and masked-MHA layouts
            for kernel, name in (
                (backend, "XQA layouts (2-32 q heads per KV head)"),
                (TRTLLM_PER_QUERY_HEAD_BACKEND, "masked-MHA layouts (1 or > 32), trtllm-mmha"),
            ):
                rows.append(_row(gpu, "decode_attention", src, name, a[kernels == kernel]))
        if tgt:  # the targeted kernel by head dim (FP8 KV depends on it, bf16 does not)
            hd = t["head_dim"].to_numpy()
            for h in sorted(set(hd.tolist())):
                rows.append(_row(gpu, "decode_attention", src, f"head dim {h:.0f}", a[hd == h]))
    p = public.aic_prefill_attention(data, gpu)
    p = p[~p["kernel"].isin(MINOR_KERNELS)]
    for key, t in p.groupby(["framework", "kv_dtype"], sort=True):
        fw, kv = (str(x) for x in cast(tuple, key))
        backend = _backend_for(fw)
        if backend not in prof.attention_backends:
            continue
        pprm = prof.prefill_attention_for(backend, kv)  # bf16's where kv has no fit of its own
        a = ape(
            ops.prefill_attention_time_s(
                pk, pprm, t["num_seqs"], t["new_tokens"], t["pairs"], t["heads"], t["head_dim"]
            ),
            t["t_s"],
        )
        tgt = "prefill_attention" if fw == ATTENTION_FRAMEWORK and kv == "bf16" else None
        src = f"AIC {fw} kv {kv} ({backend})"
        rows.append(_row(gpu, "prefill_attention", src, "all", a, tgt))
        plen = t["prompt_tokens"].to_numpy()
        for lo, hi, name in (
            (0, 512, "isl ≤ 512"),
            (512, 4096, "isl 513–4096"),
            (4096, 1e9, "isl > 4096"),
        ):
            sel = (plen > lo) & (plen <= hi)
            if sel.any():
                rows.append(_row(gpu, "prefill_attention", src, name, a[sel]))
    for frame, tgt_on in (
        (public.aic_allreduce(data, gpu), True),
        (public.vidur_allreduce(data, gpu), False),
    ):
        for key, t in frame.groupby(["framework", "num_gpus"], sort=True):
            fw, n = str(cast(tuple, key)[0]), int(cast(tuple, key)[1])
            a = ape(ops.allreduce_time_s(prof.allreduce, t["nbytes"], n), t["t_s"])
            rows.append(
                _row(
                    gpu,
                    "allreduce",
                    f"{fw} {n} GPUs",
                    "all",
                    a,
                    "allreduce" if tgt_on else None,
                )
            )
    mlp = public.vidur_mlp(data, gpu)
    gm = mlp[mlp["op"].isin(public.VIDUR_GEMM_OPS)]
    a = ape(ops.gemm_time_s(pk, prof.gemm_params("bf16"), gm["m"], gm["n"], gm["k"]), gm["t_s"])
    rows.append(_row(gpu, "gemm", "Vidur mlp.csv GEMMs", "all", a))
    ew = mlp[mlp["op"].isin(public.VIDUR_ELEMENTWISE_OPS)]
    a_ew = ape(ops.elementwise_time_s(pk, prof.elementwise, ew["nbytes"]), ew["t_s"])
    rows.append(_row(gpu, "elementwise", "Vidur mlp.csv norm/rope/act/add", "all", a_ew))
    rows += step_model_vs_vidur(gpu, mlp, prof)
    rows += graph_gap_rows(gpu, data)
    return rows


def extrapolation_rows(gpu: str, data: Path) -> list[Row]:
    """Fits that must extrapolate: refit on a part of the public rows, test on the rest
    (whole shape families held out). Decode attention per backend: fit on ≤ 8 KV heads,
    test on the 32-KV-head rows (SGLang and TensorRT-LLM have them); fit on contexts ≤ 2048
    tokens per sequence, test on > 8192; TensorRT-LLM's XQA also fit on ≤ 8 query heads per
    KV head (test ≥ 12), on head dim 128 (test the others) and on batches ≤ 64 (test ≥ 256). Prefill attention: fit on prompts ≤ 2048, test on
    > 4096. GEMM bf16: fit on m ≤ 1024 tokens, test on m ≥ 4096."""
    from calibration.fit import (
        fit_gemm,
        fit_prefill_attention,
    )

    pk = peaks_of(gpu)
    rows: list[Row] = []
    d = public.aic_decode_attention(data, gpu)
    d = d[(~d["kernel"].isin(MINOR_KERNELS)) & (d["dtype"] == "bf16")]
    for backend in BACKEND_FRAMEWORKS:
        # TensorRT-LLM per kernel: its XQA layouts and its masked-MHA layouts
        t = _decode_backend_rows(d, backend)
        if t.empty:
            continue
        fw = BACKEND_FRAMEWORKS[backend]
        label = {"trtllm": " (XQA)", TRTLLM_PER_QUERY_HEAD_BACKEND: " (masked MHA)"}.get(
            backend, ""
        )
        per_seq = (t["context_tokens"] / t["batch"]).to_numpy()
        splits = [
            ("fit KV heads ≤ 8 → test 32", t["kv_heads"] <= 8, t["kv_heads"] == 32),
            (
                "fit context ≤ 2048 → test > 8192",
                per_seq <= CONTEXT_FIT_MAX_TOKENS,
                per_seq > CONTEXT_TEST_MIN_TOKENS,
            ),
        ]
        if backend in WAVE_BACKENDS:  # XQA's layouts and batches as families as well
            group = (t["heads"] / t["kv_heads"]).round()
            splits += [
                ("fit q heads per KV head ≤ 8 → test ≥ 12", group <= 8, group >= 12),
                (
                    "fit head dim 128 → test 64, 192, 256",
                    t["head_dim"] == 128,
                    t["head_dim"] != 128,
                ),
                ("fit batch ≤ 64 → test ≥ 256", t["batch"] <= 64, t["batch"] >= 256),
            ]
        for name, tr_sel, te_sel in splits:
            tr, te = t[np.asarray(tr_sel)], t[np.asarray(te_sel)]
            if te.empty or tr.empty:
                continue
            pred = refit_decode_predict(pk, backend, tr, te, num_sms=NUM_SMS.get(gpu, 0))
            src = f"AIC {fw} kv bf16{label}"
            rows.append(_row(gpu, "decode_attention", src, name, ape(pred, te["t_s"])))
    p_all = public.aic_prefill_attention(data, gpu)
    p_all = p_all[~p_all["kernel"].isin(MINOR_KERNELS)]
    fp8_kv = [(BACKEND_FRAMEWORKS[b], "fp8") for b in FP8_KV_PREFILL_BACKENDS]
    for fw, kv in [(f, "bf16") for f in dict.fromkeys(BACKEND_FRAMEWORKS.values())] + fp8_kv:
        t = p_all[(p_all["framework"] == fw) & (p_all["kv_dtype"] == kv)]
        tr, te = t[t["prompt_tokens"] <= 2048], t[t["prompt_tokens"] > 4096]
        if te.empty or tr.empty:
            continue
        f = fit_prefill_attention(
            pk, tr["num_seqs"], tr["new_tokens"], tr["pairs"], tr["heads"], tr["head_dim"],
            tr["t_s"], held_out=False,
        )  # fmt: skip
        pred = ops.prefill_attention_time_s(
            pk, f.params, te["num_seqs"], te["new_tokens"], te["pairs"], te["heads"], te["head_dim"]
        )
        rows.append(
            _row(
                gpu,
                "prefill_attention",
                f"AIC {fw} kv {kv}",
                "fit prompt ≤ 2048 → test > 4096",
                ape(pred, te["t_s"]),
            )
        )
    g = public.aic_gemm(data, gpu)
    t = g[(g["framework"] == GEMM_FRAMEWORK["bf16"]) & (g["dtype"] == "bf16")]
    tr, te = t[t["m"] <= 1024], t[t["m"] >= 4096]
    f = fit_gemm(pk, tr["m"], tr["n"], tr["k"], tr["t_s"], held_out=False)
    pred = ops.gemm_time_s(pk, f.params, te["m"], te["n"], te["k"])
    rows.append(
        _row(gpu, "gemm", "AIC vllm bf16", "fit m ≤ 1024 → test ≥ 4096", ape(pred, te["t_s"]))
    )
    if pk.fp8_flop_per_s > 0:  # each framework's FP8 path refitted on its own rows
        prof = load_profile(gpu)
        ew = prof.elementwise
        for fw_key, t in g[g["dtype"] == "fp8"].groupby("framework", sort=True):
            fw8 = str(fw_key)
            if fw8 == FP8_FRAMEWORK:  # the form ops.gemm.fp8 is fitted with (dynamic scale)
                continue
            extra = quant_s(pk, ew, t["m"], t["k"])
            f = fit_gemm(pk, t["m"], t["n"], t["k"], t["t_s"], "fp8", held_out=False, extra_s=extra)
            pred = ops.gemm_time_s(pk, f.params, t["m"], t["n"], t["k"], "fp8") + extra
            rows.append(
                _row(gpu, "gemm", f"AIC {fw8} fp8", "refit to its own rows", ape(pred, t["t_s"]))
            )
        if ((g["dtype"] == "fp8") & (g["framework"] == FP8_FRAMEWORK)).any():
            # ops.gemm.fp8's own fit (TensorRT-LLM's cuBLASLt GEMM + its rows' dynamic scale):
            # (n, k) families held out, and fitted on m <= 1024 -> tested on m >= 4096
            launch = prof.gemm_params("bf16").launch_s
            src8 = f"AIC {FP8_FRAMEWORK} fp8 (+ dynamic scale)"
            _, _, _, held = fit_gemm_fp8(g, pk, ew, launch)
            rows.append(_row(gpu, "gemm", src8, "(n, k) families held out", held))
            t8 = g[(g["dtype"] == "fp8") & (g["framework"] == FP8_FRAMEWORK)]
            prm8, _, _, _ = fit_gemm_fp8(g[g["m"] <= 1024], pk, ew, launch, held_out=False)
            te = t8[t8["m"] >= 4096]
            pred = fp8_row_s(pk, ew, GemmParams(**prm8), FP8_FRAMEWORK, te["m"], te["n"], te["k"])
            rows.append(_row(gpu, "gemm", src8, "fit m ≤ 1024 → test ≥ 4096", ape(pred, te["t_s"])))
        for spec in TILE_KERNELS if gpu in NUM_SMS else ():
            # a framework's own FP8 kernel, its (n, k) families held out of refits
            if not ((g["dtype"] == "fp8") & (g["framework"] == spec.framework)).any():
                continue
            _, _, held = fit_tiled_fp8_kernel(g, pk, ew, NUM_SMS[gpu], spec)
            rows.append(
                _row(
                    gpu, "gemm", f"AIC {spec.framework} fp8 ({spec.name})",
                    "dispatch-table form, (n, k) families held out", held,
                )
            )  # fmt: skip
    return rows


# raw rows timed call by call: shorter ones hold launch time; graph-timed rows hold only the
# replay and cold-weight time the like-with-like row adds (2 us on the H200), so shorter
# ones are compared there too (the fp8 weight streams of the sweep are 10-35 us)
HELD_OUT_GPU_MIN_S = {"eager": 40e-6, "graph": 10e-6}
# the runs of a GPU none of whose kernel parameters was fitted to them, the first the one
# the targets apply to (graph-timed: kernel time), the others shown beside it
HELD_OUT_RUNS = {
    "h200-sxm": ("calibration/runs/h200-2026-12-04/raw", "calibration/runs/h200-2026-11-29"),
}


def run_timing(raw: pd.DataFrame) -> str:
    """``graph`` where every GEMM row of a raw run was replayed in CUDA graphs, else
    ``eager`` (timed call by call: the harness before graph timing wrote no ``timing``)."""
    g = raw[raw["op"] == "gemm"]
    if "timing" in g.columns and len(g) and (g["timing"].astype(str) == "graph").all():
        return "graph"
    return "eager"


def run_label(raw_dir: Path) -> str:
    """A raw run's name: its folder, or the run's folder for a ``raw`` subfolder."""
    return raw_dir.parent.name if raw_dir.name == "raw" else raw_dir.name


def held_out_gpu_rows(gpu: str, source_gpu: str, raw_dir: Path, target: bool = True) -> list[Row]:
    """The profile ``gpu`` takes by the same-architecture rule (``source_gpu``'s fitted
    efficiencies, ``gpu``'s peaks: ``calibration/priors/<gpu>.json``) against the kernels
    measured on ``gpu`` itself, which none of its kernel parameters were fitted to; only
    rows of at least :data:`HELD_OUT_GPU_MIN_S` of the run's timing are compared. GEMM
    rows are compared twice: the kernel alone, and like with like — the kernel plus the
    run's per-call time, the median excess of the measured over the predicted time on the
    run's floor rows (:func:`calibration.fit.per_call_time_s`: tiny GEMMs, disjoint from
    the compared rows; timed call by call that is the launch path, in graphs the replay
    and weights cold in L2). ``target``: the like-with-like rows carry
    the held-out GEMM target. Then each dtype's memory efficiency fitted alone over the
    prior's other GEMM parameters (:func:`calibration.fit.fit_gemm_mem_eff_alone`), which
    the Hopper rule says is ``source_gpu``'s; and attention rows per measured backend,
    against the profile's generic kernel (another kernel: no target)."""
    from calibration.fit import fit_gemm_mem_eff_alone, per_call_time_s
    from calibration.fit_public import PRIORS_DIR
    from calibration.rawio import read_raw
    from disaggsim.hardware.profile import profile_filename

    prior = load_profile(gpu, path=PRIORS_DIR / profile_filename(gpu))
    pk = prior.peaks
    raw = read_raw(raw_dir)
    timing = run_timing(raw)
    min_s = HELD_OUT_GPU_MIN_S[timing]
    df = raw[raw["median_s"] >= min_s]
    rows: list[Row] = []
    name = f"{run_label(raw_dir)} ({'graph-timed' if timing == 'graph' else 'timed call by call'})"
    src = f"{name}, rows ≥ {min_s * 1e6:.0f} µs, vs {source_gpu} efficiencies"
    for dt, t in raw[raw["op"] == "gemm"].groupby("dtype"):
        prm = prior.gemm_params(str(dt))
        pred = ops.gemm_time_s(pk, prm, t["m"], t["n"], t["k"], str(dt))
        meas = t["median_s"].to_numpy(float)
        compared = meas >= min_s
        call = per_call_time_s(pred, meas, prm.launch_s, compared)
        a = ape(pred[compared], meas[compared])
        rows.append(_row(gpu, "gemm", src, f"{dt}", a, None if call or not target else "held_gemm"))
        if call is None:
            continue
        call_s, n_floor = call
        src_like = (
            f"{src} + the run's per-call time ({call_s * 1e6:.2f} µs, median over "
            f"{n_floor} floor rows)"
        )
        a = ape(pred[compared] + call_s, meas[compared])
        rows.append(_row(gpu, "gemm", src_like, f"{dt}", a, "held_gemm" if target else None))
        m_bucket = gemm_bucket(t["m"].to_numpy(float)[compared])
        for mb in ("m ≤ 16", "m 17–256", "m > 256"):
            if (m_bucket == mb).any():
                rows.append(_row(gpu, "gemm", src_like, f"{dt}, {mb}", a[m_bucket == mb]))
        got = fit_gemm_mem_eff_alone(pk, prm, t, str(dt), min_s)
        if not isinstance(got, str):
            own = got.params
            pa = ops.gemm_time_s(pk, own, t["m"], t["n"], t["k"], str(dt)) + got.extra["per_call_s"]
            rows.append(
                _row(
                    gpu, "gemm",
                    f"{name}: mem_eff fitted alone {own.mem_eff:.4f} ({source_gpu}'s "
                    f"{prm.mem_eff:.4f}), the rest {source_gpu}'s, + per-call time",
                    f"{dt}, in sample", ape(pa[compared], meas[compared]),
                )
            )  # fmt: skip
    for op in ("decode_attention", "prefill_attention"):
        for backend, t in df[df["op"] == op].groupby("backend"):
            if op == "decode_attention":
                pred = ops.decode_attention_time_s(
                    pk,
                    prior.decode_attention_params("bf16"),
                    t["batch"],
                    t["context_tokens"],
                    t["kv_heads"],
                    t["head_dim"],
                )
            else:
                b = t["batch"].to_numpy(float)
                pt = t["prompt_tokens"].to_numpy(float)
                pred = ops.prefill_attention_time_s(
                    pk,
                    prior.prefill_attention_params("bf16"),
                    b,
                    b * pt,
                    b * ops.causal_pairs(pt),
                    t["heads"],
                    t["head_dim"],
                )
            a = ape(pred, t["median_s"])
            # the run timed torch's kernels, the profile's generic kernel is vLLM's FA3:
            # different kernels, so this row transfers a kernel, not only a GPU
            rows.append(_row(gpu, op, f"{src}; measured kernel {backend}", "bf16", a))
    return rows


CROSS_GPU_SOURCE = {"h100-sxm": "a100-80gb"}  # a GPU with tables: the fitted GPU it is carried from


def cross_gpu_attention_rows(gpu: str, source_gpu: str, data: Path) -> list[Row]:
    """``gpu``'s public attention rows predicted by :func:`~calibration.fit_public.prior_from`
    ``source_gpu``'s shipped profile: what a GPU whose kernels were never timed would be
    told (module ``CROSS_GPU_MD``). Decode per framework and KV dtype (TensorRT-LLM's rows
    on the kernel its layout runs), by batch × tokens per sequence; prefill by prompt
    length; each bucket's label carries its median measured / predicted time."""
    import json

    from disaggsim.hardware.profile import shipped_profile_path

    src = json.loads(shipped_profile_path(source_gpu).read_text())
    prof = profile_from_dict(prior_from(gpu, source_gpu, src), f"prior {gpu} <- {source_gpu}")
    pk = prof.peaks
    rows: list[Row] = []

    def add(op: str, source: str, bucket: str, meas: np.ndarray, pred: np.ndarray) -> None:
        if len(meas):
            ratio = float(np.median(meas / pred))
            rows.append(_row(gpu, op, source, f"{bucket} (× {ratio:.2f})", ape(pred, meas)))

    d = public.aic_decode_attention(data, gpu)
    d = d[~d["kernel"].isin(MINOR_KERNELS)]
    for key, t in d.groupby(["framework", "dtype"], sort=True):
        fw, dt = (str(x) for x in cast(tuple, key))
        kernels = decode_backend_of_rows(t)
        pred = np.full(len(t), np.nan)
        for kernel in sorted(set(kernels.tolist())):
            sel = kernels == kernel
            pred[sel] = predict_decode_rows(pk, prof.decode_attention_for(kernel, dt), dt, t[sel])
        meas = t["t_s"].to_numpy(float)
        b = t["batch"].to_numpy(float)
        per = t["context_tokens"].to_numpy(float) / b
        source = f"AIC {fw} kv {dt} ({_backend_for(fw)}) from {source_gpu}'s fits"
        add("decode_attention", source, "all", meas, pred)
        for bname, bsel in (("batch ≤ 8", b <= 8), ("batch ≥ 128", b >= 128)):
            for cname, csel in (
                ("≤ 512 tokens a sequence", per <= 512),
                ("> 4096 tokens a sequence", per > 4096),
            ):
                sel = bsel & csel
                add("decode_attention", source, f"{bname}, {cname}", meas[sel], pred[sel])
    p = public.aic_prefill_attention(data, gpu)
    p = p[~p["kernel"].isin(MINOR_KERNELS)]
    for key, t in p.groupby(["framework", "kv_dtype"], sort=True):
        fw, kv = (str(x) for x in cast(tuple, key))
        backend = _backend_for(fw)
        pred = np.asarray(
            ops.prefill_attention_time_s(
                pk, prof.prefill_attention_for(backend, kv), t["num_seqs"], t["new_tokens"],
                t["pairs"], t["heads"], t["head_dim"],
            ),
            float,
        )  # fmt: skip
        meas = t["t_s"].to_numpy(float)
        plen = t["prompt_tokens"].to_numpy(float)
        source = f"AIC {fw} kv {kv} ({backend}) from {source_gpu}'s fits"
        add("prefill_attention", source, "all", meas, pred)
        for lo, hi, name in (
            (0, 512, "isl ≤ 512"),
            (512, 4096, "isl 513–4096"),
            (4096, 1e9, "isl > 4096"),
        ):
            sel = (plen > lo) & (plen <= hi)
            add("prefill_attention", source, name, meas[sel], pred[sel])
    return rows


def hopper_rows() -> list[Row]:
    """Same SM architecture, different memory (issue 13, item 5): decode steps on H200 vs
    H100 against the datasheet bandwidth ratio (4.8 / 3.35 = 1.433), one row per
    configuration (n = 1, the 'APE' is the relative deviation of the time ratio from it);
    the single-GPU steps streaming > 15 GB carry the target."""
    from disaggsim.hardware.engines import ZERO_ENGINE

    rows = []
    ratio_bw = get_gpu("h200-sxm").hbm_bytes_per_s / get_gpu("h100-sxm").hbm_bytes_per_s
    for model, tp, batch, ctx, memory_bound in HOPPER_CASES:
        t = []
        for gpu in ("h100-sxm", "h200-sxm"):
            w = build_worker_cost(model, gpu, tp, engine=ZERO_ENGINE)
            t.append(w.decode_time_s(batch, batch * ctx))
        r = t[0] / t[1]
        rows.append(
            _row(
                "h200/h100",
                "decode step ratio",
                f"{model} TP{tp} batch {batch} ctx {ctx}: {r:.3f} vs {ratio_bw:.3f} (datasheet)",
                "kernels",
                np.array([abs(r / ratio_bw - 1.0)]),
                "hopper" if memory_bound else None,
            )
        )
    return rows


# (model, tp, batch, context per sequence, memory-bound): single-GPU steps streaming over
# 15 GB of weights and KV are memory-bound and carry the target; the TP ones add all-reduce
# latency and kernel floors that do not scale with bandwidth, shown without a target
HOPPER_CASES = (
    ("llama-3-8b", 1, 64, 4096, True),
    ("llama-2-7b", 1, 16, 8192, True),
    ("llama-3-8b", 1, 8, 2048, True),
    ("llama-3-70b", 4, 32, 2048, False),
    ("llama-3-70b", 8, 1, 4096, False),
)


def engine_rows(data: Path) -> list[Row]:
    """End-to-end step and batch latencies: the step model with each engine's shipped
    profile against the collected measurements (:mod:`calibration.engines`), per engine
    (all rows, the fit rows, the held-out rows, each (source, model, GPU, TP) family held out
    of a refit in turn) and per source, with the kernels alone beside."""
    rows: list[Row] = []
    points = engines.all_points(data)
    feat = engines.features(points)
    shipped = load_engines()
    for name in ENGINE_NAMES:
        r = feat[feat["engine"] == name].reset_index(drop=True)
        if r.empty:
            continue
        eng = shipped[name]
        x = r[[f"x_{k}" for k in PARAM_KEYS]].to_numpy(float)
        theta = np.array([getattr(eng, k) for k in PARAM_KEYS])
        meas = r["value_s"].to_numpy(float)
        pred = r["kernels_s"].to_numpy(float) + x @ theta
        if eng.launch_per_layer_s > 0.0:  # a launch floor: not linear, the step model runs it
            pred = engines.step_model_pred(r, eng)
        a = ape(pred, meas)
        fit = (r["split"] == "fit").to_numpy()
        # a target only where the fit had more rows than parameters (one SGLang point fitted
        # by one parameter cannot miss)
        target = "engine" if fit.sum() > len(engines.FIT_PARAMS[name]) else None
        rows.append(_row("all", "engine", f"{name} (shipped profile)", "all rows", a, target))
        moe = np.array([not get_model(str(m)).is_dense for m in r["model"]])
        if moe.any() and not moe.all():
            for bucket, sel in (("dense-model rows", ~moe), ("MoE-model rows", moe)):
                rows.append(_row("all", "engine", f"{name} (shipped profile)", bucket, a[sel]))
        rows.append(_row("all", "engine", f"{name} (shipped profile)", "fit rows", a[fit]))
        if (~fit).any():
            rows.append(
                _row("all", "engine", f"{name} (shipped profile)", "held-out rows", a[~fit])
            )
        f = engines.fit_engine(feat, name, engines.reread_variants(points, feat, name))
        lofo = ape(f["rows"]["lofo_pred_s"].to_numpy(float), meas)
        if (~np.isnan(lofo)).any():
            rows.append(
                _row(
                    "all",
                    "engine",
                    f"{name} (refit without each family)",
                    "all rows",
                    lofo[~np.isnan(lofo)],
                )
            )
        rows.append(
            _row("all", "engine", f"{name} kernels only", "all rows", ape(r["kernels_s"], meas))
        )
        for key, g in r.groupby(["source", "gpu"], sort=True):
            src, gpu = (str(v) for v in cast(tuple, key))
            rows.append(_row(gpu, "engine", f"{name}: {src}", "all rows", a[g.index.to_numpy()]))
        if name == "vllm-eager-2023":
            # the other end of the interval a floor no fit row binds leaves (the shipped
            # rule takes the largest floor those rows allow: engines._floor_rule)
            z = engines.fit_eager(r, unbound="zero")
            rows.append(
                _row(
                    "all",
                    "engine",
                    f"{name} (refit without each family; no floor where no fit row binds it)",
                    "all rows",
                    ape(z["rows"]["lofo_pred_s"].to_numpy(float), meas),
                )
            )
            rows += eager_family_rows(r, a, data)
    return rows


def eager_family_rows(r: pd.DataFrame, a: np.ndarray, data: Path) -> list[Row]:
    """``vllm-eager-2023`` per (GPU, model, TP) family with the shipped profile (where the miss
    sits), then the forms of :func:`calibration.engines.eager_forms` (the additive one, the
    shipped form until 2026-12-02; the shipped overlap form on DistServe alone)."""
    rows: list[Row] = []
    # per GPU too: Splitwise's DGX-H100 rows are the fit rows of that host's speed alone
    for key, g in r.groupby(["gpu", "model", "tp"], sort=True):
        gpu, model, tp = (str(v) for v in cast(tuple, key))
        split = "held out" if (g["split"] == "holdout").all() else "fit"
        for bucket, sel in (
            ("all rows", np.ones(len(g), bool)),
            ("prefill steps", g["metric"].isin(engines.PREFILL_METRICS).to_numpy()),
            ("decode steps", ~g["metric"].isin(engines.PREFILL_METRICS).to_numpy()),
        ):
            rows.append(
                _row(
                    gpu,
                    "engine",
                    f"vllm-eager-2023: {model} TP{tp} ({split})",
                    bucket,
                    a[g.index.to_numpy()[sel]],
                )
            )
    every = engines.eager_fit_every_family(data)
    rows.append(
        _row(
            "all",
            "engine",
            "vllm-eager-2023, additive form fitted to every family (not shipped)",
            "all rows",
            every["rows"]["ape"].to_numpy(float),
        )
    )
    fa = engines.eager_forms(data, forms=("additive",))["additive"]
    src = "vllm-eager-2023, additive form (shipped until 2026-12-02; not shipped)"
    rows.append(_row("all", "engine", src, "all rows", fa["ape"]))
    rows.append(_row("all", "engine", src, "fit rows", fa["ape"][fa["fit_rows"]]))
    rows.append(_row("all", "engine", src, "held-out rows", fa["ape"][~fa["fit_rows"]]))
    rows.append(_row("all", "engine", src, "refit without each family", fa["lofo_ape"]))
    f = engines.eager_forms(data, forms=("overlap",))["overlap"]
    fit = f["fit_rows"]
    src = "vllm-eager-2023, overlapped host time (the shipped form), DistServe alone"
    rows.append(_row("all", "engine", src, "all rows", f["ape"]))
    rows.append(_row("all", "engine", src, "fit rows", f["ape"][fit]))
    rows.append(_row("all", "engine", src, "held-out rows", f["ape"][~fit]))
    rows.append(_row("all", "engine", src, "refit without each family", f["lofo_ape"]))
    for form, a in engines.eager_every_row_in_sample(data).items():
        name = EVERY_ROW_FORMS[form]
        rows.append(
            _row(
                "all",
                "engine",
                f"vllm-eager-2023, {name} fitted to every row of both sources (not shipped)",
                "all rows (in sample)",
                a,
            )
        )
    sc = engines.eager_prefill_scale(data)
    fit, pre = sc["fit_rows"], sc["prefill_rows"]
    src = "vllm-eager-2023, + prefill kernel scale (not shipped)"
    rows.append(_row("all", "engine", src, "all rows", sc["ape"]))
    rows.append(_row("all", "engine", src, "fit rows", sc["ape"][fit]))
    rows.append(_row("all", "engine", src, "held-out rows", sc["ape"][~fit]))
    rows.append(_row("all", "engine", src, "refit without each family", sc["lofo_ape"]))
    sr = sc["rows"]
    t4 = ((sr["model"] == "opt-13b") & (sr["tp"] == 4)).to_numpy()
    rows.append(
        _row(EAGER_GPU_ROW, "engine", f"{src}: opt-13b TP4", "prefill steps", sc["ape"][t4 & pre])
    )
    rows.append(
        _row(EAGER_GPU_ROW, "engine", f"{src}: opt-13b TP4", "decode steps", sc["ape"][t4 & ~pre])
    )
    op = engines.eager_forms(data, forms=(engines.EAGER_OVERLAP_PREFILL,))
    f = op[engines.EAGER_OVERLAP_PREFILL]
    fit = f["fit_rows"]
    src = "vllm-eager-2023, overlapped host time + prefill kernel scale (not shipped)"
    rows.append(_row("all", "engine", src, "all rows", f["ape"]))
    rows.append(_row("all", "engine", src, "fit rows", f["ape"][fit]))
    rows.append(_row("all", "engine", src, "held-out rows", f["ape"][~fit]))
    rows.append(_row("all", "engine", src, "refit without each family", f["lofo_ape"]))
    rows.append(_row("all", "engine", src, "every family fitted (in sample)", f["every_ape"]))
    for rec in engines.second_source_check(data):
        rows.append(
            _row(
                "all" if rec["rows"].startswith("DistServe") else EAGER_GPU_ROW,
                "engine",
                f"vllm-eager-2023, {SECOND_SOURCE_FORMS[rec['form']]} fitted on "
                f"{rec['fitted_on']}"
                + (" (the shipped fit)" if shipped_fit(rec) else " (not shipped)"),
                rec["rows"],
                rec["ape"],
            )
        )
    ar = engines.cxx_prefill_allreduce(data)
    for which, who in (("cxx", "DistServe's C++ engine"), ("splitwise", "Splitwise's 2023 vLLM")):
        fac = ar[which]
        base = "kernels only" if which == "cxx" else "kernels + per iteration"
        fitted = f"all-reduces × {fac['allreduce_scale']:.2f}" + (
            f", {fac['per_step_s'] * 1e3:.1f} ms a step" if which == "cxx" else ""
        )
        bucket = "prefill steps" if which == "cxx" else "prefills ≤ 2,048 tokens"
        for label, a in ((base, fac["kernels_ape"]), (fitted, fac["fitted_ape"])):
            rows.append(_row(EAGER_GPU_ROW, "engine", f"{who}, {label}", bucket, a))
        if which == "cxx":
            lo, hi = fac["allreduce_scale_without_each_family"]
            rows.append(
                _row(
                    EAGER_GPU_ROW,
                    "engine",
                    f"{who}, all-reduces × {lo:.2f}-{hi:.2f}, each family refitted without it",
                    bucket,
                    fac["held_out_by_family_ape"],
                )
            )
    for scr in engines.eager_prefill_screen(data).to_dict("records"):
        src = f"vllm-eager-2023 screen: overlap form, {scr['form']}" + (
            " (shipped)" if scr["shipped"] else " (not shipped)"
        )
        sw, fit = scr["splitwise_rows"], scr["fit_rows"]
        rows.append(_row("all", "engine", src, "all rows", scr["ape"]))
        rows.append(
            _row("all", "engine", src, "DistServe held-out families", scr["ape"][~sw & ~fit])
        )
        rows.append(_row(EAGER_GPU_ROW, "engine", src, "Splitwise (held out)", scr["ape"][sw]))
        rows.append(
            _row("all", "engine", src, "DistServe, refit without each family", scr["lofo_ape"][~sw])
        )
        rows.append(
            _row(
                "all",
                "engine",
                src,
                "DistServe, every family fitted (in sample)",
                scr["every_ape"][~sw],
            )
        )
    cxx = engines.cxx_engine_kernel_ape(data)
    src = "DistServe's C++ engine (same A100s and harness), kernels only"
    rows.append(_row(EAGER_GPU_ROW, "engine", src, "all rows", cxx["ape"].to_numpy(float)))
    for key, g in cxx.groupby(["model", "tp"], sort=True):
        model, tp = (str(v) for v in cast(tuple, key))
        for bucket, metric in (
            ("prefill steps", "prefill_step_s"),
            ("decode steps", "decode_ctx_step_s"),
        ):
            sel = (g["metric"] == metric).to_numpy()
            rows.append(
                _row(
                    EAGER_GPU_ROW,
                    "engine",
                    f"{src}: {model} TP{tp}",
                    bucket,
                    g["ape"][sel].to_numpy(float),
                )
            )
    return rows


EAGER_GPU_ROW = engines.EAGER_GPU


def shipped_fit(rec: dict) -> bool:
    """Whether a :func:`calibration.engines.second_source_check` record is the shipped fit
    (the shipped form on DistServe's fit families)."""
    return rec["form"] == engines.EAGER_SHIPPED_FORM and rec["fitted_on"] == (
        "DistServe fit families"
    )


# how the in-sample rows name each form of calibration.engines.eager_every_row_in_sample
EVERY_ROW_FORMS = {
    "additive": "additive form",
    "overlap": "overlapped host time (the shipped form)",
    engines.EAGER_OVERLAP_HIDDEN: "host time hidden behind the kernels",
    engines.EAGER_OVERLAP_PREFILL: "overlapped host time + prefill kernel scale",
}
# how the second-source rows name each form of calibration.engines.second_source_check
SECOND_SOURCE_FORMS = {
    "additive": "additive form",
    "overlap": "overlapped host time",
    engines.EAGER_OVERLAP_HIDDEN: "host time hidden behind the kernels",
}


VIDUR_MODEL_IDS = {
    "meta-llama/Llama-2-7b-hf": "llama-2-7b",
    "meta-llama/Llama-2-70b-hf": "llama-2-70b",
    "meta-llama/Meta-Llama-3-8B": "llama-3-8b",
    "meta-llama/Meta-Llama-3-70B": "llama-3-70b",
}


def step_model_vs_vidur(gpu: str, mlp: pd.DataFrame, prof: HardwareProfile) -> list[Row]:
    """Sums of Vidur's per-op rows (one layer without attention; ``add`` counted twice: two
    residual adds per layer) against the step model's per-layer GEMM + element-wise time
    (its KV-cache write kernel taken out: Vidur's ``mlp.csv`` has none), for the catalog
    models Vidur profiled. TP shards that do not fit the worker's memory are skipped.

    A replayed CUDA graph runs these kernels back to back, so the same sums are the
    graph-mode layer: the prediction includes ``engines.cuda-graphs.per_layer_s``."""
    rows: list[Row] = []
    graph_layer_s = prof.graph_layer_s
    sub = mlp[mlp["model"].isin(list(VIDUR_MODEL_IDS))]
    weight = np.where(sub["op"] == "add", 2.0, 1.0)
    sums = (
        sub.assign(t_s=sub["t_s"] * weight)
        .groupby(["model", "tp", "m"], sort=True)["t_s"]
        .sum()
        .reset_index()
    )
    apes = []
    for key, g in sums.groupby(["model", "tp"], sort=True):
        vm, tp = str(cast(tuple, key)[0]), int(cast(tuple, key)[1])
        try:
            w = build_worker_cost(VIDUR_MODEL_IDS[vm], gpu, int(tp), profile=prof)
        except UserError:
            continue
        spec = w.model
        hd = float(spec.head_dim)
        pred = []
        for m in g["m"].to_numpy(float):
            bd = w.breakdown(prefill_seqs=1, prefill_tokens=int(m), prefill_attn_pairs=0.0)
            kv_write = float(
                ops.elementwise_time_s(
                    prof.peaks,
                    prof.elementwise,
                    m * 2.0 * w.kv_heads_per_gpu * hd * (ACT_BYTES + dtype_bytes(w.kv_dtype)),
                )
            )
            pred.append((bd.gemm_s + bd.elementwise_s) / spec.num_layers - kv_write + graph_layer_s)
        apes.append(ape(np.array(pred), g["t_s"].to_numpy(float)))
    if apes:
        rows.append(
            _row(
                gpu,
                "layer (no attention)",
                "step model (cuda-graphs layer) vs Vidur per-op sums",
                "all",
                np.concatenate(apes),
            )
        )
    return rows


def graph_gap_rows(gpu: str, data: Path) -> list[Row]:
    """CUDA-graph replay vs kernel durations (:func:`calibration.engines.graph_gap`): the
    graph-replayed GEMMs against the bare kernel durations, and against gap + slope ×
    duration with the gap and slope of the other frameworks (held out by framework)."""
    gg = engines.graph_gap(data, gpu)
    r = gg["rows"]
    g, k = r["graph_s"].to_numpy(float), r["kernel_s"].to_numpy(float)
    src = "AIC graph-replayed GEMMs vs Vidur kernel durations"
    e = gg["error"]
    gap = f"gap {e['gap_us']:+.2f} µs, slope {e['slope']:.3f}"
    return [
        _row(gpu, "graph replay", src, "m ≤ 16, kernel duration alone", ape(k, g)),
        _row(
            gpu,
            "graph replay",
            src,
            f"m ≤ 16, {gap}, held out by framework",
            ape(r["held_out_graph_s"], g),
        ),
    ]


@dataclass
class Section:
    title: str
    intro: str
    rows: list[Row] = field(default_factory=list)


@dataclass
class Report:
    sections: list[Section] = field(default_factory=list)
    profiles: dict[str, str] = field(default_factory=dict)
    extra_md: str = ""

    @property
    def rows(self) -> list[Row]:
        return [r for sec in self.sections for r in sec.rows]

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([_asdict(r) for r in self.rows])

    def all_targets_met(self) -> bool:
        return all(r.met for r in self.rows if r.met is not None)

    @staticmethod
    def _lines(rows: list[Row], md: bool) -> list[str]:
        out = []
        head = ("GPU", "op", "rows (source)", "bucket", "n", "median APE", "mean APE", "p90 APE",
                "target", "met")  # fmt: skip
        if md:
            out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rows:
            met = "" if r.met is None else ("yes" if r.met else "NO")
            cells = (
                r.gpu,
                r.op,
                r.source,
                r.bucket,
                str(r.n),
                f"{100 * r.median_ape:.1f}%",
                f"{100 * r.mean_ape:.1f}%",
                f"{100 * r.p90_ape:.1f}%",
                r.target,
                met,
            )
            if md:
                out.append("| " + " | ".join(cells) + " |")
            else:
                out.append(
                    f"{r.gpu:10s} {r.op:18s} {r.source[:60]:60s} {r.bucket[:32]:32s} {r.n:6d} "
                    f"{cells[5]:>7s} {cells[6]:>7s} {cells[7]:>7s}  {r.target} {met}"
                )
        return out

    def text(self) -> str:
        lines = [f"profile {g}: {p}" for g, p in self.profiles.items()]
        for sec in self.sections:
            lines += ["", f"== {sec.title}", *self._lines(sec.rows, md=False)]
        met = [r for r in self.rows if r.met is not None]
        lines.append(
            f"targets met: {sum(bool(r.met) for r in met)} of {len(met)}"
            + ("" if self.all_targets_met() else " (rows marked NO miss theirs)")
        )
        return "\n".join(lines)

    def markdown(self) -> str:
        met = [r for r in self.rows if r.met is not None]
        missed = [r for r in met if not r.met]
        out = [
            "# Validation: cost model vs measurements",
            "",
            "The cost model (`disaggsim/costmodel/ops.py` and `step.py` with the shipped hardware",
            "profiles and engine profiles) against measurements: every row of the public kernel",
            "tables in `../shared/data/kernels/`, the H200 run in `calibration/runs/`, and the",
            "public end-to-end engine latencies collected in",
            "`calibration/engine_data/measurements.csv`. APE = |predicted − measured| / measured.",
            "Regenerate this file with:",
            "",
            "```bash",
            COMMAND,
            "```",
            "",
            "Profiles used: "
            + "; ".join(f"`{g}` → `{p}`" for g, p in self.profiles.items())
            + "; engine profiles `disaggsim/hardware/engines.json`.",
            "",
            f"Targets met: {sum(bool(r.met) for r in met)} of {len(met)}"
            + (
                ". Missed: "
                + "; ".join(f"{r.gpu} {r.op} {r.source} [{r.bucket}]" for r in missed)
                + " (see the last section for why)."
                if missed
                else "."
            ),
            "",
        ]
        for sec in self.sections:
            intro = fill_figures(sec.intro, self.rows)
            out += [f"## {sec.title}", "", intro, "", *self._lines(sec.rows, md=True), ""]
        out.append(fill_figures(self.extra_md, self.rows))
        return "\n".join(out) + "\n"


FIGURE = re.compile(r"\{\{(n:)?([^|{}]+)\|([^{}]+)\}\}")
"""A figure the prose quotes from the tables: ``{{source|bucket}}`` is that row's median
and p90 APE ("4.9% / 20.3%"), ``{{n:source|bucket}}`` its row count, so the prose (the
sections' introductions and "Where targets are missed") cannot go stale when a refit
moves the tables."""


def fill_figures(text: str, rows: list[Row]) -> str:
    """``text`` with every ``{{...}}`` figure (:data:`FIGURE`) taken from ``rows``; a
    figure that names no row, or more than one, is an error (the prose names a row that
    the report no longer has)."""

    def one(m: re.Match) -> str:
        count, source, bucket = m.group(1), m.group(2), m.group(3)
        hits = [r for r in rows if r.source == source and r.bucket == bucket]
        if len(hits) != 1:
            raise ValueError(f"{m.group(0)} names {len(hits)} rows of the report, not one")
        r = hits[0]
        if count:
            return str(r.n)
        return f"{100 * r.median_ape:.1f}% / {100 * r.p90_ape:.1f}%"

    return FIGURE.sub(one, text)


def _asdict(r: Row) -> dict:
    return {k: getattr(r, k) for k in Row.__slots__}


def run(gpus: list[str], data: Path, extended: bool = True, moe_section: bool = False) -> Report:
    """Every section of the report; ``extended`` False keeps only the per-GPU kernel tables
    (the refits of the extrapolation section take a minute). With ``moe_section`` (the
    ``--write-doc`` path) also the MoE/MLA/DeepEP section (calibration.fit_moe, H100 only)."""
    public.kernels_dir(data)
    report = Report(extra_md=KNOWN_LIMITS_MD)
    kern = Section("Kernel tables, per GPU", KERNELS_MD)
    for gpu in gpus:
        prof = load_profile(gpu)
        report.profiles[gpu] = (
            f"disaggsim/hardware/profiles/{Path(prof.path).name} ({prof.provenance.get('kind')})"
        )
        kern.rows += validate_gpu(gpu, data, prof)
    report.sections.append(kern)
    if not extended:
        return report
    ext = Section("Extrapolation: whole shape families held out of a refit", EXTRAPOLATION_MD)
    for gpu in gpus:
        ext.rows += extrapolation_rows(gpu, data)
    report.sections.append(ext)
    held = Section("A GPU held out of the kernel fits", HELD_OUT_GPU_MD)
    for gpu, runs in HELD_OUT_RUNS.items():
        for i, raw in enumerate(runs):
            held.rows += held_out_gpu_rows(gpu, PRIORS[gpu], REPO / raw, target=i == 0)
    held.rows += hopper_rows()
    report.sections.append(held)
    cross = Section("Attention on a GPU without its own table", CROSS_GPU_MD)
    for gpu, source_gpu in CROSS_GPU_SOURCE.items():
        if gpu in gpus and source_gpu in gpus:
            cross.rows += cross_gpu_attention_rows(gpu, source_gpu, data)
    report.sections.append(cross)
    report.sections.append(
        Section(
            "Serving engines: step and batch latencies",
            # the max-load throughput check's summary, as its --write-doc run wrote it
            ENGINES_MD + "\n\n" + throughput.validation_sentence(),
            engine_rows(data),
        )
    )
    if moe_section and "h100-sxm" in gpus:  # MoE, MLA and DeepEP tables: H100 only
        from calibration.fit_moe import validation_markdown

        report.extra_md += "\n" + validation_markdown(data)
    return report
