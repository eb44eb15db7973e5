"""``disaggsim bench``: engine-speed benchmarks that print figures (never timed tests).

Default: the fixed benchmark. Llama-2-70B on a100-80gb, TP2, 8 colocated replicas with
the vllm scheduler, 50,000 requests of exactly 1024 prompt / 256 output tokens, Poisson
8 req/s, seed 42. Its figure, simulated requests per wall-second, is also printed
normalised by the bare SimPy event rate measured in the same process (timeouts per
second of a process that only waits), so figures compare across machines.

``--scale``: the fleet benchmark (issue 15). A disaggregated Llama-3.1-70B fleet on H100
SXM, TP4, 2 prefill : 3 decode workers (1,000 GPUs: 100 + 150), serving the
azure-conv-2023 preset at a load proportional to its size (278 req/s for 1,000 GPUs),
clients capping replies at 1,000 tokens, KV over InfiniBand; one hour of traffic is
1,000,000 requests. ``--gpus 40 | 200 | 1000`` picks the fleet (the README's scaling
table). Reports wall and CPU seconds and peak RSS of the whole run (workload generation,
simulation and every frame and summary), in one process on one core; the package and
the modules the run imports on first use are imported before the clock starts.
"""

from __future__ import annotations

import argparse
import importlib
import json
import resource
import sys
import time
from typing import Any

import simpy

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

FLEET_RATE_PER_GPU = 278.0 / 1000  # req/s per GPU (issue 15's 1,000-GPU fleet at 278 req/s)
FLEET_GPUS = (40, 200, 1000)


def fleet_scenario(num_gpus: int, num_requests: int) -> dict[str, Any]:
    """The ``--scale`` fleet of ``num_gpus`` H100s (TP4 workers, 2 prefill : 3 decode)."""
    workers = num_gpus // 4
    prefill = workers * 2 // 5
    rate = FLEET_RATE_PER_GPU * num_gpus
    return {
        "name": f"bench-fleet-{num_gpus}",
        "seed": 42,
        "model": "llama-3.1-70b",
        "architecture": "disaggregated",
        "prefill_pool": {
            "gpu": "h100-sxm",
            "num_workers": prefill,
            "tp": 4,
            "max_batch_tokens": 16384,  # >= the preset's longest prompt (14,050)
        },
        "decode_pool": {"gpu": "h100-sxm", "num_workers": workers - prefill, "tp": 4},
        "fabric": {"link": "infiniband"},
        "slo": {"ttft_ms": 2000, "itl_ms": 100},
        "workload": {
            "kind": "preset",
            "preset": "azure-conv-2023",
            "arrival": "gamma",  # the workload measured since issue 15 (docs/performance.md)
            "rate_per_s": rate,
            "max_tokens": 1000,  # the preset's longest reply
            "num_requests": num_requests,
        },
        "sim": {"duration_s": num_requests / rate * 1.05, "warmup_s": 0.0},
    }


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="engine speed benchmark (simulated requests per wall-second)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help="requests to simulate (default 50,000; with --scale 1,000,000)",
    )
    p.add_argument(
        "--scale",
        action="store_true",
        help="the fleet benchmark: a disaggregated Llama-3.1-70B H100 fleet at proportional "
        "load (issue 15)",
    )
    p.add_argument(
        "--gpus",
        type=int,
        choices=FLEET_GPUS,
        default=1000,
        help="with --scale: the fleet's GPUs (default 1000)",
    )
    p.set_defaults(func=cmd_bench)


# modules a run imports on first use: the summary's steady-state trend test imports
# scipy.special (with numpy.testing and unittest: about 0.1 s CPU, 6-7% of the fixed
# benchmark's seconds), once per process whatever the number of requests
FIRST_USE_IMPORTS = ("scipy.special",)


def import_on_first_use() -> None:
    """Import :data:`FIRST_USE_IMPORTS` before the clock starts, as the rest of the
    package is imported before it: the figure times simulating, not a one-time import."""
    for name in FIRST_USE_IMPORTS:
        importlib.import_module(name)


def peak_rss_bytes() -> int:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def simpy_timeouts_per_s(num_events: int = 200_000) -> float:
    """Bare SimPy speed on this machine now: one process waiting on ``num_events``
    timeouts, events per wall-second."""
    env = simpy.Environment()

    def waiter(env: simpy.Environment) -> Any:
        for _ in range(num_events):
            yield env.timeout(1.0)

    env.process(waiter(env))
    t0 = time.perf_counter()
    env.run()
    return num_events / (time.perf_counter() - t0)


def cmd_bench(args: argparse.Namespace) -> int:
    from disaggsim.config.bounds import MAX_REQUESTS
    from disaggsim.config.loader import load_scenario
    from disaggsim.errors import UserError
    from disaggsim.run import simulate

    n = args.num_requests
    if n is not None and not 1 <= n <= MAX_REQUESTS:  # before the scenario (its own words)
        raise UserError(
            f"bench: --num-requests {n}: must be from 1 to {MAX_REQUESTS:,} (docs/safety.md)"
        )
    if args.scale:
        n = args.num_requests if args.num_requests is not None else 1_000_000
        raw = fleet_scenario(args.gpus, n)
    else:
        n = args.num_requests if args.num_requests is not None else 50_000
        raw = json.loads(json.dumps(BENCH_SCENARIO))
        raw["workload"]["num_requests"] = n
        raw["sim"]["duration_s"] = n / 8.0 * 1.2
    import_on_first_use()
    simpy_before = simpy_timeouts_per_s()
    loaded = load_scenario(raw)
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(loaded)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    simpy_rate = (simpy_before + simpy_timeouts_per_s()) / 2  # before and after the run
    num = res.summary.num_requests
    rss = peak_rss_bytes()
    out: dict[str, Any] = {
        "benchmark": f"fleet-{args.gpus}-gpus" if args.scale else "fixed",
        "num_requests": num,
        "num_completed": res.summary.num_completed,
        "wall_s": wall,
        "cpu_s": cpu,
        "simulated_requests_per_s": num / wall,
        "simulated_requests_per_cpu_s": num / cpu,
        "simpy_timeouts_per_s": simpy_rate,
        # requests simulated in the time bare SimPy takes for 1,000 timeouts
        "requests_per_1k_simpy_timeouts": 1000 * num / wall / simpy_rate,
        "simulated_s": res.summary.sim_end_s,
        "peak_rss_bytes": rss,
        "ttft_p99_s": res.summary.ttft_p99_s,
        "itl_p99_s": res.summary.itl_p99_s,
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"{num} requests ({out['simulated_s']:.0f} simulated s) in {wall:.2f} s wall, "
            f"{cpu:.2f} s CPU: {out['simulated_requests_per_s']:.0f} simulated requests/s, "
            f"peak RSS {rss / 2**20:.0f} MiB\n"
            f"bare SimPy here: {simpy_rate / 1e6:.2f} M timeouts/s; normalised: "
            f"{out['requests_per_1k_simpy_timeouts']:.2f} requests per 1,000 SimPy timeouts"
        )
    return 0
