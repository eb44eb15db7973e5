"""Bad input names what the user gave, in one line (docs/safety.md):

- a Python API error names the argument passed, not a command-line flag the caller never
  typed (``sweep(seeds=0)`` said ``--seeds 0``, ``ProcessExecutor(0)`` ``--workers 0``,
  an ``overrides`` item ``--set ...``, a ``params`` key ``--param ...``), while the
  command line keeps naming its flags;
- an output path holding a control character (``--out $'r\\n'``) is refused: it made a
  folder named ``r`` + newline;
- ``--scheduler ''`` (an unset variable) is refused: it ran on local processes silently
  (tests/test_sweep_keeps_runs.py);
- a ``calibrate`` GPU id that is no catalog GPU names ``--gpu`` (``--gpu ''`` was
  reported as a missing ``profiles/.json``).
"""

from __future__ import annotations

import pytest

from disaggsim import UserError, load_scenario
from disaggsim.cli import main
from disaggsim.sweep import DaskExecutor, ProcessExecutor, sweep
from disaggsim.sweep.executors import make_executor
from tests.conftest import REPO

CHUNKED = REPO / "scenarios" / "ci" / "chunked.yaml"
RATE = {"workload.rate_per_s": [1]}


@pytest.mark.parametrize(
    ("call", "api", "argv", "cli"),
    [
        (
            lambda: sweep(CHUNKED, RATE, seeds=0),
            "seeds=0: must be an integer from 1 to 1,000",
            ["sweep", str(CHUNKED), "--param", "workload.rate_per_s=1", "--seeds", "0"],
            "--seeds 0: must be an integer from 1 to 1,000",
        ),
        (
            lambda: sweep(CHUNKED, {"seed": [1, 2]}),
            "params key 'seed': sweep seeds with seeds=, not as a parameter",
            ["sweep", str(CHUNKED), "--param", "seed=1,2"],
            "--param seed: sweep seeds with --seeds, not as a parameter",
        ),
        (
            lambda: sweep(CHUNKED, {"workload.rate_per_sx": [1]}),
            "chunked.yaml: params key 'workload.rate_per_sx': unknown key 'rate_per_sx'",
            ["sweep", str(CHUNKED), "--param", "workload.rate_per_sx=1"],
            "chunked.yaml: --param workload.rate_per_sx: unknown key 'rate_per_sx'",
        ),
        (
            lambda: sweep(
                CHUNKED,
                {
                    "workload.rate_per_s": list(range(1, 200)),
                    "decode_pool.max_batch_seqs": list(range(1, 201)),
                },
            ),  # fmt: skip
            "params: 199 × 200 simulations, more than the 10,000",
            [
                "sweep",
                str(CHUNKED),
                "--param",
                "workload.rate_per_s=1:2:199",
                "--param",
                "decode_pool.max_batch_seqs=1:200:200",
            ],  # fmt: skip
            "--param: 199 × 200 simulations, more than the 10,000",
        ),
        (
            lambda: load_scenario(CHUNKED, ["nokey=1"]),
            "overrides item 'nokey=1': unknown key 'nokey' at top level",
            ["run", str(CHUNKED), "--set", "nokey=1"],
            "--set nokey=1: unknown key 'nokey' at top level",
        ),
        (
            lambda: load_scenario(CHUNKED, ["failures.workers.0.at_s=1"]),
            "give the whole list instead: an overrides item 'failures.workers=[...]'",
            ["run", str(CHUNKED), "--set", "failures.workers.0.at_s=1"],
            "give the whole list instead: --set 'failures.workers=[...]'",
        ),
        (
            lambda: ProcessExecutor(0),
            "ProcessExecutor(workers=0): must be >= 1",
            ["sweep", str(CHUNKED), "--param", "workload.rate_per_s=1", "--workers", "0"],
            "--workers 0: must be >= 1",
        ),
        (
            lambda: DaskExecutor(address="nope").map(len, [1]),
            "DaskExecutor(address='nope'): not a scheduler address",
            None,
            None,
        ),
        (
            lambda: make_executor(scheduler="nope"),
            "scheduler='nope': expected an address like tcp://host:8786",
            ["sweep", str(CHUNKED), "--param", "workload.rate_per_s=1", "--scheduler", "nope"],
            "--scheduler nope: expected an address like tcp://host:8786",
        ),
    ],
)
def test_errors_name_the_argument_in_the_api_and_the_flag_on_the_command_line(
    work, capsys, call, api, argv, cli
):
    with pytest.raises(UserError) as e:
        call()
    assert api in str(e.value) and "--" not in str(e.value), str(e.value)
    if argv is None:
        return
    assert main([*argv, "--quiet"] if argv[0] == "sweep" else argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and cli in err, err
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("name", ["r\n", "r\tx", "a\x1b[31m", "sub/r\r"])
@pytest.mark.parametrize("flag", ["--out", "--trace"])
def test_an_output_path_with_a_control_character_is_refused(work, capsys, name, flag):
    out = ["--out", "r"] if flag == "--trace" else []
    argv = ["run", str(CHUNKED), "--quiet", "--no-plots", *out, flag, name]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{flag} " in err and "holds a control character" in err, err
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize(
    "argv",
    [
        ["calibrate", "validate", "--gpu", ""],
        ["calibrate", "validate", "--gpu", "a100-80gb", "h100"],
        ["calibrate", "show", ""],
        ["calibrate", "fit", "raw", "--gpu", ""],
        ["calibrate", "fit-steps", "raw", "--gpu", "H200"],
        ["calibrate", "validate-steps", "raw", "--gpu", " "],
    ],
)
def test_a_calibrate_gpu_id_not_in_the_catalog_names_the_flag(work, capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    flag = "argument GPU_ID" if argv[1] == "show" else "argument --gpu"
    assert flag in err and "not a catalog GPU id" in err and "a100-80gb, b200" in err, err
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]


def test_an_address_from_the_environment_is_named_as_the_variable(work, capsys, monkeypatch):
    # it was reported as `--scheduler myhost`, a flag the user never typed
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "myhost")
    assert main(["sweep", str(CHUNKED), "--param", "workload.rate_per_s=1", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "disaggsim: error: DASK_SCHEDULER_ADDRESS=myhost: expected an address like tcp://host:8786"
    ), err
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]


def test_a_tls_scheduler_without_tls_configuration_is_one_line(work, capsys):
    # dask raised a TypeError (ssl_context None): a traceback, exit 1
    argv = ["sweep", str(CHUNKED), "--param", "workload.rate_per_s=1", "--quiet"]
    assert main([*argv, "--scheduler", "tls://127.0.0.1:8786"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("disaggsim: error: --scheduler tls://127.0.0.1:8786: cannot connect ("), (
        err
    )
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize(
    ("field", "given", "meant"),
    [
        ("engine", "vlm", "vllm"),  # a close spelling
        ("engine", "trt-llm", "trtllm"),  # the same name but for separators
        ("kv_dtype", "FP8", "fp8"),  # ... or case
        ("router.decode_policy", "round-robin", "round_robin"),
        ("workload.arrival", "possion", "poisson"),
        ("pool.scheduler", "chunk", "chunked"),
        ("engine", "xyz", None),  # nothing close: no guess
    ],
)
def test_a_value_of_a_field_with_several_names_the_one_meant(field, given, meant):
    """A misspelt value of a field that takes a few names (``engine: vlm``) names the one
    meant, as a misspelt key, GPU or model does; it listed the values without it."""
    with pytest.raises(UserError) as e:
        load_scenario(CHUNKED, [f"{field}={given}"])
    line = str(e.value)
    assert f"{field}: Input should be " in line and f"got '{given}'" in line, line
    if meant is None:
        assert "did you mean" not in line, line
    else:
        assert line.endswith(f"got '{given}' (did you mean {meant}?)"), line


def test_a_misspelt_choice_of_a_flag_names_the_one_meant(capsys):
    assert main(["calibrate", "--device", "cuad", "--out", "c"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "disaggsim: error: calibrate: argument --device: invalid choice: 'cuad' (choose "
        "from 'cuda', 'cpu') (did you mean cuda?) (see disaggsim calibrate --help)\n"
    )


PLAN_QUESTION = ["plan", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--isl", "512", "--osl",
                 "100", "--ttft-ms", "1000", "--itl-ms", "50", "--target-rate", "5", "--quick"]  # fmt: skip
COST_DECODE = ["cost", "decode", "--model", "llama-3-70b", "--gpu", "h100-sxm", "--tp", "4",
               "--batch", "32", "--context-tokens", "4096"]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            [*PLAN_QUESTION, "--fabric", "infiniban"],
            "--fabric infiniban: allowed: auto, nvlink, infiniband, roce, pcie "
            "(did you mean infiniband?)",
        ),
        (
            [*PLAN_QUESTION, "--kv-dtype", "FP8"],
            "--kv-dtype FP8: allowed: bf16, fp16, fp8 (did you mean fp8?)",
        ),
        ([*PLAN_QUESTION, "--kv-dtype", "xyz"], "--kv-dtype xyz: allowed: bf16, fp16, fp8"),
        (
            [*COST_DECODE, "--engine", "vlm"],
            "cost decode: --engine: unknown value 'vlm' (allowed: vllm, sglang, trtllm, "
            "vllm-eager-2023, cuda-graphs, eager) (did you mean vllm?)",
        ),
        (
            [*COST_DECODE, "--engine", "xyz"],
            "cost decode: --engine: unknown value 'xyz' (allowed: vllm, sglang, trtllm, "
            "vllm-eager-2023, cuda-graphs, eager)",
        ),
    ],
)
def test_a_misspelt_plan_or_cost_choice_names_the_one_meant(capsys, argv, line):
    # plan's --fabric/--kv-dtype/--weight-dtype and cost's --engine listed the values
    # without the one meant, where scenario fields and argparse choices named it
    assert main(argv) == 2
    assert capsys.readouterr().err == f"disaggsim: error: {line}\n"


# One "did you mean" (disaggsim.errors.closest_hint) serves every path: a scenario's keys
# (in the file and in --set), its tag values, a field's values, a flag's choices, a
# catalog GPU or model, calibrate's --gpu. Each path had its own difflib call: a key or a
# tag value in capitals named nothing, calibrate --gpu named one of two H100s, and a
# catalog id ended "; did you mean ...?" where every other message said "(did you mean
# ...?)".
@pytest.mark.parametrize(
    ("argv", "end"),
    [
        # a key of the file (here through --set's whole section) and a --set path
        (
            ["run", str(CHUNKED), "--set", "sim={DURATION_S: 10}"],
            "sim.DURATION_S: unknown key (did you mean duration_s?) (allowed: ",
        ),
        (
            ["run", str(CHUNKED), "--set", "pool.NUM_WORKERS=2"],
            "unknown key 'NUM_WORKERS' at pool (did you mean num_workers?) (allowed: ",
        ),
        # a tag's value
        (
            ["run", str(CHUNKED), "--set", "workload.output_tokens={dist: FIXED, value: 5}"],
            "workload.output_tokens.dist: unknown value 'FIXED' (did you mean fixed?) (allowed: ",
        ),
        # a catalog id in a scenario
        (
            ["run", str(CHUNKED), "--set", "pool.gpu=H100"],
            "pool.gpu: unknown GPU 'H100' (allowed: a100-80gb, h100-sxm, h100-pcie, h200-sxm, "
            "b200, l40s, h800-sxm) (did you mean h100-sxm or h100-pcie?)",
        ),
        # calibrate --gpu: the GPU's name, and both H100s
        (
            ["calibrate", "show", "NVIDIA H100 80GB HBM3"],
            "'NVIDIA H100 80GB HBM3': not a catalog GPU id (did you mean h100-sxm?) (allowed: ",
        ),
        (
            ["calibrate", "fit", "raw", "--gpu", "H100"],
            "'H100': not a catalog GPU id (did you mean h100-sxm or h100-pcie?) (allowed: ",
        ),
    ],  # fmt: skip
    ids=["key", "set-path", "tag", "catalog", "calibrate-name", "calibrate-h100"],
)
def test_every_path_names_the_one_meant(capsys, argv, end):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("disaggsim: error: "), err
    assert end in err, err


def test_the_one_hint_never_offers_what_was_given_and_joins_several():
    from disaggsim.errors import closest_hint

    assert closest_hint("round-robin", ["round_robin", "random"]) == " (did you mean round_robin?)"
    assert closest_hint("random", ["random"]) == ""  # the name itself: nothing to say
    assert closest_hint(3, ["a"]) == "" and closest_hint("", ["a"]) == ""
    assert closest_hint("xyz", ["vllm", "sglang"]) == ""
    # a mapping: the names compared, the values meant; several prefixed names joined
    names = {"H100 SXM": "h100-sxm", "h100-pcie": "h100-pcie"}
    assert closest_hint("h100 sxm", names) == " (did you mean h100-sxm?)"
    assert closest_hint("h100", ["h100-sxm", "h100-pcie"], key=str.lower, prefix=True) == (
        " (did you mean h100-sxm or h100-pcie?)"
    )
    # same_numbers: a close spelling of another size is no hint
    assert closest_hint("llama-3-7b", ["llama-3-70b"], same_numbers=True, cutoff=0.8) == ""
