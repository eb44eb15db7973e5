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
- replays each published run as it was run (:func:`replay_at`): its first N requests of
  the sequence, each with its own prompt and output length and ``max_tokens`` = output
  (the benchmark client's ``ignore_eos``), Poisson arrivals at the run's rate, from a cold
  start, every request counted; with ``--data``, again with each side's step times taken
  from DistServe's profiled curves of its own engine (:class:`ProfiledCurveCost`);
- prints published vs simulated SLO attainment at each published per-GPU rate (replayed,
  and in steady state from the scenarios) and, with ``--goodput``, each side's simulated
  steady-state goodput per GPU and their ratio beside the bounds the published runs put
  on them.

Run: ``python -m calibration.system_check [--data ../shared/data] [--goodput]``
(docs/validation-system.md).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import yaml

from disaggsim.config.scenario import Scenario
from disaggsim.costmodel.interface import WorkerCost
from disaggsim.workload.requests import Requests

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
            # DistServe's context engine hands each request's first token to its client
            # when the prefill step ends, before the KV migrates (distserve/
            # single_stage_engine.py: ContextStageLLMEngine._step calls the step-output
            # callback, then puts the request on the bridge queue to the decoding engine)
            "first_token_from": "prefill",
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
# GPUs holding it meanwhile (the paper's pull-based KV transfer). first_token_from
# prefill: DistServe's context engine streams the first token when the prefill ends.
# SLO as the vLLM side. Question: the per-GPU goodput of this split serving the same chatbot.
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


TTFT_PARTS = ("queue_ms", "prefill_ms", "wait_ms", "transfer_ms")


def ttft_parts(r: pd.DataFrame) -> dict[str, float]:
    """Mean milliseconds of each part of a request's way to its first token, from the
    request records: queued before its prefill, the prefill, waiting after it for room on
    a decode worker (disaggregated), the KV transfer. With ``first_token_from: prefill``
    the TTFT is the first two; with ``decode``, all four."""

    def mean_ms(a: str, b: str) -> float:
        d = (r[b] - r[a]).dropna()
        return float(d.mean() * 1e3) if len(d) else math.nan

    return {
        "queue_ms": mean_ms("arrival_at_s", "prefill_start_at_s"),
        "prefill_ms": mean_ms("prefill_start_at_s", "prefill_end_at_s"),
        "wait_ms": mean_ms("prefill_end_at_s", "transfer_start_at_s"),
        "transfer_ms": mean_ms("transfer_start_at_s", "transfer_end_at_s"),
    }


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
        **ttft_parts(m),
    }


# Each side's own engine as DistServe profiled it (kernels/distserve/): the colocated side
# is 2023 vLLM, the disaggregated side DistServe's C++ engine (SwiftTransformer)
CURVE_FILES = {"vllm": "vllm", "distserve": "distserve"}
CURVE_MODEL = "facebook/opt-13b"


@dataclass(slots=True)
class ProfiledCurveCost:
    """A worker's step times from DistServe's fitted curves of one engine at one TP
    (``evaluation/1-fit-time-usage``, in ms): a prefill of prompts ``l_i`` takes
    ``A + B Σ l_i + C Σ l_i²``; a decode step of ``b`` sequences over ``K`` context tokens
    ``A + B K + C b`` (one line up to ``decoding_large_small_bs_threshold`` sequences, one
    above). Memory (GPUs, KV capacity and bytes per token, weights) is the cost model's.
    Only whole prefills and decode steps: DistServe's engines and vLLM 0.2.3 never mix
    them."""

    num_gpus: int
    kv_bytes_per_token: int
    kv_capacity_tokens: int
    weights_bytes: int
    prefill_ms: tuple[float, float, float]
    decode_small_ms: tuple[float, float, float]
    decode_large_ms: tuple[float, float, float]
    large_batch_from: int  # the curve's threshold: batches above it take the large line

    def prefill_time_s(
        self, num_seqs: int, new_tokens: int, attn_pairs: float, cached_tokens: int = 0
    ) -> float:
        if cached_tokens:
            raise ValueError("profiled curves: prefills over cached tokens are not profiled")
        a, b, c = self.prefill_ms
        # attn_pairs = Σ l(l + 1)/2 over the prompts, so Σ l² = 2 attn_pairs − Σ l
        return (a + b * new_tokens + c * (2.0 * attn_pairs - new_tokens)) * 1e-3

    def decode_coeffs(self, batch: int) -> tuple[float, float]:
        a, b, c = self.decode_small_ms if batch <= self.large_batch_from else self.decode_large_ms
        return (a + c * batch) * 1e-3, b * 1e-3

    def mixed_time_s(
        self,
        decode_batch: int,
        decode_context_tokens: int,
        prefill_seqs: int,
        prefill_tokens: int,
        prefill_attn_pairs: float,
        prefill_cached_tokens: int = 0,
        decode_longest_history_tokens: float | None = None,
    ) -> float:
        raise ValueError("profiled curves: mixed prefill-decode steps are not profiled")


def curve_cost(inner: WorkerCost, curves: dict, tp: int) -> ProfiledCurveCost:
    """``inner``'s memory with the step times of ``curves`` (one DistServe profile file)
    for OPT-13B at ``tp``."""
    c = curves[CURVE_MODEL][str(tp)]
    a, b, q = c["prefill"]
    sa, sb, sq = c["decoding_smallbs"]
    la, lb, lq = c["decoding_largebs"]
    return ProfiledCurveCost(
        num_gpus=inner.num_gpus,
        kv_bytes_per_token=inner.kv_bytes_per_token,
        kv_capacity_tokens=inner.kv_capacity_tokens,
        weights_bytes=inner.weights_bytes,
        prefill_ms=(a, b, q),
        decode_small_ms=(sa, sb, sq),
        decode_large_ms=(la, lb, lq),
        large_batch_from=int(c["decoding_large_small_bs_threshold"]),
    )


@contextmanager
def profiled_curves(system: str, data_root: Path) -> Iterator[None]:
    """While open, :func:`disaggsim.run.simulate` costs every pool of ``system``'s
    scenario with DistServe's profiled curves of that system's own engine (the check only:
    no scenario can ask for this)."""
    import disaggsim.run as run
    from calibration.engines import load_curves

    curves = load_curves(data_root, CURVE_FILES[system])
    build = run.build_costs

    def build_costs(scenario: Scenario, label: str = "<scenario>") -> dict[str, WorkerCost]:
        tps = {str(role): pool.tp for role, pool in scenario.pools.items()}
        return {r: curve_cost(c, curves, tps[r]) for r, c in build(scenario, label).items()}

    with mock.patch.object(run, "build_costs", build_costs):
        yield


def step_times(system: str, data_root: Path | None) -> AbstractContextManager[None]:
    """The scenario's own step times (``data_root`` None) or :func:`profiled_curves`."""
    return nullcontext() if data_root is None else profiled_curves(system, data_root)


def replay_requests(num_requests: int, rate_per_s: float, seed: int) -> Requests:
    """The first ``num_requests`` of the published sequence, in order, each with its own
    prompt and output length and ``max_tokens`` = its output (the benchmark client sets
    ``max_tokens`` to the output length with ``ignore_eos``), at Poisson arrivals of
    ``rate_per_s`` from 0 (exponential gaps from ``seed``)."""
    reqs = read_requests()[:num_requests]
    prompt = np.array([p for p, _ in reqs], dtype=np.int64)
    output = np.array([o for _, o in reqs], dtype=np.int64)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_per_s, num_requests)
    arrival = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    return Requests(
        arrival_s=arrival, prompt_tokens=prompt, output_tokens=output, max_tokens=output.copy()
    )


REPLAY_DRAIN_S = 600.0  # simulated after the last arrival: every request finishes in it


def replay_at(
    system: str, rate_per_s: float, num_requests: int, seed: int, data_root: Path | None = None
) -> dict:
    """A published run replayed from a cold start (no warm-up: every request counts, as
    in the run): attainment of both limits, of TTFT alone and of TPOT alone, over all
    ``num_requests`` (one unfinished counts as a miss). ``data_root``: step times from
    DistServe's profiled curves of the system's own engine (:func:`profiled_curves`)."""
    from disaggsim.run import simulate

    reqs = replay_requests(num_requests, rate_per_s, seed)
    overrides = [f"sim.duration_s={reqs.arrival_s[-1] + REPLAY_DRAIN_S}", "sim.warmup_s=0"]
    with step_times(system, data_root):
        res = simulate(str(SCENARIO_FILES[system]), overrides, requests=reqs)
    r = res.requests
    slo = read_setup()["slo"]
    done = (r["status"] == "completed").to_numpy()
    ttft_ok = done & (r["ttft_s"] <= slo["ttft_ms"] / 1e3).to_numpy()
    # DistServe's TPOT of a one-token reply is 0 (structs.py); disaggsim's is NaN
    tpot_ok = done & (r["tpot_s"].fillna(0.0) <= slo["tpot_ms"] / 1e3).to_numpy()
    return {
        "both": float(np.mean(ttft_ok & tpot_ok)),
        "ttft": float(np.mean(ttft_ok)),
        "tpot": float(np.mean(tpot_ok)),
        "ttft_mean_ms": float(r["ttft_s"].mean() * 1e3),
        "n": len(r),
        **ttft_parts(r),
    }


def replay_mean(
    system: str, rate_per_s: float, num_requests: int, seeds: int, data_root: Path | None = None
) -> dict:
    runs = [replay_at(system, rate_per_s, num_requests, s, data_root) for s in range(1, seeds + 1)]
    keys = ("both", "ttft", "tpot", "ttft_mean_ms", *TTFT_PARTS)
    return {k: float(np.mean([r[k] for r in runs])) for k in keys}


def _cell(a: dict) -> str:
    return f"{a['both']:.1%} ({a['ttft']:.1%} / {a['tpot']:.1%})"


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
        "--duration-s",
        type=float,
        default=600.0,
        help="steady state: simulated seconds per rate (default 600)",
    )
    ap.add_argument(
        "--seeds", type=int, default=1, help="seeds per rate, replayed and steady (default 1)"
    )
    ap.add_argument(
        "--data",
        type=Path,
        default=None,
        help="public data folder (../shared/data): also replay on DistServe's profiled curves",
    )
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
        "attainment: both limits (TTFT alone / TPOT alone); replayed: the run's own requests "
        f"from a cold start, mean of {args.seeds} arrival seed(s); steady: the scenario, "
        f"{args.duration_s:g} s"
    )
    steps: list[tuple[str, Path | None]] = [("engine profile", None)]
    if args.data is not None:
        steps.append(("profiled curves", args.data))
    cols = ["published"]
    cols += [f"replayed, {label}" for label, _ in steps]
    cols += [f"steady, {label}" for label, _ in steps]
    print(f"| system | GPUs | per-GPU rate | {' | '.join(cols)} |")
    print("|---|---|---|" + "---|" * len(cols))
    replayed: dict[str, dict[str, float]] = {label: {} for label, _ in steps}
    parts: list[str] = []
    for run in read_runs():
        rows = measured[run.run]
        pub = {
            "both": attainment(rows, slo["ttft_ms"], slo["tpot_ms"]),
            "ttft": attainment(rows, slo["ttft_ms"], math.inf),
            "tpot": attainment(rows, math.inf, slo["tpot_ms"]),
        }
        pub_ttft_ms = sum(r[2] for r in rows) / len(rows)
        cells = [f"{_cell(pub)}; TTFT mean {pub_ttft_ms:.0f} ms"]
        if args.no_sim:
            cells += ["not run"] * (len(cols) - 1)
        else:
            n, rate = run.num_requests, run.rate_per_s
            got = []
            for label, root in steps:
                a = replay_mean(run.system, rate, n, args.seeds, root)
                replayed[label][run.run] = a["both"]
                cells.append(f"{_cell(a)}; {a['ttft_mean_ms']:.0f} ms")
                got.append((f"replayed, {label}", a))
            for label, root in steps:
                with step_times(run.system, root):
                    runs = [
                        simulate_at(run.system, rate, s, args.duration_s)
                        for s in range(1, args.seeds + 1)
                    ]
                keys = ("both", "ttft", "tpot", *TTFT_PARTS)
                steady = {k: float(np.mean([r[k] for r in runs])) for k in keys}
                cells.append(_cell(steady))
                got.append((f"steady, {label}", steady))
            parts += [
                f"| {run.system} | {run.per_gpu_per_s:g} | {label} | "
                + " | ".join("-" if math.isnan(g[k]) else f"{g[k]:.1f}" for k in TTFT_PARTS)
                + " |"
                for label, g in got
            ]
        print(f"| {run.system} | {run.gpus} | {run.per_gpu_per_s:g} | {' | '.join(cells)} |")
        sys.stdout.flush()
    if parts:
        print("TTFT parts, mean ms (records: queued, prefill, waiting for decode room, transfer)")
        print("| system | per-GPU rate | run | queue | prefill | decode-room wait | transfer |")
        print("|---|---|---|---|---|---|---|")
        print("\n".join(parts))
    bounds = published_bounds(slo)
    for s in SYSTEMS:
        lo, hi = bounds[s]
        print(f"published goodput per GPU, {s}: {_bound(lo, hi)}")
    for label, att in replayed.items():
        if att:
            rb = run_bounds(att, slo)
            for s in SYSTEMS:
                print(f"replayed ({label}) goodput per GPU, {s}: {_bound(*rb[s])}")
    if args.goodput:
        from disaggsim.sweep.goodput import goodput

        for label, root in steps:
            gp = {}
            for s in SYSTEMS:
                with step_times(s, root):
                    g = goodput(str(SCENARIO_FILES[s]), 0.25, 4.0)
                gp[s] = g.per_gpu_per_s
                print(
                    f"steady ({label}) goodput per GPU, {s}: {g.per_gpu_per_s:.3g} req/s "
                    f"({g.status}, {g.num_gpus} GPUs)"
                )
            ratio = gp["distserve"] / gp["vllm"] if gp["vllm"] > 0 else math.inf
            print(f"steady ({label}) ratio distserve / vllm: {ratio:.2f}")
    return 0


def published_bounds(slo: dict) -> dict[str, tuple[float, float]]:
    """Per system, the per-GPU goodput interval the published runs imply: above the
    highest rate met, below the lowest rate missed (no interpolation between runs)."""
    measured = read_measured()
    att = {
        run.run: attainment(measured[run.run], slo["ttft_ms"], slo["tpot_ms"])
        for run in read_runs()
    }
    return run_bounds(att, slo)


def run_bounds(att: dict[str, float], slo: dict) -> dict[str, tuple[float, float]]:
    """:func:`published_bounds` of any attainment per published run (``att``: run name
    -> attainment of both limits)."""
    out: dict[str, tuple[float, float]] = {}
    for s in SYSTEMS:
        lo, hi = 0.0, math.inf
        for run in read_runs():
            if run.system != s:
                continue
            a = att[run.run]
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
