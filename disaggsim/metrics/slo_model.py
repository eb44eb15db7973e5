"""The SLO model in words: one text, used by the CLI help, the YAML comments of scenarios
that disaggsim writes, the plan output and report, and docs/metrics.md ("SLO model").

:data:`SLO_MODEL` is a template; :func:`describe_slo` fills it with a scenario's values
and :func:`slo_model_help` with the names of the fields and flags, so every place says
the same sentences. What it describes is :func:`disaggsim.metrics.summary.slo_met` and
``slo_attainment`` (docs/metrics.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from disaggsim.config.scenario import SloConfig

__all__ = ["SLO_MODEL", "describe_slo", "slo_model_help", "slo_model_lines"]

SLO_MODEL = (
    "Each measured request is judged on its own: it meets the SLO when it completed, its "
    "TTFT (arrival to first token) is <= {ttft}, and its {itl_statistic} is <= {itl}. "
    "Attainment is the share of measured requests that meet it (rejected and unfinished "
    "requests count as misses); a rate is served within the SLO when attainment >= "
    "{target} in steady state (after a warm-up, over a run whose length comes from the "
    "workload, with no upward trend in queues or TTFT, and again over a run twice as "
    "long), and the goodput is the highest such rate. Not judged: the fleet TTFT "
    "percentile and the percentile of all inter-token gaps, which are reported at "
    "{percentile} for reference."
)

_STATISTIC = {
    "tpot": "TPOT (the mean gap between its tokens after the first; a one-token reply passes)",
    "max_gap": "largest gap between two consecutive tokens (a one-token reply passes)",
}


def describe_slo(slo: SloConfig) -> str:
    """The SLO model with this SLO's values, e.g. ``... TTFT ... is <= 2000 ms ...``."""
    return SLO_MODEL.format(
        ttft=f"{slo.ttft_ms:g} ms",
        itl_statistic=_STATISTIC[slo.itl_statistic],
        itl=f"{slo.itl_ms:g} ms",
        target=f"{slo.attainment_target:g}",
        percentile=f"the {slo.percentile:g}th percentile",
    )


def slo_model_help(flags: bool = True) -> str:
    """The SLO model with field names (and the one-command ``plan`` flags, with
    ``flags``) in place of values (CLI help)."""

    def f(flag: str) -> str:
        return flag if flags else ""

    return SLO_MODEL.format(
        ttft="slo.ttft_ms" + f(" (--ttft-ms)"),
        itl_statistic=(
            "ITL statistic (slo.itl_statistic" + f(", --itl-statistic") + ") — TPOT, the mean "
            "gap between its tokens after the first (tpot, the default), or its largest gap "
            "between two consecutive tokens (max_gap); a one-token reply passes —"
        ),
        itl="slo.itl_ms" + f(" (--itl-ms)"),
        target="slo.attainment_target (" + f("--attainment, ") + "default 0.9)",
        percentile="slo.percentile (" + f("--percentile, ") + "default 99)",
    )


def slo_model_lines(slo: SloConfig, width: int = 86, prefix: str = "") -> list[str]:
    """:func:`describe_slo` wrapped to ``width`` columns, each line after ``prefix``."""
    import textwrap

    return [
        prefix + line
        for line in textwrap.wrap("SLO model: " + describe_slo(slo), width - len(prefix))
    ]
