"""Chrome/Perfetto trace export: valid JSON with the required fields per event kind,
spans that agree with the run's records, and the ``run --trace`` option."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import numpy as np
import pytest

from disaggsim.run import simulate
from disaggsim.trace_export import trace_events, write_trace
from tests.conftest import REPO

CI = REPO / "scenarios" / "ci"
SHORT = ["sim.duration_s=30", "sim.warmup_s=5"]
REQUIRED = {"X": {"name", "ph", "ts", "dur", "pid", "tid"}, "C": {"name", "ph", "ts", "pid", "args"},
            "M": {"name", "ph", "pid", "args"}, "b": {"name", "ph", "ts", "pid", "id", "cat"},
            "e": {"name", "ph", "ts", "pid", "id", "cat"}}  # fmt: skip


@pytest.fixture(scope="module", params=["disaggregated", "colocated-vllm", "chunked"])
def result(request):
    return simulate(CI / f"{request.param}.yaml", SHORT)


def test_trace_is_valid_json_with_required_fields(result, tmp_path):
    path = write_trace(result, tmp_path / "t.json")
    doc = json.loads(path.read_text())  # strict JSON: NaN would not parse back as a number
    events = doc["traceEvents"]
    kinds = Counter(e["ph"] for e in events)
    assert kinds["X"] > 0 and kinds["C"] > 0 and kinds["M"] > 0
    for e in events:
        assert REQUIRED[e["ph"]] <= set(e), e
        if "ts" in e:
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
    assert len(names) == len({e["pid"] for e in events if e["ph"] != "M"})


def test_spans_match_the_step_logs(result):
    events = trace_events(result)["traceEvents"]
    by_pid = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            by_pid[e["pid"]].append(e)
    for w in result.raw.workers:
        spans = sorted(by_pid[w.index + 1], key=lambda e: e["ts"])
        runs = sum(1 for k in w.steps.run_steps if k > 0)
        assert len(spans) == runs + len(w.steps.prefill_iters)
        # one worker runs one iteration at a time: its spans never overlap
        for a, b in zip(spans, spans[1:], strict=False):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3
        # busy time agrees with the engine's own accounting (µs, rounding per span)
        busy_us = sum(e["dur"] for e in spans)
        assert busy_us == pytest.approx(w.steps.busy_s() * 1e6, abs=1e-3 * len(spans) + 1e-6)


def test_transfers_only_when_disaggregated(result):
    events = trace_events(result)["traceEvents"]
    begins = [e for e in events if e["ph"] == "b"]
    ends = {e["id"]: e for e in events if e["ph"] == "e"}
    if result.scenario.architecture != "disaggregated":
        assert begins == [] and ends == {}
        return
    done = result.requests[np.isfinite(result.requests["transfer_end_at_s"])]
    assert len(begins) == len(done) == len(ends)
    for b in begins:
        e = ends[b["id"]]
        assert e["ts"] >= b["ts"] and e["name"] == b["name"]


def test_counters_follow_the_time_series(result):
    events = trace_events(result)["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    # workers: queue, batch, KV; the router: held requests and orphaned KV bytes
    assert {e["name"] for e in counters} == {"queue_len", "batch", "kv_util", "orphaned_kv_bytes"}
    is_router = result.timeseries["worker"] < 0
    assert len(counters) == 3 * int((~is_router).sum()) + 2 * int(is_router.sum())
    peak = max(e["args"]["batch"] for e in counters if e["name"] == "batch")
    assert peak == result.timeseries["batch"].max()


def test_run_trace_option(tmp_path):
    from disaggsim.cli import main

    trace = tmp_path / "sub" / "trace.json"
    argv = ["run", str(CI / "disaggregated.yaml"), "--out", str(tmp_path / "out"), "--quiet",
            "--no-plots", "--trace", str(trace), *(a for s in SHORT for a in ("--set", s))]  # fmt: skip
    assert main(argv) == 0
    assert {"X", "C", "M", "b", "e"} <= {
        e["ph"] for e in json.loads(trace.read_text())["traceEvents"]
    }


def test_run_trace_into_a_folder_is_a_one_line_error(tmp_path, capsys):
    from disaggsim.cli import main

    out = tmp_path / "out"
    rc = main(
        ["run", str(CI / "chunked.yaml"), "--out", str(out), "--quiet", "--trace", str(tmp_path)]
    )
    assert rc == 2
    assert "--trace" in capsys.readouterr().err
    assert not out.exists()  # checked before simulating
