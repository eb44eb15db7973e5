"""``disaggsim plan``: best prefill:decode split and TP per pool for a GPU budget, and
whether to disaggregate at all (docs/planning.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from disaggsim.cli.common import add_set_option


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="size prefill/decode pools for a GPU budget and advise: disaggregate or colocate",
    )
    p.add_argument("scenario", type=Path, help="scenario YAML: workload, model, GPU, fabric, SLOs")
    p.add_argument(
        "--gpus", type=int, default=None, help="GPU budget (default: the scenario's GPUs)"
    )
    p.add_argument(
        "--target-rate",
        type=float,
        default=None,
        metavar="R",
        help="size for R req/s instead (used for the budget when --gpus is not given)",
    )
    p.add_argument(
        "--price-per-gpu-hour",
        type=float,
        default=None,
        metavar="P",
        help="$ per GPU-hour: adds $ per million output tokens at the goodput",
    )
    p.add_argument(
        "--quick", action="store_true", help="bounded search: short runs, fewer candidates"
    )
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="S",
        help="simulated seconds per run (default: the scenario's; --quick: 60)",
    )
    add_set_option(p, "override a scenario field first (repeatable)")
    p.add_argument(
        "--json", action="store_true", help="print one JSON object instead of the report"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write plan.json, ranked.csv, recommended.yaml, pareto.png",
    )
    p.add_argument("--no-plots", action="store_true", help="with --out: skip pareto.png")
    p.add_argument(
        "--workers", type=int, default=None, help="local worker processes (default min(2, CPUs))"
    )
    p.add_argument(
        "--scheduler", default=None, metavar="tcp://HOST:PORT", help="run on this Dask scheduler"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    import dataclasses

    from disaggsim.cli.common import progress
    from disaggsim.config.loader import load_scenario
    from disaggsim.errors import UserError
    from disaggsim.output import check_folder
    from disaggsim.plan import PlanOptions, plan
    from disaggsim.plan.advisor import fabric_name
    from disaggsim.plan.report import plan_json, ranked_table, write_outputs
    from disaggsim.sweep.executors import make_executor

    if args.duration is not None and not args.duration > 0:
        raise UserError(f"--duration {args.duration}: must be > 0 s")
    loaded = load_scenario(args.scenario, args.overrides)
    if args.out is not None:
        check_folder(args.out, "--out")
    opts = PlanOptions.quick() if args.quick else PlanOptions()
    if args.duration is not None:
        warm = min(loaded.scenario.sim.warmup_s, 0.2 * args.duration)
        opts = dataclasses.replace(opts, duration_s=args.duration, warmup_s=warm)
    with (
        make_executor(args.workers, args.scheduler) as ex,
        progress(args.quiet or args.json) as bar,
    ):
        res, advice = plan(
            loaded,
            gpus=args.gpus,
            target_rate_per_s=args.target_rate,
            price_per_gpu_hour=args.price_per_gpu_hour,
            options=opts,
            executor=ex,
            progress=bar("goodput bisection"),
        )
    written = write_outputs(res, advice, args.out, plots=not args.no_plots) if args.out else None
    if args.json:
        print(json.dumps(plan_json(res, advice), indent=2))
        return 0
    s = loaded.scenario
    print(f"plan for {s.name}: {s.model} on {res.gpu_budget} x {res.gpu}, fabric {fabric_name(s)}")
    print("\nanalytic first guess:")
    for line in res.analytic.arithmetic():
        print(f"  {line}")
    print(
        f"\nsimulated goodput (bisection over {res.rate_lo_per_s:.3g}-{res.rate_hi_per_s:.3g} req/s, "
        f"{len(res.ranked)} candidates):"
    )
    for line in ranked_table(res, args.price_per_gpu_hour is not None):
        print(f"  {line}")
    print(f"\nverdict: {advice.verdict}")
    print(f"  {advice.reason}")
    for c in advice.conditions:
        print(f"  [{'x' if c.holds else ' '}] {c.name}: {c.detail}")
    if written is not None:
        print(f"plan {written.note()}")
    return 0
