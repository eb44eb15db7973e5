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

from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from calibration import engines, public
from calibration.fit_public import ATTENTION_FRAMEWORK, GEMM_FRAMEWORK
from disaggsim.catalog import dtype_bytes, get_model
from disaggsim.costmodel import ops
from disaggsim.costmodel.step import ACT_BYTES, build_worker_cost
from disaggsim.errors import UserError
from disaggsim.hardware.profile import HardwareProfile, load_profile

TARGETS = {  # op: (median_ape max, mean_ape max or None)
    "gemm": (0.10, 0.15),
    "decode_attention": (0.10, 0.15),
    "prefill_attention": (0.20, None),
    "allreduce": (0.15, None),
}
KNOWN_LIMITS_MD = """## Whole steps

`whole step` rows: the step model (`build_worker_cost` kernel sums + the profile's
`engines.eager`) against DistServe's A100 whole-step curves for OPT-13B (TP 1/2/4) and
OPT-66B (TP 2/3/4/8), evaluated on a grid (`calibration/engines.py` says which grid and
why). `engines.eager` (per-iteration 0.49 ms, per-layer 53 µs) is fitted to the
`distserve` file (DistServe's own engine); held out by (model, TP) family its median APE
is 7.2% (`fit_error["engines.eager"]` of the A100 profile). Both files are eager engines
(no CUDA graphs): their batch-1 decode steps sit milliseconds above the weight-streaming
time. The `vllm` file (vLLM of late 2023) is shown for transfer: its kernels themselves are
slower (prefill grows 1.4–1.8× faster per token than the fitted kernels), which no additive
overhead represents, so it stays 27–35% off. `cuda-graphs` has no public whole-step table
(see `docs/calibration.md`). `step model (cuda-graphs layer) vs Vidur per-op sums`: one layer without attention
from `build_worker_cost` against the sum of Vidur's per-op rows (catalog Llama models; TP
shards that do not fit one worker are skipped). It includes
`engines.cuda-graphs.per_layer_s`: a replayed graph runs the layer's kernels back to
back, so these sums are the graph-mode layer, the whole-layer check of `cuda-graphs`.

`graph replay` rows: AIConfigurator times each op as a replayed CUDA graph (graph time /
ops), Vidur's `mlp.csv` the same GEMM shapes as bare kernel durations (kineto). For
bf16 GEMMs with m ≤ 16 on the same GPU, the graph-replayed time is the kernel duration
within a few percent, and `graph = gap + slope × duration` puts the per-kernel gap at
about zero (the bucket names the pooled fit; per framework within ±1.1 µs, see
`fit_error["engines.cuda-graphs"]`). So `engines.cuda-graphs.per_layer_s` — the gaps of
the seven element-wise kernels per layer whose terms were fitted to kernel durations —
is 7 × max(gap, 0) = 0 on both GPUs, and a CUDA-graph step is its kernels plus the
per-iteration CPU time. A whole-step measurement in graph mode
(`calibration/gpu_step_run.sh`) has not been run yet.

Regenerate the fit: `python -m calibration.fit_public --data ../shared/data --engines`
(`python -m calibration.engines` prints it alone).

## What changed in this fit, and what still misses

- Decode attention now has a per-(sequence × KV head × head-dim element) cost and a
  bandwidth share `P / (P + par_half_sat)` with `P = batch × KV heads` work items
  (`ops.decode_attention_time_s`). Before (commit a8b96a0, form floor + per-sequence +
  KV bytes / bandwidth): A100 vLLM bf16 KV median 14.1% / mean 25.6%, H100 vLLM bf16
  9.2% / 14.9%, H100 vLLM fp8 12.8% / 16.5%.
- All-reduce is the faster of two NCCL protocols per GPU count (Simple and LL, latency +
  size / bus bandwidth each). Before: A100 2 GPUs median 17.9%; held-out medians now
  4.5–7.9% (5 random folds of 21 sizes).
- Decode attention has a second fixed floor, `multi_floor_s`, added when the kernel takes
  its multi-sequence GQA path (batch > 1 and KV heads > 1;
  `ops.decode_attention_floor_s`): the A100 vLLM kernel runs ≈ 12.5 µs with one sequence
  or one KV head per shard and ≈ 18.5 µs otherwise. A100 fit: floor 12.6 µs + 5.5 µs.
  H100 and H200 fit it to ~0 (term off). Before (commit da46739): A100 vLLM bf16 KV
  median 11.1% / mean 18.4% (held-out 11.1% / 18.5%); now both targets are met.
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
    if target_op is not None:
        med_max, mean_max = TARGETS[target_op]
        target = f"median ≤ {med_max:.0%}" + (f", mean ≤ {mean_max:.0%}" if mean_max else "")
        met = bool(np.median(a) <= med_max and (mean_max is None or np.mean(a) <= mean_max))
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


def validate_gpu(gpu: str, data: Path, prof: HardwareProfile) -> list[Row]:
    rows: list[Row] = []
    pk = prof.peaks
    g = public.aic_gemm(data, gpu)
    for key, t in g.groupby(["framework", "dtype"], sort=True):
        fw, dt = (str(x) for x in cast(tuple, key))
        if dt == "fp8" and pk.fp8_flop_per_s <= 0:
            continue
        a = ape(ops.gemm_time_s(pk, prof.gemm_params(dt), t["m"], t["n"], t["k"], dt), t["t_s"])
        tgt = "gemm" if GEMM_FRAMEWORK.get(dt) == fw else None
        src = f"AIC {fw} {dt}"
        rows.append(_row(gpu, "gemm", src, "all", a, tgt))
        b = gemm_bucket(t["m"].to_numpy(float))
        for bucket in ("m ≤ 16", "m 17–256", "m > 256"):
            rows.append(_row(gpu, "gemm", src, bucket, a[b == bucket]))
    d = public.aic_decode_attention(data, gpu)
    for key, t in d.groupby(["framework", "dtype"], sort=True):
        fw, dt = (str(x) for x in cast(tuple, key))
        prm = prof.decode_attention_params(dt)
        a = ape(
            ops.decode_attention_time_s(
                pk,
                prm,
                t["batch"],
                t["context_tokens"],
                t["kv_heads"],
                t["head_dim"],
                1.0 if dt == "fp8" else 2.0,
            ),
            t["t_s"],
        )
        tgt = "decode_attention" if fw == ATTENTION_FRAMEWORK else None
        rows.append(_row(gpu, "decode_attention", f"AIC {fw} kv {dt}", "all", a, tgt))
    p = public.aic_prefill_attention(data, gpu)
    for key, t in p.groupby(["framework", "kv_dtype"], sort=True):
        fw, kv = (str(x) for x in cast(tuple, key))
        pprm = prof.prefill_attention_params("bf16")
        a = ape(
            ops.prefill_attention_time_s(
                pk, pprm, t["num_seqs"], t["new_tokens"], t["pairs"], t["heads"], t["head_dim"]
            ),
            t["t_s"],
        )
        tgt = "prefill_attention" if fw == ATTENTION_FRAMEWORK and kv == "bf16" else None
        rows.append(_row(gpu, "prefill_attention", f"AIC {fw} kv {kv}", "all", a, tgt))
        plen = t["prompt_tokens"].to_numpy()
        for lo, hi, name in (
            (0, 512, "isl ≤ 512"),
            (512, 4096, "isl 513–4096"),
            (4096, 1e9, "isl > 4096"),
        ):
            sel = (plen > lo) & (plen <= hi)
            if sel.any():
                rows.append(_row(gpu, "prefill_attention", f"AIC {fw} kv {kv}", name, a[sel]))
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
    b = gemm_bucket(gm["m"].to_numpy(float))
    for bucket in ("m ≤ 16", "m 17–256", "m > 256"):
        rows.append(_row(gpu, "gemm", "Vidur mlp.csv GEMMs", bucket, a[b == bucket]))
    ew = mlp[mlp["op"].isin(public.VIDUR_ELEMENTWISE_OPS)]
    a_ew = ape(ops.elementwise_time_s(pk, prof.elementwise, ew["nbytes"]), ew["t_s"])
    rows.append(_row(gpu, "elementwise", "Vidur mlp.csv norm/rope/act/add", "all", a_ew))
    # whole layer minus attention: the sum of a row's per-op times vs the sum of predictions
    mlp = mlp.assign(
        pred=np.where(
            mlp["op"].isin(public.VIDUR_GEMM_OPS),
            ops.gemm_time_s(
                pk, prof.gemm_params("bf16"), mlp["m"], mlp["n"].fillna(1), mlp["k"].fillna(1)
            ),
            ops.elementwise_time_s(pk, prof.elementwise, mlp["nbytes"].fillna(0)),
        )
    )
    layer = mlp.groupby(["table", "tp", "m"]).agg(t_s=("t_s", "sum"), pred=("pred", "sum"))
    rows.append(
        _row(
            gpu,
            "layer (no attention)",
            "Vidur mlp.csv per-row sums",
            "all",
            ape(layer["pred"], layer["t_s"]),
        )
    )
    rows += step_model_vs_vidur(gpu, mlp, prof)
    rows += graph_gap_rows(gpu, data)
    if gpu == engines.GPU and (public.kernels_dir(data) / "distserve").is_dir():
        rows += whole_step_rows(gpu, data, prof)
    return rows


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
    graph_layer_s = prof.engine("cuda-graphs").per_layer_s
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


def whole_step_rows(gpu: str, data: Path, prof: HardwareProfile) -> list[Row]:
    """Whole forward passes: the step model with the profile's ``engines.eager`` against
    DistServe's A100 curves (:mod:`calibration.engines`), per file, model/TP and kind, and
    the kernels-only sum beside (no engine overhead)."""
    rows: list[Row] = []
    eng = prof.engine("eager")
    for which in engines.FILES:
        pts = engines.whole_step_points(data, which)
        kern = engines.kernel_sums(pts, prof)
        layers = np.array([get_model(m).num_layers for m in pts["model"]], float)
        pred = kern + eng.per_iteration_s + eng.per_layer_s * layers
        meas = pts["t_s"].to_numpy(float)
        a, ak = ape(pred, meas), ape(kern, meas)
        label = f"DistServe {which} (eager)"
        for kind in ("prefill", "decode"):
            sel = (pts["kind"] == kind).to_numpy()
            rows.append(_row(gpu, "whole step", label, f"{kind}, all", a[sel]))
            rows.append(
                _row(gpu, "whole step", f"DistServe {which} kernels only", f"{kind}, all", ak[sel])
            )
        for key, g in pts.groupby(["model", "tp", "kind"], sort=True):
            model, tp, kind = (str(x) for x in cast(tuple, key))
            idx = g.index.to_numpy()
            rows.append(_row(gpu, "whole step", label, f"{kind}, {model} TP{tp}", a[idx]))
    return rows


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    profiles: dict[str, str] = field(default_factory=dict)
    extra_md: str = ""

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(
            [r.__dict__ if hasattr(r, "__dict__") else _asdict(r) for r in self.rows]
        )

    def all_targets_met(self) -> bool:
        return all(r.met for r in self.rows if r.met is not None)

    def _lines(self, md: bool) -> list[str]:
        out = []
        head = (
            "GPU",
            "op",
            "rows (source)",
            "bucket",
            "n",
            "median APE",
            "mean APE",
            "p90 APE",
            "target",
            "met",
        )
        if md:
            out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        else:
            out.append(
                f"{'GPU':10s} {'op':20s} {'rows (source)':34s} {'bucket':13s} {'n':>6s} {'median':>7s} {'mean':>7s} {'p90':>7s}  target"
            )
        for r in self.rows:
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
                    f"{r.gpu:10s} {r.op:20s} {r.source:34s} {r.bucket:13s} {r.n:6d} {cells[5]:>7s} {cells[6]:>7s} "
                    f"{cells[7]:>7s}  {r.target} {met}"
                )
        return out

    def text(self) -> str:
        lines = [f"profile {g}: {p}" for g, p in self.profiles.items()]
        lines += self._lines(md=False)
        lines.append(
            "all targets met" if self.all_targets_met() else "some targets NOT met (rows marked NO)"
        )
        return "\n".join(lines)

    def markdown(self) -> str:
        met = [r for r in self.rows if r.met is not None]
        return (
            "\n".join(
                [
                    "# Validation: cost model vs public measured kernels",
                    "",
                    "Every measured row of the public kernel tables in `../shared/data/kernels/` is compared",
                    "with the cost model (`disaggsim/costmodel/ops.py` with the shipped profile). APE =",
                    "|predicted − measured| / measured. Regenerate this file with:",
                    "",
                    "```bash",
                    COMMAND,
                    "```",
                    "",
                    "Profiles used: "
                    + "; ".join(f"`{g}` → `{p}`" for g, p in self.profiles.items())
                    + ".",
                    "",
                    "Targets (rows marked in the `target` column: the rows each profile was fitted to —",
                    "vLLM bf16 cuBLAS GEMMs, TensorRT-LLM fp8 GEMMs, vLLM attention, nccl-tests all-reduce):",
                    "GEMM and decode attention median ≤ 10% and mean ≤ 15%; prefill attention median ≤ 20%;",
                    "all-reduce median ≤ 15%. Rows of other frameworks are shown for transfer, without a",
                    f"target. Targets met: {sum(bool(r.met) for r in met)} of {len(met)}.",
                    "",
                    "Skipped by design: sliding-window attention rows (`window_size` > 0), fp8-math context",
                    "attention rows, int8/int4/fp8-block GEMM rows (the cost model has no such kernels).",
                    "",
                    *self._lines(md=True),
                    "",
                    self.extra_md,
                ]
            )
            + "\n"
        )


def _asdict(r: Row) -> dict:
    return {k: getattr(r, k) for k in Row.__slots__}


def run(gpus: list[str], data: Path, moe_section: bool = False) -> Report:
    """Validate ``gpus``' shipped profiles; with ``moe_section`` (the ``--write-doc`` path)
    also render the MoE/MLA/DeepEP section (calibration.fit_moe, H100 tables only)."""
    public.kernels_dir(data)
    report = Report(extra_md=KNOWN_LIMITS_MD)
    for gpu in gpus:
        prof = load_profile(gpu)
        report.profiles[gpu] = (
            f"disaggsim/hardware/profiles/{Path(prof.path).name} ({prof.provenance.get('kind')})"
        )
        report.rows += validate_gpu(gpu, data, prof)
    if moe_section and "h100-sxm" in gpus:  # MoE, MLA and DeepEP tables: H100 only
        from calibration.fit_moe import validation_markdown

        report.extra_md += "\n" + validation_markdown(data)
    return report
