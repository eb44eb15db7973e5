"""Crash classes on valid input (issue 11): every command that takes a scenario works on a
``kind: topology`` fabric (``plan`` failed on ``fabric.link``), autoscaled pools included,
and writes a result folder that names what it replaced."""

from __future__ import annotations

import json

from disaggsim.cli import main
from tests.conftest import REPO

FABRIC = REPO / "scenarios" / "fabric"
SHORT = ["--set", "sim.duration_s=30", "--set", "sim.warmup_s=5"]
AUTOSCALE = "autoscale={prefill: {min_workers: 1, max_workers: 2, policy: slo}}"


def test_plan_on_a_topology_fabric(tmp_path, capsys):
    out = tmp_path / "plan"
    argv = ["plan", str(FABRIC / "nvlink.yaml"), "--quick", "--min-requests", "100",
            "--service-multiple", "1", "--workers", "1", "--quiet", "--no-plots",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "fabric topology" in text and "fast_fabric" in text
    obj = json.loads((out / "plan.json").read_text())
    assert obj["fabric_link"] == "topology"
    # the planner quotes the placed path (it used to read fabric.link, which a topology
    # fabric does not have): pack placement puts a TP2 pair on one node, two NVLink shards
    # at 450 GB/s each
    (fast,) = [c for c in obj["conditions"] if c["name"] == "fast_fabric"]
    assert fast["holds"] and fast["detail"].startswith("nvlink at 450 GB/s per GPU")


def test_sweep_and_compare_on_topology_fabrics(tmp_path, capsys):
    sweep = ["sweep", str(FABRIC / "pcie.yaml"), "--param", "workload.rate_per_s=0.5,1",
             "--workers", "1", "--quiet", "--no-plots", "--out", str(tmp_path / "s"), *SHORT]  # fmt: skip
    assert main(sweep) == 0
    compare = ["compare", str(FABRIC / "nvlink.yaml"), str(FABRIC / "pcie.yaml"), "--param",
               "workload.rate_per_s=0.5,1", "--tol", "0.5", "--workers", "1", "--quiet",
               "--min-requests", "100", "--service-multiple", "1",
               "--no-plots", "--out", str(tmp_path / "c"), *SHORT]  # fmt: skip
    assert main(compare) == 0
    # compare states the SLO model it judged by (disaggsim/metrics/slo_model.py)
    assert "SLO model: Each measured request is judged on its own" in capsys.readouterr().out
    assert (tmp_path / "s" / "sweep.parquet").is_file()
    assert (tmp_path / "c" / "goodput.csv").is_file()


def test_run_autoscaled_on_a_topology_fabric(tmp_path):
    out = tmp_path / "r"
    argv = ["run", str(FABRIC / "nvlink.yaml"), "--set", AUTOSCALE, "--out", str(out),
            "--quiet", "--no-plots", *SHORT]  # fmt: skip
    assert main(argv) == 0
    assert (out / "links.parquet").is_file()
