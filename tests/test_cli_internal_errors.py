"""Internal errors are not bad input (docs/safety.md, "Exit codes"): a value disaggsim
computed itself that breaks a rule (a planner's goodput bracket) ends with one
``disaggsim: internal error: ... (please report)`` line and exit code 3, writing nothing;
the same rule broken by a value the user gave (``compare --rate-lo/--rate-hi/--tol``, the
Python API's ``goodput(rate_lo, rate_hi)``) stays a one-line error naming it, exit 2,
before any simulation."""

from __future__ import annotations

import pytest

from disaggsim.cli import main
from disaggsim.errors import InvariantError, UserError
from tests.conftest import REPO

CI = REPO / "scenarios" / "ci"
QUESTION = [
    "plan", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1", "--isl", "200",
    "--osl", "20", "--ttft-ms", "1000", "--itl-ms", "100", "--quick", "--quiet", "--no-plots",
]  # fmt: skip


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err
    return err.strip()


def test_a_planner_bracket_that_breaks_the_search_rule_is_an_internal_error(
    tmp_path, monkeypatch, capsys
):
    """Before: the planner's own bracket [0, 0] (a6cd3f0's screen at 0 req/s, fixed in
    447059a) ended with ``disaggsim: error: goodput: need 0 < rate_lo < rate_hi, got 0.0``
    and exit 2, as if the user had given a bad flag."""
    from disaggsim.plan.search import _Evaluator
    from disaggsim.sweep import SerialExecutor, executors

    monkeypatch.setattr(_Evaluator, "_bracket", lambda self, c: (0.0, 0.0))
    monkeypatch.setattr(executors, "make_executor", lambda *a, **k: SerialExecutor())
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "plan"
    rc = main([*QUESTION, "--out", str(out)])
    line = _one_line(capsys)
    assert rc == 3, line
    assert line.startswith("disaggsim: internal error: "), line
    assert "need 0 < rate_lo < rate_hi, got 0.0 and 0.0" in line
    assert "computed by the caller" in line and line.endswith("(please report)")
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_goodput_many_brackets_given_by_its_caller_are_internal(monkeypatch):
    from disaggsim.sweep import goodput, goodput_many
    from disaggsim.sweep.core import as_source

    src = as_source(CI / "chunked.yaml", ["sim.duration_s=20"])
    with pytest.raises(InvariantError, match=r"ci-chunked: goodput: need 0 < rate_lo"):
        goodput_many([src], 1.0, 2.0, brackets=[(0.0, 0.0)])
    # the API's own arguments are the user's: bad input, checked before any run
    with pytest.raises(UserError, match=r"need 0 < rate_lo < rate_hi, got 5.0 and 5.0"):
        goodput(CI / "chunked.yaml", 5.0, 5.0)
    with pytest.raises(UserError, match="tolerance must be a finite number > 0"):
        goodput(CI / "chunked.yaml", 1.0, 5.0, tol_per_s=float("nan"))
    with pytest.raises(UserError, match=r"rate_hi must be at most 1e\+15 req/s"):
        goodput(CI / "chunked.yaml", 1.0, 1e300)  # was refused after rate_lo's runs


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--rate-lo", "5", "--rate-hi", "5"], "compare: --rate-lo 5 and --rate-hi 5: "),
        (["--rate-lo", "0", "--rate-hi", "5"], "compare: --rate-lo 0 and --rate-hi 5: "),
        (["--rate-lo", "1", "--rate-hi", "inf"], "compare: --rate-lo 1 and --rate-hi inf: "),
        (
            ["--param", "workload.rate_per_s=2"],
            "compare: the lowest swept workload.rate_per_s 2 and the highest swept "
            "workload.rate_per_s 2: ",
        ),
        (
            ["--param", "workload.rate_per_s=1,3", "--rate-lo", "4"],
            "compare: --rate-lo 4 and the highest swept workload.rate_per_s 3: ",
        ),
        (["--rate-lo", "1", "--rate-hi", "5", "--tol", "-1"], "compare: --tol -1: must be"),
        (["--rate-lo", "1", "--rate-hi", "5", "--tol", "nan"], "compare: --tol nan: must be"),
        # written into a scenario, refused by the loader after the first runs had run
        (["--rate-lo", "1", "--rate-hi", "1e300"], "compare: --rate-hi 1e+300: at most 1e+15"),
    ],
)
def test_compare_names_the_bracket_flags_before_any_run(
    tmp_path, monkeypatch, capsys, flags, fragment
):
    """Before: ``compare: need 0 < rate-lo < rate-hi, got 2.0 and 2.0`` (no flag named
    when the bracket came from the swept rates), and a bad ``--tol`` was found by the
    goodput search only after the whole sweep had run."""
    from disaggsim.sweep import compare as sweep_compare

    def no_runs(*a, **k):
        raise AssertionError("simulations started before the flags were checked")

    monkeypatch.setattr(sweep_compare, "run_tasks", no_runs)
    monkeypatch.chdir(tmp_path)
    rc = main(["compare", str(CI / "chunked.yaml"), *flags, "--quiet", "--workers", "1"])
    line = _one_line(capsys)
    assert rc == 2, line
    assert line.startswith("disaggsim: error: " + fragment), line
    assert list(tmp_path.iterdir()) == []
