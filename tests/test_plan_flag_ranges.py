"""Every numeric ``disaggsim plan`` input out of range is one line that names the flag (or
the file and field) and what it allows, exit code 2, nothing written (docs/safety.md).

Found: ``--target-rate 1e-9`` answered "plan: the scenario's workload produces no
requests (raise the rate or duration)", naming no flag (the question's 300 s window
held no request to sample); ``--target-rate 1e9`` on a question "plan question:
workload: about 3e+11 requests expected"; on a scenario file ``--target-rate 1e300``
printed a budget of 301 digits; ``--service-multiple 1e300`` was taken, and every run
then shrank to the 2,000,000 requests one run may hold (a plan that never finished)."""

from __future__ import annotations

import pytest
import yaml

from disaggsim.cli import main
from tests.conftest import REPO

QUESTION = {
    "--model": "llama-3.1-8b",
    "--gpu": "h100-sxm",
    "--gpus": "2",
    "--isl": "2000",
    "--osl": "200",
    "--ttft-ms": "2000",
    "--itl-ms": "50",
}

# flag -> values of the zero / negative / nan / inf / tiny / huge kinds that are out of
# its range (a tiny SLO target, attainment or price is a question the plan answers)
BAD = {
    "--gpus": ["0", "-1", "100000000"],
    "--target-rate": ["0", "-1", "nan", "inf", "1e-9", "1e-300", "7000", "1e9", "1e300"],
    "--ttft-ms": ["0", "-1", "nan", "inf", "1e300"],
    "--itl-ms": ["0", "-1", "nan", "inf", "1e300"],
    "--attainment": ["0", "-1", "nan", "inf", "1.5", "1e300"],
    "--percentile": ["0", "-1", "nan", "inf", "101", "1e300"],
    "--seed": ["-1", "99999999999999999999"],
    "--max-tokens": ["0", "-1", "5000000"],
    "--price-per-gpu-hour": ["0", "-1", "nan", "inf", "1e300"],
    "--min-requests": ["0", "-1", "2000001"],
    "--service-multiple": ["0", "-1", "nan", "inf", "1e300", "1001"],
    "--seeds": ["0", "-1", "1001"],
    "--settle-seeds": ["-1", "1001"],
}
CASES = [(flag, v) for flag, values in BAD.items() for v in values]


def _refused(argv: list[str], tmp_path, capsys) -> str:
    out = tmp_path / "out"
    rc = main([*argv, "--quick", "--quiet", "--workers", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert "\n" not in err and "Traceback" not in err and "<scenario>" not in err, err
    assert not out.exists() and not (tmp_path / "out.partial").exists()
    return err


@pytest.mark.parametrize("flag, value", CASES, ids=[f"{f}={v}" for f, v in CASES])
def test_a_question_flag_out_of_range_is_named_with_its_range(tmp_path, capsys, flag, value):
    flags = dict(QUESTION)
    if flag == "--target-rate":
        del flags["--gpus"]
    flags[flag] = value
    err = _refused(["plan", *(x for kv in flags.items() for x in kv)], tmp_path, capsys)
    assert f"{flag} " in err, err
    # what it allows, not only what failed
    assert any(w in err for w in ("must", "allowed", "the largest number")), err


def test_a_target_rate_whose_window_draws_no_request_names_the_flag(tmp_path, capsys):
    """0.0034 req/s expects 1.02 requests in the question's 300 s; seed 0's Poisson draw
    holds none there (the rate passes the range, the draw does not)."""
    flags = dict(QUESTION, **{"--target-rate": "0.0034"})
    del flags["--gpus"]
    err = _refused(["plan", *(x for kv in flags.items() for x in kv)], tmp_path, capsys)
    assert err.startswith("disaggsim: error: --target-rate 0.0034: "), err
    assert "--seed 0" in err and "allowed" in err, err


@pytest.fixture
def scenario(tmp_path):
    raw = yaml.safe_load((REPO / "scenarios" / "advisor" / "two-gpus.yaml").read_text())
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path, raw


@pytest.mark.parametrize(
    "flags, needles",
    [
        (["--target-rate", "1e300"], ["--target-rate 1e+300: ", "at most 1e+15 req/s"]),
        (["--target-rate", "1e9"], ["--target-rate 1e+09: sizes a budget of ", "up to about"]),
        (["--price-per-gpu-hour", "1e300"], ["--price-per-gpu-hour 1e+300", "at most"]),
        (["--gpus", "100000000"], ["--gpus 100000000", "16,384"]),
        (["--service-multiple", "1e300"], ["--service-multiple 1e+300", "at most 1000"]),
    ],
)
def test_a_scenario_plan_flag_out_of_range_is_named(tmp_path, capsys, scenario, flags, needles):
    path, _ = scenario
    err = _refused(["plan", str(path), *flags], tmp_path, capsys)
    for n in needles:
        assert n in err, err
    assert len(err) < 400, err  # no 301-digit budget


def test_a_scenario_whose_window_holds_no_request_names_its_fields(tmp_path, capsys, scenario):
    path, raw = scenario
    raw["workload"]["rate_per_s"] = 1e-9
    path.write_text(yaml.safe_dump(raw))
    err = _refused(["plan", str(path)], tmp_path, capsys)
    assert f"{path}: workload: no requests" in err, err
    assert "workload.rate_per_s" in err and "sim.duration_s" in err, err


def test_seeds_reach_every_goodput_search_and_plan_json(tmp_path, monkeypatch):
    """``--seeds N``: every goodput search of the plan averages its attainment over N
    seeds (docs/sweeps.md, "How much a goodput moves": 4 cut its seed spread by about half)."""
    import json

    from disaggsim.plan import search

    asked: list[int] = []

    def recording(*args, **kwargs):
        asked.append(kwargs["seeds"])
        return goodput_many(*args, **kwargs)

    goodput_many = search.goodput_many
    monkeypatch.setattr(search, "goodput_many", recording)
    out = tmp_path / "out"
    argv = [
        "plan", str(REPO / "scenarios" / "advisor" / "two-gpus.yaml"), "--gpus", "2",
        "--quick", "--min-requests", "60", "--service-multiple", "0.5", "--quiet",
        "--no-plots", "--workers", "1", "--seeds", "2", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    assert asked and set(asked) == {2}
    assert json.loads((out / "plan.json").read_text())["search"]["seeds"] == 2
