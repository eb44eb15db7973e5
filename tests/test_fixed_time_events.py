"""Events timed at a fixed simulated second (worker and link failures, a workload mix
shift) in goodput searches and plans: a goodput search sets each run's length from its
rate, so such an event would fall inside some runs and after others. The search refuses
them (before any run); ``plan`` drops the scenario's failures and says so (plan.json ``search.notes``, a
``note:`` line under the ranked table)."""

from __future__ import annotations

import pytest

from disaggsim.config.loader import load_scenario
from disaggsim.errors import UserError
from disaggsim.plan.search import dropped_failures_note
from disaggsim.sweep import SerialExecutor
from disaggsim.sweep.core import as_source, fixed_time_events
from disaggsim.sweep.goodput import goodput_many
from tests.conftest import REPO

DECODE_LOSS = REPO / "scenarios" / "failures" / "decode-loss.yaml"
RANDOM = ["failures.workers=[]", "failures.random=[{pool: decode, mtbf_s: 600, mttr_s: 60}]"]


def test_fixed_time_events_lists_every_timed_field():
    loaded = load_scenario(
        DECODE_LOSS,
        [
            "failures.links=[{start_s: 30, duration_s: 5}, {start_s: 90, duration_s: 1}]",
            "workload.mix_shift={at_s: 200, output_tokens: {dist: fixed, value: 8}}",
        ],
    )
    assert fixed_time_events(loaded.scenario) == [
        ("failures.workers.0.at_s", 120.0),
        ("failures.links.0.start_s", 30.0),
        ("failures.links.1.start_s", 90.0),
        ("workload.mix_shift.at_s", 200.0),
    ]
    # failures given as a rate are not fixed in time: a goodput search may run them
    assert fixed_time_events(load_scenario(DECODE_LOSS, RANDOM).scenario) == []


def test_goodput_search_refuses_a_fixed_failure_before_any_run():
    class NoRuns(SerialExecutor):
        def submit(self, fn, task):  # pragma: no cover - must not be reached
            raise AssertionError("a run was sent")

        map = submit  # pragma: no cover

    with pytest.raises(UserError) as e:
        goodput_many([as_source(DECODE_LOSS)], 5.0, 40.0, executor=NoRuns())
    msg = str(e.value)
    assert msg.startswith(f"{DECODE_LOSS}: failures.workers.0.at_s = 120 s: ")
    assert "failures.random" in msg and "disaggsim sweep" in msg
    assert "\n" not in msg


def test_plan_says_it_drops_the_scenarios_failures():
    (note,) = dropped_failures_note(load_scenario(DECODE_LOSS))
    assert note.startswith("planned without the scenario's failures.workers (1 entry)")
    links = "failures.links=[{start_s: 30, duration_s: 5}, {start_s: 90, duration_s: 1}]"
    (note,) = dropped_failures_note(load_scenario(DECODE_LOSS, RANDOM + [links]))
    assert "failures.random (1 entry), failures.links (2 entries)" in note
    assert dropped_failures_note(load_scenario(DECODE_LOSS, ["failures.workers=[]"])) == ()
