"""Engine overheads: whole steps are more than their kernels.

A serving engine's forward pass takes its kernels' time plus CPU time the GPU waits for:
per-iteration scheduling/sampling/bookkeeping and, in eager mode, per-layer launch gaps.
The step model (:mod:`disaggsim.costmodel.step`) adds ``per_iteration_s + per_layer_s ×
num_layers`` from the profile's ``engines.<kind>``. This module fits those two numbers
for A100-80GB against DistServe's whole-step curves and reports whole-step error.

Data (``kernels/distserve/profiler-a100-80g.{distserve,vllm}.json``): per (OPT model, TP)
DistServe's fitted curves, in ms, of measured whole forward passes on A100-80GB::

    prefill = a + b·ΣL + c·ΣL²            (L: prompt lengths of the batch)
    decode  = a + b·Σcontext + c·batch     (separate [a, b, c] for batch ≤ / > 95)

The raw profiles are not published, so the curves are evaluated on a grid inside the
range they were fitted on (prefill: batch 1–8 × prompt 64–2048 tokens, ≤ 8192 tokens in
all; decode: batch 1–256 × context 64–2048 per sequence, within the KV capacity of
``max_num_tokens.csv``) and those values are the "measured" whole steps.

Which engine each file is. Both are *eager* engines: no CUDA graphs. A graph-replayed
decode step costs its kernels plus well under a millisecond; DistServe's curves sit
milliseconds above the weights-streaming bound at batch 1 (OPT-13B TP4: 10.3 ms vs 3.2 ms
of weights at peak HBM), and vLLM's more so (25.9 ms at TP4, *more* than its 23.5 ms at
TP1: CPU/Ray-bound). DistServe's engine (SwiftTransformer C++ kernels driven from Python
per step) has kernel times close to this model's sums, so its residual is overhead: it
is what ``engines.eager`` is fitted to. The vLLM file (vLLM of late 2023: eager PyTorch,
xformers attention, before CUDA-graph decode) is slower in its *kernels* too — its
prefill grows 1.4–1.8× faster with tokens than the fitted GEMM/attention kernels — which
no additive overhead can represent; it is reported beside as a transfer check.

``cuda-graphs`` has no public whole-step table. Its ``per_iteration_s`` (scheduler/CPU
time a graph does not remove) is taken from the eager fit. Its ``per_layer_s`` is what a
replayed layer costs beyond the kernels the step model sums, estimated per GPU from the
public per-op tables (:func:`graph_gap`):

- AIConfigurator times every op as a captured CUDA graph replayed many times (its
  collector's ``benchmark_with_power``: latency = graph time / ops), so each of its rows
  is the kernel plus that kernel's share of graph-replay gaps. The step model's GEMM and
  attention terms are fitted to these rows: their gaps are already inside them.
- Vidur's ``mlp.csv`` rows are kernel durations (CUDA time from the kineto profiler): no
  gap. The element-wise terms (``ELEMENTWISE_KERNELS_PER_LAYER`` launches per layer) are
  fitted to these rows.
- For bf16 GEMMs of the same (m, n, k) on the same GPU with m ≤ 16 (latency-bound, tens of
  µs), fitting ``graph_replayed = gap + slope × kernel_duration`` gives the per-kernel gap
  as the intercept (the slope takes up the kernel-library difference between the two runs).

So ``per_layer_s = ELEMENTWISE_KERNELS_PER_LAYER × max(gap, 0)``. The data put the gap at
about zero on A100 and H100 (within ±1.1 µs per framework); the whole-step check on a
GPU (:mod:`calibration.steps`) is what should replace this estimate.

Run: ``python -m calibration.engines --data ../shared/data`` prints the fits and the
whole-step errors; ``python -m calibration.fit_public --engines`` writes ``engines.eager``
into the A100 profile (H100 and the priors take it), and each fitted GPU's own
``engines.cuda-graphs.per_layer_s``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, lsq_linear

from calibration import public
from calibration.fit import ape, prediction_error
from disaggsim.catalog import get_model
from disaggsim.costmodel.step import ELEMENTWISE_KERNELS_PER_LAYER, build_worker_cost
from disaggsim.errors import UserError
from disaggsim.hardware.profile import EngineOverhead, HardwareProfile, profile_from_dict

MS = 1e-3
GPU = "a100-80gb"
FILES = {"distserve": "profiler-a100-80g.distserve.json", "vllm": "profiler-a100-80g.vllm.json"}
FIT_FILE = "distserve"
PREFILL_BATCHES = (1, 2, 4, 8)
PREFILL_LENGTHS = (64, 128, 256, 512, 1024, 2048)
PREFILL_MAX_TOKENS = 8192
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DECODE_CONTEXTS = (64, 256, 512, 1024, 2048)
GRAPH_GAP_MAX_M = 16  # GEMM rows (tokens) used for the graph-gap estimate


def _distserve_dir(data_root: Path) -> Path:
    d = public.kernels_dir(data_root) / "distserve"
    if not d.is_dir():
        raise UserError(f"{d}: DistServe profiles not found")
    return d


def load_curves(data_root: Path, which: str) -> dict[str, Any]:
    path = _distserve_dir(data_root) / FILES[which]
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: cannot read DistServe profile ({e})") from None


def kv_capacity_tokens(data_root: Path) -> dict[tuple[str, int], int]:
    """DistServe's KV-cache token capacity per (model id, tp) at pp = 1."""
    path = _distserve_dir(data_root) / "max_num_tokens.csv"
    df = pd.read_csv(path)
    df = df[df["pp"] == 1]
    return {
        (str(m).split("/")[-1], int(tp)): int(n)
        for m, tp, n in zip(df["model"], df["tp"], df["max_num_tokens"], strict=True)
    }


def whole_step_points(data_root: Path, which: str) -> pd.DataFrame:
    """The curves of one DistServe file evaluated on the grid: one row per step."""
    curves = load_curves(data_root, which)
    cap = kv_capacity_tokens(data_root)
    rows = []
    for hf_id, by_tp in curves.items():
        model = hf_id.split("/")[-1]
        for tp_s, c in by_tp.items():
            tp = int(tp_s)
            a, b, q = c["prefill"]
            for batch in PREFILL_BATCHES:
                for length in PREFILL_LENGTHS:
                    if batch * length > PREFILL_MAX_TOKENS:
                        continue
                    s1, s2 = batch * length, batch * length**2
                    rows.append((model, tp, "prefill", batch, length, (a + b * s1 + q * s2) * MS))
            threshold = c["decoding_large_small_bs_threshold"]
            for batch in DECODE_BATCHES:
                a, b, q = c["decoding_smallbs"] if batch <= threshold else c["decoding_largebs"]
                for ctx in DECODE_CONTEXTS:
                    if batch * ctx > cap.get((model, tp), 0):
                        continue
                    rows.append(
                        (model, tp, "decode", batch, ctx, (a + b * batch * ctx + q * batch) * MS)
                    )
    return pd.DataFrame(rows, columns=["model", "tp", "kind", "batch", "tokens", "t_s"])


def kernel_sums(points: pd.DataFrame, prof: HardwareProfile) -> np.ndarray:
    """The step model's time of each point with zero engine overhead (kernels only)."""
    zero = EngineOverhead(per_iteration_s=0.0, per_layer_s=0.0)
    bare = replace(prof, engines={"eager": zero, "cuda-graphs": zero})
    out = np.empty(len(points))
    workers: dict[tuple[str, int], Any] = {}
    for i, (model, tp, kind, batch, tokens) in enumerate(
        zip(
            points["model"],
            points["tp"],
            points["kind"],
            points["batch"],
            points["tokens"],
            strict=True,
        )
    ):
        key = (model, int(tp))
        if key not in workers:
            workers[key] = build_worker_cost(model, GPU, int(tp), engine="eager", profile=bare)
        w = workers[key]
        b, n = int(batch), int(tokens)
        if kind == "prefill":
            out[i] = w.prefill_time_s(b, b * n, b * n * (n + 1) / 2.0)
        else:
            out[i] = w.decode_time_s(b, b * n)
    return out


def _solve(kern: np.ndarray, layers: np.ndarray, meas: np.ndarray) -> tuple[float, float]:
    """Non-negative (per_iteration_s, per_layer_s) minimising the relative error of
    ``kern + per_iteration_s + per_layer_s × layers`` against ``meas`` (linear in both)."""
    a = np.column_stack([1.0 / meas, layers / meas])
    res = lsq_linear(a, 1.0 - kern / meas, bounds=(0.0, np.inf))
    return float(res.x[0]), float(res.x[1])


def fit(data_root: Path, prof: HardwareProfile, which: str = FIT_FILE) -> dict[str, Any]:
    """Fit ``(per_iteration_s, per_layer_s)`` to one DistServe file; errors on all points,
    and held out by (model, TP) family (fit on the others, predict the one left out)."""
    pts = whole_step_points(data_root, which)
    kern = kernel_sums(pts, prof)
    layers = np.array([get_model(m).num_layers for m in pts["model"]], float)
    meas = pts["t_s"].to_numpy(float)
    per_iter, per_layer = _solve(kern, layers, meas)
    pred = kern + per_iter + per_layer * layers
    fam = pts["model"] + "/tp" + pts["tp"].astype(str)
    held = np.empty(len(pts))
    for f in fam.unique():
        test = (fam == f).to_numpy()
        pi, pl = _solve(kern[~test], layers[~test], meas[~test])
        held[test] = kern[test] + pi + pl * layers[test]
    return {
        "per_iteration_s": per_iter,
        "per_layer_s": per_layer,
        "points": pts.assign(kernels_s=kern, pred_s=pred, held_out_pred_s=held),
        "error": {
            **prediction_error(pred, held, meas, "(model, TP) families").as_dict(),
            "kernels_only_median_ape": round(float(np.median(ape(kern, meas))), 5),
            "source": f"kernels/distserve/{FILES[which]} (curves on a grid; see calibration/engines.py)",
        },
    }


def graph_gap_rows(data_root: Path, gpu: str) -> pd.DataFrame:
    """bf16 GEMMs timed both ways on ``gpu``: AIConfigurator graph-replayed per-op latency
    (``graph_s``, one row per framework) beside Vidur's kernel duration (``kernel_s``,
    median over Vidur's repeated rows) for the same (m, n, k), m ≤ ``GRAPH_GAP_MAX_M``."""
    aic = public.aic_gemm(data_root, gpu)
    aic = aic[(aic["dtype"] == "bf16") & (aic["m"] <= GRAPH_GAP_MAX_M)]
    vid = public.vidur_mlp(data_root, gpu)
    vid = vid[vid["n"].notna() & (vid["m"] <= GRAPH_GAP_MAX_M)]
    kern = vid.groupby(["op", "model", "tp", "m", "n", "k"], as_index=False)["t_s"].median()
    both = pd.DataFrame(kern).merge(aic, on=["m", "n", "k"])
    if both.empty:
        raise UserError(f"{gpu}: no GEMM shape is in both the AIConfigurator and Vidur tables")
    return both.rename(columns={"t_s_x": "kernel_s", "t_s_y": "graph_s"})[
        ["framework", "model", "op", "tp", "m", "n", "k", "kernel_s", "graph_s"]
    ]


def gap_slope(kernel_s: np.ndarray, graph_s: np.ndarray) -> tuple[float, float]:
    """``graph_s ≈ gap + slope × kernel_s`` (soft-L1 least squares in µs): (gap_s, slope)."""
    x, y = kernel_s * 1e6, graph_s * 1e6
    res = least_squares(lambda p: p[0] + p[1] * x - y, [0.0, 1.0], loss="soft_l1", f_scale=1.0)
    return float(res.x[0]) * 1e-6, float(res.x[1])


def graph_gap(data_root: Path, gpu: str) -> dict[str, Any]:
    """Per-kernel gap of a CUDA-graph replay beyond the kernel's duration (module doc):
    pooled over frameworks, per framework, and held out by framework (the gap of the
    others predicting each framework's graph-replayed times from the kernel durations)."""
    rows = graph_gap_rows(data_root, gpu)
    k, g = rows["kernel_s"].to_numpy(float), rows["graph_s"].to_numpy(float)
    gap, slope = gap_slope(k, g)
    fw = rows["framework"].to_numpy()
    per_fw = {}
    held = np.empty(len(rows))
    for f in sorted(set(fw)):
        test = fw == f
        per_fw[f] = gap_slope(k[test], g[test])[0]
        gap_o, slope_o = gap_slope(k[~test], g[~test])
        held[test] = gap_o + slope_o * k[test]
    return {
        "gap_s": gap,
        "slope": slope,
        "per_framework_gap_s": per_fw,
        "bound_s": max(abs(v) for v in (gap, *per_fw.values())),
        "rows": rows.assign(held_out_graph_s=held),
        "error": {
            **prediction_error(gap + slope * k, held, g, "frameworks").as_dict(),
            "gap_us": round(gap * 1e6, 3),
            "slope": round(slope, 4),
            "per_framework_gap_us": {f: round(v * 1e6, 3) for f, v in per_fw.items()},
            "kernels_per_layer": ELEMENTWISE_KERNELS_PER_LAYER,
            "what": "AIConfigurator graph-replayed bf16 GEMM latency = gap + slope × Vidur "
            f"kernel duration, same (m, n, k), m <= {GRAPH_GAP_MAX_M}; per_layer_s = "
            "kernels_per_layer × max(gap, 0) (calibration/engines.py)",
        },
    }


def graphs_into(prof_dict: dict[str, Any], data_root: Path, gpu: str) -> dict[str, Any]:
    """``prof_dict`` with ``engines.cuda-graphs.per_layer_s`` from :func:`graph_gap`."""
    gg = graph_gap(data_root, gpu)
    out = json.loads(json.dumps(prof_dict))
    per_layer = ELEMENTWISE_KERNELS_PER_LAYER * max(gg["gap_s"], 0.0)
    out["engines"]["cuda-graphs"]["per_layer_s"] = float(f"{per_layer:.5g}")
    out["fit_error"]["engines.cuda-graphs"] = gg["error"]
    prov = out["provenance"]
    prov["carried"] = [c for c in prov.get("carried", []) if c != "engines.cuda-graphs.per_layer_s"]
    prov["graphs_from"] = (
        f"engines.cuda-graphs.per_layer_s = {ELEMENTWISE_KERNELS_PER_LAYER} element-wise "
        f"kernels x max(gap, 0), gap {gg['gap_s'] * 1e6:.2f} us per kernel from {gpu}'s "
        "AIConfigurator graph-replayed GEMMs against Vidur kernel durations "
        "(calibration/engines.py graph_gap); per_iteration_s = the eager one"
    )
    return out


def fit_into(prof_dict: dict[str, Any], data_root: Path) -> dict[str, Any]:
    """The A100 profile dict with ``engines`` fitted to DistServe's engine (see module doc);
    ``cuda-graphs`` takes the eager ``per_iteration_s`` and keeps its ``per_layer_s``
    (:func:`graphs_into` sets that)."""
    prof = profile_from_dict(prof_dict, "<a100 profile being fitted>")
    f = fit(data_root, prof, FIT_FILE)
    out = json.loads(json.dumps(prof_dict))
    graphs_layer = prof_dict["engines"]["cuda-graphs"]["per_layer_s"]
    out["engines"] = {
        "eager": {
            "per_iteration_s": float(f"{f['per_iteration_s']:.5g}"),
            "per_layer_s": float(f"{f['per_layer_s']:.5g}"),
        },
        "cuda-graphs": {
            "per_iteration_s": float(f"{f['per_iteration_s']:.5g}"),
            "per_layer_s": graphs_layer,
        },
    }
    out["fit_error"]["engines.eager"] = f["error"]
    prov = out["provenance"]
    prov["carried"] = [c for c in prov.get("carried", []) if c != "engines"]
    prov["engines_from"] = (
        "engines.eager fitted to DistServe's A100 whole-step curves of its own engine "
        "(calibration/engines.py); engines.cuda-graphs.per_iteration_s = the eager one "
        "(CPU time a graph does not remove)"
    )
    return out


def report_frame(data_root: Path, prof: HardwareProfile) -> pd.DataFrame:
    """Whole-step APE of the shipped profile (its ``engines.eager``) on both files, per
    file × model/TP × prefill/decode, with the kernels-only APE beside."""
    eng = prof.engine("eager")
    rows = []
    for which in FILES:
        pts = whole_step_points(data_root, which)
        kern = kernel_sums(pts, prof)
        layers = np.array([get_model(m).num_layers for m in pts["model"]], float)
        pred = kern + eng.per_iteration_s + eng.per_layer_s * layers
        meas = pts["t_s"].to_numpy(float)
        pts = pts.assign(ape=ape(pred, meas), kern_ape=ape(kern, meas))
        for (model, tp, kind), g in pts.groupby(["model", "tp", "kind"], sort=True):
            rows.append(
                (which, f"{model} TP{tp}", kind, g["ape"].to_numpy(), g["kern_ape"].to_numpy())
            )
        for kind, g in pts.groupby("kind", sort=True):
            rows.append((which, "all", kind, g["ape"].to_numpy(), g["kern_ape"].to_numpy()))
    return pd.DataFrame(
        [
            {
                "file": w,
                "model_tp": m,
                "kind": k,
                "n": len(a),
                "median_ape": float(np.median(a)),
                "mean_ape": float(np.mean(a)),
                "kernels_only_median_ape": float(np.median(ka)),
            }
            for w, m, k, a, ka in rows
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m calibration.engines", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--data", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data")
    )
    p.add_argument("--profile", help="A100 profile JSON (default: the shipped one)")
    args = p.parse_args(argv)
    from disaggsim.hardware.profile import load_profile

    try:
        prof = load_profile(GPU) if args.profile is None else load_profile(path=args.profile)
        for which in FILES:
            f = fit(Path(args.data), prof, which)
            e = f["error"]
            print(
                f"{which:9s} per_iteration {1e3 * f['per_iteration_s']:.3f} ms, per_layer "
                f"{1e6 * f['per_layer_s']:.1f} us: median APE {100 * e['median_ape']:.1f}% mean "
                f"{100 * e['mean_ape']:.1f}% (held-out median {100 * e['held_out_median_ape']:.1f}%, "
                f"kernels only {100 * e['kernels_only_median_ape']:.1f}%), n={e['n']}"
            )
        print(report_frame(Path(args.data), prof).to_string(index=False))
        for gpu in public.AIC_GPU_DIR:
            gg = graph_gap(Path(args.data), gpu)
            e = gg["error"]
            fws = ", ".join(f"{f} {1e6 * v:+.2f}" for f, v in gg["per_framework_gap_s"].items())
            print(
                f"{gpu}: CUDA-graph gap {1e6 * gg['gap_s']:+.2f} us per kernel (slope "
                f"{gg['slope']:.3f}; per framework {fws} us) -> cuda-graphs per_layer_s "
                f"{1e6 * ELEMENTWISE_KERNELS_PER_LAYER * max(gg['gap_s'], 0.0):.2f} us; "
                f"graph = gap + slope x kernel: median APE {100 * e['median_ape']:.1f}%, "
                f"held out by framework {100 * e['held_out_median_ape']:.1f}%, n={e['n']}"
            )
    except UserError as e:
        print(f"engines: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
