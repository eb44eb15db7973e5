"""No wrong result is written (issue 11): the run's invariants are checked on its records
before anything is derived or written; a violation is exit 3, one line naming the request
and the invariant, nothing written. Each invariant is shown to fire on a run whose records
were corrupted the way a bug would corrupt them, and the two wrong results the issue saw
(requests "completed" without any time; output_tokens = -2**63) are caught even with the
input validation bypassed. (That a correct run passes is checked by the hypothesis
strategies in test_engine_failures.py, test_engine_properties.py and
test_scenario_properties.py, which call the same check.)"""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest

import disaggsim.run as run_module
from disaggsim.cli import main
from disaggsim.config.loader import load_scenario
from disaggsim.engine.cluster import WorkerFailureEvent, run_cluster
from disaggsim.engine.records import STATUS_COMPLETED, STATUS_REJECTED, STATUS_UNFINISHED
from disaggsim.errors import InvariantError
from disaggsim.metrics.invariants import check_run
from disaggsim.run import build_costs, engine_config, make_requests, simulate
from disaggsim.workload.requests import Requests
from tests.conftest import REPO

CI = REPO / "scenarios" / "ci"
SHORT = ["sim.duration_s=30", "sim.warmup_s=0"]


@pytest.fixture(scope="module")
def clean_raw():
    raw = simulate(CI / "disaggregated.yaml", SHORT).raw
    check_run(raw)
    return raw


def _completed(raw) -> int:
    return int(np.flatnonzero(raw.log.status == STATUS_COMPLETED)[0])


def _with_multi_token_segment(raw) -> int:
    tokens = np.asarray(raw.segments.tokens)
    return int(np.flatnonzero(tokens > 1)[0])


def corrupt_finish(raw):
    r = _completed(raw)
    raw.log.finish_at_s[r] = math.nan
    return r, "finite times"


def corrupt_first_after_finish(raw):
    r = _completed(raw)
    raw.log.first_token_at_s[r] = raw.log.finish_at_s[r] + 1.0
    return r, "finite times"


def corrupt_unfinished_with_finish(raw):
    r = _completed(raw)
    raw.log.status[r] = STATUS_UNFINISHED
    return r, "finite times"


def corrupt_rejected_without_reason(raw):
    r = _completed(raw)
    raw.log.status[r] = STATUS_REJECTED
    raw.log.reason.pop(r, None)
    return r, "status"


def corrupt_status_code(raw):
    r = _completed(raw)
    raw.log.status[r] = 7
    return r, "status"


def corrupt_token_count(raw):
    i = _with_multi_token_segment(raw)
    raw.segments.tokens[i] -= 1
    return raw.segments.rid[i], "token count"


def corrupt_extra_tokens(raw):
    i = _with_multi_token_segment(raw)
    raw.segments.rid.append(raw.segments.rid[i])
    raw.segments.worker.append(raw.segments.worker[i])
    raw.segments.start_step.append(raw.segments.start_step[i])
    raw.segments.tokens.append(1)
    return raw.segments.rid[i], "token count"


def corrupt_segment_past_steps(raw):
    i = _with_multi_token_segment(raw)
    raw.segments.start_step[i] = 10**9
    return raw.segments.rid[i], "token order"


def corrupt_lengths(raw):
    r = _completed(raw)
    raw.requests.output_tokens[r] = -(2**63)
    return r, "lengths"


def corrupt_arrival(raw):
    r = _completed(raw)
    raw.requests.arrival_s[r] = math.inf
    return r, "arrival"


CORRUPTIONS = [
    corrupt_finish,
    corrupt_first_after_finish,
    corrupt_unfinished_with_finish,
    corrupt_rejected_without_reason,
    corrupt_status_code,
    corrupt_token_count,
    corrupt_extra_tokens,
    corrupt_segment_past_steps,
    corrupt_lengths,
    corrupt_arrival,
]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__)
def test_each_invariant_fires(clean_raw, corrupt):
    raw = copy.deepcopy(clean_raw)
    rid, invariant = corrupt(raw)
    with pytest.raises(InvariantError) as e:
        check_run(raw)
    msg = str(e.value)
    assert msg.startswith(f"request {rid}: ") and msg.endswith(f"(invariant: {invariant})"), msg
    assert "\n" not in msg


def test_token_order_fires_when_steps_run_backwards(clean_raw):
    raw = copy.deepcopy(clean_raw)
    w = next(w for w in raw.workers if len(w.steps.run_base_s) > 2)
    w.steps.run_start_at_s[-1] = -1.0  # a run of steps that ends before earlier ones
    with pytest.raises(InvariantError, match=r"invariant: token order"):
        check_run(raw)


def test_completed_without_times_is_caught():
    """The issue's case with validation bypassed: every worker lost for ever, an endless
    horizon; the engine ends the run and the requests must not count as completed."""
    loaded = load_scenario(CI / "disaggregated.yaml", SHORT)
    s = loaded.scenario
    cfg = engine_config(s, build_costs(s))
    n = sum(p.num_workers for p in cfg.pools)
    cfg = dataclasses.replace(
        cfg,
        horizon_s=math.inf,
        worker_failures=tuple(WorkerFailureEvent(1.0, w, math.inf) for w in range(n)),
    )
    raw = run_cluster(make_requests(loaded), cfg, None)
    with pytest.raises(InvariantError, match=r"invariant: (finite times|token count)"):
        check_run(raw)


def test_overflowed_lengths_are_caught():
    """The issue's lognormal overflow with validation bypassed: output_tokens = -2**63."""
    reqs = Requests(
        np.array([0.0, 0.5]), np.array([100, 100]), np.array([20, -(2**63)], dtype=np.int64)
    )
    with pytest.raises(InvariantError, match=r"^.*request 1: .*\(invariant: lengths\)$"):
        simulate(CI / "disaggregated.yaml", SHORT, requests=reqs)


def test_cli_exit_3_one_line_nothing_written(tmp_path, capsys, monkeypatch):
    real = run_module.run_cluster

    def broken(*args, **kwargs):
        raw = real(*args, **kwargs)
        corrupt_token_count(raw)
        return raw

    monkeypatch.setattr(run_module, "run_cluster", broken)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("mine")
    argv = ["run", str(CI / "disaggregated.yaml"), "--out", "out", "--trace", "t.json", "--quiet"]
    argv += [a for s in SHORT for a in ("--set", s)]
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("disaggsim: internal error: ")
    assert "request " in err and "(invariant: token count)" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
