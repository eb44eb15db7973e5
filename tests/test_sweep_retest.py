"""The goodput search's retest (disaggsim/sweep/goodput.py, "Retest"): a rate whose runs
met the attainment target but failed the trend test is run again, twice as long with
fresh seeds, and that run decides. A lone false alarm of the trend test no longer caps a
goodput; a run above capacity, whose queue grows, is still rejected."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from disaggsim.config.loader import load_scenario
from disaggsim.metrics import steady
from disaggsim.metrics.steady import horizon
from disaggsim.plan.analytic import sample_lengths, sample_requests
from disaggsim.sweep import SerialExecutor, search_rate
from disaggsim.sweep.core import RATE_PATH, _task, run_point, source_of
from disaggsim.sweep.goodput import goodput_many, steady_profile
from disaggsim.sweep.grid import override_text
from tests.conftest import REPO

search = importlib.import_module("disaggsim.plan.search")

# ------------------------------------------------------------------ pure functions


def test_a_false_alarm_at_the_bottom_of_the_bracket_is_retested():
    """Capacity 10 req/s; the trend test's first run at 3 req/s (the bracket's rate_lo)
    rejects although nothing trends. Without the retest the bracket goes down fourfold
    and the goodput stays below 3; with it the search finds 10."""
    calls: list[tuple[float, bool]] = []

    def evaluate(rate: float, long: bool) -> tuple[float, bool]:
        first = not any(r == rate for r, _ in calls)
        calls.append((rate, long))
        false_alarm = rate == 3.0 and first
        return 1.0 if rate <= 10.0 else 0.5, rate <= 10.0 and not false_alarm

    capped = search_rate(evaluate, 3.0, 15.0, 0.9, tol_per_s=0.1, confirm=False)
    assert capped.rate_per_s < 3.0
    calls.clear()
    s = search_rate(evaluate, 3.0, 15.0, 0.9, tol_per_s=0.1, confirm=False, retest=True)
    assert s.rate_per_s == pytest.approx(10.0, abs=0.1)
    (first,) = [e for e in s.evaluations if e.rate_per_s == 3.0]
    assert not first.stable and first.meets and first.retest is not None
    assert calls[:3] == [(3.0, False), (3.0, True), (15.0, False)]


def test_a_trend_that_holds_in_the_retest_is_a_miss():
    """Above 10 req/s the queue grows (trend) while attainment still holds: the retest
    sees the trend again, so the goodput is 10, not the top of the bracket."""
    s = search_rate(lambda r, long: (1.0, r <= 10.0), 3.0, 15.0, 0.9, tol_per_s=0.1, retest=True)
    assert s.rate_per_s == pytest.approx(10.0, abs=0.1)
    over = [e for e in s.evaluations if e.rate_per_s > 10.0]
    assert over and all(not e.meets and e.retest is not None for e in over)


# ------------------------------------------------------------------ by simulation


@pytest.fixture(scope="module")
def pcie_pool():
    """The pcie-only advisor's chunked pool (8 x L40S tp1, chunk 512), its quick
    exploration rule (raised to the family's loaded residence) at the default alpha,
    its source and analytic capacity (5.973 req/s at this commit; 6.004 before 2026-12-03)."""
    loaded = load_scenario(REPO / "scenarios" / "advisor" / "pcie-only.yaml")
    opts = search.PlanOptions.quick()
    reqs = sample_requests(loaded)
    _, guesses = search.plan_families(loaded, 8, opts, sample_lengths(loaded, reqs), reqs)
    ev = search._Evaluator(loaded, guesses, opts, None, None, "explore")
    c = search.Candidate("colocate_chunked", 8, 1, chunk_tokens=512)
    rule = dataclasses.replace(ev.rule_for(c, opts.explore_rule), alpha=0.01)
    cap = ev._guess(c).capacity_per_gpu_per_s * c.num_gpus
    return ev.source(c), rule, cap


FALSE_ALARM_FRACTION = 0.5  # of the analytic capacity: every trend rejection there is false
FALSE_ALARM_SEEDS = 200  # seeds scanned; 7 of these 200 were false alarms without the floor


def first_false_alarm(src, rule, rate: float):
    """The source with the first seed (the scenario's own, then the next ones) whose run at
    ``rate`` (the goodput search's own run length there, which depends on the seed's
    requests) meets the attainment target while the trend test rejects it, and that run's
    p-value: the rule ``benchmarks/plan_trend_alarms.py`` scans by, chosen here rather than
    pinned, so that a move of the cost model picks another seed instead of losing the case."""
    for k in range(FALSE_ALARM_SEEDS):
        seeded = source_of(
            load_scenario({**src.raw, "seed": src.seed + k}, base_dir=src.base_dir), src.label
        )
        prof = steady_profile(load_scenario(seeded.raw, base_dir=seeded.base_dir))
        h = horizon(rule, rate, prof.service_s, prof.drain_s)
        ov = [override_text(RATE_PATH, rate), override_text("seed", seeded.seed), *h.overrides()]
        s = run_point(_task(seeded, ov))
        if s.slo_attainment >= src.attainment_target and s.stability_p_value < rule.alpha:
            return seeded, s.stability_p_value
    raise AssertionError(
        f"no false alarm in {FALSE_ALARM_SEEDS} seeds at {rate:.3f} req/s: raise FALSE_ALARM_SEEDS"
    )


def test_a_false_alarm_found_by_scanning_no_longer_caps_the_goodput(pcie_pool, monkeypatch):
    """A run well below capacity (half the analytic capacity) that meets every request but
    fails the trend test (a false alarm) is made the bracket's rate_lo by giving the source
    its seed (chosen by ``first_false_alarm``). Without the retest it sends the search down
    fourfold, below the bracket (0.37 req/s per GPU); retested (twice the window, fresh
    seeds) it meets and the search finds about 0.82 req/s per GPU.

    Such alarms came from the trend test before its overload floor (``MIN_OVERLOAD_SHARE``,
    docs/metrics.md): ``python benchmarks/plan_trend_alarms.py --fractions 0.5 --seeds 200``
    counted 7 in 200 at p < 0.01 then, and this scan finds none in 200 seeds with the floor
    (2026-12-04). So the scan and the searches run with the floor at 0, the rule before it,
    to keep a false alarm for the retest to meet (the retest guards any alarm that passes
    the floor); with the floor restored the scanned run is no alarm."""
    src, rule, cap = pcie_pool
    lo, hi = FALSE_ALARM_FRACTION * cap, 1.5 * cap
    monkeypatch.setattr(steady, "MIN_OVERLOAD_SHARE", 0.0)
    alarmed, p = first_false_alarm(src, rule, lo)

    def run(retest: bool):
        (r,) = goodput_many(
            [alarmed], lo, hi, rule=rule, confirm=False, tol_fraction=0.06,
            executor=SerialExecutor(), retest=retest,
        )  # fmt: skip
        return r

    before = run(False)
    first = before.evaluations[0]
    # the search's first run is the scanned one
    assert first.rate_per_s == lo and first.p_value == pytest.approx(p)
    assert first.attainment >= 0.9 and not first.stable
    assert before.rate_per_s < lo  # capped below the bracket it started from
    after = run(True)
    first = after.evaluations[0]
    assert first.retest is not None and first.meets and first.retest.confirm
    assert after.per_gpu_per_s >= 0.7, after.per_gpu_per_s
    monkeypatch.undo()
    (floored,) = goodput_many(
        [alarmed], lo, hi, rule=rule, confirm=False, tol_fraction=0.06,
        executor=SerialExecutor(), retest=False,
    )  # fmt: skip
    first = floored.evaluations[0]
    assert first.attainment == before.evaluations[0].attainment
    assert first.stable and first.meets and first.retest is None


def test_an_overloaded_pool_that_meets_attainment_is_still_rejected(pcie_pool):
    """With a TTFT target of 100 s every request of a short run above capacity still
    meets the SLO while the queue grows: at 1.5 x the analytic capacity (8.96 req/s; the
    search finds 6.72) attainment is 1.000 and only the trend test can reject, at p far
    below alpha² (a miss outright; 7.47 req/s too). Nearer capacity (7.09 req/s) p lies
    between alpha² and alpha (0.00087): the retest, twice as long, rejects too. Every
    rate the search tries above 7.05 req/s misses, and the goodput stays below them
    (re-pinned from a fresh run after the cost model's move of 2026-12-03: 7.1 before)."""
    src, rule, cap = pcie_pool
    raw = dict(src.raw)
    raw["slo"] = {**raw["slo"], "ttft_ms": 100_000}
    lenient = source_of(load_scenario(raw, base_dir=src.base_dir), src.label)
    (r,) = goodput_many(
        [lenient], 0.5 * cap, 1.5 * cap, rule=rule, confirm=False, tol_fraction=0.06,
        executor=SerialExecutor(),
    )  # fmt: skip
    top = next(e for e in r.evaluations if e.rate_per_s == 1.5 * cap)
    assert top.attainment >= 0.9 and top.p_value < rule.alpha**2
    assert top.retest is None and not top.meets
    over = [e for e in r.evaluations if e.rate_per_s > 7.05]
    assert len(over) >= 3 and not any(e.meets for e in over)
    retested = [e for e in over if e.retest is not None]
    assert retested and all(e.attainment >= 0.9 for e in retested)
    assert all(not e.retest.stable for e in retested if e.retest is not None)
    assert r.rate_per_s < 7.05
