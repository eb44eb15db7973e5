"""The summary table: one declaration gives summary.json, docs/metrics.md's key list, the
`disaggsim run` rows and regress's metrics; the typed Summary reads back what it wrote."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from disaggsim.metrics.summary_table import (
    SUMMARY_KEYS,
    Summary,
    cli_rows,
    regress_metrics,
    summary_key,
)
from disaggsim.regress import METRICS
from disaggsim.run import simulate, write_results
from tests.conftest import REPO


@pytest.fixture(scope="module")
def disagg():
    return simulate(REPO / "scenarios" / "quickstart.yaml", ["sim.duration_s=40", "sim.warmup_s=5"])


@pytest.fixture(scope="module")
def colocated():
    return simulate(
        REPO / "scenarios" / "ci" / "chunked.yaml", ["sim.duration_s=40", "sim.warmup_s=5"]
    )


def test_docs_key_table_is_current():
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "metrics_doc.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_key_of_a_run_is_documented(disagg, colocated):
    doc = (REPO / "docs" / "metrics.md").read_text()
    for res in (disagg, colocated):
        for key in res.summary.to_dict():
            row = summary_key(key)
            assert f"`{row.key}`" in doc, key


def test_regress_tracks_the_same_metrics_in_the_same_order():
    # the reference files under results/reference/ list exactly these, in this order
    expected = (
        "ttft_p50_s",
        "ttft_p90_s",
        "ttft_p99_s",
        "itl_p50_s",
        "itl_p90_s",
        "itl_p99_s",
        "slo_attainment",
        "num_completed",
    )
    assert METRICS == regress_metrics() == expected
    for path in sorted((REPO / "results" / "reference").glob("*.json")):
        assert tuple(json.loads(path.read_text())["metrics"]) == expected, path.name
    for key in expected:  # tracked keys are in every run's summary
        assert summary_key(key).required


def test_presence_follows_the_table(disagg, colocated):
    d, c = disagg.summary, colocated.summary
    assert d.architecture == "disaggregated" and c.architecture == "colocated-chunked"
    for row in SUMMARY_KEYS:
        if row.required:
            assert row.key in d and row.key in c
    for key in ("kv_transfer_p99_s", "kv_exposed_p50_s", "link_util_max"):
        assert key in d and key not in c
    assert set(d.util) == {"prefill", "decode"} and set(c.mean_workers) == {"colocated"}
    assert d["util_decode"] == d.util["decode"]
    assert "retried_ttft_p99_s" not in d  # no failures in this run


def test_checked_keys(disagg, colocated):
    with pytest.raises(KeyError, match="not a summary key"):
        disagg.summary["ttft_p99"]
    with pytest.raises(KeyError, match="not present in this run"):
        colocated.summary["kv_transfer_p99_s"]
    with pytest.raises(KeyError, match="not present in this run"):
        colocated.summary["util_decode"]
    with pytest.raises(ValueError, match="'ttft_p99' is not in the summary table"):
        Summary.from_dict({**disagg.summary.to_dict(), "ttft_p99": 1.0})
    flat = disagg.summary.to_dict()
    del flat["num_gpus"]
    with pytest.raises(ValueError, match="missing required keys: num_gpus"):
        Summary.from_dict(flat)


def test_summary_json_reads_back(disagg, tmp_path):
    out = write_results(disagg, tmp_path / "r", plots=False)
    flat = json.loads((out / "summary.json").read_text())
    assert list(flat) == list(disagg.summary)  # same keys, table order
    back = Summary.from_dict(flat)
    for key, value in disagg.summary.items():
        if isinstance(value, float) and math.isnan(value):
            assert flat[key] is None and math.isnan(back[key])
        else:
            assert back[key] == value, key
    assert "wall_s" in flat and "wall_s" not in disagg.summary.deterministic()


def test_cli_rows_by_hand():
    zeros = {k.key: k.kind() for k in SUMMARY_KEYS if k.required}
    s = Summary.from_dict(
        {
            **zeros,
            "num_completed": 12,
            "itl_p99_s": 0.0421,
            "ttft_p50_s": float("nan"),
            "slo_attainment": 0.875,
            "busy_share_decode": 0.5,
            "kv_transfer_p99_s": 0.003,
        }
    )
    rows = dict(cli_rows(s))
    assert rows["completed"] == "12"
    assert rows["ITL p99"] == "42.1 ms"  # seconds shown in ms
    assert rows["TTFT p50"] == "-"  # NaN
    assert rows["SLO attainment"] == "87.5%"
    assert rows["decode pool busy share"] == "50.0%"
    assert rows["KV handoff p99"] == "3.0 ms"
    assert "KV handoff exposed p99" not in rows  # absent key, no row
    assert "wall time" not in rows


def test_wall_time_covers_the_frames_and_the_summary(monkeypatch):
    # wall_s is the whole simulate call: a slow time-series frame or summary shows in it
    import time

    import disaggsim.run as run

    def slow(real):
        def wrapped(*args, **kwargs):
            time.sleep(0.2)
            return real(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(run, "timeseries_frame", slow(run.timeseries_frame))
    monkeypatch.setattr(run, "summarize", slow(run.summarize))
    res = simulate(REPO / "scenarios" / "quickstart.yaml", ["sim.duration_s=10", "sim.warmup_s=1"])
    assert res.wall_s >= 0.4
    assert res.summary.wall_s == res.wall_s
