"""The planner on a workload with prefix reuse (docs/planning.md, "Prefix reuse").

    python benchmarks/plan_reuse.py

Plans ``scenarios/prefix/chat-sessions.yaml`` (Llama-3-8B, sessions of 2-6 turns over two
1,500-token system prompts, radix cache with 64 GiB of DRAM per node, cache-aware
routing) on 4 H100 in quick mode with short runs (60 measured requests, one longest
service time), and prints the
analytic hit share beside the simulated ``prefix_hit_share`` of the candidates, the
verdict and the prefix-reuse line. Not a test: nothing is asserted.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

# the question, shared with tests/test_plan_layouts.py (which checks its arithmetic)
SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "prefix" / "chat-sessions.yaml"


def main() -> None:
    from disaggsim.config.loader import load_scenario
    from disaggsim.metrics.steady import RunLengthRule
    from disaggsim.plan import PlanOptions, plan
    from disaggsim.sweep import SerialExecutor

    tiny = RunLengthRule(min_measured_requests=60, service_multiple=1.0)
    opts = dataclasses.replace(
        PlanOptions.quick(), rule=tiny, explore_rule=tiny, max_waves=3, max_tp=2
    )
    t0 = time.perf_counter()
    with SerialExecutor() as ex:
        res, advice = plan(load_scenario(SCENARIO), gpus=4, options=opts, executor=ex)
    print(f"{res.num_simulations} simulations, {time.perf_counter() - t0:.0f} s wall")
    print(f"analytic hit share: {res.analytic.prefix_hit_share:.3f}")
    for r in res.ranked[:6]:
        a = r.at_rate
        hit = None if a is None else a.to_dict().get("prefix_hit_share")
        shown = "-" if hit is None else f"{hit:.3f}"
        print(f"  {r.candidate.label:<34} {r.goodput_per_gpu_per_s:7.3f} req/s/GPU  hit {shown}")
    print(f"verdict: {advice.verdict}: {advice.reason}")
    print("\n".join(res.analytic.arithmetic()))


if __name__ == "__main__":
    main()
