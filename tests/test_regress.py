"""CI regression on TTFT/ITL curves: fresh runs of scenarios/ci/*.yaml match the
committed references in results/reference/ exactly (same code, same seeds), and a
perturbed reference fails with a readable diff."""

from __future__ import annotations

import json
import shutil

import pytest

from disaggsim import regress
from disaggsim.sweep import SerialExecutor
from tests.conftest import REPO

CI = REPO / "scenarios" / "ci"
REF = REPO / "results" / "reference"


def test_every_ci_scenario_has_a_reference_with_a_grid():
    names = sorted(p.stem for p in CI.glob("*.yaml"))
    assert {"disaggregated", "colocated-vllm", "chunked"} <= set(names)
    for name in names:
        ref = regress.load_reference(REF / f"{name}.json")
        assert ref.metrics == regress.METRICS
        assert ref.grid and all(len(v) >= 5 for v in ref.grid.values())
        assert len(ref.points) == len(next(iter(ref.grid.values()))) * ref.seeds


def test_fresh_runs_match_the_committed_references():
    """The CI regression itself. On failure: if the change is an intended modelling
    change, run `disaggsim regress --update` and say so in the commit message."""
    report = regress.check(CI, REF, executor=SerialExecutor())
    assert report.ok, report.text()
    assert set(report.checked) == {p.stem for p in CI.glob("*.yaml")}


@pytest.fixture(scope="module")
def fresh_refs(tmp_path_factory):
    """The committed references' grids with values freshly computed by this checkout,
    so the perturbation tests below do not depend on the committed values being current
    (that is the previous test's job). Computed once per module."""
    d = tmp_path_factory.mktemp("fresh") / "reference"
    shutil.copytree(REF, d)
    regress.update(CI, d, executor=SerialExecutor())
    return d


@pytest.fixture
def ref_copy(fresh_refs, tmp_path):
    d = tmp_path / "reference"
    shutil.copytree(fresh_refs, d)
    return d


def _perturb(ref_dir, name, index, metric, factor):
    f = ref_dir / f"{name}.json"
    doc = json.loads(f.read_text())
    point = doc["points"][index]
    old = point[metric]
    point[metric] = old * factor
    f.write_text(json.dumps(doc, indent=1))
    return point, old


def test_a_perturbed_reference_point_fails_with_a_readable_diff(ref_copy):
    point, old = _perturb(ref_copy, "chunked", 2, "ttft_p99_s", 1.01)
    report = regress.check(CI, ref_copy, executor=SerialExecutor(), only=["chunked"])
    assert not report.ok
    assert len(report.drifts) == 1
    d = report.drifts[0]
    assert (d.scenario, d.metric) == ("chunked", "ttft_p99_s")
    assert d.fresh == old and d.reference == point["ttft_p99_s"]
    # fresh = ref / 1.01 → relative change 1/1.01 − 1 = −0.990 %
    assert d.rel_change == pytest.approx(1 / 1.01 - 1, rel=1e-9)
    text = report.text()
    assert "DRIFT" in text
    line = next(ln for ln in text.splitlines() if "ttft_p99_s" in ln)
    assert "chunked" in line and f"rate_per_s={point['workload.rate_per_s']}" in line
    assert "-0.990%" in line
    assert "regress --update" in text


def test_a_change_below_the_tolerance_is_not_drift(ref_copy):
    _perturb(ref_copy, "disaggregated", 0, "itl_p50_s", 1 + 1e-12)
    report = regress.check(CI, ref_copy, executor=SerialExecutor(), only=["disaggregated"])
    assert report.ok, report.text()


def test_structural_problems_are_reported(ref_copy, tmp_path):
    (ref_copy / "chunked.json").unlink()
    (ref_copy / "retired.json").write_text((ref_copy / "disaggregated.json").read_text())
    report = regress.check(CI, ref_copy, executor=SerialExecutor())
    problems = {d.scenario: d.problem for d in report.drifts}
    assert (
        "no reference" in problems["chunked"] and "--update --only chunked" in problems["chunked"]
    )
    assert "has no scenario" in problems["retired"]
    assert not report.ok


def test_update_writes_references_that_then_match(tmp_path):
    ci = tmp_path / "ci"
    ci.mkdir()
    shutil.copy(CI / "chunked.yaml", ci / "chunked.yaml")
    ref = tmp_path / "ref"
    written = regress.update(ci, ref, executor=SerialExecutor())
    assert written == [ref / "chunked.json"]
    doc = json.loads(written[0].read_text())
    # no reference yet: rates around the scenario's own 2 req/s
    assert doc["grid"] == {"workload.rate_per_s": [1.0, 1.5, 2.0, 2.5, 3.0]}
    assert [p["workload.rate_per_s"] for p in doc["points"]] == [1.0, 1.5, 2.0, 2.5, 3.0]
    assert regress.check(ci, ref, executor=SerialExecutor()).ok
    # an existing reference keeps its grid on update
    regress.update(ci, ref, executor=SerialExecutor())
    assert json.loads(written[0].read_text())["grid"] == doc["grid"]


def test_cli_regress_exit_codes(ref_copy, capsys):
    from disaggsim.cli import main

    args = [
        "regress",
        "--ci-dir",
        str(CI),
        "--reference-dir",
        str(ref_copy),
        "--workers",
        "1",
        "--quiet",
    ]
    assert main([*args, "--only", "colocated-vllm"]) == 0
    assert "OK" in capsys.readouterr().out
    _perturb(ref_copy, "colocated-vllm", 0, "slo_attainment", 0.5)
    assert main([*args, "--only", "colocated-vllm"]) == 1
    out = capsys.readouterr().out
    assert "slo_attainment" in out and "colocated-vllm" in out
    assert main([*args, "--only", "nope"]) == 2
    assert "--only nope" in capsys.readouterr().err
