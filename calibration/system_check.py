"""Whole-system check: DistServe's published OPT-13B chatbot runs against disaggsim.

DistServe (OSDI'24) served OPT-13B on A100-80GB SXM with ShareGPT requests, as vLLM v0.2.3
(colocated continuous batching, one GPU, TP1) and as DistServe (prefill TP2 on two GPUs +
decode TP1 on one GPU, same node), and published every request's measured TTFT and TPOT
(LLMServe/DistServe, simdistserve/benchmarks/alignment/data-ground-truth/opt-13b-sharegpt/,
commit 20a1633, the runs its simulator was aligned against). This module

- reads the transcribed runs (``calibration/engine_data/distserve_e2e_opt13b.csv``, one row
  per request of each run, and ``distserve_e2e_opt13b.json``: setup, sources, each run's
  published summary line) and the 400 requests those runs draw from, in order
  (``distserve_sharegpt_opt13b_requests.csv``);
- writes the two scenarios (``scenarios/validation/distserve-opt13b-*.yaml``): the
  published setup, lengths as the empirical quantiles of the 400 requests, Poisson
  arrivals (the benchmark's), engine ``vllm-eager-2023`` on both sides;
- prints published vs simulated SLO attainment at each published per-GPU rate and, with
  ``--goodput``, each side's simulated goodput per GPU and their ratio beside the bounds
  the published runs put on them.

Run: ``python -m calibration.system_check [--goodput]`` (docs/validation-system.md).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "engine_data"
MEASURED_CSV = DATA / "distserve_e2e_opt13b.csv"
SETUP_JSON = DATA / "distserve_e2e_opt13b.json"
REQUESTS_CSV = DATA / "distserve_sharegpt_opt13b_requests.csv"
SCENARIO_DIR = ROOT / "scenarios" / "validation"
SYSTEMS = ("vllm", "distserve")
SCENARIO_FILES = {s: SCENARIO_DIR / f"distserve-opt13b-{s}.yaml" for s in SYSTEMS}


@dataclass(frozen=True)
class Run:
    """One published run: ``system`` on ``gpus`` GPUs at ``rate_per_s`` in total."""

    run: str
    system: str
    gpus: int
    rate_per_s: float
    num_requests: int
    avg_ttft_ms: float
    avg_tpot_ms: float

    @property
    def per_gpu_per_s(self) -> float:
        return self.rate_per_s / self.gpus


def read_setup() -> dict:
    return json.loads(SETUP_JSON.read_text())


def read_runs() -> list[Run]:
    return [Run(**r) for r in read_setup()["runs"]]


def read_requests() -> list[tuple[int, int]]:
    """The 400 requests (prompt, output tokens) in the order every run issued them."""
    with REQUESTS_CSV.open() as f:
        return [(int(r["prompt_len"]), int(r["output_len"])) for r in csv.DictReader(f)]


def read_measured() -> dict[str, list[tuple[int, int, float, float]]]:
    """Per run: (prompt, output tokens, TTFT ms, TPOT ms) of each request."""
    out: dict[str, list[tuple[int, int, float, float]]] = {}
    with MEASURED_CSV.open() as f:
        for r in csv.DictReader(f):
            out.setdefault(r["run"], []).append(
                (
                    int(r["prompt_len"]),
                    int(r["output_len"]),
                    float(r["ttft_ms"]),
                    float(r["tpot_ms"]),
                )
            )
    return out


def attainment(rows: list[tuple[int, int, float, float]], ttft_ms: float, tpot_ms: float) -> float:
    """Share of requests with TTFT <= ttft_ms and TPOT <= tpot_ms (DistServe's rule)."""
    return sum(1 for _, _, t, p in rows if t <= ttft_ms and p <= tpot_ms) / len(rows)


def quantiles(values: list[int]) -> list[list[float]]:
    """Every sorted value as a point of a piecewise-linear inverse CDF (q = i / (n - 1))."""
    v = sorted(values)
    n = len(v)
    return [[round(i / (n - 1), 6), float(x)] for i, x in enumerate(v)]


def scenario_mapping(system: str) -> dict:
    setup = read_setup()
    slo = setup["slo"]
    reqs = read_requests()
    common = {
        "seed": 1,
        "model": "opt-13b",
        "weight_dtype": "fp16",
        "kv_dtype": "fp16",
        "engine": "vllm-eager-2023",
    }
    if system == "vllm":
        layout = {
            "architecture": "colocated",
            "pool": {
                "gpu": "a100-80gb",
                "num_workers": 1,
                "tp": 1,
                "scheduler": "vllm",
                "max_batch_seqs": 1024,
                "max_batch_tokens": 16384,
                "gpu_mem_util": 0.95,
            },
        }
    else:
        layout = {
            "architecture": "disaggregated",
            "prefill_pool": {
                "gpu": "a100-80gb",
                "num_workers": 1,
                "tp": 2,
                "max_batch_seqs": 128,
                "max_batch_tokens": 8192,
                "gpu_mem_util": 0.95,
            },
            "decode_pool": {
                "gpu": "a100-80gb",
                "num_workers": 1,
                "tp": 1,
                "max_batch_seqs": 1024,
                "gpu_mem_util": 0.95,
            },
            "fabric": {"link": "nvlink"},
            # DistServe's decode instance pulls a finished prefill's KV when it has room,
            # the prefill GPUs' memory holding the KV meanwhile (the paper's pull-based KV
            # transfer): no router hold on a decode promise of prompt + max_tokens
            "router": {"backpressure": "none"},
        }
    return {
        "name": f"distserve-opt13b-{system}",
        **common,
        **layout,
        "slo": {
            "ttft_ms": slo["ttft_ms"],
            "itl_ms": slo["tpot_ms"],
            "itl_statistic": "tpot",
            "percentile": 90,
            "attainment_target": slo["attainment_target"],
        },
        "workload": {
            "kind": "synthetic",
            "rate_per_s": 1.0,
            "arrival": "poisson",
            "prompt_tokens": {"dist": "empirical", "quantiles": quantiles([p for p, _ in reqs])},
            "output_tokens": {"dist": "empirical", "quantiles": quantiles([o for _, o in reqs])},
        },
        "sim": {"duration_s": 600, "warmup_s": 60},
    }


HEADER = {
    "vllm": """\
# DistServe (OSDI'24) chatbot, OPT-13B on A100-80GB SXM: the colocated side, vLLM v0.2.3
# (DistServe's fork) on one GPU, TP1 (LLMServe/DistServe evaluation/2-benchmark-serving/
# 2-start-api-server.py: --max-num-batched-tokens 16384 --max-num-seqs 1024 --block-size 16
# --gpu-memory-utilization 0.95 --dtype half). SLO: TTFT 0.25 s, TPOT 0.1 s, 90 % of
# requests (evaluation/ae-scripts/e2e/plot-fig-8-and-9.sh's plot: OPT-13B ShareGPT).
# Question: the per-GPU goodput of 2023 vLLM serving this chatbot on one A100.
""",
    "distserve": """\
# DistServe (OSDI'24) chatbot, OPT-13B on A100-80GB SXM: the disaggregated side, one
# prefill instance TP2 (two GPUs) + one decode instance TP1 (one GPU) on one NVLink node
# (2-start-api-server.py: (context_tp, context_pp, decoding_tp, decoding_pp) = (2, 1, 1, 1),
# --context-max-batch-size 128 --context-max-tokens-per-batch 8192
# --decoding-max-batch-size 1024 --gpu-memory-utilization 0.95). Both sides run
# vllm-eager-2023's step times: DistServe's own C++ engine is not an engine profile
# (docs/validation-system.md says what that leaves out). router.backpressure none:
# DistServe's decode instance pulls finished prefills' KV when it has room, the prefill
# GPUs holding it meanwhile (the paper's pull-based KV transfer). SLO as the vLLM side.
# Question: the per-GPU goodput of this split serving the same chatbot.
""",
}
FOOTER = """\
# Lengths: the empirical quantiles of the 400 requests DistServe's runs issued
# (calibration/engine_data/distserve_sharegpt_opt13b_requests.csv; prompt and output
# drawn independently); arrivals Poisson as the benchmark's; max_tokens the default
# (context - prompt: OPT-13B's 2,048-token context holds every request). Written by
# `python -m calibration.system_check --write-scenarios`; do not edit by hand.
"""


def scenario_text(system: str) -> str:
    body = yaml.safe_dump(
        scenario_mapping(system), sort_keys=False, default_flow_style=None, width=100
    )
    return HEADER[system] + FOOTER + body


def write_scenarios() -> None:
    SCENARIO_DIR.mkdir(parents=True, exist_ok=True)
    for s in SYSTEMS:
        SCENARIO_FILES[s].write_text(scenario_text(s))


def simulate_at(system: str, rate_per_s: float, seed: int, duration_s: float) -> dict:
    """One simulated run at a total rate: attainment of both, of TTFT alone, of TPOT alone."""
    from disaggsim.run import simulate

    warmup_s = min(60.0, duration_s / 10)
    res = simulate(
        str(SCENARIO_FILES[system]),
        [
            f"workload.rate_per_s={rate_per_s}",
            f"seed={seed}",
            f"sim.duration_s={duration_s}",
            f"sim.warmup_s={warmup_s}",
        ],
    )
    s = res.summary
    req = res.requests
    m = req[req["measured"]] if "measured" in req else req
    slo = read_setup()["slo"]
    ttft_ok = (m["ttft_s"] <= slo["ttft_ms"] / 1e3).mean() if "ttft_s" in m else math.nan
    tpot_ok = (m["tpot_s"].fillna(0) <= slo["tpot_ms"] / 1e3).mean() if "tpot_s" in m else math.nan
    return {
        "both": float(s.slo_attainment),
        "ttft": float(ttft_ok),
        "tpot": float(tpot_ok),
        "n": len(m),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m calibration.system_check", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--write-scenarios",
        action="store_true",
        help="(re)write scenarios/validation/distserve-opt13b-*.yaml",
    )
    ap.add_argument(
        "--duration-s", type=float, default=600.0, help="simulated seconds per rate (default 600)"
    )
    ap.add_argument("--seeds", type=int, default=1, help="seeds per rate (default 1)")
    ap.add_argument(
        "--goodput", action="store_true", help="also each side's goodput per GPU (a bisection each)"
    )
    ap.add_argument("--no-sim", action="store_true", help="published figures only")
    args = ap.parse_args(argv)
    if args.write_scenarios:
        write_scenarios()
        print(f"wrote {', '.join(str(p.relative_to(ROOT)) for p in SCENARIO_FILES.values())}")
    slo = read_setup()["slo"]
    measured = read_measured()
    print(
        f"SLO: TTFT <= {slo['ttft_ms']:g} ms and TPOT <= {slo['tpot_ms']:g} ms, target {slo['attainment_target']:.0%}"
    )
    print(
        "| system | GPUs | per-GPU rate | published attainment (TTFT / TPOT alone) | simulated (TTFT / TPOT alone) |"
    )
    print("|---|---|---|---|---|")
    for run in read_runs():
        rows = measured[run.run]
        pub = attainment(rows, slo["ttft_ms"], slo["tpot_ms"])
        pub_t = attainment(rows, slo["ttft_ms"], math.inf)
        pub_p = attainment(rows, math.inf, slo["tpot_ms"])
        sim = "not run"
        if not args.no_sim:
            runs = [
                simulate_at(run.system, run.rate_per_s, s, args.duration_s)
                for s in range(1, args.seeds + 1)
            ]
            both = np.mean([r["both"] for r in runs])
            t = np.mean([r["ttft"] for r in runs])
            p = np.mean([r["tpot"] for r in runs])
            sim = f"{both:.1%} ({t:.1%} / {p:.1%}; {sum(r['n'] for r in runs)} requests)"
        print(
            f"| {run.system} | {run.gpus} | {run.per_gpu_per_s:g} | {pub:.1%} ({pub_t:.1%} / {pub_p:.1%}; "
            f"{len(rows)} requests) | {sim} |"
        )
        sys.stdout.flush()
    bounds = published_bounds(slo)
    for s in SYSTEMS:
        lo, hi = bounds[s]
        print(f"published goodput per GPU, {s}: {_bound(lo, hi)}")
    if args.goodput:
        from disaggsim.sweep.goodput import goodput

        gp = {}
        for s in SYSTEMS:
            g = goodput(str(SCENARIO_FILES[s]), 0.25, 4.0)
            gp[s] = g.per_gpu_per_s
            print(
                f"simulated goodput per GPU, {s}: {g.per_gpu_per_s:.3g} req/s ({g.status}, {g.num_gpus} GPUs)"
            )
        ratio = gp["distserve"] / gp["vllm"] if gp["vllm"] > 0 else math.inf
        print(f"simulated ratio distserve / vllm: {ratio:.2f}")
    return 0


def published_bounds(slo: dict) -> dict[str, tuple[float, float]]:
    """Per system, the per-GPU goodput interval the published runs imply: above the
    highest rate met, below the lowest rate missed (no interpolation between runs)."""
    measured = read_measured()
    out: dict[str, tuple[float, float]] = {}
    for s in SYSTEMS:
        lo, hi = 0.0, math.inf
        for run in read_runs():
            if run.system != s:
                continue
            a = attainment(measured[run.run], slo["ttft_ms"], slo["tpot_ms"])
            if a >= slo["attainment_target"]:
                lo = max(lo, run.per_gpu_per_s)
            else:
                hi = min(hi, run.per_gpu_per_s)
        out[s] = (lo, hi)
    return out


def _bound(lo: float, hi: float) -> str:
    if hi == math.inf:
        return f">= {lo:g} req/s (met at every published rate)"
    if lo == 0.0:
        return f"< {hi:g} req/s (missed at every published rate)"
    return f"in [{lo:g}, {hi:g}) req/s"


if __name__ == "__main__":
    sys.exit(main())
