"""What the planner's own process computes once instead of per call (docs/planning.md,
"Speed"): the prefill side of the analytic guesses, shared by every family with the same
prefill layout, and a goodput search's check that its scenario can run, shared by its
runs. The same values as computing them every time."""

from __future__ import annotations

import importlib

from disaggsim.config.loader import load_scenario
from disaggsim.plan.analytic import Layout, analytic_guess, sample_lengths
from disaggsim.sweep import SerialExecutor
from disaggsim.sweep.core import as_source
from disaggsim.sweep.goodput import goodput_many
from tests.conftest import REPO
from tests.one_server import one_server, patch_constant_cost

core = importlib.import_module("disaggsim.sweep.core")


def test_guesses_with_a_shared_memo_are_the_guesses_without():
    loaded = load_scenario(REPO / "scenarios/advisor/long-prompt-infiniband.yaml")
    lengths = sample_lengths(loaded)
    memo: dict = {}
    cases = [
        (1, 1, 16, None, 0.0), (1, 2, 16, None, 0.0), (1, 4, 32, None, 0.0),
        (2, 2, 16, None, 0.0), (1, 1, 16, 512, 0.0), (1, 2, 16, None, 0.3),
        (1, 1, 64, None, 0.3),
    ]  # fmt: skip
    for p, d, gpus, tokens, share in cases:
        kw = {
            "prefill_tp": Layout(p), "decode_tp": Layout(d), "gpu_budget": gpus,
            "lengths": lengths, "prefill_budget_tokens": tokens, "hit_share": share,
        }  # fmt: skip
        assert analytic_guess(loaded, memo=memo, **kw) == analytic_guess(loaded, **kw)
    # one entry per prefill layout, token budget and hit share: the decode side is not kept
    assert len(memo) == 4


def test_a_goodput_search_checks_its_scenario_once(monkeypatch):
    """Each search builds its scenario's cost models, link and topology once (its first
    run), not once per run; the results are those of checking every run."""
    patch_constant_cost(monkeypatch)
    calls: list[str] = []
    real = core._check_runnable

    def counted(loaded, label):
        calls.append(loaded.scenario.name)
        real(loaded, label)

    monkeypatch.setattr(core, "_check_runnable", counted)
    srcs = [as_source(one_server(2.0, name="a")), as_source(one_server(0.6, name="b"))]
    kw = {"tol_per_s": 0.5, "brackets": [(2.0, 20.0), (1.0, 12.0)], "seeds": 2}
    once = goodput_many(srcs, 0, 0, executor=SerialExecutor(), **kw)  # type: ignore[arg-type]
    assert sorted(calls) == ["a", "b"]
    assert sum(r.num_runs for r in once) > 10
    calls.clear()
    monkeypatch.setattr(core, "_task", _always_checked(core._task))
    monkeypatch.setattr(importlib.import_module("disaggsim.sweep.goodput"), "_task", core._task)
    every = goodput_many(srcs, 0, 0, executor=SerialExecutor(), **kw)  # type: ignore[arg-type]
    assert len(calls) == sum(r.num_runs for r in every)
    assert once == every


def _always_checked(task_fn):
    def task(*args, **kw):
        kw["check_runnable"] = True
        return task_fn(*args, **kw)

    return task
