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

import numpy as np
import pandas as pd

from calibration import public
from calibration.fit_public import ATTENTION_FRAMEWORK, GEMM_FRAMEWORK
from disaggsim.costmodel import ops
from disaggsim.hardware.profile import HardwareProfile, load_profile

TARGETS = {  # op: (median_ape max, mean_ape max or None)
    "gemm": (0.10, 0.15),
    "decode_attention": (0.10, 0.15),
    "prefill_attention": (0.20, None),
    "allreduce": (0.15, None),
}
KNOWN_LIMITS_MD = """## Why the misses miss

- Decode attention (A100 FA2; H100 fp8 KV): the `ops.py` form is floor + per-sequence
  cost × batch + KV bytes / bandwidth, with no term in the number of query or KV heads.
  Rows with few heads (1–4) run well below the fitted per-sequence cost (the kernel's work
  per sequence scales with heads), rows with many heads above it. A per-(sequence × KV
  head) term would follow that dependence better; it needs the
  step model to pass heads, so it is left as a proposed change to `ops.py`.
- All-reduce on 2 A100s: 21 points; the latency + size / bus-bandwidth form cannot follow
  NCCL's protocol switch (LL → LL128 → Simple) between 64 KB and 4 MB.
- Whole steps (engine overheads) are not yet fitted to DistServe's curves; the profiles'
  `engines` are still the provisional values.
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
    for (fw, dt), t in g.groupby(["framework", "dtype"], sort=True):
        if dt == "fp8" and pk.fp8_flop_per_s <= 0:
            continue
        a = ape(ops.gemm_time_s(pk, prof.gemm_params(dt), t["m"], t["n"], t["k"], dt), t["t_s"])
        tgt = "gemm" if GEMM_FRAMEWORK.get(dt) == fw else None
        src = f"AIC {fw} {dt}"
        rows.append(_row(gpu, "gemm", src, "all", a, tgt))
        b = gemm_bucket(t["m"])
        for bucket in ("m ≤ 16", "m 17–256", "m > 256"):
            rows.append(_row(gpu, "gemm", src, bucket, a[b == bucket]))
    d = public.aic_decode_attention(data, gpu)
    for (fw, dt), t in d.groupby(["framework", "dtype"], sort=True):
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
    for (fw, kv), t in p.groupby(["framework", "kv_dtype"], sort=True):
        prm = prof.prefill_attention_params("bf16")
        a = ape(
            ops.prefill_attention_time_s(
                pk, prm, t["num_seqs"], t["new_tokens"], t["pairs"], t["heads"], t["head_dim"]
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
        for (fw, n), t in frame.groupby(["framework", "num_gpus"], sort=True):
            a = ape(ops.allreduce_time_s(prof.allreduce, t["nbytes"], int(n)), t["t_s"])
            rows.append(
                _row(
                    gpu,
                    "allreduce",
                    f"{fw} {int(n)} GPUs",
                    "all",
                    a,
                    "allreduce" if tgt_on else None,
                )
            )
    mlp = public.vidur_mlp(data, gpu)
    gm = mlp[mlp["op"].isin(public.VIDUR_GEMM_OPS)]
    a = ape(ops.gemm_time_s(pk, prof.gemm_params("bf16"), gm["m"], gm["n"], gm["k"]), gm["t_s"])
    rows.append(_row(gpu, "gemm", "Vidur mlp.csv GEMMs", "all", a))
    b = gemm_bucket(gm["m"])
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
                    "```",
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
    return {k: getattr(r, k) for k in Row.__slots__}  # type: ignore[attr-defined]


def run(gpus: list[str], data: Path) -> Report:
    public.kernels_dir(data)
    report = Report(extra_md=KNOWN_LIMITS_MD)
    for gpu in gpus:
        prof = load_profile(gpu)
        report.profiles[gpu] = (
            f"disaggsim/hardware/profiles/{Path(prof.path).name} ({prof.provenance.get('kind')})"
        )
        report.rows += validate_gpu(gpu, data, prof)
    return report
