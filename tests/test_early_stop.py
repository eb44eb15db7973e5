"""Stopping a run that certainly misses the SLO (disaggsim/metrics/early_stop.py, the
engine's stop check in Cluster.run, ``simulate(..., stop_on_certain_miss=True)``).

The stop is exact: a run it ends early misses the SLO over its full length too. These
tests check each bound by hand, that the engine's check only reads (a check that never
stops leaves every record as it was; a stopped run's records are the full run's up to
its end), and, over real scenarios at rates near and above capacity, that every stopped
run's full-length attainment is below target.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from disaggsim.config.loader import load_scenario
from disaggsim.engine.records import (
    STATUS_ABANDONED,
    STATUS_COMPLETED,
    STATUS_REJECTED,
    STATUS_UNFINISHED,
    RequestView,
)
from disaggsim.errors import UserError
from disaggsim.metrics.early_stop import (
    CertainMiss,
    attainment_bound,
    certain_miss,
    provable_misses,
    seeds_stop_below,
)
from disaggsim.metrics.steady import RunLengthRule, horizon
from disaggsim.run import (
    build_costs,
    build_topology,
    build_transfer,
    certain_miss_check,
    make_requests,
    run_engine,
    simulate,
)
from disaggsim.sweep.goodput import steady_profile

REPO = Path(__file__).resolve().parents[1]
NAN = math.nan
U, C, R, A = STATUS_UNFINISHED, STATUS_COMPLETED, STATUS_REJECTED, STATUS_ABANDONED


# -- the bounds, by hand ---------------------------------------------------------------


def _misses(rows, now_s, ttft_s=1.0, itl_s=0.1, max_itl=None):
    """rows: (arrival, output tokens, status, first token at, finish at)."""
    a, o, st, f, fin = (np.array(c) for c in zip(*rows, strict=True))
    return provable_misses(a, o, st, f, fin, now_s, ttft_s, itl_s, max_itl).tolist()


def test_ttft_bound_without_a_first_token():
    # waited 1.0 s (= target: may still meet), 1.5 s (certainly late), not arrived yet
    assert _misses(
        [(9.0, 10, U, NAN, NAN), (8.5, 10, U, NAN, NAN), (11.0, 10, U, NAN, NAN)], 10.0
    ) == [
        False,
        True,
        False,
    ]


def test_first_token_late_or_on_time():
    rows = [(0.0, 10, U, 1.0, NAN), (0.0, 10, U, 1.25, NAN), (0.0, 1, C, 1.25, 1.25)]
    assert _misses(rows, 1.3) == [False, True, True]


def test_tpot_bound_of_an_unfinished_request():
    # first token at 1.0; 11 tokens: 10 gaps; by now = 2.0 the mean gap is at least 0.1
    # (= target: may meet); by 2.01 more than the target, whatever comes later
    rows = [(0.5, 11, U, 1.0, NAN)]
    assert _misses(rows, 2.0) == [False]
    assert _misses(rows, 2.01) == [True]
    # one token only: no gaps, never an ITL miss
    assert _misses([(0.5, 1, U, 1.0, NAN)], 100.0) == [False]


def test_completed_requests_are_judged_exactly():
    rows = [(0.0, 11, C, 0.5, 1.5), (0.0, 11, C, 0.5, 1.6)]  # TPOT 0.1 and 0.11
    assert _misses(rows, 50.0) == [False, True]
    # max_gap: judged on the largest gap when given (the TPOT is its lower bound)
    assert _misses(rows, 50.0, max_itl=np.array([0.2, 0.2])) == [True, True]
    assert _misses(rows, 50.0, max_itl=np.array([0.1, 0.1])) == [False, False]


def test_rejected_and_abandoned_always_miss():
    assert _misses([(0.0, 5, R, NAN, NAN), (0.0, 5, A, NAN, NAN)], 0.0) == [True, True]


def test_the_stop_rule_is_the_summarys_comparison():
    # 100 measured, target 0.9: 10 misses leave 0.9 reachable, 11 do not
    assert attainment_bound(100, 10) == 0.9 and not certain_miss(100, 10, 0.9)
    assert certain_miss(100, 11, 0.9)
    assert not certain_miss(0, 0, 0.9)  # nothing measured: never stopped
    assert math.isnan(attainment_bound(0, 0))
    # the float comparison the summary makes: mean of 9 in 10 True vs 0.9
    assert (np.arange(10) < 9).mean() >= 0.9 and not certain_miss(10, 1, 0.9)


def test_certain_miss_counts_only_measured_arrivals_and_each_once():
    arrival = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    out = np.array([5, 5, 5, 5, 5])
    first = np.full(5, NAN)
    finish = np.full(5, NAN)
    status = np.full(5, U)
    view = RequestView(arrival, out, first, finish, status)
    check = CertainMiss(arrival, out, warmup_s=1.0, ttft_s=0.5, itl_s=1.0, target=0.5)
    assert check.num_measured == 4
    assert not check(1.2, view)  # request 1 waited 0.2 s
    assert check.num_open == 1 and check.num_missed == 0
    assert not check(2.6, view)  # 1 late; 2 waited 0.6 s: late too -> 2 of 4, bound 0.5
    assert check.num_missed == 2 and check.num_open == 0
    assert check(3.6, view)  # 3 late: bound 0.25 < 0.5
    assert check.num_missed == 3  # request 0 (warm-up) never counted


# -- the engine's check only reads -----------------------------------------------------


def _engine_inputs(path: str, overrides: list[str]):
    loaded = load_scenario(REPO / path, overrides)
    s = loaded.scenario
    costs = build_costs(s)
    return s, costs, make_requests(loaded), build_transfer(s), build_topology(s)


def _hash_raw():
    """benchmarks/hash_records.py's hash of every record group of a RawResult."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "hash_records", REPO / "benchmarks" / "hash_records.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.hash_raw


@pytest.mark.parametrize(
    "path",
    ["scenarios/ci/disaggregated.yaml", "scenarios/ci/failure.yaml", "scenarios/ci/chunked.yaml"],
)
def test_a_check_that_never_stops_changes_no_record(path):
    s, costs, reqs, transfer, topology = _engine_inputs(path, [])
    plain = run_engine(s, costs, reqs, transfer, topology)
    seen: list[float] = []

    def never(now_s: float, view: RequestView) -> bool:
        seen.append(now_s)
        return False

    checked = run_engine(s, costs, reqs, transfer, topology, stop_check=never, check_every_s=0.7)
    hash_raw = _hash_raw()
    assert hash_raw(plain) == hash_raw(checked)
    assert math.isnan(checked.stopped_early_at_s)
    assert len(seen) == int(plain.end_at_s / 0.7)  # every 0.7 s until the run ended
    assert seen[:3] == [0.7, 1.4, 0.7 + 0.7 + 0.7]


def test_a_stopped_run_is_the_full_run_up_to_its_stop():
    s, costs, reqs, transfer, topology = _engine_inputs("scenarios/ci/disaggregated.yaml", [])
    full = run_engine(s, costs, reqs, transfer, topology)
    stop = run_engine(
        s, costs, reqs, transfer, topology, stop_check=lambda now, v: now >= 40.0, check_every_s=2.0
    )
    assert stop.stopped_early_at_s == 40.0 and stop.end_at_s == 40.0
    first, full_first = stop.log.first_token_at_s, full.log.first_token_at_s
    came = ~np.isnan(first)
    assert came.any() and (first[came] <= 40.0).all()
    np.testing.assert_array_equal(first[came], full_first[came])
    np.testing.assert_array_equal(np.isnan(first), np.isnan(full_first) | (full_first > 40.0))
    done = stop.log.status == STATUS_COMPLETED
    np.testing.assert_array_equal(stop.log.finish_at_s[done], full.log.finish_at_s[done])
    np.testing.assert_array_equal(done, full.log.finish_at_s <= 40.0)


def test_bad_check_interval_is_refused():
    s, costs, reqs, transfer, topology = _engine_inputs("scenarios/ci/disaggregated.yaml", [])
    with pytest.raises(ValueError, match="check_every_s"):
        run_engine(s, costs, reqs, transfer, topology, stop_check=lambda n, v: False)


# -- stopped verdicts agree with full runs ---------------------------------------------

# (scenario, overrides, rates): each near (below or at) and above the scenario's capacity
CASES = [
    # prefill-bound, fixed 4k prompts: prefill capacity 3.67 req/s (docs/metrics.md)
    ("scenarios/seed-70b-4k/disaggregated.yaml", [], [3.4, 3.7, 4.0, 5.5, 11.0]),
    # short prompts and a tight TPOT target: decode-bound (TTFT p50 under 0.1 s at
    # every rate here), the TPOT bound decides
    (
        "scenarios/seed-70b-4k/disaggregated.yaml",
        ["slo.itl_ms=25", "slo.itl_statistic=tpot", "workload.prompt_tokens.value=256"],
        [20.0, 25.0, 30.0, 45.0],
    ),
    ("scenarios/ci/chunked.yaml", [], [2.0, 3.0, 4.5, 9.0]),
    # misses on its largest gaps from 3 req/s (prefills stall decoding): no bound sees a
    # gap before the request completes, so only the TTFT and TPOT bounds stop it, at 9
    ("scenarios/ci/colocated-vllm.yaml", [], [3.0, 9.0]),
    # client timeouts: abandoned requests count as misses
    ("scenarios/ci/disaggregated.yaml", ["router.client_timeout_s=4"], [4.0, 6.0, 12.0]),
    # a worker failure and its retries; a topology fabric
    ("scenarios/ci/failure.yaml", [], [24.0, 40.0, 60.0]),
    ("scenarios/ci/fabric-contention.yaml", [], [12.0, 24.0]),
]


def _goodput_run(path: str, overrides: list[str], rate: float):
    """The scenario at ``rate`` with a (quick) goodput run's length, as the search runs it."""
    base = [*overrides, f"workload.rate_per_s={rate}"]
    loaded = load_scenario(REPO / path, base)
    prof = steady_profile(loaded)
    rule = RunLengthRule(min_measured_requests=300, service_multiple=5.0)
    h = horizon(rule, rate, prof.service_s, prof.drain_s)
    return load_scenario(REPO / path, [*base, *h.overrides()])


@pytest.mark.parametrize(("path", "overrides", "rates"), CASES)
def test_a_stopped_run_misses_over_its_full_length(path, overrides, rates):
    stopped = 0
    for rate in rates:
        loaded = _goodput_run(path, overrides, rate)
        full = simulate(loaded).summary
        early = simulate(loaded, stop_on_certain_miss=True).summary
        if early.stopped_early_at_s is None:  # not stopped: the same run
            assert early.slo_attainment == full.slo_attainment
            assert early.meets_slo == full.meets_slo
            assert early.sim_end_s == full.sim_end_s
            continue
        stopped += 1
        bound = early.slo_attainment_upper_bound
        assert bound is not None
        assert full.slo_attainment <= bound < full.slo_attainment_target, (rate, bound)
        assert not full.meets_slo and not early.meets_slo
        assert math.isnan(early.slo_attainment) and not early.stable
        assert early.stopped_early_at_s < full.sim_end_s
    assert stopped >= 1, f"no run of {path} {overrides} stopped early"


def test_stopped_runs_are_not_judged_as_normal_runs():
    loaded = _goodput_run("scenarios/seed-70b-4k/disaggregated.yaml", [], 11.0)
    res = simulate(loaded, stop_on_certain_miss=True)
    s = res.summary
    assert s.stopped_early_at_s is not None and s.sim_end_s == s.stopped_early_at_s
    assert not s.slo_attained and not s.meets_slo and not s.stable
    assert math.isnan(s.slo_attainment) and math.isnan(s.stability_p_value)
    flat = s.to_dict()
    assert flat["stopped_early_at_s"] == s.stopped_early_at_s
    assert "slo_attainment_upper_bound" in flat
    # the measured requests it simulated: those that arrived before the stop, counted on
    # the run's own requests generated again (the same seed gives the same arrivals);
    # none arriving later reached a worker
    arrival = make_requests(loaded).arrival_s
    measured = arrival >= loaded.scenario.sim.warmup_s
    assert int(measured.sum()) == s.num_requests
    arrived = int((measured & (arrival < s.stopped_early_at_s)).sum())
    assert s.num_arrived == flat["num_arrived"] == arrived
    assert 0 < s.num_arrived < s.num_requests
    late = res.requests[res.requests["arrival_at_s"] >= s.stopped_early_at_s]
    assert len(late) and late["prefill_start_at_s"].isna().all()
    # a run that is not stopped has none of these keys
    plain = simulate(
        _goodput_run("scenarios/ci/disaggregated.yaml", [], 1.0), stop_on_certain_miss=True
    )
    assert "stopped_early_at_s" not in plain.summary.to_dict()
    assert "num_arrived" not in plain.summary.to_dict()


def test_the_incremental_check_equals_the_whole_table():
    """At every check, CertainMiss's count is provable_misses over all measured rows."""
    loaded = _goodput_run("scenarios/ci/disaggregated.yaml", ["router.client_timeout_s=4"], 6.0)
    s = loaded.scenario
    costs = build_costs(s)
    reqs = make_requests(loaded)
    inner = certain_miss_check(s, reqs)
    measured = reqs.arrival_s >= s.sim.warmup_s
    counts: list[tuple[int, int]] = []

    def check(now_s: float, view: RequestView) -> bool:
        stop = inner(now_s, view)
        whole = provable_misses(
            view.arrival_s[measured],
            view.output_tokens[measured],
            view.status[measured],
            view.first_token_at_s[measured],
            view.finish_at_s[measured],
            now_s,
            s.slo.ttft_s,
            s.slo.itl_s,
        )
        counts.append((inner.num_missed, int(whole.sum())))
        return stop

    raw = run_engine(
        s, costs, reqs, build_transfer(s), build_topology(s), stop_check=check, check_every_s=1.0
    )
    assert not math.isnan(raw.stopped_early_at_s)
    assert len(counts) > 5
    assert all(a == b for a, b in counts), counts


def test_a_lower_stop_threshold_stops_later_and_below_it():
    loaded = _goodput_run("scenarios/seed-70b-4k/disaggregated.yaml", [], 5.5)
    at_target = simulate(loaded, stop_on_certain_miss=True).summary
    below = simulate(loaded, stop_on_certain_miss=True, stop_below_attainment=0.5).summary
    assert at_target.stopped_early_at_s is not None and below.stopped_early_at_s is not None
    assert below.stopped_early_at_s > at_target.stopped_early_at_s
    assert below.slo_attainment_upper_bound is not None
    assert below.slo_attainment_upper_bound < 0.5
    with pytest.raises(UserError, match="stop_below_attainment: 0.95 must be from 0 to"):
        simulate(loaded, stop_on_certain_miss=True, stop_below_attainment=0.95)


def test_seeds_stop_below():
    assert seeds_stop_below(0.9, 1) == 0.9
    assert seeds_stop_below(0.9, 2) == pytest.approx(0.8)
    assert seeds_stop_below(0.9, 20) < 0  # never stops: 20 seeds may miss 2 runs' worth
    with pytest.raises(ValueError):
        seeds_stop_below(0.9, 0)


def test_sweep_workers_pass_the_flag_on():
    from disaggsim.sweep.core import _task, as_source, run_point

    loaded = _goodput_run("scenarios/seed-70b-4k/disaggregated.yaml", [], 11.0)
    src = as_source(loaded)
    plain = run_point(_task(src, []))
    stopped = run_point(_task(src, [], stop_on_certain_miss=True))
    assert plain.stopped_early_at_s is None and plain.sim_end_s > 100.0
    assert stopped.stopped_early_at_s is not None and stopped.sim_end_s < 50.0
    assert "stopped_early_at_s" in stopped.to_dict()  # kept by Summary.deterministic


def test_the_stop_check_with_a_progress_callback():
    s, costs, reqs, transfer, topology = _engine_inputs("scenarios/ci/disaggregated.yaml", [])
    ticks: list[float] = []
    raw = run_engine(
        s,
        costs,
        reqs,
        transfer,
        topology,
        progress=lambda now, done, total: ticks.append(now),
        stop_check=lambda now, v: now >= 30.0,
        check_every_s=3.0,
    )
    assert raw.stopped_early_at_s == 30.0 and raw.end_at_s == 30.0
    assert ticks[-1] == 30.0 and len(ticks) == 26  # every 1.2 s (duration / 100), then 30


def test_a_stopped_run_writes_and_reads_back(tmp_path):
    from disaggsim.metrics.summary_table import Summary, cli_rows
    from disaggsim.run import write_results

    res = simulate(
        REPO / "scenarios/ci/disaggregated.yaml",
        ["workload.rate_per_s=8"],
        stop_on_certain_miss=True,
    )
    assert res.summary.stopped_early_at_s is not None
    folder = write_results(res, tmp_path / "out")  # plots included
    flat = json.loads((folder / "summary.json").read_text())
    assert flat["slo_attainment"] is None  # NaN: not measured
    assert flat["stopped_early_at_s"] == res.summary.stopped_early_at_s
    back = Summary.from_dict(flat)
    assert back.stopped_early_at_s == res.summary.stopped_early_at_s
    assert back.slo_attainment_upper_bound == res.summary.slo_attainment_upper_bound
    rows = dict(cli_rows(res.summary))
    assert rows["SLO attainment"] == "-" and rows["stopped early at"].endswith(" s")
