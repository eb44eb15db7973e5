"""What ``disaggsim plan`` prints and writes: the JSON object, the ranked table, the
Pareto front plot and the recommended scenario YAML (docs/planning.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from disaggsim.config.bounds import MAX_REQUESTS, fmt
from disaggsim.config.loader import load_scenario
from disaggsim.metrics.slo_model import describe_slo, slo_model_lines
from disaggsim.output import Written
from disaggsim.plan.advisor import Advice, fabric_name
from disaggsim.plan.holds import accuracy_options, written_scenario, written_sim
from disaggsim.plan.search import CandidateResult, SearchResult

__all__ = [
    "pareto_front",
    "plan_json",
    "plot_pareto",
    "ranked_table",
    "recommended_scenario",
    "write_outputs",
]


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def _ranked_dict(res: SearchResult, r: CandidateResult) -> dict[str, Any]:
    """A ranked row as plan.json and ranked.csv give it: ``settled``, whether a close
    call's settling measured it again averaging more seeds (plan/confirm.py)."""
    st = res.settlement
    return {**r.as_dict(), "settled": st is not None and r.candidate in st.candidates}


def plan_json(res: SearchResult, advice: Advice) -> dict[str, Any]:
    """One object: verdict, reason, ranked (best first), analytic, and the search's inputs."""
    s = res.loaded.scenario
    out = {
        "scenario": s.name,
        "model": s.model,
        "gpu": res.gpu,
        "gpu_budget": res.gpu_budget,
        # --target-rate: the rate asked, and the budget first sized where the plan was
        # searched again at fewer GPUs (plan.fit_target_rate)
        "target_rate_per_s": res.target_rate_per_s,
        "first_budget": res.first_budget,
        "fabric_link": fabric_name(s),
        "slo": s.slo.model_dump(mode="json"),
        "slo_model": describe_slo(s.slo),
        **advice.as_dict(),
        # a quick plan's close call measured again at full accuracy (plan/confirm.py)
        "confirmation": None if res.confirmation is None else res.confirmation.as_dict(),
        # a close call at full accuracy measured again averaging more seeds (plan/confirm.py)
        "settlement": None if res.settlement is None else res.settlement.as_dict(),
        "ranked": [_ranked_dict(res, r) for r in res.ranked],
        "analytic": res.analytic.as_dict(),
        "search": {
            "rate_lo_per_s": res.rate_lo_per_s,
            "rate_hi_per_s": res.rate_hi_per_s,
            "tol_fraction": res.options.tol_fraction,
            "num_candidates": len(res.ranked),
            "num_simulations": res.num_simulations,
            "num_stopped_early": res.num_stopped_early,
            "num_screened_out": res.num_screened_out,
            "num_as_written_runs": res.num_as_written_runs,
            "converged": res.converged,
            "families": res.families,
            "quick": res.options.quick_mode,
            "min_measured_requests": res.options.rule.min_measured_requests,
            "service_multiple": res.options.rule.service_multiple,
            "confirm_factor": res.options.rule.confirm_factor,
            "seeds": res.options.seeds,
            "notes": list(res.notes),
        },
    }
    return _clean(out)


def _ms(v: Any) -> str:
    return "-" if v is None or not math.isfinite(float(v)) else f"{float(v) * 1e3:.0f}"


def ranked_table(res: SearchResult, price: bool) -> list[str]:
    head = (
        f"{'#':>2}  {'candidate':<34} {'GPUs':>4} {'goodput/GPU':>14} {'search':>10} "
        f"{'TTFT p99 ms':>11} {'ITL p99 ms':>10}"
    )
    if price:
        head += f" {'$/M out tok':>11}"
    lines = [head]
    settled = set(res.settlement.candidates) if res.settlement is not None else set()
    for i, r in enumerate(res.ranked, 1):
        a = r.at_rate
        g = f"{r.goodput_per_gpu_per_s:.3f}"
        if r.status == "unbounded":  # met the SLO at every rate up to 2**16 x the start
            g = "unbounded"
        elif r.goodput_per_s <= 0:
            g = "0 (SLO missed)"
        how = {"found": "confirmed", "refined": "confirmed"}.get(r.status, r.status)
        if r.candidate in settled:  # a close call measured again (confirm.py)
            how = f"{res.settlement.seeds} seeds" if res.settlement is not None else how
        if r.as_written is not None:  # run as its recommended.yaml is written (holds.py)
            how = "as written"
        line = (
            f"{i:>2}  {r.candidate.label:<34} {r.candidate.num_gpus:>4} {g:>14} {how:>10} "
            f"{_ms(None if a is None else a.ttft_p99_s):>11} "
            f"{_ms(None if a is None else a.itl_p99_s):>10}"
        )
        if price:
            u = r.usd_per_m_output_tokens
            line += f" {('-' if u is None else f'{u:.2f}'):>11}"
        lines.append(line)
    return lines


def pareto_front(
    rows: tuple[CandidateResult, ...] | list[CandidateResult],
) -> list[CandidateResult]:
    """Candidates no other beats on both goodput per GPU (higher) and ITL p99 (lower),
    among those with a goodput; sorted by goodput per GPU, best first."""
    pts = [r for r in rows if r.goodput_per_s > 0 and r.at_rate is not None]
    front = []
    for r in pts:
        g, lat = r.goodput_per_gpu_per_s, _itl_p99(r)
        dominated = any(
            o.goodput_per_gpu_per_s >= g
            and _itl_p99(o) <= lat
            and (o.goodput_per_gpu_per_s > g or _itl_p99(o) < lat)
            for o in pts
        )
        if not dominated:
            front.append(r)
    return sorted(front, key=lambda r: -r.goodput_per_gpu_per_s)


def _itl_p99(r: CandidateResult) -> float:
    """ITL p99 at the goodput rate of a candidate that has one."""
    assert r.at_rate is not None
    return r.at_rate.itl_p99_s


def recommended_scenario(res: SearchResult, advice: Advice) -> dict:
    """The recommended deployment as a runnable scenario: the original's workload,
    model, fabric and SLOs, its own ``sim`` section, the rate set to the goodput found
    (:func:`~disaggsim.plan.holds.written_scenario`: the scenario the plan checked as
    written). Only for a decided verdict (``undecided`` and ``none`` recommend nothing)."""
    rec = advice.recommended
    if not advice.decided or rec is None or rec.goodput_per_s <= 0:
        raise ValueError(f"plan: verdict {advice.verdict!r} recommends no deployment")
    rate = rec.file_rate_per_s  # the goodput, or what the file's own seed meets (holds.py)
    raw = written_scenario(res, rec.candidate, rate, name=f"{res.loaded.scenario.name}-plan")
    raw["description"] = (
        f"disaggsim plan recommendation ({advice.verdict}) for {res.gpu_budget} x {res.gpu}: "
        f"{rec.candidate.label}, goodput {rec.goodput_per_gpu_per_s:.3f} req/s per GPU"
    )
    if rec.full_accuracy and res.confirmation is not None:
        raw["description"] += (
            " (quick plan, its close call measured again at full accuracy: "
            + ", ".join(c.label for c in res.confirmation.candidates)
            + ")"
        )
    if res.settlement is not None and rec.candidate in res.settlement.candidates:
        raw["description"] += (
            f" (a close call, measured again averaging {res.settlement.seeds} fresh seeds)"
        )
    if rec.as_written is not None:
        raw["description"] += (
            f" (checked as written: this file at this rate meets the SLOs, seed "
            f"{res.loaded.scenario.seed})"
        )
    if rec.file_check is not None:
        raw["description"] += (
            f"; written at {rate:.6g} req/s, under that goodput of {rec.goodput_per_s:.6g}: "
            "at the goodput this seed's run flags a growing queue that a run with a fresh "
            "seed did not (the goodput search's retest, docs/planning.md §4)"
        )
    ws = written_sim(res, rec.candidate.kind, rate)
    if ws.bound == "file_requests":
        raw["description"] += (
            f"; sim shortened from the question's {ws.question_s:g} s to "
            f"{raw['sim']['duration_s']:g} s (about {fmt(round(ws.requests))} requests at "
            f"this rate): at least {fmt(res.options.file_requests)} requests and a window "
            f"in which a rate {accuracy_options(res).tol_fraction:.0%} above what the deployment "
            f'serves misses (docs/planning.md §4, "How long the file runs")'
        )
    elif ws.bound == "MAX_REQUESTS":
        raw["description"] += (
            f"; sim shortened to {raw['sim']['duration_s']:g} s so that the requests at "
            f"this rate stay within the {fmt(MAX_REQUESTS)} of one run (docs/safety.md)"
        )
    load_scenario(raw, base_dir=res.loaded.base_dir)  # it must load as written
    return raw


def plot_pareto(res: SearchResult, ax: Any) -> None:
    """Goodput per GPU against ITL p99 at the goodput rate, one colour per kind, the
    Pareto front dashed and labelled, on a matplotlib ``ax``."""
    colours = {
        "disaggregate": "tab:blue",
        "colocate_chunked": "tab:green",
        "colocate_vllm": "tab:red",
    }
    for kind, colour in colours.items():
        pts = [
            r
            for r in res.ranked
            if r.candidate.kind == kind and r.goodput_per_s > 0 and r.at_rate is not None
        ]
        if pts:
            ax.scatter(
                [_itl_p99(r) * 1e3 for r in pts],
                [r.goodput_per_gpu_per_s for r in pts],
                c=colour,
                label=kind,
                alpha=0.8,
            )
    front = sorted(pareto_front(res.ranked), key=lambda r: _itl_p99(r))
    if front:
        ax.plot(
            [_itl_p99(r) * 1e3 for r in front],
            [r.goodput_per_gpu_per_s for r in front],
            "k--",
            lw=1,
            label="Pareto front",
        )
        for r in front:
            ax.annotate(
                r.candidate.label,
                (_itl_p99(r) * 1e3, r.goodput_per_gpu_per_s),
                fontsize=7,
                xytext=(3, 3),
                textcoords="offset points",
            )
    ax.set_xlabel("ITL p99 at the goodput rate (ms)")
    ax.set_ylabel("goodput per GPU (req/s)")
    ax.set_title(f"{res.loaded.scenario.name}: {res.gpu_budget} x {res.gpu}")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no candidate met the SLOs", ha="center", transform=ax.transAxes)
    ax.figure.tight_layout()


def _plot(res: SearchResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    plot_pareto(res, ax)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(
    res: SearchResult,
    advice: Advice,
    out_dir: Path,
    plots: bool = True,
    extra: dict[str, str] | None = None,
) -> Written:
    """``plan.json``, ``ranked.csv``, ``recommended.yaml``, ``pareto.png`` (unless
    ``plots`` is false), ``report.html`` (self-contained, its figures inline) and the
    recommended deployment's launch configurations (``deploy-vllm.sh``,
    ``deploy-sglang.sh``, ``deploy-dynamo.yaml``; :mod:`disaggsim.plan.deploy`) in ``out_dir``
    (a result folder, written through :func:`disaggsim.output.write_folder`), plus
    ``extra`` text files by name (one-command mode: ``question.yaml``)."""
    import pandas as pd

    from disaggsim.output import write_folder

    def render(tmp: Path) -> None:
        for name, text in (extra or {}).items():
            (tmp / name).write_text(text)
        (tmp / "plan.json").write_text(json.dumps(plan_json(res, advice), indent=2) + "\n")
        rows = []
        for r in res.ranked:
            d = _ranked_dict(res, r)
            d.pop("deployment")
            # one column per field of the check as written (empty: not checked)
            written = d.pop("as_written") or {}
            for key in (
                "status",
                "from_rate_per_s",
                "duration_s",
                "num_runs",
                "num_retests",
                "file_rate_per_s",
            ):
                d[f"as_written_{key}"] = written.get(key)
            rows.append(d)
        pd.DataFrame.from_records(rows).to_csv(tmp / "ranked.csv", index=False)
        if advice.decided:  # undecided and none recommend nothing
            (tmp / "recommended.yaml").write_text(
                "# Written by disaggsim plan; run it with: disaggsim run recommended.yaml\n#\n"
                + "\n".join(slo_model_lines(res.loaded.scenario.slo, prefix="# "))
                + "\n"
                + yaml.safe_dump(recommended_scenario(res, advice), sort_keys=False)
            )
        if plots:
            _plot(res, tmp / "pareto.png")
        from disaggsim.html_report import REPORT_FILE, plan_report
        from disaggsim.plan.deploy import launch_configs

        if advice.decided:  # launch configs only for a recommendation that stands
            for name, text in launch_configs(res, advice).items():
                (tmp / name).write_text(text)

        (tmp / REPORT_FILE).write_text(plan_report(res, advice, plan_json(res, advice)))

    return write_folder(out_dir, render, command="plan")
