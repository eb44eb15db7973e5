"""`disaggsim run` end to end, and every class of bad input: one line, exit 2, no output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from disaggsim.cli import main
from tests.conftest import REPO

QUICKSTART = REPO / "scenarios" / "quickstart.yaml"


def test_quickstart_writes_results(tmp_path, capsys):
    out = tmp_path / "qs"
    rc = main(
        [
            "run",
            str(QUICKSTART),
            "--out",
            str(out),
            "--quiet",
            "--set",
            "sim.duration_s=60",
            "--set",
            "sim.warmup_s=5",
        ]
    )
    assert rc == 0
    files = {p.name for p in out.iterdir()}
    assert {
        "requests.parquet",
        "timeseries.parquet",
        "summary.json",
        "scenario.yaml",
        "latency_cdf.png",
        "timeline.png",
    } <= files
    summary = json.loads((out / "summary.json").read_text())
    for key in (
        "num_requests",
        "num_completed",
        "num_gpus",
        "ttft_p50_s",
        "ttft_p90_s",
        "ttft_p99_s",
        "itl_p50_s",
        "itl_p90_s",
        "itl_p99_s",
        "tpot_p50_s",
        "tpot_p99_s",
        "e2e_p50_s",
        "e2e_p99_s",
        "slo_attainment",
        "output_tokens_per_s",
        "requests_per_s",
    ):
        assert key in summary, key
    assert summary["num_gpus"] == 4
    frame = pd.read_parquet(out / "requests.parquet")
    assert len(frame) >= summary["num_requests"]
    # the resolved scenario carries the override and loads again
    resolved = yaml.safe_load((out / "scenario.yaml").read_text())
    assert resolved["sim"]["duration_s"] == 60
    assert "SLO attainment" in capsys.readouterr().out


def test_set_overrides_reach_the_simulation(tmp_path):
    from disaggsim.run import simulate

    a = simulate(QUICKSTART, ["sim.duration_s=40", "decode_pool.num_workers=2"])
    assert a.summary["num_gpus"] == 3
    b = simulate(QUICKSTART, ["sim.duration_s=40", "workload.rate_per_s=5"])
    assert b.summary["num_requests"] < a.summary["num_requests"]


def _write(tmp_path: Path, mutate) -> Path:
    raw = yaml.safe_load(QUICKSTART.read_text())
    mutate(raw)
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


def _set(path, value):
    def f(raw):
        node = raw
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value

    return f


BAD = {
    "misspelt key": (
        _set(["decode_pool", "num_workerz"], 3),
        "decode_pool.num_workerz: unknown key",
    ),
    "wrong type": (_set(["decode_pool", "num_workers"], "three"), "decode_pool.num_workers"),
    "negative rate": (_set(["workload", "rate_per_s"], -2), "workload.rate_per_s"),
    "unknown model": (_set(["model"], "llama-9"), "model: unknown model 'llama-9' (allowed: "),
    "unknown gpu": (
        _set(["prefill_pool", "gpu"], "h100"),
        "prefill_pool.gpu: unknown GPU 'h100' (allowed: a100-80gb, h100-sxm, h100-pcie, h200-sxm, "
        "b200, l40s, h800-sxm) (did you mean h100-sxm or h100-pcie?)",
    ),
    "Hugging Face model id": (
        _set(["model"], "meta-llama/Llama-3.1-8B-Instruct"),
        " (did you mean llama-3.1-8b?)",
    ),
    "does not fit": (_set(["model"], "llama-3-70b"), "does not fit"),
    "architecture without its pool": (_set(["architecture"], "colocated"), "needs pool"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_scenario_one_line_exit_2_nothing_written(case, tmp_path, capsys):
    mutate, expected = BAD[case]
    path = _write(tmp_path, mutate)
    out = tmp_path / "out"
    rc = main(["run", str(path), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1, err
    assert str(path) in err or "--set" in err
    assert expected in err
    assert not out.exists()
    assert not list(tmp_path.glob(".out.*"))


def test_malformed_yaml(tmp_path, capsys):
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\nmodel: [llama\n")
    assert main(["run", str(p), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{p}: line" in err and "malformed YAML" in err


def test_bad_trace_row(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,100,20\n2023-11-16 18:17:04.0,abc,20\n"
    )
    p = _write(tmp_path, _set(["workload"], {"kind": "trace", "path": str(trace)}))
    out = tmp_path / "out"
    assert main(["run", str(p), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(trace) in err and ":3" in err
    assert not out.exists()


def test_bad_set_path(capsys):
    assert main(["run", str(QUICKSTART), "--set", "decode_pool.nope=1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'nope' at decode_pool (allowed:" in err


def test_console_script_no_traceback(tmp_path):
    p = _write(tmp_path, _set(["model"], "nope"))
    r = subprocess.run(
        [sys.executable, "-m", "disaggsim", "run", str(p), "--quiet"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith("disaggsim: error: ")


def test_run_notes_failures_after_the_end_and_a_kept_bucketed_replay(tmp_path, capsys, shared_data):
    """A scheduled worker or link failure timed at or after the run's end never happens:
    the run says so in one line naming the entries (before, the summary only showed 0
    failures). A bucketed trace replayed with its buckets kept gets the workload's note."""
    raw = yaml.safe_load((REPO / "scenarios" / "failures" / "decode-loss.yaml").read_text())
    raw["sim"] = {"duration_s": 40, "warmup_s": 5}
    raw["failures"]["workers"] = [
        {"at_s": 10, "worker": "decode:0"},
        {"at_s": 4000, "worker": "decode:1"},
    ]
    raw["failures"]["links"] = [{"start_s": 5000, "duration_s": 10}]
    path = tmp_path / "late.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--quiet", "--no-plots"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("note:")]
    assert len(lines) == 1
    assert "failures.workers.1 (decode:1 at 4000 s)" in lines[0]
    assert "failures.links.0 (from 5000 s)" in lines[0]
    assert "failures.workers.0" not in lines[0]  # it happened
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["num_worker_failures"] == 1

    trace = {
        "name": "kept",
        "model": "llama-3.1-8b",
        "architecture": "colocated",
        "pool": {"gpu": "h100-sxm", "num_workers": 2, "scheduler": "chunked"},
        "slo": {"ttft_ms": 2000, "itl_ms": 100},
        "workload": {
            "kind": "trace",
            "path": str(shared_data / "traces" / "mooncake_conversation_trace.jsonl"),
            "window_s": 30.0,
        },
        "sim": {"duration_s": 30},
    }
    path = tmp_path / "kept.yaml"
    path.write_text(yaml.safe_dump(trace))
    assert main(["run", str(path), "--out", str(tmp_path / "k"), "--quiet", "--no-plots"]) == 0
    notes = [x for x in capsys.readouterr().out.splitlines() if x.startswith("note:")]
    assert len(notes) == 1 and "bucketed_timestamps" in notes[0]


def test_run_notes_workload_changes_after_the_arrivals_end(tmp_path, capsys):
    """A mix shift, rate schedule point or step burst timed at or after sim.duration_s
    never applies (no request arrives then): the run names them in one line; the ones
    before the end are not named."""
    raw = yaml.safe_load((REPO / "scenarios" / "ci" / "disaggregated.yaml").read_text())
    raw["sim"] = {"duration_s": 30, "warmup_s": 5}
    raw["workload"].pop("rate_per_s")
    raw["workload"]["rate_schedule"] = [[0, 2.0], [10, 3.0], [30, 9.0], [45, 1.0]]
    raw["workload"]["mix_shift"] = {"at_s": 60, "output_tokens": {"dist": "fixed", "value": 8}}
    path = tmp_path / "late.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--quiet", "--no-plots"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("note:")]
    assert line == (
        "note: workload.mix_shift (at 60 s), workload.rate_schedule.2 (from 30 s), "
        "workload.rate_schedule.3 (from 45 s) did not apply: arrivals end at "
        "sim.duration_s = 30 s"
    )

    raw["workload"].pop("rate_schedule")
    raw["workload"].pop("mix_shift")
    raw["workload"]["rate_shape"] = {
        "kind": "step",
        "base_per_s": 2.0,
        "burst_per_s": 6.0,
        "start_s": 31,
        "duration_s": 5,
    }
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--out", str(tmp_path / "p"), "--quiet", "--no-plots"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("note:")]
    assert "workload.rate_shape (its burst from 31 s) did not apply" in line

    raw["workload"]["rate_shape"]["start_s"] = 20
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--out", str(tmp_path / "q"), "--quiet", "--no-plots"]) == 0
    assert not [x for x in capsys.readouterr().out.splitlines() if x.startswith("note:")]


def test_run_notes_a_request_cap_not_reached(tmp_path, capsys):
    """``workload.num_requests`` caps the arrivals; when the run's duration ends them
    first, the run says how many arrived (the summary counts only measured ones)."""
    scenario = str(REPO / "scenarios" / "ci" / "disaggregated.yaml")
    cut = ["--set", "sim.duration_s=30", "--set", "sim.warmup_s=1", "--quiet", "--no-plots"]
    argv = ["run", scenario, *cut, "--set", "workload.num_requests=5000"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("note:")]
    arrived = len(pd.read_parquet(tmp_path / "a" / "requests.parquet"))
    assert 20 < arrived < 5000
    assert line == (
        f"note: workload.num_requests = 5,000 was not reached: {arrived:,} requests arrived "
        "before sim.duration_s = 30 s"
    )
    argv[-1] = "workload.num_requests=20"  # reached: no note
    assert main([*argv, "--out", str(tmp_path / "b")]) == 0
    assert not [x for x in capsys.readouterr().out.splitlines() if x.startswith("note:")]
    assert len(pd.read_parquet(tmp_path / "b" / "requests.parquet")) == 20
