"""A close call at full accuracy measured again averaging more seeds
(disaggsim/plan/confirm.py ``settle_close_call``, docs/planning.md §2 "Close calls at full
accuracy"). A full-accuracy ratio of two goodputs moves up to 9 % (one sd) with the seed
(docs/sweeps.md), so a gain of +10 % on the plan's seed can be none on others. The runs
are stubbed (tests/plan_fakes.py) with capacities that depend on the run's seed: the
scenario's own seed (5) can be lucky for one side."""

from __future__ import annotations

import dataclasses

import pytest

from disaggsim.plan import PlanOptions, plan
from disaggsim.plan.report import plan_json, ranked_table, recommended_scenario
from disaggsim.sweep import SerialExecutor
from tests.plan_fakes import fake_run_points
from tests.test_plan_confirm import FLEET

SEED = FLEET["seed"]
FULL = dataclasses.replace(PlanOptions(), max_tp=1)  # full mode, 4 x H100 tp1


def _fake(monkeypatch, dis_own: float, dis_others: float, chunked: float = 8.0, own: int = SEED):
    """Runs meet at up to these req/s per GPU: disaggregated ``dis_own`` on the
    scenario's seed (``own``) and ``dis_others`` on any other, chunked prefill
    ``chunked`` on all, vllm far behind."""

    def meets(sc) -> bool:
        if sc.architecture == "disaggregated":
            cap = dis_own if sc.seed == own else dis_others
        else:
            cap = chunked if sc.pool.scheduler == "chunked" else 3.0
        return sc.workload.rate_per_s / sc.num_gpus <= cap

    return fake_run_points(monkeypatch, meets)


def test_a_close_call_won_on_one_lucky_seed_is_settled_the_other_way(monkeypatch):
    """On the plan's seed disaggregation serves 8.8 req/s per GPU against chunked
    prefill's 8.0 (+10 %, within 9 % of the 5 % line); on three other seeds 8.0, so the
    attainment averaged over four seeds misses above 8.0 and the gain is gone:
    colocate."""
    runs = _fake(monkeypatch, 8.8, 8.0)
    off = dataclasses.replace(FULL, settle_seeds=0)
    res0, adv0 = plan(FLEET, options=off, executor=SerialExecutor())
    assert adv0.verdict == "disaggregate" and res0.settlement is None
    assert adv0.disaggregation_gain == pytest.approx(0.10, abs=0.015)
    assert "a close call: within 9.0% of the 5% line" in adv0.reason
    assert {sc.seed for sc in runs} == {SEED}  # one seed: no other was run
    runs.clear()

    res, advice = plan(FLEET, options=FULL, executor=SerialExecutor())
    assert advice.verdict == "colocate_chunked"
    st = res.settlement
    assert st is not None and st.seeds == 4 and st.seeds_before == 1
    # the search's gain (the settling comes before the check as written, which moved it
    # a little there)
    assert st.gain == pytest.approx(adv0.disaggregation_gain, abs=0.005)
    assert st.band == pytest.approx(0.09)
    # the settling's searches average four fresh seeds, none the plan's (which picked the
    # candidates): every run not on the plan's seed is theirs
    fresh = [sc for sc in runs if sc.seed != SEED]
    assert {sc.seed for sc in fresh} == {SEED + 1, SEED + 2, SEED + 3, SEED + 4}
    assert len(fresh) == st.num_simulations
    kinds = {c.kind for c in st.candidates}
    assert {"disaggregate", "colocate_chunked"} <= kinds
    after = {c.kind: a for c, _, a in st.remeasured}
    assert after["disaggregate"] == pytest.approx(8.0, rel=0.02)
    assert after["colocate_chunked"] == pytest.approx(8.0, rel=0.02)
    assert advice.disaggregation_gain == pytest.approx(0.0, abs=0.03)
    assert "measured again averaging 4 fresh seeds: the gain at 1 seed (+10" in advice.reason
    # the compared rows are the settled ones, checked again as written
    for r in (advice.best_disaggregated, advice.best_chunked):
        assert r.candidate in st.candidates and r.as_written is not None
        assert max(e.num_runs for e in r.goodput.evaluations) == 1  # one seed a search
    # one search a fresh seed, the figure their mean: the split serves 8.0 on each
    assert st.seeds_run == (SEED + 1, SEED + 2, SEED + 3, SEED + 4)
    dis = [p for (c, _, _), p in zip(st.remeasured, st.per_seed, strict=True)
           if c.kind == "disaggregate"]  # fmt: skip
    assert all(len(p) == 4 and max(p) < 8.1 for p in dis)
    full = plan_json(res, advice)
    # each row says whether it was settled; the table's search column says at how many
    # seeds where the check as written did not run it again
    assert {r["label"] for r in full["ranked"] if r["settled"]} == {c.label for c in st.candidates}
    table = "\n".join(ranked_table(res, False))
    assert "   4 seeds " in table and "as written" in table
    d = full["settlement"]
    assert d["seeds"] == 4 and d["seeds_before"] == 1 and d["seeds_run"] == [6, 7, 8, 9]
    assert all(len(r["goodput_per_gpu_per_seed"]) == 4 for r in d["remeasured"])
    assert d["gain_before"] == st.gain
    assert len(d["remeasured"]) == len(st.remeasured)
    assert "averaging 4 fresh seeds" in recommended_scenario(res, advice)["description"]


def test_a_close_call_that_holds_on_every_seed_stays_and_its_band_narrows(monkeypatch):
    """9.0 against 8.0 on every seed: +12.5 %, within 9 % of the line at one seed; the
    settling confirms it, and its own band (the same ratio on every seed: the
    bisection's grain, 1 % / 2) leaves +12.5 % far outside: no close-call clause."""
    _fake(monkeypatch, 9.0, 9.0)
    res, advice = plan(FLEET, options=FULL, executor=SerialExecutor())
    assert advice.verdict == "disaggregate"
    assert res.settlement is not None and res.settlement.seeds == 4
    assert res.settlement.gain == pytest.approx(0.125, abs=0.015)
    assert advice.disaggregation_gain == pytest.approx(0.125, abs=0.015)
    assert res.settlement.own_band == 0.005
    assert advice.close_call_band is None and "a close call" not in advice.reason
    assert "measured again averaging 4 fresh seeds" in advice.reason


def test_a_gain_far_from_the_line_is_not_settled(monkeypatch):
    runs = _fake(monkeypatch, 11.0, 11.0)  # +37 %
    res, advice = plan(FLEET, options=FULL, executor=SerialExecutor())
    assert advice.verdict == "disaggregate" and res.settlement is None
    assert {sc.seed for sc in runs} == {SEED}
    assert plan_json(res, advice)["settlement"] is None


def test_a_plan_averaging_as_many_seeds_is_not_settled_again(monkeypatch):
    _fake(monkeypatch, 8.4, 8.4)  # +5 %: on the line
    res, advice = plan(FLEET, options=dataclasses.replace(FULL, seeds=4), executor=SerialExecutor())
    assert res.settlement is None
    assert advice.close_call_band == pytest.approx(0.045)


def test_same_seed_same_settled_plan(monkeypatch):
    _fake(monkeypatch, 8.8, 8.0)
    a = plan_json(*plan(FLEET, options=FULL, executor=SerialExecutor()))
    b = plan_json(*plan(FLEET, options=FULL, executor=SerialExecutor()))
    assert a["settlement"] is not None and a == b


def test_settle_seeds_out_of_range_is_named_as_given():
    from disaggsim.errors import UserError

    for bad in (-1, 1001, 2.0, True):
        with pytest.raises(UserError, match=rf"^settle_seeds={bad!r}: must be an integer"):
            plan(FLEET, options=dataclasses.replace(FULL, settle_seeds=bad))


def test_a_quick_plans_close_call_is_settled_after_its_confirmation(monkeypatch):
    """Quick mode: +10 % lies within its +-15 %, so the confirmation measures both sides
    at full accuracy (one seed: +10 % again); that is a close call by the band, settled
    at four seeds: colocate."""
    runs = _fake(monkeypatch, 8.8, 8.0)
    quick = dataclasses.replace(PlanOptions.quick(), max_tp=1)
    res, advice = plan(FLEET, options=quick, executor=SerialExecutor())
    assert res.confirmation is not None  # the quick close call measured at full accuracy
    assert res.settlement is not None and res.settlement.seeds == 4
    assert res.settlement.options.tol_fraction == quick.full_tol_fraction  # full accuracy
    assert advice.verdict == "colocate_chunked"
    assert {sc.seed for sc in runs} == {SEED, SEED + 1, SEED + 2, SEED + 3, SEED + 4}


def test_a_scenario_seed_at_the_top_of_its_range_is_settled_on_seeds_below(monkeypatch):
    from disaggsim.config.bounds import MAX_SEED

    runs = _fake(monkeypatch, 8.8, 8.0, own=MAX_SEED)
    res, advice = plan({**FLEET, "seed": MAX_SEED}, options=FULL, executor=SerialExecutor())
    assert res.settlement is not None and advice.verdict == "colocate_chunked"
    assert {sc.seed for sc in runs} == {MAX_SEED - k for k in range(5)}


def test_the_settled_figure_is_the_mean_of_the_seeds_goodputs_not_the_worst(monkeypatch):
    """The split serves 9.6 req/s per GPU on two fresh seeds and 8.0 on the other two
    (mean 8.8, chunked prefill 8.0 on all): the settled figure is 8.8, the mean of four
    one-seed searches. One search averaging the attainment over the four would meet only
    up to 8.0 (above it two of four runs miss: mean attainment 0.75), the worst seed."""
    caps = {SEED + 1: 9.6, SEED + 2: 8.0, SEED + 3: 9.6, SEED + 4: 8.0}

    def meets(sc) -> bool:
        if sc.architecture == "disaggregated":
            cap = caps.get(sc.seed, 8.8)
        else:
            cap = 8.0 if sc.pool.scheduler == "chunked" else 3.0
        return sc.workload.rate_per_s / sc.num_gpus <= cap

    fake_run_points(monkeypatch, meets)
    res, advice = plan(FLEET, options=FULL, executor=SerialExecutor())
    st = res.settlement
    assert st is not None
    after = {c.kind: (a, p) for (c, _, a), p in zip(st.remeasured, st.per_seed, strict=True)}
    mean, per_seed = after["disaggregate"]
    assert per_seed == pytest.approx([9.6, 8.0, 9.6, 8.0], rel=0.02)
    assert mean == pytest.approx(8.8, rel=0.02)
    assert advice.verdict == "disaggregate"
    assert advice.best_disaggregated.goodput_per_gpu_per_s == pytest.approx(8.8, rel=0.02)
    # the margin's own spread over those seeds (log ratios 0.18, 0, 0.18, 0: sd 0.105,
    # its 90 % upper bound 2.27 x that, over sqrt(4)) is wider than +10 % lies from the
    # line: a close call by its own band, said so
    assert st.own_band == pytest.approx(0.119, abs=0.004)
    assert advice.close_call_band == st.own_band
    assert "one sd of this margin over its 4 settled seeds (a 90% upper bound)" in advice.reason


def test_a_settled_margins_own_band_is_its_paired_ratios_upper_sd():
    """The per-seed log ratios' sd, times sqrt(3 / 0.5844) (0.5844: the 10th percentile
    of chi-square with 3 degrees of freedom, from a table), over sqrt(4); the B200
    question's settled figures: 1.7 %, where the generic band says 4.5 %."""
    import numpy as np

    from disaggsim.plan.confirm import own_band

    dis, colo = (520.95, 523.36, 509.52, 523.66), (481.86, 484.92, 484.65, 481.86)
    sd = float(np.std(np.log(np.array(dis) / np.array(colo)), ddof=1))
    assert own_band(dis, colo, 0.01) == pytest.approx(sd * (3 / 0.5844) ** 0.5 / 2, rel=1e-3)
    assert own_band(dis, colo, 0.01) == pytest.approx(0.0168, abs=0.0002)
    # equal on every seed: the bisection's grain, not zero
    assert own_band((8.0,) * 4, (8.0,) * 4, 0.01) == 0.005
    assert own_band((8.0,), (7.0,), 0.01) is None  # one seed: no spread to measure
    assert own_band((8.0, 0.0), (7.0, 7.0), 0.01) is None  # a seed that served nothing


def test_a_close_call_the_check_as_written_makes_is_settled_too(monkeypatch):
    """The split serves 9.6 req/s per GPU in the search's runs on the plan's seed (+20 %
    over chunked prefill's 8.0: outside the close-call band, not settled before the
    check), 9.0 in its file's runs (+12.5 %, inside it) and 8.0 on every other seed. The
    close call the check makes is settled as the search's would be (fresh seeds, then
    checked again): colocate. Before, the plan said disaggregate +12.5 %, a close call,
    with nothing settled."""
    from tests.test_plan_confirm import FILE_S

    def meets(sc) -> bool:
        if sc.architecture == "disaggregated":
            if sc.seed != SEED:
                cap = 8.0
            else:
                cap = 9.0 if sc.sim.duration_s == FILE_S else 9.6
        else:
            cap = 8.0 if sc.pool.scheduler == "chunked" else 3.0
        return sc.workload.rate_per_s / sc.num_gpus <= cap

    runs = fake_run_points(monkeypatch, meets)
    off = dataclasses.replace(FULL, settle_seeds=0)
    res0, adv0 = plan(FLEET, options=off, executor=SerialExecutor())
    assert adv0.verdict == "disaggregate" and res0.settlement is None
    assert adv0.disaggregation_gain == pytest.approx(0.125, abs=0.015)
    assert "a close call: within 9.0% of the 5% line" in adv0.reason
    assert "; --settle-seeds 4 narrows that by about half)" in adv0.reason  # not --seeds 4
    runs.clear()

    res, advice = plan(FLEET, options=FULL, executor=SerialExecutor())
    st = res.settlement
    assert st is not None and st.after_check and st.seeds == 4
    assert st.gain == pytest.approx(adv0.disaggregation_gain, abs=0.005)  # the checked gain
    assert {sc.seed for sc in runs} == {SEED + k for k in range(5)}
    assert advice.verdict == "colocate_chunked"
    assert advice.disaggregation_gain == pytest.approx(0.0, abs=0.03)
    assert (
        "the gain at 1 seed (+12" in advice.reason
        and "once checked as written) lay" in advice.reason
    )
    # the compared rows are the settled ones, checked again as written
    for r in (advice.best_disaggregated, advice.best_chunked):
        assert r.candidate in st.candidates and r.as_written is not None
    assert plan_json(res, advice)["settlement"]["after_check"] is True


def test_a_quick_close_call_the_check_makes_is_confirmed_then_settled(monkeypatch):
    """Quick mode: the split serves 9.8 req/s per GPU in quick runs (+22.5 % over
    chunked prefill's 8.0: decided, nothing measured again), 8.8 in its file's runs
    (+10 % as written: inside quick mode's band, so confirmed at full accuracy), 9.0 in
    full-accuracy runs on the plan's seed (+12.5 %: a close call at one seed) and 8.0 on
    every other. The confirmed close call is settled like one the search found: colocate.
    Before, the confirmation's +12.5 % stood, unsettled."""
    from tests.test_plan_confirm import OPTS, _arch, _stage

    caps = {
        "quick": {"disaggregated": 9.8, "colocated-chunked": 8.0, "colocated-vllm": 3.0},
        "full": {"disaggregated": 9.0, "colocated-chunked": 8.0, "colocated-vllm": 3.0},
        "file": {"disaggregated": 8.8, "colocated-chunked": 8.0, "colocated-vllm": 3.0},
    }

    def meets(sc) -> bool:
        cap = caps[_stage(sc)][_arch(sc)]
        if sc.seed != SEED and sc.architecture == "disaggregated":
            cap = 8.0
        return sc.workload.rate_per_s / sc.num_gpus <= cap

    fake_run_points(monkeypatch, meets)
    opts = dataclasses.replace(OPTS, settle_seeds=4)
    res, advice = plan(FLEET, options=opts, executor=SerialExecutor())
    assert res.confirmation is not None and "once checked as written" in res.confirmation.doubt
    st = res.settlement
    assert st is not None and st.seeds == 4 and not st.after_check
    assert advice.verdict == "colocate_chunked"
    assert "measured again averaging 4 fresh seeds" in advice.reason
