"""Fake goodput runs for the planner's tests: ``run_point`` replaced by a rule over the
run's scenario (no simulation), shared by tests/test_plan*.py."""

from __future__ import annotations

import sys
from collections.abc import Callable

from disaggsim.config.loader import load_scenario
from disaggsim.config.scenario import Scenario
from disaggsim.metrics.summary_table import SUMMARY_KEYS, Summary

ZEROS = {k.key: k.kind() for k in SUMMARY_KEYS if k.required}  # 0, 0.0, "", False


def summary(**values) -> Summary:
    """A run's summary: every required key zero (0, 0.0, "", False) but ``values``."""
    return Summary.from_dict({**ZEROS, **values})


def fake_run_points(monkeypatch, meets: Callable[[Scenario], bool]) -> list[Scenario]:
    """Replace the goodput search's simulation: a run meets the SLO (attainment 1.0, no
    trend) when ``meets`` of its scenario, else misses (attainment 0.5). Returns the
    scenarios run, in order (the list grows as the plan runs)."""
    runs: list[Scenario] = []

    def fake_run(task):
        sc = load_scenario(task.raw).scenario
        runs.append(sc)
        ok = meets(sc)
        return summary(slo_attainment=1.0 if ok else 0.5, stability_p_value=1.0)

    monkeypatch.setattr(sys.modules["disaggsim.sweep.goodput"], "run_point", fake_run)
    return runs
