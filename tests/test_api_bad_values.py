"""The Python API (a notebook's use) given values of the wrong kind: each is one
:class:`UserError` line naming the argument, never an internal TypeError,
AttributeError, RecursionError or yaml RepresenterError, and never a value read with
another meaning (a string of overrides read character by character, one path given to
``compare`` read as one scenario per character). Found by /work/fuzz-scripts/api_fuzz.py
(2026-12-03, second session); numpy values, common in notebooks, are read as the Python
values they hold.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml

import disaggsim as ds
from disaggsim.errors import UserError
from tests.conftest import REPO

Q = REPO / "scenarios" / "ci" / "chunked.yaml"


def _raw() -> dict:
    raw = yaml.safe_load(Q.read_text())
    raw["sim"] = {"duration_s": 3, "warmup_s": 0}
    return raw


def _cyclic() -> dict:
    raw = _raw()
    raw["pool"]["moe"] = raw
    return raw


def _deep() -> dict:
    raw = _raw()
    node = raw["x"] = {}
    for _ in range(5000):
        node["a"] = {}
        node = node["a"]
    return raw


# (id, call, the message's start)
CASES = [
    ("source-int", lambda: ds.load_scenario(3), "load_scenario: a scenario is a YAML file "
     "path, YAML text or a mapping, got int 3"),
    ("source-none", lambda: ds.simulate(None), "load_scenario: a scenario is a YAML file path"),
    ("source-bytes", lambda: ds.load_scenario(str(Q).encode()), "load_scenario: a scenario is "
     "a YAML file path, YAML text or a mapping, got bytes b'"),
    ("source-one-line-yaml", lambda: ds.load_scenario("name: x"), "name: x: no such scenario "
     "file (a string is read as YAML text only when it holds a line break)"),
    ("overrides-str", lambda: ds.load_scenario(_raw(), "seed=3"), "overrides: give a list of "
     "'KEY.PATH=VALUE' strings (e.g. ['seed=3']), got str 'seed=3'"),
    ("overrides-dict", lambda: ds.simulate(_raw(), {"seed": 3}), "overrides: give a list of "),
    ("overrides-int-item", lambda: ds.load_scenario(_raw(), [3]), "overrides: each item is a "
     "'KEY.PATH=VALUE' string, got int 3"),
    ("dict-cyclic", lambda: ds.load_scenario(_cyclic()), "<scenario>: a value holds itself"),
    ("dict-deep", lambda: ds.load_scenario(_deep()), "<scenario>: nested more than 64 levels"),
    ("dict-huge", lambda: ds.load_scenario({**_raw(), "x": list(range(1_000_001))}),
     "<scenario>: more than 1,000,000 values"),
    ("text-bad-line", lambda: ds.load_scenario(Q.read_text().replace("seed: 11", "seed: [11")),
     "<scenario>: line 7: malformed YAML"),
    ("text-duplicate", lambda: ds.load_scenario(Q.read_text() + "seed: 3\n"),
     "<scenario>: line 21: duplicate key 'seed' (first given on line 6)"),
    ("sweep-params-list", lambda: ds.sweep(_raw(), ["workload.rate_per_s=1,2"]),
     "params: give a mapping of dot path to values"),
    ("sweep-params-2d-array", lambda: ds.sweep(_raw(), {"workload.rate_per_s": np.ones((2, 2))}),
     "param workload.rate_per_s: expected a list of values, got array([[1., 1.], [1., 1.]])"),
    ("sweep-executor-str", lambda: ds.sweep(_raw(), {"workload.rate_per_s": [1]},
     executor="serial"), "executor: give SerialExecutor(), ProcessExecutor(n), DaskExecutor"),
    ("sweep-executor-class", lambda: ds.sweep(_raw(), {"workload.rate_per_s": [1]},
     executor=ds.SerialExecutor), "executor: give SerialExecutor()"),
    ("goodput-str-rate", lambda: ds.goodput(_raw(), "1", "2"),
     "goodput: rate_lo must be a number (req/s), got '1'"),
    ("goodput-bool-tol", lambda: ds.goodput(_raw(), 1, 2, tol_per_s=True),
     "goodput: tolerance must be a number (req/s), got True"),
    ("compare-one-path", lambda: ds.compare(str(Q), rate_lo=1, rate_hi=2),
     "compare: give a list of scenarios (paths, mappings or loaded scenarios), got str"),
    ("compare-one-mapping", lambda: ds.compare(_raw(), rate_lo=1, rate_hi=2),
     "compare: give a list of scenarios"),
    ("write-results-not-a-result", lambda: ds.write_results(_raw(), "r"),
     "write_results: give the SimulationResult simulate() returns, got dict"),
    # 2026-12-04: each was a traceback from inside the run (AttributeError, TypeError), or
    # a value read by its truth ("no" as True), or named a flag the caller never typed
    ("goodput-rule-str", lambda: ds.goodput(_raw(), 1, 2, rule="fast"),
     "rule: give a RunLengthRule(min_measured_requests=..., service_multiple=...) or None, "
     "got str 'fast'"),
    ("goodput-rule-dict", lambda: ds.goodput(_raw(), 1, 2, rule={"service_multiple": 5}),
     "rule: give a RunLengthRule("),
    ("goodput-progress-int", lambda: ds.goodput(_raw(), 1, 2, progress=5),
     "progress: give a function or None, got int 5"),
    ("goodput-retest-word", lambda: ds.goodput(_raw(), 1, 2, retest="no"),
     "retest: give True or False, got str 'no'"),
    ("simulate-progress-int", lambda: ds.simulate(_raw(), progress=5),
     "progress: give a function or None, got int 5"),
    ("simulate-stop-word", lambda: ds.simulate(_raw(), stop_on_certain_miss="yes"),
     "stop_on_certain_miss: give True or False, got str 'yes'"),
    ("sweep-progress-str", lambda: ds.sweep(_raw(), {"workload.rate_per_s": [1]}, progress="x"),
     "progress: give a function or None, got str 'x'"),
    ("compare-params-strings", lambda: ds.compare([_raw()], ["workload.rate_per_s=1,2"],
     rate_lo=1, rate_hi=2), "params: give a mapping of dot path to values"),
    ("compare-same-gpus-word", lambda: ds.compare([_raw()], rate_lo=1, rate_hi=2,
     same_gpus="no"), "same_gpus: give True or False, got str 'no'"),
    ("compare-rule-str", lambda: ds.compare([_raw()], rate_lo=1, rate_hi=2, rule="fast"),
     "rule: give a RunLengthRule("),
    ("compare-tol-negative", lambda: ds.compare([_raw()], rate_lo=1, rate_hi=2, tol_per_s=-1),
     "compare: tol_per_s=-1: must be a finite number > 0 req/s"),
    ("compare-tol-word", lambda: ds.compare([_raw()], rate_lo=1, rate_hi=2, tol_per_s="x"),
     "compare: tol_per_s='x': must be a finite number > 0 req/s"),
    ("write-results-plots-word", lambda: ds.write_results(ds.simulate(_raw()), "r",
     plots="no"), "plots: give True or False, got str 'no'"),
    # the fuzz api kind, seed 11004: it said "--out /tmp/...: is the working folder"
    ("write-results-working-folder", lambda: ds.write_results(ds.simulate(_raw()), "."),
     "out_dir .: names an existing folder"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "start"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_wrong_kind_of_value_is_one_line(tmp_path, monkeypatch, call, start):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert msg.startswith(start), msg
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_yaml_text_is_a_scenario(tmp_path, monkeypatch):
    """A string holding a line break is YAML text (it was taken as a file name and the
    whole text came back in a multi-line "not found" error)."""
    monkeypatch.chdir(tmp_path)
    text = Q.read_text().replace("duration_s: 120, warmup_s: 15", "duration_s: 3, warmup_s: 0")
    from_text = ds.simulate(text)
    from_file = ds.simulate(Q, ["sim.duration_s=3", "sim.warmup_s=0"])
    assert from_text.requests.equals(from_file.requests)
    assert ds.load_scenario("\ufeff" + text).scenario.name == "ci-chunked"  # a BOM


def test_numpy_values_are_their_python_values(tmp_path, monkeypatch):
    """np.linspace values for a sweep were refused ("expected a list"), numpy numbers in a
    list or as goodput bounds failed in yaml's RepresenterError; numpy values in a
    scenario mapping were kept as numpy (and written so)."""
    monkeypatch.chdir(tmp_path)
    table = ds.sweep(_raw(), {"workload.rate_per_s": np.linspace(1.0, 2.0, 2)})
    assert list(table["workload.rate_per_s"]) == [1.0, 2.0]
    table = ds.sweep(_raw(), {"pool.max_batch_seqs": [np.int64(16), np.int64(32)]})
    assert list(table["pool.max_batch_seqs"]) == [16, 32]
    raw = _raw()
    raw["seed"] = np.int64(5)
    raw["workload"]["rate_per_s"] = np.float32(1.5)
    loaded = ds.load_scenario(raw)
    assert type(loaded.raw["seed"]) is int and type(loaded.raw["workload"]["rate_per_s"]) is float
    ds.write_results(ds.simulate(loaded), tmp_path / "r")
    assert "seed: 5" in (tmp_path / "r" / "scenario.yaml").read_text()


def test_every_user_error_is_one_line():
    """UserError makes its message one line (the CLI did; the Python API raised messages
    of several lines: found by the api fuzz kind, seed 9901)."""
    import pickle

    e = UserError("a\nb\tc")
    assert str(e) == "a\\nb\\tc"
    assert str(pickle.loads(pickle.dumps(e))) == "a\\nb\\tc"  # as a worker process sends it
    with pytest.raises(UserError) as got:
        ds.load_scenario(_raw(), np.ones((2, 2)))
    assert "\n" not in str(got.value)


def test_fractions_and_decimals_are_their_python_numbers(tmp_path, monkeypatch):
    """A Fraction as a goodput bound or a Decimal as a sweep value was a yaml
    RepresenterError traceback (and a Decimal bound was refused as no number): each is
    the float it holds, as numpy numbers are."""
    from decimal import Decimal
    from fractions import Fraction

    monkeypatch.chdir(tmp_path)
    table = ds.sweep(_raw(), {"workload.rate_per_s": [Decimal("1.5"), Fraction(5, 2)]})
    assert list(table["workload.rate_per_s"]) == [1.5, 2.5]
    raw = _raw()
    raw["workload"]["rate_per_s"] = Fraction(3, 2)
    loaded = ds.load_scenario(raw)
    assert loaded.raw["workload"]["rate_per_s"] == 1.5
    ds.write_results(ds.simulate(loaded), tmp_path / "r")
    assert "rate_per_s: 1.5" in (tmp_path / "r" / "scenario.yaml").read_text()
    ex = ds.SerialExecutor()
    a = ds.goodput(_raw(), Fraction(1), Decimal(10), tol_per_s=Fraction(1, 2), executor=ex)
    b = ds.goodput(_raw(), 1.0, 10.0, tol_per_s=0.5, executor=ex)
    assert (a.status, a.rate_per_s) == (b.status, b.rate_per_s)
