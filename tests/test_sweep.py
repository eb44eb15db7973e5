"""Sweeps: grid syntax, the tidy table's columns and order, seeds, executors agreeing,
the steady-state columns, compare, and the CLI
(outputs written, one-line errors with nothing written)."""

from __future__ import annotations

import pandas as pd
import pytest

from disaggsim.errors import UserError
from disaggsim.run import simulate
from disaggsim.sweep import (
    Param,
    ProcessExecutor,
    RunLengthRule,
    SerialExecutor,
    expand_grid,
    parse_param,
    sweep,
)
from disaggsim.sweep.compare import GOODPUT_COLUMNS, SCENARIO_FILE, compare
from disaggsim.sweep.executors import DaskExecutor, make_executor
from disaggsim.sweep.grid import override_text
from tests.conftest import REPO

CI = REPO / "scenarios" / "ci"
SHORT = ["sim.duration_s=40", "sim.warmup_s=5"]
QUICK_RULE = RunLengthRule(min_measured_requests=150, service_multiple=2.0)  # cheap goodput runs


# ------------------------------------------------------------------ grid syntax


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("workload.rate_per_s=1:12:12", tuple(range(1, 13))),
        ("workload.rate_per_s=0:10:3", (0, 5, 10)),
        ("workload.rate_per_s=1:2:3", (1.0, 1.5, 2.0)),
        ("workload.rate_per_s=1:4:3", (1.0, 2.5, 4.0)),  # step 1.5: floats
        ("workload.rate_per_s=0.5:2:4", (0.5, 1.0, 1.5, 2.0)),
        ("workload.rate_per_s=3:3:1", (3,)),
        ("workload.rate_per_s=1,2.5,4", (1, 2.5, 4)),
        ("fabric.link=nvlink,pcie", ("nvlink", "pcie")),
        ("fabric.bandwidth_gb_per_s=1e2,50", (100.0, 50)),
    ],
)
def test_parse_param_values(text, values):
    p = parse_param(text)
    assert p.path == text.split("=")[0]
    assert p.values == values
    assert [type(v) for v in p.values] == [type(v) for v in values]


@pytest.mark.parametrize("item", ["2001-02-30", "!!int x", "!!timestamp x"])
def test_parse_param_keeps_scalars_yaml_cannot_build_as_text(item):
    # PyYAML's constructors raise ValueError/AttributeError (not YAMLError) on these:
    # `sweep --param workload.rate_per_s=2001-02-30,1` printed a traceback; the item is
    # kept as text and the scenario's own validation refuses it in one line
    p = parse_param(f"workload.rate_per_s={item},1")
    assert p.values == (item, 1)
    assert override_text("workload.rate_per_s", item) == f"workload.rate_per_s='{item}'"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("workload.rate_per_s", "expected PATH=a:b:n"),
        ("=1:2:3", "expected PATH=a:b:n"),
        ("workload.rate_per_s=1:2", "a range is a:b:n"),
        ("workload.rate_per_s=1:x:3", "range ends must be numbers"),
        ("workload.rate_per_s=1:2:0", "number of points must be an integer >= 1"),
        ("workload.rate_per_s=1:2:2.5", "number of points must be an integer >= 1"),
        ("workload.rate_per_s=1,,2", "empty value"),
        ("workload..rate_per_s=1,2", "empty component"),
    ],
)
def test_parse_param_errors_are_one_line(text, fragment):
    with pytest.raises(UserError) as e:
        parse_param(text)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"--param {text}")


def test_expand_grid_first_parameter_slowest():
    grid = expand_grid([Param("a", (1, 2)), Param("b", ("x", "y", "z"))])
    assert grid == [
        {"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 1, "b": "z"},
        {"a": 2, "b": "x"}, {"a": 2, "b": "y"}, {"a": 2, "b": "z"},
    ]  # fmt: skip
    assert expand_grid([]) == [{}]


@pytest.mark.parametrize("value", [1, 2.5, 1e-5, 1e20, 0.1 + 0.2, "nvlink", "1.5", True])
def test_override_text_round_trips(value):
    import yaml

    text = override_text("a.b", value)
    assert text.startswith("a.b=")
    assert yaml.safe_load(text[4:]) == value
    assert type(yaml.safe_load(text[4:])) is type(value)


# ------------------------------------------------------------------ sweep table


@pytest.fixture(scope="module")
def small_table() -> pd.DataFrame:
    return sweep(
        CI / "chunked.yaml",
        {"workload.rate_per_s": [1, 3], "pool.max_batch_tokens": [256, 512]},
        seeds=2,
        executor=SerialExecutor(),
        overrides=SHORT,
    )


def test_sweep_columns_and_order(small_table):
    df = small_table
    cols = list(df.columns)
    assert cols[:3] == ["workload.rate_per_s", "pool.max_batch_tokens", "seed_index"]
    for key in ("seed", "ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "slo_attainment",
                "num_requests", "num_gpus", "scenario", "architecture"):  # fmt: skip
        assert key in cols
    assert "wall_s" not in cols  # differs between identical runs
    assert len(df) == 2 * 2 * 2
    assert df["workload.rate_per_s"].tolist() == [1, 1, 1, 1, 3, 3, 3, 3]
    assert df["pool.max_batch_tokens"].tolist() == [256, 256, 512, 512] * 2
    assert df["seed_index"].tolist() == [0, 1] * 4
    # the scenario's seed is 11: seed index k runs seed 11 + k
    assert df["seed"].tolist() == [11, 12] * 4


def test_sweep_row_is_the_plain_run_of_that_point(small_table):
    row = small_table.iloc[5]  # rate 3, budget 256, seed index 1
    assert (row["workload.rate_per_s"], row["pool.max_batch_tokens"], row["seed_index"]) == (
        3,
        256,
        1,
    )
    direct = simulate(
        CI / "chunked.yaml",
        [*SHORT, "workload.rate_per_s=3", "pool.max_batch_tokens=256", "seed=12"],
    ).summary
    for key in ("ttft_p99_s", "itl_p99_s", "slo_attainment", "num_requests", "seed"):
        assert row[key] == direct[key]


def test_different_seeds_give_different_requests(small_table):
    a, b = small_table.iloc[0], small_table.iloc[1]
    assert a["num_requests"] != b["num_requests"] or a["ttft_p50_s"] != b["ttft_p50_s"]


def test_process_executor_gives_the_serial_table(small_table):
    with ProcessExecutor(workers=2) as ex:
        df = sweep(
            CI / "chunked.yaml",
            {"workload.rate_per_s": [1, 3], "pool.max_batch_tokens": [256, 512]},
            seeds=2,
            executor=ex,
            overrides=SHORT,
        )
    pd.testing.assert_frame_equal(df, small_table)


def test_progress_reports_every_task():
    seen = []
    sweep(
        CI / "disaggregated.yaml", {"workload.rate_per_s": [1, 2, 3]}, executor=SerialExecutor(),
        overrides=SHORT, progress=lambda done, total: seen.append((done, total)),
    )  # fmt: skip
    assert seen == [(0, 3), (1, 3), (2, 3), (3, 3)]


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        # the API names its argument (docs/safety.md), the CLI its flag
        ({"workload.rate": [1]}, "params key 'workload.rate': unknown key 'rate' at workload"),
        ({"pool.gpu": ["h100-sxm"]}, "architecture disaggregated takes prefill_pool/decode_pool"),
        ({"workload.rate_per_s": [-1]}, "workload.rate_per_s"),
        ({"seed": [1, 2]}, "sweep seeds with seeds="),
        ({"workload.rate_per_s": []}, "at least one value"),
    ],
)
def test_bad_params_fail_before_running(params, fragment):
    ran = []

    class Recording(SerialExecutor):
        def map(self, fn, tasks, on_done=None):
            ran.append(len(tasks))
            return super().map(fn, tasks, on_done)

    with pytest.raises(UserError) as e:
        sweep(CI / "disaggregated.yaml", params, executor=Recording(), overrides=SHORT)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)
    assert ran == []


def test_bad_seeds():
    with pytest.raises(UserError, match="^seeds=0: "):
        sweep(CI / "chunked.yaml", {}, seeds=0, executor=SerialExecutor())


def test_make_executor_choice():
    assert isinstance(make_executor(3, None, environ={}), ProcessExecutor)
    assert make_executor(3, None, environ={}).workers == 3
    ex = make_executor(None, None, environ={"DASK_SCHEDULER_ADDRESS": "tcp://10.0.0.1:8786"})
    assert isinstance(ex, DaskExecutor) and ex.address == "tcp://10.0.0.1:8786"
    ex = make_executor(None, "tcp://h:1", environ={"DASK_SCHEDULER_ADDRESS": "tcp://x:2"})
    assert ex.address == "tcp://h:1"  # the flag wins over the environment
    with pytest.raises(UserError, match="tcp://host"):
        make_executor(None, "myhost", environ={})
    with pytest.raises(UserError, match=r"ProcessExecutor\(workers=0\)"):
        ProcessExecutor(0)


# ------------------------------------------------------------------ compare


def test_compare_table_and_goodput_columns():
    res = compare(
        [CI / "disaggregated.yaml", CI / "chunked.yaml"],
        {"workload.rate_per_s": [1.0, 4.0]},
        executor=SerialExecutor(),
        same_gpus=True,
        overrides=SHORT,
        tol_per_s=0.5,
        rule=QUICK_RULE,
    )
    df = res.table
    assert list(df.columns[:3]) == [SCENARIO_FILE, "workload.rate_per_s", "seed_index"]
    assert (
        df[SCENARIO_FILE].tolist()
        == [str(CI / "disaggregated.yaml")] * 2 + [str(CI / "chunked.yaml")] * 2
    )
    assert df["architecture"].tolist() == ["disaggregated"] * 2 + ["colocated-chunked"] * 2
    g = res.goodput
    assert list(g.columns) == list(GOODPUT_COLUMNS)
    assert g["num_gpus"].tolist() == [8, 8]
    assert (g["goodput_per_gpu_per_s"] == g["goodput_per_s"] / 8).all()
    finite = g["ratio_to_best"].dropna()
    assert finite.max() == 1.0
    assert g["tol_per_s"].tolist() == [0.5, 0.5]


def test_compare_goodput_per_other_parameter():
    res = compare(
        [CI / "disaggregated.yaml"],
        {"workload.rate_per_s": [1.0, 4.0], "decode_pool.max_batch_seqs": [16, 128]},
        executor=SerialExecutor(),
        overrides=SHORT,
        tol_per_s=1.0,
        rule=QUICK_RULE,
    )
    assert res.goodput["decode_pool.max_batch_seqs"].tolist() == [16, 128]
    assert len(res.table) == 4


def test_compare_same_gpus_names_the_file_that_differs():
    with pytest.raises(UserError) as e:
        compare(
            [CI / "chunked.yaml", REPO / "scenarios" / "quickstart.yaml"],
            {"workload.rate_per_s": [1, 2]},
            executor=SerialExecutor(),
            same_gpus=True,
        )
    msg = str(e.value)
    assert msg.startswith(str(REPO / "scenarios" / "quickstart.yaml"))
    assert "4 GPUs" in msg and "8" in msg


def test_compare_needs_a_rate_range():
    with pytest.raises(UserError, match="--rate-lo and --rate-hi"):
        compare([CI / "chunked.yaml"], {"pool.max_batch_tokens": [256]}, executor=SerialExecutor())


# ------------------------------------------------------------------ CLI


def test_cli_sweep_writes_table_and_plots(tmp_path, capsys):
    from disaggsim.cli import main

    out = tmp_path / "sw"
    rc = main([
        "sweep", str(CI / "colocated-vllm.yaml"), "--param", "workload.rate_per_s=1:3:3",
        "--param", "pool.max_batch_seqs=32,64", "--seeds", "2", "--workers", "1",
        "--set", "sim.duration_s=30", "--set", "sim.warmup_s=5", "--out", str(out), "--quiet",
    ])  # fmt: skip
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == [
        ".disaggsim-result.json", "itl.png", "slo_attainment.png", "sweep.csv", "sweep.parquet",
        "ttft.png",
    ]  # fmt: skip
    df = pd.read_parquet(out / "sweep.parquet")
    assert len(df) == 3 * 2 * 2
    assert df["workload.rate_per_s"].tolist() == [1] * 4 + [2] * 4 + [3] * 4
    csv = pd.read_csv(out / "sweep.csv")
    assert list(csv.columns) == list(df.columns)
    assert "12 runs" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--param", "workload.rate_per_s=1:2"], "a range is a:b:n"),
        (["--param", "workload.nope=1,2"], "unknown key 'nope'"),
        (["--param", "workload.rate_per_s=1,2", "--seeds", "0"], "--seeds 0"),
        (["--param", "workload.rate_per_s=1,2", "--workers", "0"], "--workers 0"),
    ],
)
def test_cli_sweep_errors(tmp_path, capsys, argv, fragment):
    from disaggsim.cli import main

    out = tmp_path / "sw"
    rc = main(["sweep", str(CI / "chunked.yaml"), "--out", str(out), "--quiet", *argv])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("disaggsim: error: ") and fragment in err
    assert err.count("\n") == 1
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary folder left behind either


def test_cli_compare_prints_goodput_and_writes_files(tmp_path, capsys, monkeypatch):
    from disaggsim.cli import main

    monkeypatch.setenv("COLUMNS", "200")  # rich folds long names on a narrow terminal
    out = tmp_path / "cmp"
    rc = main([
        "compare", str(CI / "disaggregated.yaml"), str(CI / "colocated-vllm.yaml"),
        "--param", "workload.rate_per_s=0.5:4:3", "--same-gpus", "--tol", "0.5",
        "--set", "sim.duration_s=30", "--set", "sim.warmup_s=5", "--workers", "1",
        "--min-requests", "150", "--service-multiple", "2",
        "--out", str(out), "--quiet",
    ])  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0
    assert {
        "compare.parquet",
        "compare.csv",
        "goodput.csv",
        "ttft.png",
        "itl.png",
        "slo_attainment.png",
    } <= {p.name for p in out.iterdir()}
    g = pd.read_csv(out / "goodput.csv")
    assert g["scenario"].tolist() == ["ci-disaggregated", "ci-colocated-vllm"]
    assert "goodput" in text and "vs best" in text
    # vllm misses the max-gap SLO at every rate swept: its goodput is searched below them
    assert g["goodput_per_s"][1] < 0.5 and g["ratio_to_best"][1] < 0.1
    assert set(g["status"]) <= {"found", "refined"} and g["confirmed"].all()
    assert (
        g["confirm_duration_s"] >= 2 * g["search_duration_s"].where(g["status"] == "found", 0)
    ).all()
    line = next(ln for ln in text.splitlines() if "ci-colocated-vllm" in ln)
    assert " over " in line  # the confirmation run: attainment over its length
