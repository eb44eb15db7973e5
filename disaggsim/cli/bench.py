"""``disaggsim bench``: the fixed engine-speed benchmark (simulated requests per wall-second).

Llama-2-70B on a100-80gb, TP2, 8 colocated replicas with the vllm scheduler, 50,000
requests of exactly 1024 prompt / 256 output tokens, Poisson 8 req/s, seed 42.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

BENCH_SCENARIO = {
    "name": "bench",
    "seed": 42,
    "model": "llama-2-70b",
    "architecture": "colocated",
    "pool": {"gpu": "a100-80gb", "num_workers": 8, "tp": 2, "scheduler": "vllm"},
    "slo": {"ttft_ms": 2000, "itl_ms": 200},
    "workload": {
        "kind": "synthetic",
        "rate_per_s": 8.0,
        "arrival": "poisson",
        "prompt_tokens": {"dist": "fixed", "value": 1024},
        "output_tokens": {"dist": "fixed", "value": 256},
        "num_requests": 50_000,
    },
    "sim": {"duration_s": 7000.0, "warmup_s": 0.0},
}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="engine speed benchmark (simulated requests per wall-second)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--num-requests", type=int, default=50_000, help="requests to simulate")
    p.set_defaults(func=cmd_bench)


def peak_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def cmd_bench(args: argparse.Namespace) -> int:
    from disaggsim.config.loader import load_scenario
    from disaggsim.run import simulate

    raw = json.loads(json.dumps(BENCH_SCENARIO))
    raw["workload"]["num_requests"] = args.num_requests
    raw["sim"]["duration_s"] = args.num_requests / 8.0 * 1.2
    loaded = load_scenario(raw)
    t0 = time.perf_counter()
    res = simulate(loaded)
    wall = time.perf_counter() - t0
    n = res.summary.num_requests
    out = {
        "num_requests": n,
        "num_completed": res.summary.num_completed,
        "wall_s": wall,
        "simulated_requests_per_s": n / wall,
        "simulated_s": res.summary.sim_end_s,
        "peak_rss_bytes": peak_rss_bytes(),
        "ttft_p99_s": res.summary.ttft_p99_s,
        "itl_p99_s": res.summary.itl_p99_s,
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"{n} requests ({out['simulated_s']:.0f} simulated s) in {wall:.2f} s wall: "
            f"{out['simulated_requests_per_s']:.0f} simulated requests/s, "
            f"peak RSS {out['peak_rss_bytes'] / 2**20:.0f} MiB"
        )
    return 0
