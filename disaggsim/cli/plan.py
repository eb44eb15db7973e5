"""``disaggsim plan``: best prefill:decode split and TP per pool for a GPU budget, and
whether to disaggregate at all (docs/planning.md). The question comes from a scenario file
or, in one command, from flags (``--model --gpu --gpus --isl --osl --ttft-ms --itl-ms``,
:mod:`disaggsim.plan.question`)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from contextlib import ExitStack
from pathlib import Path

from disaggsim.cli.common import add_set_option, executor_args, resume_arg
from disaggsim.config.bounds import MAX_NUMBER, MAX_REQUESTS, MAX_SEEDS, MAX_SERVICE_MULTIPLE


def add_parser(sub: argparse._SubParsersAction) -> None:
    from disaggsim.metrics.slo_model import slo_model_help
    from disaggsim.plan.question import FABRICS, LENGTH_SPEC

    p = sub.add_parser(
        "plan",
        help="size prefill/decode pools for a GPU budget and advise: disaggregate or colocate",
        description="Size prefill/decode pools for a GPU budget and advise: disaggregate or "
        "colocate. Ask from a scenario file, or in one command: disaggsim plan --model "
        "llama-3-70b --gpu h100-sxm --gpus 16 --isl 8000 --osl 300 --ttft-ms 2000 --itl-ms 100. "
        "SLO model: " + slo_model_help(),
    )
    p.add_argument(
        "scenario",
        type=Path,
        nargs="?",
        default=None,
        help="scenario YAML: workload, model, GPU, fabric, SLOs (or the question flags below)",
    )
    q = p.add_argument_group(
        "the question in one command (instead of SCENARIO; writes question.yaml)",
    )
    q.add_argument("--model", default=None, help="catalog model id, e.g. llama-3-70b")
    q.add_argument("--gpu", default=None, help="catalog GPU id, e.g. h100-sxm")
    q.add_argument("--isl", default=None, metavar="SPEC", help=f"prompt tokens: {LENGTH_SPEC}")
    q.add_argument("--osl", default=None, metavar="SPEC", help=f"output tokens: {LENGTH_SPEC}")
    q.add_argument("--preset", default=None, help="a shipped workload preset instead of lengths")
    q.add_argument("--trace", default=None, metavar="FILE", help="a trace to replay instead")
    q.add_argument("--ttft-ms", type=float, default=None, help="TTFT target per request (ms)")
    q.add_argument("--itl-ms", type=float, default=None, help="ITL target per request (ms)")
    q.add_argument(
        "--itl-statistic",
        default="tpot",
        metavar="tpot|max_gap",
        help="per-request ITL statistic judged: mean gap (tpot, default) or largest gap",
    )
    q.add_argument(
        "--attainment", type=float, default=0.9, help="share of requests to meet the SLO (0.9)"
    )
    q.add_argument(
        "--percentile", type=float, default=99.0, help="reported fleet percentile (99; not judged)"
    )
    q.add_argument(
        "--fabric",
        default="auto",
        metavar="|".join(FABRICS),
        help="KV link between pools (auto: nvlink if the budget fits one node, else "
        "infiniband; with --target-rate, the budget the plan sizes)",
    )
    q.add_argument(
        "--weight-dtype",
        default="bf16",
        metavar="bf16|fp16|fp8|fp8-block|mxfp4|nvfp4|released",
        help="weights (released: the checkpoint's own precision, e.g. DeepSeek-V3's fp8-block)",
    )
    q.add_argument("--kv-dtype", default="bf16", metavar="bf16|fp16|fp8", help="KV cache")
    q.add_argument("--seed", type=int, default=0, help="workload seed (0)")
    q.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="the clients' max_tokens, which routing and KV admission plan on (default: the "
        "longest --osl reply; unbounded lognormal: the model's context minus the prompt)",
    )
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
        "--quick",
        action="store_true",
        help=(
            "bounded search: shorter runs, coarser steps; a close call is settled by "
            "re-measuring each side's two best at full accuracy; says 'undecided' only when "
            "a doubt remains"
        ),
    )
    p.add_argument(
        "--min-requests",
        type=int,
        default=None,
        metavar="N",
        help=(
            f"goodput runs measure at least N requests, 1-{MAX_REQUESTS:,} (default 1000, quick 400; "
            "docs/metrics.md)"
        ),
    )
    p.add_argument(
        "--service-multiple",
        type=float,
        default=None,
        metavar="M",
        help=(
            "goodput runs measure at least M longest service times, > 0 and <= "
            f"{MAX_SERVICE_MULTIPLE:g} (default 10, quick 5)"
        ),
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help=(
            f"seeds every goodput search averages its attainment over (scenario seed + "
            f"0..N-1), 1-{MAX_SEEDS:,}: N times the simulations; 4 cut a goodput's seed "
            "spread by about half (docs/sweeps.md, 'How much a goodput moves')"
        ),
    )
    p.add_argument(
        "--settle-seeds",
        type=int,
        default=None,
        metavar="N",
        help=(
            "a gain at full accuracy within a seed's spread of the 5%% line is measured "
            "again: each compared kind's best searched on N fresh seeds, their mean "
            "compared (default 4; 0 never; docs/planning.md §3)"
        ),
    )
    p.add_argument(
        "--fp8",
        action="store_true",
        help="also try FP8 weights (on GPUs whose profile has FP8)",
    )
    add_set_option(p, "override a scenario field first (repeatable)")
    p.add_argument(
        "--json", action="store_true", help="print one JSON object instead of the report"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write plan.json, ranked.csv, recommended.yaml, pareto.png (one-command mode: "
        "also question.yaml; default results/<question name>)",
    )
    p.add_argument("--no-plots", action="store_true", help="with --out: skip pareto.png")
    resume_arg(p)
    executor_args(p)
    p.set_defaults(func=cmd_plan)


def _question(args: argparse.Namespace):
    from disaggsim.plan.question import Question

    return Question(
        model=args.model,
        gpu=args.gpu,
        gpus=args.gpus,
        target_rate_per_s=args.target_rate,
        isl=args.isl,
        osl=args.osl,
        preset=args.preset,
        trace=args.trace,
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        itl_statistic=args.itl_statistic,
        attainment=args.attainment,
        percentile=args.percentile,
        fabric=args.fabric,
        weight_dtype=args.weight_dtype,
        kv_dtype=args.kv_dtype,
        seed=args.seed,
        max_tokens=args.max_tokens,
    )


def _question_flag_defaults_changed(args: argparse.Namespace) -> list[str]:
    defaults = {
        "itl_statistic": "tpot",
        "attainment": 0.9,
        "percentile": 99.0,
        "fabric": "auto",
        "weight_dtype": "bf16",
        "kv_dtype": "bf16",
        "seed": 0,
        "max_tokens": None,
    }
    return ["--" + k.replace("_", "-") for k, v in defaults.items() if getattr(args, k) != v]


def cmd_plan(args: argparse.Namespace) -> int:
    import dataclasses

    from disaggsim.cli.common import executor, keeping_runs, kept_line, printing_after, progress
    from disaggsim.config.loader import load_scenario
    from disaggsim.errors import UserError
    from disaggsim.metrics.slo_model import slo_model_lines
    from disaggsim.metrics.steady import check_run_length_flags
    from disaggsim.output import hold_folder, out_flag
    from disaggsim.plan import PlanOptions, plan
    from disaggsim.plan.advisor import fabric_name
    from disaggsim.plan.question import build_question, flag_error, question_yaml
    from disaggsim.plan.report import plan_json, ranked_table, write_outputs
    from disaggsim.plan.search import check_settle_seeds
    from disaggsim.sweep.core import check_seeds
    from disaggsim.sweep.journal import KeptRuns

    question = _question(args)
    asked = question.given() + _question_flag_defaults_changed(args)
    question_text = None
    out = args.out
    if args.scenario is not None:
        if asked:
            raise UserError(
                f"plan: give a scenario file or the question flags, not both "
                f"({args.scenario} and {', '.join(asked)})"
            )
        loaded = load_scenario(args.scenario, args.overrides)
    else:
        raw = build_question(question)
        try:
            loaded = load_scenario(raw, args.overrides, base_dir=Path.cwd())
        except UserError as e:  # a --set's (the flags' values loaded in build_question)
            raise flag_error(e, None) from None
        question_text = question_yaml(loaded.raw, question)
        if out is None:
            out = Path("results") / loaded.scenario.name
    with ExitStack() as held:
        if out is not None:
            # held until written: another command writing there meanwhile is refused
            held.enter_context(hold_folder(out, out_flag(args.out is not None)))
        opts = PlanOptions.quick() if args.quick else PlanOptions()
        if args.fp8:
            opts = dataclasses.replace(opts, weight_dtypes=("fp8",))
        check_run_length_flags(args.min_requests, args.service_multiple)
        check_seeds(args.seeds)  # as sweep's and compare's --seeds
        opts = dataclasses.replace(opts, seeds=args.seeds)
        if args.settle_seeds is not None:
            check_settle_seeds(args.settle_seeds)
            opts = dataclasses.replace(opts, settle_seeds=args.settle_seeds)
        price = args.price_per_gpu_hour
        if price is not None and not (math.isfinite(price) and 0 < price <= MAX_NUMBER):
            # inf passed the planner's "> 0" and priced every candidate at inf $ (ranked.csv)
            raise UserError(
                f"--price-per-gpu-hour {price}: must be a finite number > 0 and at most "
                f"{MAX_NUMBER:g} ($ per GPU-hour)"
            )
        opts = opts.with_run_length(args.min_requests, args.service_multiple)
        # where the finished runs are kept until the plan is written: beside --out, or
        # (no --out) beside results/<name>-plan, a folder the plan itself does not write
        kept_in = out if out is not None else Path("results") / f"{loaded.scenario.name}-plan"
        with keeping_runs() as runs:
            with executor(args) as ex, progress(args.quiet or args.json) as bar:
                journal = runs.open(
                    kept_in, out_flag(args.out is not None), None, args.resume, "plan"
                )
                res, advice = plan(
                    loaded,
                    gpus=args.gpus,
                    target_rate_per_s=args.target_rate,
                    price_per_gpu_hour=args.price_per_gpu_hour,
                    options=opts,
                    executor=KeptRuns(ex, journal),
                    progress=bar("steady-state goodput"),
                    # a question's --fabric auto follows the fleet a target rate sizes
                    auto_fabric=args.scenario is None and args.fabric == "auto",
                )
            if question_text is not None:  # with what the plan searched (a target rate's fleet)
                question_text = question_yaml(loaded.raw, question, planned=res)
            written = None
            if out is not None:
                extra = {"question.yaml": question_text} if question_text is not None else {}
                written = write_outputs(res, advice, out, plots=not args.no_plots, extra=extra)
        kept = kept_line(journal)
        with printing_after(written.note() if written is not None else None):
            if kept and (
                args.json or written is None
            ):  # said on stderr, where no last line says it
                print(f"disaggsim: note: {kept[2:]}", file=sys.stderr)
            if args.json:
                print(json.dumps(plan_json(res, advice), indent=2))
                return 0
            s = res.loaded.scenario  # a target rate's fleet may be planned on another link
            print(
                f"plan for {s.name}: {s.model} on {res.gpu_budget} x {res.gpu}, fabric {fabric_name(s)}"
            )
            for line in slo_model_lines(s.slo, prefix="  "):
                print(line)
            print("\nanalytic first guess:")
            for line in res.analytic.arithmetic():
                print(f"  {line}")
            pruned = sum(1 for v in res.families.values() if v == "pruned")
            print(
                f"\nsteady-state goodput of {len(res.ranked)} candidates ({len(res.families)} families, "
                f"{pruned} pruned by their analytic bound; {res.num_simulations} simulations, "
                f"{res.num_stopped_early} stopped once they certainly missed; run "
                "lengths from the workload, each goodput confirmed at twice the horizon; rows "
                "marked 'as written' checked again as their recommended.yaml runs):"
            )
            for line in ranked_table(res, args.price_per_gpu_hour is not None):
                print(f"  {line}")
            for note in res.notes:
                print(f"  note: {note}")
            print(f"\nverdict: {advice.verdict}")
            print(f"  {advice.reason}")
            for c in advice.conditions:
                print(f"  [{'x' if c.holds else ' '}] {c.name}: {c.detail}")
            if written is not None:
                print(f"plan {written.note()}{kept}")
        return 0
