"""Seeded CLI fuzz (docs/safety.md): random ``--set`` mutations of shipped scenarios,
random ``disaggsim cost`` queries and random ``sweep`` grids, each through the real CLI
entry point in-process (``disaggsim.cli.main``), each a short run.

Every invocation must end with exit code 0 or 2, never a traceback:

- exit 2: exactly one line on stderr, ``disaggsim: error: ...``, naming what was wrong
  (a mutated field, or for ``cost`` the subcommand), and nothing written;
- exit 0: for ``run``, request conservation in summary.json (every measured request
  completed, rejected, abandoned or still in flight); for ``cost``, finite non-negative
  numbers; for ``sweep``, a table;
- either way nothing written outside the ``--out`` folder (the working folder, which
  holds a user's file, is compared byte for byte before and after).

The cases are drawn once from a fixed seed (the same on every run of the suite); the
larger out-of-suite fuzzers are described in docs/safety.md. Draw a different sample with
``python tests/test_fuzz_cli.py SEED N`` (prints one line per case, "BUG" where one of
the rules above fails).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import random
import re
import shutil
import sys
from pathlib import Path

import pytest

if __name__ == "__main__":  # script mode: import the project and tests/ from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from disaggsim.catalog import GPU_IDS, MODEL_IDS
from disaggsim.cli import main
from disaggsim.errors import UserError
from tests.conftest import REPO

SEED = 20261202
SCENARIOS = REPO / "scenarios"
# every shipped scenario (scenarios/**.yaml: each runs 5 s in about a second)
RUN_BASES = sorted(str(p.relative_to(SCENARIOS)) for p in SCENARIOS.rglob("*.yaml"))
POOLS = ["prefill_pool", "decode_pool", "pool"]
# (field path, values); {p} is a pool section
MUTATIONS: list[tuple[str, list]] = [
    ("{p}.num_workers", [1, 2, 3, 0, 2000]),
    ("{p}.tp", [1, 2, 4, 8, 3]),
    ("{p}.max_batch_seqs", [1, 2, 16, 1000]),
    ("{p}.max_batch_tokens", [16, 100, 512, 65536]),
    ("{p}.gpu_mem_util", [0.3, 0.95, 0.99, 1.5]),
    ("{p}.gpu", ["a100-80gb", "l40s", "h200", "b200", "h100-pcie", "tpu"]),
    ("{p}.scheduler", ["vllm", "chunked", "fifo"]),
    ("weight_dtype", ["fp8", "bf16", "nvfp4", "fp8-block"]),
    ("kv_dtype", ["fp8", "bf16", "int2"]),
    ("engine", ["sglang", "trtllm", "vllm-eager-2023"]),
    ("attention_backend", ["flex", "sdpa-cudnn", "trtllm"]),
    ("first_token_from", ["prefill", "decode"]),
    ("fabric.link", ["pcie", "infiniband", "nvlink", "roce"]),
    (
        "fabric",
        ["{kind: topology}", "{kind: topology, gpus_per_node: 4, placement: {policy: pair}}"],
    ),
    ("router.prefill_policy", ["round_robin", "shortest_queue", "cache_aware", "least_tokens"]),
    ("router.decode_policy", ["round_robin", "fastest_path", "most_free_kv"]),
    ("router.backpressure", ["none", "kv_aware"]),
    ("router.max_queue", [1, 5, 100, -1]),
    ("router.client_timeout_s", [0.5, 2, ".nan"]),
    ("kv.block_tokens", [1, 16, 256]),
    ("kv.admission", ["reserve_full", "on_demand"]),
    ("kv.preemption", ["swap", "recompute"]),
    (
        "failures.random",
        ["[{pool: decode, mtbf_s: 20, mttr_s: 5}]", "[{pool: colocated, mtbf_s: 15, mttr_s: 2}]"],
    ),
    ("failures.workers", ["[{at_s: 2, worker: 'decode:0'}]", "[{at_s: 2, worker: 'colocated:0'}]"]),
    ("failures.links", ["[{start_s: 1, duration_s: 2}]"]),
    ("cache", ["{policy: lru}", "null"]),
    ("slo.ttft_ms", [1, 500, 1e300]),
    ("slo.itl_ms", [0.5, 50]),
    ("slo.itl_statistic", ["max_gap", "tpot", "mean"]),
    ("slo.attainment_target", [0.0, 0.9, 1.0, 2]),
    ("slo.percentile", [50, 99.9, 100]),
    ("workload.rate_per_s", [0.5, 5, 40, ".inf"]),
    (
        "workload.prompt_tokens",
        [
            "{dist: fixed, value: 1}",
            "{dist: fixed, value: 8000}",
            "{dist: uniform, low: 1, high: 2}",
        ],
    ),
    (
        "workload.output_tokens",
        [
            "{dist: fixed, value: 1}",
            "{dist: uniform, low: 1, high: 300}",
            "{dist: fixed, value: 0}",
        ],
    ),
    ("workload.arrival", ["gamma", "poisson", "modulated"]),
    ("workload.num_requests", [1, 2, 50]),
    ("workload.mix_shift", ["{at_s: 2, prompt_tokens: {dist: fixed, value: 3000}}"]),
    ("sim.warmup_s", [0, 4.9, 6]),
    ("sim.max_drain_s", [0, 1]),
    (
        "autoscale",
        [
            "{decode: {min_workers: 1, max_workers: 3, policy: target, interval_s: 1, target: {signal: kv_util, target_value: 0.5}}}"
        ],
    ),
    ("decode_pool.num_worker", [2]),
]
PREFIX = "disaggsim: error: "
LAST_RC: object = None  # the last (exit code, stderr tail), for the printout of __main__


def _invoke(argv: list[str]) -> tuple[object, str, str]:
    """``main(argv)`` in-process: (exit code, stdout, stderr); a traceback is returned as
    the exit code "EXC" with the traceback in place of stderr."""
    import traceback

    global LAST_RC
    out, err = io.StringIO(), io.StringIO()
    LAST_RC = "EXC"
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc: object = main(argv)
    except SystemExit as e:
        rc = e.code
    except BaseException:  # the point of the test: nothing may escape main
        return "EXC", out.getvalue(), err.getvalue() + traceback.format_exc()
    LAST_RC = rc, err.getvalue().strip()[-300:]
    return rc, out.getvalue(), err.getvalue()


def _tree(root: Path, skip: Path | None = None) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for p in sorted(root.rglob("*")):
        if skip is not None and (p == skip or skip in p.parents):
            continue
        out[str(p.relative_to(root))] = p.read_bytes() if p.is_file() else None
    return out


def _one_error_line(rc: object, err: str) -> list[str]:
    """What is wrong with an invocation's exit code and stderr (empty: nothing)."""
    bad = []
    if rc not in (0, 2):
        bad.append(f"exit code {rc!r}")
    if "Traceback" in err:
        bad.append("traceback")
    if rc == 2 and not (err.count("\n") == 1 and err.endswith("\n") and err.startswith(PREFIX)):
        bad.append("not one 'disaggsim: error:' line")
    return bad


# ------------------------------------------------------------------ run --set mutations


_OWN_POOLS = {"disaggregated": ["prefill_pool", "decode_pool"], "colocated": ["pool"]}


def _architecture(base: str) -> str:
    import yaml

    return yaml.safe_load((SCENARIOS / base).read_text())["architecture"]


def run_cases(seed: int, n: int) -> list[tuple[str, list[str]]]:
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        base = rng.choice(RUN_BASES)
        # mostly the scenario's own pool sections (another one is a one-line error)
        own = _OWN_POOLS[_architecture(base)]
        sets = []
        for _ in range(rng.randint(1, 3)):
            path, values = rng.choice(MUTATIONS)
            pool = rng.choice(own if rng.random() < 0.85 else POOLS)
            sets.append(f"{path.format(p=pool)}={rng.choice(values)}")
        cases.append((base, sets))
    return cases


def _named(err: str, sets: list[str]) -> bool:
    """Whether the error line names one of the mutated fields (its path or a key on it)."""
    for s in sets:
        path = s.split("=", 1)[0]
        if path in err:
            return True
        # a key of the path: 'pool.tp=3' on a disaggregated scenario is about 'pool'
        # ('attention_backend' as "attention backend 'x' is not fitted ...")
        keys = [w for k in path.split(".") for w in (k, k.replace("_", " "))]
        if any(re.search(rf"(?<![\w.]){re.escape(k)}\b", err) for k in keys):
            return True
    return False


def check_run(work: Path, base: str, sets: list[str]) -> list[str]:
    out = work / "out"
    argv = ["run", str(SCENARIOS / base), "--out", str(out), "--no-plots", "--quiet"]
    argv += ["--set", "sim.duration_s=5", "--set", "sim.warmup_s=1"]
    for s in sets:
        argv += ["--set", s]
    before = _tree(work)
    rc, _, err = _invoke(argv)
    bad = _one_error_line(rc, err)
    if rc == 2:
        if not _named(err, sets):
            bad.append("the error names none of the mutated fields")
        if _tree(work) != before:
            bad.append("wrote on error")
    elif rc == 0:
        if _tree(work, skip=out) != before:
            bad.append("wrote outside --out")
        s = json.loads((out / "summary.json").read_text())
        parts = sum(
            s[k] for k in ("num_completed", "num_rejected", "num_abandoned", "num_unfinished")
        )
        if parts != s["num_requests"]:
            bad.append(f"conservation: {s['num_requests']} requests, {parts} accounted for")
    return [f"{b}: {err.strip()[-2000:]}" for b in bad]


RUN_CASES = run_cases(SEED, 40)


def _run_id(case: tuple[str, list[str]]) -> str:
    return case[0].removesuffix(".yaml") + ":" + ",".join(case[1])


@pytest.mark.parametrize("case", RUN_CASES, ids=[_run_id(c) for c in RUN_CASES])
def test_fuzz_run(work, case):
    assert check_run(work, *case) == []


# ------------------------------------------------------------------ cost queries

_COST_OPTS = {
    "prefill": [
        "--tp",
        "--batch",
        "--dp",
        "--ep",
        "--gpus",
        "--weight-dtype",
        "--kv-dtype",
        "--engine",
        "--attention-backend",
        "--routing",
        "--imbalance-factor",
    ],
    "decode": [
        "--tp",
        "--dp",
        "--ep",
        "--gpus",
        "--weight-dtype",
        "--kv-dtype",
        "--engine",
        "--attention-backend",
    ],
    "kv": [
        "--kv-dtype",
        "--link",
        "--gpu",
        "--prefill-s",
        "--tp",
        "--host-staging",
        "--nic-gbit-per-s",
    ],
    "gemm": ["--dtype"],
    "decode-attention": ["--kv-dtype"],
    "prefill-attention": [],
}
_COST_REQUIRED = {
    "prefill": ["--model", "--gpu", "--batch", "--prompt-tokens"],
    "decode": ["--model", "--gpu", "--batch", "--context-tokens"],
    "kv": ["--model", "--tokens"],
    "gemm": ["--gpu", "--m", "--n", "--k"],
    "decode-attention": [
        "--gpu",
        "--batch",
        "--context-tokens",
        "--heads",
        "--kv-heads",
        "--head-dim",
    ],
    "prefill-attention": [
        "--gpu",
        "--batch",
        "--prompt-tokens",
        "--heads",
        "--kv-heads",
        "--head-dim",
    ],
}
_INTS = ["1", "2", "3", "7", "8", "64", "1000", "4096", "0", "1048577"]
_TPS = ["1", "2", "4", "8", "3", "16", "0"]


def cost_cases(seed: int, n: int) -> list[list[str]]:
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        sub = rng.choice(sorted(_COST_OPTS))
        argv = [
            "cost",
            *(["op", sub] if sub in ("gemm", "decode-attention", "prefill-attention") else [sub]),
        ]
        opts = _COST_OPTS[sub]
        chosen = list(
            dict.fromkeys(_COST_REQUIRED[sub] + rng.sample(opts, rng.randint(0, min(3, len(opts)))))
        )
        if sub in ("prefill", "decode") and "--gpus" not in chosen and rng.random() < 0.85:
            chosen.append("--tp")  # else "missing --tp (or --gpus)"
        if rng.random() < 0.1:  # a required flag left out
            chosen.remove(rng.choice(_COST_REQUIRED[sub]))
        for o in chosen:
            if o == "--model":
                v = rng.choice(MODEL_IDS)
            elif o == "--gpu":
                v = rng.choice([*GPU_IDS, "tpu"])
            elif o in ("--weight-dtype", "--kv-dtype", "--dtype"):
                v = rng.choice(["bf16", "fp8", "fp16", "nvfp4", "mxfp4", "int4"])
            elif o == "--engine":
                v = rng.choice(["vllm", "sglang", "trtllm", "vllm-eager-2023", "tgi"])
            elif o == "--attention-backend":
                v = rng.choice(["auto", "flex", "trtllm", "sdpa-cudnn", "x"])
            elif o == "--link":
                v = rng.choice(["nvlink", "pcie", "infiniband", "roce", "smoke"])
            elif o == "--host-staging":
                v = rng.choice(["pinned", "pageable", "none"])
            elif o == "--routing":
                v = rng.choice(["balanced", "power_law", "zipf"])
            elif o in ("--prefill-s", "--imbalance-factor", "--nic-gbit-per-s"):
                v = rng.choice(["0", "0.5", "3", "nan", "-1", "inf", "1e300"])
            elif o in ("--tp", "--gpus", "--dp", "--ep"):
                v = rng.choice(_TPS)
            else:
                v = rng.choice(_INTS)
            argv += [o, v]
        cases.append(argv)
    return cases


def check_cost(work: Path, argv: list[str]) -> list[str]:
    before = _tree(work)
    rc, out, err = _invoke(argv)
    bad = _one_error_line(rc, err)
    if _tree(work) != before:
        bad.append("wrote a file")
    sub = " ".join(argv[1:3] if argv[1] == "op" else argv[1:2])
    if rc == 2 and not err.startswith(f"{PREFIX}cost {sub}: "):
        bad.append(f"the error does not start with 'cost {sub}: '")
    if rc == 0:

        def walk(x: object) -> None:
            if isinstance(x, float) and not (math.isfinite(x) and x >= 0):
                bad.append(f"number {x} in the output")
            elif isinstance(x, dict):
                for v in x.values():
                    walk(v)
            elif isinstance(x, list):
                for v in x:
                    walk(v)

        lines = out.strip().splitlines()
        if len(lines) != 1:
            bad.append(f"{len(lines)} output lines")
        for line in lines:
            walk(json.loads(line))
    return [f"{b}: {err.strip()[-2000:]}" for b in bad]


COST_CASES = cost_cases(SEED, 60)


@pytest.mark.parametrize("argv", COST_CASES, ids=[" ".join(a[1:]) for a in COST_CASES])
def test_fuzz_cost(work, argv):
    assert check_cost(work, argv) == []


# ------------------------------------------------------------------ sweep grids

SWEEP_BASES = ["ci/disaggregated.yaml", "ci/chunked.yaml", "ci/colocated-vllm.yaml"]
SWEEP_PARAMS = [
    "workload.rate_per_s=0.5:4:2",
    "workload.rate_per_s=1,2",
    "decode_pool.num_workers=1,2",
    "pool.num_workers=1,2",
    "pool.max_batch_tokens=256,2048",
    "kv.block_tokens=16,32",
    "slo.itl_ms=10:100:2",
    "sim.warmup_s=0:2:2",
    "seed=1:3:2",
    "kv_dtype=bf16,fp8",
    "nonsense.path=1,2",
    "workload.rate_per_s=3:1:2",
    "workload.rate_per_s=1:2:0",
    "workload.rate_per_s=0:2:2",
    "decode_pool.gpu=h100-sxm,tpu",
]


def sweep_cases(seed: int, n: int) -> list[list[str]]:
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        argv = [str(SCENARIOS / rng.choice(SWEEP_BASES))]
        for p in rng.sample(SWEEP_PARAMS, rng.randint(1, 2)):
            argv += ["--param", p]
        if rng.random() < 0.2:
            argv += ["--seeds", rng.choice(["0", "2"])]
        cases.append(argv)
    return cases


def check_sweep(work: Path, args: list[str]) -> list[str]:
    out = work / "out"
    argv = ["sweep", *args, "--out", str(out), "--quiet", "--no-plots", "--workers", "1"]
    argv += ["--set", "sim.duration_s=5", "--set", "sim.warmup_s=1"]
    before = _tree(work)
    rc, _, err = _invoke(argv)
    bad = _one_error_line(rc, err)
    if rc == 2 and _tree(work) != before:
        bad.append("wrote on error")
    if rc == 0:
        if _tree(work, skip=out) != before:
            bad.append("wrote outside --out")
        if not ((out / "sweep.csv").exists() or (out / "sweep.parquet").exists()):
            bad.append("no table")
    return [f"{b}: {err.strip()[-2000:]}" for b in bad]


SWEEP_CASES = sweep_cases(SEED, 10)


@pytest.fixture
def serial_sweeps(monkeypatch):
    """Sweeps in this process (the CLI's process pool would start workers per case)."""
    from disaggsim.sweep import executors

    monkeypatch.setattr(executors, "make_executor", lambda *a, **k: executors.SerialExecutor())


@pytest.mark.parametrize("args", SWEEP_CASES, ids=[" ".join(a[1:]) for a in SWEEP_CASES])
def test_fuzz_sweep(work, serial_sweeps, args):
    assert check_sweep(work, args) == []


# ------------------------------------------------------------------ plan question flags

# a valid question (1 GPU); each case breaks one to three of its flags, so every case is
# a one-line error before any simulation (a plan itself runs minutes: not fuzzed here)
PLAN_ASK = {
    "--model": "llama-3.1-8b",
    "--gpu": "h100-sxm",
    "--gpus": "1",
    "--isl": "200",
    "--osl": "20",
    "--ttft-ms": "1000",
    "--itl-ms": "100",
}
PLAN_BAD: list[tuple[str, list[str]]] = [
    ("--model", ["llama-9b", "", "LLAMA-3.1-8B"]),
    ("--gpu", ["tpu", "h100"]),
    ("--gpus", ["0", "-1", "100000"]),
    (
        "--isl",
        ["0", "abc", "uniform:5:1", "2000000", "lognormal:1000:9", "lognormal:100:nan", "1.5"],
    ),
    ("--osl", ["0", "uniform:1:2000000", "lognormal:100:0.5:2000000", ":"]),
    ("--ttft-ms", ["0", "-5", "nan", "inf", "1e300"]),
    ("--itl-ms", ["0", "nan", "1e20"]),
    ("--itl-statistic", ["mean", "p99"]),
    ("--attainment", ["0", "1.5", "nan"]),
    ("--percentile", ["0", "101", "nan"]),
    ("--fabric", ["smoke", "ethernet"]),
    ("--weight-dtype", ["int3", "fp4"]),
    ("--kv-dtype", ["int4", "released"]),
    ("--seed", ["-1", "99999999999999999999"]),
    ("--max-tokens", ["0", "-2", "5000000"]),
    ("--target-rate", ["0", "-1", "inf", "1e300"]),
    ("--preset", ["nope"]),
    ("--trace", ["missing.csv"]),
    ("--price-per-gpu-hour", ["0", "-1", "nan", "inf", "1e300"]),
    ("--min-requests", ["0", "2000001"]),
    ("--service-multiple", ["0", "nan", "inf", "1e300", "1000.5"]),
]


def plan_cases(seed: int, n: int) -> list[tuple[list[str], list[str]]]:
    """(argv, the flags broken)."""
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        flags = dict(PLAN_ASK)
        broken = []
        for _ in range(rng.randint(1, 3)):
            flag, values = rng.choice(PLAN_BAD)
            flags[flag] = rng.choice(values)
            broken.append(flag)
            if flag == "--target-rate":
                flags.pop("--gpus", None)
        argv = ["plan"]
        for k, v in flags.items():
            argv += [k, v]
        cases.append((argv + ["--quick", "--quiet", "--no-plots"], broken))
    return cases


def check_plan(work: Path, case: tuple[list[str], list[str]]) -> list[str]:
    argv, broken = case
    before = _tree(work)
    rc, _, err = _invoke([*argv, "--out", str(work / "out")])
    bad = _one_error_line(rc, err)
    if rc != 2:
        bad.append(f"exit code {rc!r}, not 2 (every case breaks a flag)")
    elif not any(f in err for f in ["plan:", *broken]):
        bad.append("the error names none of the broken flags")
    if _tree(work) != before:
        bad.append("wrote a file")
    return [f"{b}: {err.strip()[-2000:]}" for b in bad]


PLAN_CASES = plan_cases(SEED, 20)


@pytest.mark.parametrize("case", PLAN_CASES, ids=[" ".join(c[1]) for c in PLAN_CASES])
def test_fuzz_plan_flags(work, case):
    assert check_plan(work, case) == []


# ------------------------------------------------------------------ compare flags

COMPARE_BAD: list[tuple[str, list[str]]] = [
    ("--rate-lo", ["0", "-1", "nan", "inf", "5", "abc"]),
    ("--rate-hi", ["0", "nan", "inf", "0.5"]),
    ("--tol", ["0", "-1", "nan", "inf"]),
    ("--min-requests", ["0", "-3", "2000001", "1.5"]),
    ("--service-multiple", ["0", "-1", "nan", "inf", "1e300", "1000.5"]),
    ("--seeds", ["0", "-1", "1001", "x"]),
    ("--workers", ["0", "-2", "two"]),
    ("--param", ["seed=seeds", "workload.rate_per_s=3:1:0", "nonsense=1,2", "=1", "pool.tp"]),
    ("--set", ["sim.duration_s=-1", "workload.rate_per_s=.nan", "nope=1"]),
]


def compare_cases(seed: int, n: int) -> list[tuple[list[str], list[str]]]:
    """(argv, the flags broken): a goodput comparison of two CI scenarios with one to three
    flags broken, each a one-line error before any run."""
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        flags = {"--rate-lo": "1", "--rate-hi": "4"}
        extra: list[str] = []
        broken = []
        for _ in range(rng.randint(1, 3)):
            flag, values = rng.choice(COMPARE_BAD)
            if flag in ("--param", "--set"):
                value = rng.choice(values)
                extra += [flag, value]
                key = value.partition("=")[0]
                if key:  # the error may name the field rather than the flag
                    broken.append(key)
            else:
                flags[flag] = rng.choice(values)
            broken.append(flag)
        argv = ["compare", str(SCENARIOS / "ci" / "chunked.yaml"),
                str(SCENARIOS / "ci" / "colocated-vllm.yaml")]  # fmt: skip
        for k, v in flags.items():
            argv += [k, v]
        cases.append((argv + extra + ["--quiet", "--no-plots"], broken))
    return cases


def check_compare(work: Path, case: tuple[list[str], list[str]]) -> list[str]:
    argv, broken = case
    before = _tree(work)
    rc, _, err = _invoke([*argv, "--out", str(work / "out")])
    bad = _one_error_line(rc, err)
    if rc != 2:
        bad.append(f"exit code {rc!r}, not 2 (every case breaks a flag)")
    elif not any(f in err for f in ["compare:", "--param", "--set", "seed", *broken]):
        bad.append("the error names none of the broken flags")
    if _tree(work) != before:
        bad.append("wrote a file")
    return [f"{b}: {err.strip()[-2000:]}" for b in bad]


COMPARE_CASES = compare_cases(SEED, 10)


@pytest.mark.parametrize("case", COMPARE_CASES, ids=[" ".join(c[1]) for c in COMPARE_CASES])
def test_fuzz_compare_flags(work, case):
    assert check_compare(work, case) == []


# ------------------------------------------------------------------ mutated scenario files

# A scenario file with one value replaced by another of a wrong or edge kind (chosen by
# the type of the value it replaces), a key deleted or added, or the text itself broken;
# the bases are the shipped scenarios and the catalog fuzzer's drawn scenarios (which
# hold cache tiers, topology fabrics, failures, autoscaling, MoE options, traces).
_GARBAGE = "zzz-not-a-value"


def _value_mutants(v: object) -> list[tuple[str, object]]:
    """(kind, replacement) for a value; kind "garbage" marks one no field should take."""
    wrong_shape = [("garbage", [v]), ("garbage", {"x": v}), ("null", None)]
    if isinstance(v, bool):
        return [("garbage", _GARBAGE), ("number", 2), ("string", "true"), *wrong_shape]
    if isinstance(v, int):
        return [
            ("edge", 0), ("edge", -1), ("edge", v + 1), ("edge", v * 1000 + 1),
            ("edge", 2**31), ("edge", 2**64), ("edge", 10**400), ("edge", 1.5),
            ("edge", float(v)), ("string", str(v)), ("garbage", _GARBAGE),
            ("garbage", True), ("edge", math.inf), ("edge", math.nan), ("string", "1e3"),
            *wrong_shape,
        ]  # fmt: skip
    if isinstance(v, float):
        return [
            ("edge", 0.0), ("edge", -v), ("edge", -1e-9), ("edge", 1e-300), ("edge", 1e300),
            ("edge", math.nan), ("edge", math.inf), ("edge", -math.inf), ("edge", v * 1e6),
            ("edge", v / 1e6), ("string", str(v)), ("garbage", _GARBAGE), ("garbage", False),
            *wrong_shape,
        ]  # fmt: skip
    if isinstance(v, str):
        return [
            ("garbage", ""), ("garbage", " "), ("case", v.upper()), ("garbage", v + "x"),
            ("garbage", v[:-1]), ("garbage", _GARBAGE), ("number", 0), ("number", 1),
            ("garbage", True), ("garbage", "x" * 300), ("garbage", "é" + v),
            ("garbage", "../" + v), ("garbage", v + "\n"), *wrong_shape,
        ]  # fmt: skip
    if isinstance(v, list):
        out: list[tuple[str, object]] = [
            ("edge", []), ("garbage", {"x": 1}), ("garbage", _GARBAGE), ("edge", v[:1]),
            ("edge", v + v), ("garbage", [None]), ("edge", list(reversed(v))),
            ("garbage", [v]), ("null", None),
        ]  # fmt: skip
        return out
    if isinstance(v, dict):
        return [("garbage", []), ("garbage", _GARBAGE), ("null", None), ("edge", {}),
                ("garbage", 5)]  # fmt: skip
    return [("garbage", _GARBAGE)]


def _leaves(node: object, path: tuple = ()) -> list[tuple]:
    """Every path into a scenario mapping (sections and values, list items by index)."""
    out = [path] if path else []
    if isinstance(node, dict):
        for k, v in node.items():
            out += _leaves(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _leaves(v, (*path, i))
    return out


def _get(node, path):
    for k in path:
        node = node[k]
    return node


def _yaml_base(rng: random.Random) -> tuple[str, dict]:
    if rng.random() < 0.5:
        return _yaml_base_of(rng.choice(RUN_BASES))
    return _yaml_base_of(f"catalog:{rng.randrange(10**9)}")


def _yaml_base_of(base: str) -> tuple[str, dict]:
    import yaml

    if not base.startswith("catalog:"):
        raw = yaml.safe_load((SCENARIOS / base).read_text())
        # a short run; a trace path relative to the shipped scenario made absolute
        raw.setdefault("sim", {})["duration_s"] = 3
        raw["sim"].pop("warmup_s", None)
        w = raw.get("workload", {})
        if isinstance(w.get("path"), str):
            w["path"] = str((SCENARIOS / base).parent / w["path"])
        return base, raw
    from tests.test_scenario_properties_catalog import case

    return base, case(1, int(base.removeprefix("catalog:")))


def yaml_cases(seed: int, n: int) -> list[tuple[str, str, str, str]]:
    """(base, mutation kind, the mutated path or text edit, the file's text)."""
    import yaml

    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        base, raw = _yaml_base(rng)
        r = rng.random()
        if r < 0.75:  # one value replaced
            path = rng.choice(_leaves(raw))
            kind, value = rng.choice(_value_mutants(_get(raw, path)))
            _get(raw, path[:-1])[path[-1]] = value
            text = yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)
            where = ".".join(map(str, path))
        elif r < 0.85:  # a key deleted, or an unknown one added
            maps = [p for p in [(), *_leaves(raw)] if isinstance(_get(raw, p), dict)]
            path = rng.choice(maps)
            node = _get(raw, path)
            if node and rng.random() < 0.6:
                key = rng.choice(list(node))
                del node[key]
                kind, where = "deleted", ".".join(map(str, (*path, key)))
            else:
                key = rng.choice(["bogus", "Seed", "num_worker", "rate", "tp "])
                node[key] = 1
                kind, where = "garbage", ".".join(map(str, (*path, key)))
            text = yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)
        else:  # the text broken: cut, a line doubled or dropped, a tab, a stray byte
            text = yaml.safe_dump(raw, sort_keys=False, allow_unicode=True)
            lines = text.splitlines(keepends=True)
            i = rng.randrange(len(lines))
            edit = rng.choice(["cut", "double", "drop", "tab", "byte", "colon", "bom"])
            if edit == "cut":
                text = text[: rng.randrange(len(text))]
            elif edit == "double":
                lines.insert(i, lines[i])
                text = "".join(lines)
            elif edit == "drop":
                del lines[i]
                text = "".join(lines)
            elif edit == "tab":
                lines[i] = "\t" + lines[i]
                text = "".join(lines)
            elif edit == "byte":
                text = text[:i] + "\udcff" + text[i:]
            elif edit == "colon":
                lines[i] = lines[i].replace(":", "=", 1)
                text = "".join(lines)
            else:
                text = "\ufeff" + text
            kind, where = "text", f"{edit}@{i}"
        cases.append((base, kind, where, text))
    return cases


def _base_error(base: str, work: Path) -> str:
    """The error of the unmutated base scenario (a drawn base may be refused itself)."""
    import yaml

    _, raw = _yaml_base_of(base)
    src = work / "in" / "base.yaml"
    src.write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    rc, _, err = _invoke(["run", str(src), "--out", str(work / "base-out"), "--no-plots",
                          "--quiet"])  # fmt: skip
    shutil.rmtree(work / "base-out", ignore_errors=True)
    src.unlink()
    return err.replace(str(src), "<file>") if rc == 2 else ""


def check_yaml(work: Path, case: tuple[str, str, str, str]) -> list[str]:
    base, kind, where, text = case
    src = work / "in" / "mutated.yaml"
    src.parent.mkdir(exist_ok=True)
    src.write_bytes(text.encode("utf-8", "surrogateescape"))
    out = work / "out"
    argv = ["run", str(src), "--out", str(out), "--no-plots", "--quiet"]
    before = _tree(work)
    rc, _, err = _invoke(argv)
    bad = _one_error_line(rc, err)
    if rc == 2:
        if str(src) not in err:
            bad.append("the error does not name the file")
        keys = [k for k in where.split(".") if not k.isdigit()]
        if kind not in ("text", "deleted") and not any(k in err for k in keys):
            if _base_error(base, work) != err.replace(str(src), "<file>"):
                bad.append("the error names no key of the mutated path")
        if _tree(work) != before:
            bad.append("wrote on error")
    elif rc == 0:
        if _tree(work, skip=out) != before:
            bad.append("wrote outside --out")
        if kind == "garbage" and where not in ("name", "description"):
            bad.append(f"accepted a garbage value at {where}")
        s = json.loads((out / "summary.json").read_text())
        parts = sum(
            s[k] for k in ("num_completed", "num_rejected", "num_abandoned", "num_unfinished")
        )
        if parts != s["num_requests"]:
            bad.append(f"conservation: {s['num_requests']} requests, {parts} accounted for")
    return [f"{b}: {err.strip()[-2000:]}" for b in bad]


YAML_CASES = yaml_cases(SEED, 20)


@pytest.mark.parametrize("case", YAML_CASES, ids=[f"{c[0]}:{c[1]}:{c[2]}" for c in YAML_CASES])
def test_fuzz_yaml(work, case):
    assert check_yaml(work, case) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [("workload.kind", "synthetic\n"), ("name", "a\nb"), ("workload.path", "trace.csv\n")],
)
def test_an_error_echoing_a_value_with_a_newline_is_one_line(work, field, value):
    """A string value ending in a newline, echoed by its error (pydantic's "Input tag
    'synthetic\n' ...", a trace path), split the error over two lines (found by
    yaml_cases, seed 7004). Control characters are written as escapes now."""
    import yaml

    raw = yaml.safe_load((SCENARIOS / "ci" / "chunked.yaml").read_text())
    node = raw
    *above, last = field.split(".")
    for k in above:
        node = node[k]
    node[last] = value
    if field == "workload.path":
        raw["workload"] = {"kind": "trace", "path": value, "format": "azure"}
    src = work / "s.yaml"
    src.write_text(yaml.safe_dump(raw))
    rc, _, err = _invoke(["run", str(src), "--out", "out", "--quiet", "--no-plots"])
    assert rc == 2 and _one_error_line(rc, err) == [], err
    assert "\\n" in err and last in err, err


def test_a_trace_path_that_is_no_file_names_workload_path(work):
    """`workload.path` naming a missing file or a folder said only "<path>: trace file
    not found", not the field."""
    base = {"name": "t", "seed": 1, "model": "llama-3-8b", "architecture": "colocated",
            "pool": {"gpu": "h100-sxm", "num_workers": 1, "scheduler": "vllm"},
            "slo": {"ttft_ms": 1, "itl_ms": 1},
            "sim": {"duration_s": 1}}  # fmt: skip
    from disaggsim.run import simulate

    for path, what in (("nope.csv", "no such file"), (str(work), "a folder")):
        s = {**base, "workload": {"kind": "trace", "path": path, "format": "azure"}}
        with pytest.raises(UserError) as e:
            simulate(s)
        assert str(e.value).startswith("<scenario>: workload.path: "), str(e.value)
        assert what in str(e.value), str(e.value)


@pytest.mark.parametrize(
    ("command", "flag", "value"),
    [
        *((c, f, v) for c in ("compare", "plan")
          for f, v in (("--service-multiple", "inf"), ("--service-multiple", "1e300"),
                       ("--service-multiple", "1001"), ("--min-requests", "2000001"))),
        ("plan", "--price-per-gpu-hour", "inf"),
    ],
)  # fmt: skip
def test_run_length_flags_no_run_can_honour_are_refused(work, monkeypatch, command, flag, value):
    """`--service-multiple inf` made every goodput run's length NaN, reported as the
    scenario's `sim.duration_s: ... got 'nan'`; `--min-requests` beyond the 2,000,000
    requests a run may hold ran runs of millions of requests (over 5 minutes for one
    compare of two CI scenarios), and so did `--service-multiple 1e300` (each run shrunk
    to the requests bound); `plan --price-per-gpu-hour inf` priced every candidate
    at inf $. Each is refused naming the flag now, before any run (the comparison and
    the plan are replaced by a raise: a case that reached them fails at once)."""
    import importlib

    import disaggsim.plan

    def reached(*_a, **_k):
        raise AssertionError(f"{command} {flag} {value} reached its runs")

    # the module, not disaggsim.sweep's function of the same name
    monkeypatch.setattr(importlib.import_module("disaggsim.sweep.compare"), "compare", reached)
    monkeypatch.setattr(disaggsim.plan, "plan", reached)
    s = str(SCENARIOS / "ci" / "chunked.yaml")
    argv = [command, s, *(["--rate-lo", "1", "--rate-hi", "2"] if command == "compare" else [])]
    argv += ["--quick"] if command == "plan" else []
    rc, _, err = _invoke([*argv, flag, value, "--out", "out", "--quiet", "--no-plots"])
    assert rc == 2 and _one_error_line(rc, err) == [], err
    shown = f"{float(value):g}" if flag == "--service-multiple" else value  # 1e300: 1e+300
    assert err.startswith(f"{PREFIX}{flag} {shown}"), err
    assert _tree(work) == {"keep.txt": b"a user's file\n"}


def test_regress_against_a_reference_folder_that_does_not_exist_is_bad_input(work):
    """`regress --reference-dir /nonexist` ran every CI scenario and then reported each as
    drift (exit 1, "no reference ..."): a path naming no folder is bad input (exit 2)
    before any run."""
    rc, _, err = _invoke(["regress", "--ci-dir", str(SCENARIOS / "ci"), "--reference-dir",
                          str(work / "nope"), "--only", "chunked", "--quiet"])  # fmt: skip
    assert rc == 2 and _one_error_line(rc, err) == [], err
    assert err.startswith(f"{PREFIX}--reference-dir {work / 'nope'}: no such folder"), err


# ------------------------------------------------------------------ trace replay options

TRACES = REPO.parent / "shared" / "data" / "traces"
_TRACE_FILES = [
    "AzureLLMInferenceTrace_code.csv",
    "AzureLLMInferenceTrace_conv.csv",
    "mooncake_conversation_trace.jsonl",
    "mooncake_synthetic_trace.jsonl",
]
_TRACE_OPTS: dict[str, list] = {
    "format": ["azure", "mooncake", "auto"],
    "start_s": [0.0, 0.5, 3599.9, 1e6],
    "window_s": [1e-9, 0.5, 5.0, 1e9],
    "rate_scale": [1e-9, 1e-3, 1.0, 50.0],
    "rate_per_s": [1e-6, 0.5, 100.0],
    "max_prompt_tokens": [1, 100, 1048576],
    "max_output_tokens": [1, 50],
    "max_tokens": [1, 64],
    "num_requests": [1, 5, 40],
    "bucketed_timestamps": ["keep", "spread"],
    "hash_block_tokens": [1, 7, 512, 1048576],
}


def trace_cases(seed: int, n: int) -> list[dict]:
    """Scenarios replaying a trace of ../shared/data with one to six odd options (a
    format for the other kind of file, a start past the end, windows of a nanosecond
    to 30 years, rates scaled by 1e-9, a prefix cache on a trace with or without
    hash_ids), colocated or disaggregated."""
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        w: dict = {"kind": "trace", "path": str(TRACES / rng.choice(_TRACE_FILES))}
        for k in rng.sample(sorted(_TRACE_OPTS), rng.randint(1, 6)):
            w[k] = rng.choice(_TRACE_OPTS[k])
        s: dict = {"name": "trace-fuzz", "seed": rng.randint(0, 100), "model": "llama-3.1-8b",
                   "slo": {"ttft_ms": 1000, "itl_ms": 100}, "workload": w,
                   "sim": {"duration_s": rng.choice([2.0, 10.0])}}  # fmt: skip
        if rng.random() < 0.5:
            s["architecture"] = "colocated"
            s["pool"] = {"gpu": "h100-sxm", "num_workers": 2, "max_batch_tokens": 131072,
                         "scheduler": rng.choice(["vllm", "chunked"])}  # fmt: skip
        else:
            s["architecture"] = "disaggregated"
            s["prefill_pool"] = {"gpu": "h100-sxm", "num_workers": 2, "max_batch_tokens": 131072}
            s["decode_pool"] = {"gpu": "h100-sxm", "num_workers": 2}
            s["fabric"] = {"link": "nvlink"}
        if rng.random() < 0.3:
            s["cache"] = {"policy": rng.choice(["radix", "lru"])}
        cases.append(s)
    return cases


def check_trace(work: Path, s: dict) -> list[str]:
    import yaml

    if not TRACES.is_dir():
        return []
    src = work / "in" / "trace.yaml"
    src.parent.mkdir(exist_ok=True)
    src.write_text(yaml.safe_dump(s, sort_keys=False))
    out = work / "out"
    before = _tree(work)
    rc, _, err = _invoke(["run", str(src), "--out", str(out), "--no-plots", "--quiet"])
    bad = _one_error_line(rc, err)
    if rc == 2:
        if str(src) not in err:
            bad.append("the error does not name the file")
        if _tree(work) != before:
            bad.append("wrote on error")
    elif rc == 0:
        summ = json.loads((out / "summary.json").read_text())
        parts = sum(summ[k] for k in ("num_completed", "num_rejected", "num_abandoned",
                                      "num_unfinished"))  # fmt: skip
        if parts != summ["num_requests"]:
            bad.append(f"conservation: {summ['num_requests']} requests, {parts} accounted for")
    return [f"{b}: {err.strip()[-2000:]}" for b in bad]


TRACE_CASES = trace_cases(SEED, 8)


@pytest.mark.parametrize("case", TRACE_CASES, ids=[str(sorted(c["workload"])) for c in TRACE_CASES])
def test_fuzz_trace_options(work, case):
    assert check_trace(work, case) == []


# ------------------------------------------------------------------ --out and --trace paths

# Where a short run is asked to write: paths drawn from names that collide with each other,
# with the user's file, with folders above, with an earlier result (first state of the
# working folder), through links and files; --out and --trace together.
_OUT_NAMES = [
    "r", "r/", "./r", "r/t.json", "r/summary.json", "r/sub/t.json", "r/.disaggsim-result.json",
    "t.json", "keep.txt", "keep.txt/x", ".", "..", "", " ", "r/..", "link", "link/t.json",
    "a b", "deep/er/r", ".hidden", "-dash", "r/../r", "user", "user/t.json", "t.json/x",
    "r2", "r/r2", "é", "x" * 230, "y" * 300, "/".join(["d" * 200] * 25),
    "~", "~/r", "~user/r", "r/sub/deeper", "results", "t/", "r/",
]  # fmt: skip
_OUT_STATES = ["none", "earlier-result", "empty", "user-folder", "link", "trace-file"]


def out_cases(seed: int, n: int) -> list[tuple[str, str | None, str | None]]:
    """(state of the working folder, --out, --trace)."""
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        out = rng.choice([None, *_OUT_NAMES])
        trace = rng.choice(_OUT_NAMES) if rng.random() < 0.6 else None
        cases.append((rng.choice(_OUT_STATES), out, trace))
    return cases


_OUT_BASE = ["run", str(SCENARIOS / "quickstart.yaml"), "--no-plots", "--quiet"]
_OUT_BASE += ["--set", "sim.duration_s=2", "--set", "sim.warmup_s=0"]


def _out_state(work: Path, state: str) -> None:
    if state == "earlier-result":
        _invoke([*_OUT_BASE, "--out", str(work / "r")])
        assert (work / "r" / ".disaggsim-result.json").is_file()
    elif state == "empty":
        (work / "r").mkdir()
    elif state == "user-folder":
        (work / "user").mkdir()
        (work / "user" / "notes.txt").write_text("a user's notes\n")
    elif state == "link":
        (work / "elsewhere").mkdir()
        (work / "link").symlink_to(work / "elsewhere")
    elif state == "trace-file":
        (work / "t.json").write_text('{"a user\'s": "json"}\n')


def check_out(work: Path, case: tuple[str, str | None, str | None]) -> list[str]:
    state, out, trace = case
    _out_state(work, state)
    argv = list(_OUT_BASE)
    if out is not None:
        argv += ["--out", out]
    if trace is not None:
        argv += ["--trace", trace]
    before = _tree(work)
    rc, _, err = _invoke(argv)
    bad = _one_error_line(rc, err)
    after = _tree(work)
    if rc == 2 and after != before:
        bad.append(f"wrote on error: {sorted(set(after.items()) ^ set(before.items()))[:4]}")
    if rc == 0:
        for flag, p in (("--out", out), ("--trace", trace)):
            if p is not None and (p == "~" or p.startswith("~") and "/" in p):
                bad.append(f"{flag} {p} ran: a leading ~ no shell expanded")
        if trace is not None and trace.endswith("/"):
            bad.append(f"--trace {trace} ran: a file written where a folder was named")
        if out is not None and state == "earlier-result" and out.startswith("r/"):
            if (work / out).resolve().parent != (work / "r").resolve().parent:
                bad.append(f"--out {out} ran: a result folder inside an earlier result")
        outs = [work / (out if out is not None else "results/quickstart")]
        outs += [work / trace] if trace is not None else []
        if trace is not None:
            # a trace written into an earlier result folder joins its marker (safety.md)
            marker = (work / trace).parent.resolve() / ".disaggsim-result.json"
            if before.get(os.path.relpath(marker, work.resolve())):
                outs.append(marker)
        changed = {k for k in set(after) | set(before) if after.get(k) != before.get(k)}
        for k in changed:
            p = (work / k).resolve()
            if not any(p == o.resolve() or o.resolve() in p.parents for o in outs):
                if not any(p in o.resolve().parents for o in outs):  # a folder made above
                    bad.append(f"touched {k}")
        if (work / "keep.txt").read_text() != "a user's file\n":
            bad.append("changed keep.txt")
        folder = outs[0].resolve()
        if not (folder / "summary.json").is_file():
            bad.append("no summary.json in --out")
        t = work / trace if trace is not None else None  # "r/../r": r/ resolved first
        if t is not None and not (t.parent.resolve() / t.name).is_file():
            bad.append("no trace file")
    return [f"{b}: {err.strip()[-2000:]}" for b in bad]


OUT_CASES = out_cases(SEED, 12)


@pytest.mark.parametrize("case", OUT_CASES, ids=[" ".join(map(str, c)) for c in OUT_CASES])
def test_fuzz_out_paths(work, case):
    assert check_out(work, case) == []


@pytest.mark.parametrize(
    ("out", "trace"),
    [
        ("r", "r"),  # the result folder itself
        ("r", "r/summary.json"),  # a file the result folder writes
        ("r", "r/.disaggsim-result.json"),
        ("r", "r/sub/t.json"),  # a folder inside the result folder
        ("r/sub", "r"),  # a path holding the result folder
    ],
)
def test_a_trace_the_result_folder_collides_with_is_refused_before_running(work, out, trace):
    """`run --out r --trace r` wrote the result folder, then refused the trace (a folder
    now): exit 2 with files written (found by out_cases, this file). Refused first now,
    nothing written."""
    before = _tree(work)
    rc, _, err = _invoke([*_OUT_BASE, "--out", out, "--trace", trace])
    assert rc == 2 and _one_error_line(rc, err) == [], err
    assert err.startswith(f"{PREFIX}--trace "), err
    assert _tree(work) == before


def test_an_out_path_through_dotdot_replaces_the_earlier_result_in_place(work):
    """`run --out r` then `run --out r/../r`: the earlier result was renamed aside, then
    the new one renamed to "r/../r", which no longer resolved (r was gone): traceback,
    the earlier result hidden in .r.old-XXXX (found by out_cases, this file). The writers
    now act on the location they checked."""
    rc, _, err = _invoke([*_OUT_BASE, "--out", "r"])
    assert rc == 0, err
    rc, out, err = _invoke([*_OUT_BASE, "--out", "r/../r"])
    assert rc == 0, err
    assert "replaced the earlier disaggsim run result there: 5 files" in out
    assert sorted(p.name for p in work.iterdir()) == ["keep.txt", "r"]
    assert (work / "r" / "summary.json").is_file()


def test_a_trace_path_through_a_missing_folder_and_dotdot_makes_no_folder(work):
    """`--trace r/../r` with no r: the writer made folder r (mkdir of the parent "r/..")
    and then refused its own trace path as a folder, after writing the results (exit 2,
    files written). Now the trace is the file r."""
    rc, _, err = _invoke([*_OUT_BASE, "--out", "r2", "--trace", "r/../r"])
    assert rc == 0, err
    assert (work / "r").is_file() and (work / "r2" / "summary.json").is_file()


def test_every_file_a_result_folder_writes_is_listed(tmp_path):
    """RESULT_FILE_NAMES (the names a --trace may not take) lists every file a result
    folder with every optional part writes: plots, a topology fabric, a prefix cache."""
    import yaml

    from disaggsim.output import MARKER
    from disaggsim.run import RESULT_FILE_NAMES, simulate, write_results

    s = yaml.safe_load((SCENARIOS / "prefix" / "chat-sessions.yaml").read_text())
    s["fabric"] = {"kind": "topology"}
    s["sim"] = {"duration_s": 3.0}
    folder = write_results(simulate(s), tmp_path / "r")
    names = {p.name for p in folder.iterdir()} - {MARKER}
    assert {"links.parquet", "cache.png", "timeline.png"} <= names, names
    assert names <= set(RESULT_FILE_NAMES), names - set(RESULT_FILE_NAMES)


_LONG_NAME = "x" * 300  # longer than a file name may be (NAME_MAX 255)
_LONG_PATH = "/".join(["d" * 200] * 25)  # longer than a path may be (PATH_MAX 4096)


@pytest.mark.parametrize(
    ("argv", "start"),
    [
        (["run", f"{_LONG_NAME}.yaml"], f"{_LONG_NAME}.yaml: cannot read (File name too long)"),
        (["run", f"{_LONG_PATH}.yaml"], f"{_LONG_PATH}.yaml: cannot read"),
        ([*_OUT_BASE, "--out", _LONG_PATH], f"--out {_LONG_PATH}: cannot use this path"),
        ([*_OUT_BASE, "--out", "r", "--trace", f"{_LONG_PATH}/t.json"], "--trace "),
        (["sweep", str(SCENARIOS / "quickstart.yaml"), "--out", _LONG_PATH], f"--out {_LONG_PATH}"),
        ([*_OUT_BASE, "--out", "r", "--set", f"workload={{kind: trace, path: {_LONG_NAME}}}"],
         f"{SCENARIOS / 'quickstart.yaml'}: workload.path: "),
    ],
    ids=["scenario-name", "scenario-path", "out", "trace", "sweep-out", "workload-path"],
)  # fmt: skip
def test_a_path_the_system_refuses_is_one_line_naming_it(work, argv, start):
    """Paths longer than the filesystem takes raised OSError (File name too long) out of
    `Path.is_file()` / `is_symlink()` (Python 3.11 swallows only a missing file): a
    traceback from `run`, `sweep`, `--out`, `--trace` and a workload.path (found by
    yaml_cases, seed 7006). Each is one line naming the path, nothing written."""
    rc, _, err = _invoke(argv)
    assert rc == 2 and _one_error_line(rc, err) == [], err[-3000:]
    assert err.startswith(PREFIX + start), err[:400]
    assert _tree(work) == {"keep.txt": b"a user's file\n"}


def test_an_os_error_no_check_caught_is_still_one_line(work, monkeypatch):
    """The backstop at the CLI boundary: an OSError no check turned into a message (a
    disk that fills while a result is written) is one line naming the file, exit 2."""
    from disaggsim.cli import run as run_cmd

    def full_disk(args):
        raise OSError(28, "No space left on device", "out/requests.parquet")

    monkeypatch.setattr(run_cmd, "cmd_run", full_disk)
    rc, _, err = _invoke(["run", "s.yaml"])
    assert rc == 2 and err == f"{PREFIX}out/requests.parquet: No space left on device\n", err


# ------------------------------------------------------------------ mutated trace files

# The head of a trace of ../shared/data (5-40 rows) with one to three edits of its text:
# a cell replaced by a wrong or edge value, a row cut, a column dropped or doubled, the
# header lost, a key given twice, the bytes re-encoded (UTF-16, latin-1, a BOM, CR line
# ends, a NUL). Run colocated or disaggregated with or without a prefix cache: refused
# in one line naming the trace file (or workload.*), or run conserving requests. A cell
# no trace may hold ("garbage": a negative, NaN, a word, 10**400) must not run.
_CELL_GARBAGE = ["-1", "nan", "NaN", "inf", "abc", "", "1e400", "1" + "0" * 400,
                 "1" + "0" * 5000, "0x10", "1_000", "true", "null", "[1]", "{}",
                 "2000000", "-0.5", "1.5", "5\x00"]  # fmt: skip
# values a trace may hold (a quoted number, an Arabic-Indic digit five): run or refused
_CELL_EDGE = ["0", "1", "1048576", " 7 ", "7.0", "3", '"5"', "\u0665"]
_STAMP_GARBAGE = ["", "abc", "2023-13-45 99:99:99", "0001-01-01 00:00:00",
                  "9999-12-31 23:59:59", "2023-11-16 18:17:03+01:00", "1700000000",
                  "2023-11-16T18:17:03Z", "-1", "1e400"]  # fmt: skip
_TEXT_EDITS = ["cut", "cut-row", "drop-column", "extra-cell", "no-header", "double-header",
               "utf16", "latin1", "bom", "crlf", "cr", "nul", "blank-lines", "empty",
               "dup-key", "array-line", "long-line", "swap-rows"]  # fmt: skip


def _trace_head(name: str, rows: int) -> str:
    with open(TRACES / name, encoding="utf-8") as f:
        return "".join(f.readline() for _ in range(rows + (name.endswith(".csv"))))


def _json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _edit_cell(text: str, csv: bool, rng: random.Random) -> tuple[str, str]:
    lines = text.splitlines(keepends=True)
    body = range(1, len(lines)) if csv else range(len(lines))
    i = rng.choice(list(body))
    if csv:
        cells = lines[i].rstrip("\n").split(",")
        j = rng.randrange(len(cells))
        pool = _STAMP_GARBAGE if j == 0 else _CELL_GARBAGE + _CELL_EDGE
        v = rng.choice(pool)
        kind = "edge" if v in _CELL_EDGE else "garbage"
        cells[j] = v.replace(",", ";")
        lines[i] = ",".join(cells) + "\n"
        return "".join(lines), f"{kind}:row{i}:col{j}={v[:12]!r}"
    try:
        record = json.loads(lines[i])
    except ValueError:
        # a line an earlier edit of this case left unreadable (an integer of 5,000
        # digits): the first line still whole, else an edit of the text
        whole = [k for k in body if _json_object(lines[k])]
        if not whole:
            return _edit_text(text, csv, rng)
        i = whole[0]
        record = json.loads(lines[i])
    key = rng.choice([*record, "max_tokens", "hash_ids"])
    v = rng.choice(_CELL_GARBAGE + _CELL_EDGE + ["[]", "[-1]", "[1.5]", '["a"]', "[[1]]"])
    if key not in record:
        kind = "garbage"  # on one line only: refused (a key on every line or on none)
    elif key == "hash_ids":
        kind = "edge" if v in ("[]", "[-1]", "[1]") else "garbage"
    elif key == "timestamp":  # milliseconds: any non-negative finite number
        kind = "edge" if v in [*_CELL_EDGE, "1.5", "2000000"] else "garbage"
    else:
        kind = "edge" if v in _CELL_EDGE else "garbage"
    raw = json.dumps(record)
    literal = v if v.strip() and v not in ("abc", "5\x00", "\u0665") else json.dumps(v)
    if key in record:
        raw = re.sub(
            rf'"{key}": (\[[^\]]*\]|[^,}}]+)', lambda m: f'"{key}": {literal}', raw, count=1
        )
    else:
        raw = raw[:-1] + f', "{key}": {literal}}}'
    lines[i] = raw + "\n"
    return "".join(lines), f"{kind}:line{i}:{key}={v[:12]!r}"


def _edit_text(text: str, csv: bool, rng: random.Random) -> tuple[str | bytes, str]:
    lines = text.splitlines(keepends=True)
    edit = rng.choice(_TEXT_EDITS)
    if len(lines) < 2 or not all(lines):  # an earlier edit left (almost) nothing
        return text, "text:none"
    i = rng.randrange(1 if csv else 0, len(lines))
    out: str | bytes = text
    if edit == "cut":
        out = text[: rng.randrange(len(text))]
    elif edit == "cut-row":
        lines[i] = lines[i][: rng.randrange(len(lines[i]))] + "\n"
        out = "".join(lines)
    elif edit == "drop-column" and csv:
        j = rng.randrange(3)
        out = "".join(",".join(c for k, c in enumerate(ln.rstrip("\n").split(",")) if k != j)
                      + "\n" for ln in lines)  # fmt: skip
    elif edit == "extra-cell":
        lines[i] = lines[i].rstrip("\n") + (",9\n" if csv else "x\n")
        out = "".join(lines)
    elif edit == "no-header" and csv:
        out = "".join(lines[1:])
    elif edit == "double-header" and csv:
        out = "".join([lines[0], *lines[1:i], lines[0], *lines[i:]])
    elif edit == "utf16":
        out = text.encode("utf-16")
    elif edit == "latin1":
        out = text[:i].encode() + "é".encode("latin-1") + text[i:].encode()
    elif edit == "bom":
        out = "\ufeff" + text
    elif edit == "crlf":
        out = text.replace("\n", "\r\n")
    elif edit == "cr":
        out = text.replace("\n", "\r")
    elif edit == "nul":
        out = text[:i] + "\x00" + text[i:]
    elif edit == "blank-lines":
        out = "\n\n" + "\n\n".join(lines) + "\n  \n"
    elif edit == "empty":
        out = rng.choice(["", "\n", "   \n\n"])
    elif edit == "dup-key" and not csv:
        lines[i] = lines[i].replace("{", '{"input_length": 3, ', 1)
        out = "".join(lines)
    elif edit == "array-line" and not csv:
        lines[i] = "[" + lines[i].rstrip("\n") + "]\n"
        out = "".join(lines)
    elif edit == "long-line":
        lines[i] = lines[i].rstrip("\n") + " " * 200_000 + "\n"
        out = "".join(lines)
    elif edit == "swap-rows":
        lines[i], lines[-1] = lines[-1], lines[i]
        out = "".join(lines)
    kind = (
        "edge" if edit in ("crlf", "cr", "bom", "blank-lines", "swap-rows", "long-line") else "text"
    )
    return out, f"{kind}:{edit}@{i}"


def tracefile_cases(seed: int, n: int) -> list[dict]:
    """(name, edits, file bytes, scenario) for a mutated head of a shared trace."""
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        name = rng.choice(_TRACE_FILES)
        csv = name.endswith(".csv")
        text: str | bytes = _trace_head(name, rng.randint(5, 40))
        edits = []
        steps = sorted(rng.random() < 0.6 for _ in range(rng.randint(1, 3)))
        for cell in reversed(steps):  # cell edits first, on rows still whole
            if isinstance(text, bytes):
                break
            text, e = _edit_cell(text, csv, rng) if cell else _edit_text(text, csv, rng)
            edits.append(e)
        w = {"kind": "trace", "path": "t" + Path(name).suffix}
        if rng.random() < 0.3:
            w["format"] = rng.choice(["azure", "mooncake", "auto"])
        if rng.random() < 0.3:
            w["bucketed_timestamps"] = rng.choice(["keep", "spread"])
        s: dict = {"name": "tracefile-fuzz", "seed": rng.randint(0, 100),
                   "model": "llama-3.1-8b", "slo": {"ttft_ms": 1000, "itl_ms": 100},
                   "workload": w, "sim": {"duration_s": 1e6, "max_drain_s": 600}}  # fmt: skip
        s["architecture"] = "colocated"
        s["pool"] = {"gpu": "h100-sxm", "num_workers": 2, "max_batch_tokens": 131072,
                     "scheduler": "chunked"}  # fmt: skip
        if not csv and rng.random() < 0.4:
            s["cache"] = {"policy": "radix"}
        data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape")
        cases.append({"name": name, "edits": edits, "data": data, "scenario": s})
    return cases


def check_tracefile(work: Path, case: dict) -> list[str]:
    import yaml

    if not TRACES.is_dir():
        return []
    src = work / "in" / "s.yaml"
    src.parent.mkdir(exist_ok=True)
    (src.parent / case["scenario"]["workload"]["path"]).write_bytes(case["data"])
    src.write_text(yaml.safe_dump(case["scenario"], sort_keys=False))
    out = work / "out"
    before = _tree(work)
    rc, _, err = _invoke(["run", str(src), "--out", str(out), "--no-plots", "--quiet"])
    bad = _one_error_line(rc, err)
    if rc == 2:
        if str(src.parent) not in err and "workload." not in err:
            bad.append("the error names neither the trace file nor a workload field")
        if _tree(work) != before:
            bad.append("wrote on error")
    elif rc == 0:
        edits = case["edits"]  # a text edit (a cut, a dropped row) may remove the garbage
        if any(e.startswith("garbage:") for e in edits) and not any(
            e.startswith("text:") for e in edits
        ):
            bad.append("ran a trace holding a value no trace may hold")
        summ = json.loads((out / "summary.json").read_text())
        parts = sum(summ[k] for k in ("num_completed", "num_rejected", "num_abandoned",
                                      "num_unfinished"))  # fmt: skip
        if parts != summ["num_requests"]:
            bad.append(f"conservation: {summ['num_requests']} requests, {parts} accounted for")
    return [f"{b}: {err.strip()[-2000:]}" for b in bad]


TRACEFILE_CASES = tracefile_cases(SEED, 10)


@pytest.mark.parametrize("case", TRACEFILE_CASES, ids=[f"{c['name']}:{'+'.join(c['edits'])}"
                                                       for c in TRACEFILE_CASES])  # fmt: skip
def test_fuzz_trace_file(work, case):
    assert check_tracefile(work, case) == []


# ------------------------------------------------------------------ every command's flags

# Each case is one command line of a subcommand (every leaf of the argument parser: run,
# sweep, compare, regress, plan, bench, calibrate and its subcommands, cost and its
# subcommands) built from a short valid base by one to three edits drawn from the
# parser itself: a flag given an odd value (empty, a dash, NaN, a huge or negative
# number, a path to a file, a folder, nothing), a choice flag a wrong choice, a switch
# given a value, a flag repeated, an unknown flag, a positional left out or doubled. The
# commands that run for minutes (compare, plan, regress, bench, calibrate's measurements
# and validate) always get a flag no value of which is valid, so each is refused in one
# line before any work; the others may run (short). Exit 0 or 2, one line, no
# traceback, nothing written outside --out.
_Q = str(SCENARIOS / "ci" / "chunked.yaml")
_SHORT = ["--set", "sim.duration_s=3", "--set", "sim.warmup_s=0"]
_FLAG_BASES: dict[str, list[str]] = {
    "run": [_Q, *_SHORT, "--quiet", "--no-plots", "--out", "out"],
    "sweep": [_Q, "--param", "workload.rate_per_s=1,2", *_SHORT, "--workers", "1", "--quiet",
              "--no-plots", "--out", "out"],
    "compare": [_Q, _Q, "--rate-lo", "1", "--rate-hi", "2", "--quiet", "--no-plots",
                "--out", "out"],
    "regress": ["--ci-dir", str(SCENARIOS / "ci"), "--reference-dir", "ref", "--only",
                "chunked", "--quiet"],
    "plan": ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1", "--isl", "200",
             "--osl", "20", "--ttft-ms", "1000", "--itl-ms", "100", "--quick", "--quiet",
             "--no-plots", "--out", "out"],
    "bench": ["--num-requests", "200"],
    "calibrate": ["--device", "cpu", "--quick", "--ops", "gemm", "--out", "raw"],
    "calibrate fit": ["raw", "--gpu", "h100-sxm"],
    "calibrate show": ["h100-sxm"],
    "calibrate validate": ["--gpu", "h100-sxm"],
    "calibrate validate-steps": ["raw", "--gpu", "h100-sxm"],
    "calibrate fit-steps": ["raw", "--gpu", "h100-sxm"],
    "cost prefill": ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1", "--batch",
                     "2", "--prompt-tokens", "100"],
    "cost decode": ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1", "--batch",
                    "2", "--context-tokens", "100"],
    "cost kv": ["--model", "llama-3.1-8b", "--tokens", "100"],
    "cost op gemm": ["--gpu", "h100-sxm", "--m", "8", "--n", "8", "--k", "8"],
    "cost op decode-attention": ["--gpu", "h100-sxm", "--batch", "2", "--context-tokens", "64",
                                 "--heads", "8", "--kv-heads", "8", "--head-dim", "64"],
    "cost op prefill-attention": ["--gpu", "h100-sxm", "--batch", "2", "--prompt-tokens",
                                  "64", "--heads", "8", "--kv-heads", "8", "--head-dim", "64"],
}  # fmt: skip
# commands that run for minutes when every flag is valid: a case always breaks one
_SLOW = {"compare", "plan", "regress", "bench", "calibrate", "calibrate validate"}
# a value of each of these is refused whatever it is, before any work
_ALWAYS_BAD = {
    "compare": ("--rate-lo", ["-1", "nan", "0", "abc"]),
    "plan": ("--gpus", ["0", "-1", "x", "1.5"]),
    "regress": ("--workers", ["0", "-2", "x"]),
    "bench": ("--num-requests", ["0", "-5", "1e3", "x", "3000000"]),
    "calibrate": ("--ops", ["nonsense", ",", "gemm,,x"]),
    "calibrate validate": ("--gpu", ["tpu", "", "H100"]),
}
_ODD_VALUES = ["", " ", "-", "--", "0", "-1", "1.5", "nan", "inf", "-inf", "1e400",
               "9" * 30, "é", "x" * 300, "a,b", ":", "=", "=x", "../", "/", ".", "keep.txt",
               "keep.txt/x", "nope/nope", "/dev/null", "\t", "h100-sxm", "1", "2"]  # fmt: skip


# odd values of a flag's own kind (a scheduler address Dask cannot parse was a traceback)
_ODD_FLAG_VALUES = {
    "--scheduler": ["tcp://", "tcp://host", "a://b", "inproc://x", "tcp://[::1", "tcp://:"],
}


def _leaf_parsers() -> dict[str, argparse.ArgumentParser]:
    from disaggsim.cli import build_parser

    out: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if prefix:
            out[" ".join(prefix)] = parser
        for s in subs:
            for name, sp in s.choices.items():
                walk(sp, [*prefix, name])

    walk(build_parser(), [])
    return {k: v for k, v in out.items() if k in _FLAG_BASES}


# Valid values of the flags of the commands that run in seconds (run, sweep, cost, show):
# half the cases give one to three of them (a combination that should run; a refusal
# there is still one line). Before, nearly every case was refused (seed 9401: 6 of 60
# ran), so the flags' valid combinations were barely run.
_VALID_FLAG_VALUES: dict[str, list[str]] = {
    "--set": ["workload.rate_per_s=0.5", "seed=5", "pool.max_batch_tokens=512",
              "pool.max_batch_seqs=16", "engine=sglang", "slo.ttft_ms=300",
              "workload.output_tokens={dist: fixed, value: 8}", "kv_dtype=fp8",
              "pool.scheduler=chunked", "attention_backend=auto", "sim.warmup_s=1",
              "workload.prompt_tokens.max=2000"],
    "--param": ["pool.max_batch_seqs=16,32", "engine=vllm,sglang",
                "slo.ttft_ms=200:400:2", "kv_dtype=bf16,fp8"],
    "--seeds": ["1", "2"],
    "--workers": ["1"],
    "--out": ["out2", "sub/out3"],
    "--trace": ["t.json", "out/trace.json"],
    "--profile": [str(REPO / "disaggsim" / "hardware" / "profiles" / "h100_sxm.json")],
}  # fmt: skip
_FAST = {"run", "sweep", "calibrate show", *(k for k in _FLAG_BASES if k.startswith("cost "))}


def _valid_values(command: str, action: argparse.Action) -> list[str]:
    """Values ``action``'s flag takes in ``command`` (empty: none known): the table
    above, argparse choices, else a ``cost`` field's kind, choices and bounds."""
    flag = action.option_strings[-1]
    if flag in _VALID_FLAG_VALUES:
        return _VALID_FLAG_VALUES[flag]
    if action.choices:
        return [str(c) for c in action.choices]
    if command.startswith("cost "):
        from disaggsim.cli.cost import COMMANDS

        field = {f.flag: f for f in COMMANDS[command[len("cost ") :]][1]}.get(flag)
        if field is None:
            return []
        if field.choices:
            return list(field.choices)
        if field.kind == "int":
            lo = max(int(field.minimum), 0)
            return [str(v) for v in (lo, 1, 2, 8, 64, 4096) if lo <= v <= field.maximum]
        if field.kind == "float":
            return ["1.0", "1.5"]
    return []


def _valid_edits(command: str, argv: list[str], options: list, rng: random.Random) -> list[str]:
    """One to three flags of ``command`` given valid values (switches given as such)."""
    edits = []
    known = [a for a in options if a.nargs == 0 or _valid_values(command, a)]
    known = [a for a in known if a.option_strings[-1] not in ("--input", "--scheduler")]
    for _ in range(rng.choice([1, 2, 3])):
        action = rng.choice(known)
        flag = action.option_strings[-1]
        if action.nargs == 0:
            argv.append(flag)
            edits.append(f"valid {flag}")
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(rng.choice(action.option_strings))
            edits.append(f"valid {argv[-1]}")
            continue
        value = rng.choice(_valid_values(command, action))
        argv += [flag, value]
        edits.append(f"valid {flag} {value[:24]!r}")
    return edits


def flag_cases(seed: int, n: int) -> list[tuple[str, list[str], list[str]]]:
    """(command, argv after the command, the edits)."""
    rng = random.Random(seed)
    leaves = _leaf_parsers()
    cases = []
    for _ in range(n):
        if rng.random() < 0.5:  # a valid combination of a command that runs in seconds
            command = rng.choice(sorted(_FAST))
            argv = list(_FLAG_BASES[command])
            options = [a for a in leaves[command]._actions if a.option_strings and a.dest != "help"]
            cases.append((command, argv, _valid_edits(command, argv, options, rng)))
            continue
        command = rng.choice(sorted(_FLAG_BASES))
        parser = leaves[command]
        argv = list(_FLAG_BASES[command])
        options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
        edits = []
        for _ in range(rng.choice([1, 1, 2, 3])):
            r = rng.random()
            action = rng.choice(options)
            flag = action.option_strings[-1]
            if r < 0.6:  # a flag given an odd value (a switch: given one)
                if action.nargs == 0:
                    argv.append(f"{flag}={rng.choice(_ODD_VALUES[:8])}")
                    edits.append(f"{flag}=value")
                    continue
                valid = [str(c) for c in (action.choices or [])] or ["1", "2", "out2"]
                value = rng.choice(valid if rng.random() < 0.4 else _ODD_VALUES)
                if flag in _ODD_FLAG_VALUES and rng.random() < 0.5:
                    value = rng.choice(_ODD_FLAG_VALUES[flag])
                argv += [flag, value]
                edits.append(f"{flag} {value[:12]!r}")
            elif r < 0.7:  # a flag repeated, or with its value missing at the end
                argv += [flag] if action.nargs == 0 or rng.random() < 0.5 else [flag, "1"]
                edits.append(f"{flag} again")
            elif r < 0.8:
                argv.append(rng.choice(["--bogus", "-x", "--out-", "---", "--=1"]))
                edits.append("unknown flag")
            elif r < 0.9:  # a positional left out or doubled
                if argv and not argv[0].startswith("-"):
                    if rng.random() < 0.5:
                        argv = argv[1:]
                        edits.append("positional left out")
                    else:
                        argv = [argv[0], *argv]
                        edits.append("positional doubled")
            else:
                argv.insert(rng.randrange(len(argv) + 1), rng.choice(_ODD_VALUES))
                edits.append("stray word")
        if command in _SLOW:
            flag, values = _ALWAYS_BAD[command]
            argv += [flag, rng.choice(values)]
            edits.append(f"{flag} bad")
        cases.append((command, argv, edits))
    return cases


def check_flags(work: Path, case: tuple[str, list[str], list[str]]) -> list[str]:
    command, args, _ = case
    (work / "raw").mkdir(exist_ok=True)
    (work / "ref").mkdir(exist_ok=True)  # a copy: regress --update may rewrite it
    shutil.copy(REPO / "results" / "reference" / "chunked.json", work / "ref")
    before = _tree(work)
    rc, _, err = _invoke([*command.split(), *args])
    bad = _one_error_line(rc, err)
    after = _tree(work)
    if rc == 2 and after != before:
        bad.append(f"wrote on error: {sorted(set(after) ^ set(before))[:4]}")
    if rc == 0:
        outs = [work / a for i, a in enumerate(args) if i and args[i - 1] in ("--out", "--trace")]
        outs += [work / "raw", work / "ref"]
        for k in {k for k in set(after) | set(before) if after.get(k) != before.get(k)}:
            p = work / k
            if not any(p == o or o in p.parents or p in o.parents for o in outs):
                bad.append(f"touched {k}")
    return [f"{b}: {err.strip()[-2000:]}" for b in bad]


FLAG_CASES = flag_cases(SEED, 16)


@pytest.mark.parametrize("case", FLAG_CASES, ids=[f"{c[0]}:{'+'.join(c[2])}" for c in FLAG_CASES])
def test_fuzz_flags(work, serial_sweeps, case):
    assert check_flags(work, case) == []


# ------------------------------------------------------------------ the Python API

# Each case is one call of the public API (a notebook's use) with one or two arguments
# replaced by a value of an odd kind (None, a number, a string of overrides, bytes, a
# numpy number or array, a class, YAML text, a mapping with one value replaced by a
# numpy or odd value, ...). It must return, or raise UserError with one line; any other
# exception (TypeError, AttributeError, RecursionError, yaml's RepresenterError) is a
# bug, and nothing is written outside the case's out folder.
_API_QUICK = ["sim.duration_s=2", "sim.warmup_s=0"]


def _api_odd(rng: random.Random, work: Path, raw: dict) -> tuple[str, object]:
    from decimal import Decimal
    from fractions import Fraction

    import numpy as np
    import yaml

    from disaggsim import SerialExecutor
    from disaggsim.sweep import RunLengthRule

    text = yaml.safe_dump(raw, sort_keys=False)
    pool: list[tuple[str, object]] = [
        ("None", None), ("int", 3), ("float", 2.5), ("bool", True), ("str", "x"),
        ("empty str", ""), ("bytes", b"x"), ("empty list", []), ("empty dict", {}),
        ("overrides list", ["seed=3"]), ("overrides str", "seed=3"), ("np.int64", np.int64(2)),
        ("np.float64", np.float64(1.5)), ("np array", np.array([1.0, 2.0])),
        ("2-d array", np.ones((2, 2))), ("nan", math.nan), ("inf", math.inf),
        ("object", object()), ("class", SerialExecutor), ("missing path", Path("nope.yaml")),
        ("folder", work), ("yaml text", text), ("one-line yaml", "name: x"),
        ("list of dicts", [raw, raw]), ("tuple", (1, 2)), ("set", {1, 2}),
        # 2026-12-04: numbers of other kinds, words for switches, functions
        ("fraction", Fraction(3, 2)), ("decimal", Decimal("2.5")), ("word no", "no"),
        ("np.bool", np.True_), ("function", lambda *a: None), ("rule", RunLengthRule()),
    ]  # fmt: skip
    return rng.choice(pool)


def _api_mutated(rng: random.Random, raw: dict) -> tuple[str, dict]:
    import copy

    import numpy as np

    raw = copy.deepcopy(raw)
    path = rng.choice(_leaves(raw))
    old = _get(raw, path)
    choices: list[tuple[str, object]] = list(_value_mutants(old))
    if isinstance(old, (int, float)) and not isinstance(old, bool):
        choices += [("numpy", np.float64(old)), ("numpy", np.int64(int(old) if math.isfinite(old) else 1)),
                    ("numpy", np.array([old]))]  # fmt: skip
    kind, value = rng.choice(choices)
    if rng.random() < 0.2:  # a structure holding itself
        kind, value = "cycle", raw
    _get(raw, path[:-1])[path[-1]] = value
    return f"{'.'.join(map(str, path))}={kind}", raw


def api_cases(seed: int, n: int) -> list[tuple[str, int]]:
    """(function, case seed): the arguments are drawn when the case runs (they hold
    numpy values and paths of the case's folder)."""
    rng = random.Random(seed)
    funcs = ["load_scenario", "simulate", "sweep", "goodput", "compare", "write_results"]
    return [(rng.choice(funcs), rng.randrange(10**9)) for _ in range(n)]


def _api_call(work: Path, case: tuple[str, int]) -> tuple[str, object]:
    """(description, a callable making the call)."""
    import disaggsim as ds

    func, case_seed = case
    rng = random.Random(case_seed)
    _, raw = _yaml_base_of(rng.choice(SWEEP_BASES))
    raw["sim"] = {"duration_s": 2, "warmup_s": 0}
    scenario: object = raw
    if rng.random() < 0.5:
        what, scenario = _api_mutated(rng, raw)
    else:
        what, scenario = _api_odd(rng, work, raw) if rng.random() < 0.5 else ("valid", raw)
    odd_name, odd = _api_odd(rng, work, raw)
    out = work / "out"
    if func == "load_scenario":
        args = [scenario, odd if rng.random() < 0.5 else list(_API_QUICK)]
        return f"load_scenario({what}, {odd_name})", lambda: ds.load_scenario(*args)
    if func == "simulate":
        over = odd if rng.random() < 0.4 else list(_API_QUICK)
        if rng.random() < 0.3:  # a keyword argument odd instead
            key = rng.choice(["progress", "stop_on_certain_miss"])
            kw = {key: odd}
            return f"simulate({what}, {key}={odd_name})", lambda: ds.simulate(
                scenario, list(_API_QUICK), **kw
            )
        return f"simulate({what}, {odd_name})", lambda: ds.simulate(scenario, over)
    if func == "sweep":
        r = rng.random()
        params = odd if r < 0.3 else {RATE_PATH_FUZZ: odd} if r < 0.6 else {RATE_PATH_FUZZ: [1]}
        executor = odd if rng.random() < 0.3 else None
        seeds = odd if rng.random() < 0.3 else 1
        return (
            f"sweep({what}, params {odd_name}, seeds, executor)",
            lambda: ds.sweep(scenario, params, seeds, executor),
        )
    if func == "goodput":  # a bad rate, tolerance or executor always: no search runs
        which = rng.choice(["rate_lo", "rate_hi", "tol_per_s", "executor", "rule", "progress",
                            "retest", "stop_early", "seeds"])  # fmt: skip
        kw: dict = {"rate_lo": 1.0, "rate_hi": 2.0}
        if which in ("rule", "progress", "retest", "stop_early", "seeds"):
            kw["rate_hi"] = 0.5  # refused in turn where the odd value is a valid one
            kw[which] = odd
        else:
            kw[which] = odd if not isinstance(odd, (int, float)) or isinstance(odd, bool) else -1
        if which == "executor" and odd is None:
            kw["executor"] = "serial"
        return f"goodput({what}, {which}={odd_name})", lambda: ds.goodput(scenario, **kw)
    if func == "compare":  # the scenarios argument odd, or a bad rate: no search runs
        scenarios = odd if rng.random() < 0.5 else [scenario, raw]
        kw = {"rate_lo": 1.0, "rate_hi": 0.5}
        key = rng.choice([None, "params", "same_gpus", "rule", "progress", "tol_per_s"])
        if key is not None:
            kw[key] = odd
        return f"compare({odd_name}, {key})", lambda: ds.compare(scenarios, **kw)
    target = odd if rng.random() < 0.5 else out
    if isinstance(target, (str, Path)) and target not in ("", ".") and target != work:
        target = out  # a name of the case's own is a result folder to write, not an odd value

    plots = odd if rng.random() < 0.2 else True

    def write():
        result = ds.simulate(raw, list(_API_QUICK)) if rng.random() < 0.7 else odd
        return ds.write_results(result, target, plots)

    return f"write_results({odd_name})", write


RATE_PATH_FUZZ = "workload.rate_per_s"


def check_api(work: Path, case: tuple[str, int]) -> list[str]:
    global LAST_RC
    what, call = _api_call(work, case)
    before = _tree(work, skip=work / "out")
    bad = []
    try:
        result = call()
        LAST_RC = (0, what)
    except UserError as e:
        LAST_RC = (2, f"{what}: {str(e)[:200]}")
        if "\n" in str(e):
            bad.append(f"{what}: a UserError of more than one line: {str(e)[:300]!r}")
        # an API caller passed arguments: a message naming a command-line flag
        # (--seeds, --set, --param, --workers, --scheduler) names one they never typed
        flag = re.search(r"(?<![\w-])--(seeds|set|param|workers|scheduler|out)\b", str(e))
        if flag:
            bad.append(f"{what}: names the flag {flag.group(0)}: {str(e)[:300]!r}")
    except BaseException as e:  # the point of the fuzz: nothing else may escape
        import traceback

        LAST_RC = ("EXC", what)
        tb = traceback.format_exc().strip().replace("\n", " | ")[-800:]
        bad.append(f"{what}: {type(e).__name__}: {tb}")
        return bad
    else:
        summary = getattr(result, "summary", None)
        if summary is not None:
            s = summary.to_dict()
            parts = sum(s[k] for k in ("num_completed", "num_rejected", "num_abandoned",
                                       "num_unfinished"))  # fmt: skip
            if parts != s["num_requests"]:
                bad.append(f"{what}: conservation {s['num_requests']} != {parts}")
    if _tree(work, skip=work / "out") != before:
        bad.append(f"{what}: wrote outside out/")
    return bad


API_CASES = api_cases(SEED, 12)


@pytest.mark.parametrize("case", API_CASES, ids=[f"{c[0]}:{c[1]}" for c in API_CASES])
def test_fuzz_api(work, case):
    assert check_api(work, case) == []


# ------------------------------------------------------------------ regress references

# Each case is the committed reference of scenarios/ci/chunked.yaml with one edit (a value
# replaced by a wrong or edge value of its kind, a key deleted or added, the text cut or
# given a stray byte), checked by `regress --only chunked`: exit 0 or 1 (a drift), or 2
# in one line naming the reference file; never a traceback; nothing written.
_REF = REPO / "results" / "reference" / "chunked.json"


def reffile_cases(seed: int, n: int) -> list[tuple[str, str]]:
    """(the edit, the file's text)."""
    rng = random.Random(seed)
    base = json.loads(_REF.read_text())
    cases = []
    for _ in range(n):
        doc = json.loads(json.dumps(base))
        r = rng.random()
        if r < 0.7:
            top = rng.choice(["grid", "seeds", "metrics", "points", "points", "format"])
            paths = [p for p in _leaves(doc) if p[0] == top]
            path = rng.choice(paths)
            kind, value = rng.choice(_value_mutants(_get(doc, path)))
            if isinstance(value, float) and not math.isfinite(value):
                value = str(value)  # JSON holds no NaN/inf literal a writer would emit
            _get(doc, path[:-1])[path[-1]] = value
            edit = f"{'.'.join(map(str, path))}={kind}"
            text = json.dumps(doc)
        elif r < 0.85:
            key = rng.choice(list(doc))
            if rng.random() < 0.5:
                del doc[key]
                edit = f"-{key}"
            else:
                doc["extra"] = 1
                edit = "+extra"
            text = json.dumps(doc)
        else:
            text = json.dumps(doc)
            i = rng.randrange(len(text))
            text, edit = rng.choice([(text[:i], "cut"), (text[:i] + "\x00" + text[i:], "nul"),
                                     (text[:i] + "}" + text[i:], "brace")])  # fmt: skip
        cases.append((edit, text))
    return cases


def check_reffile(work: Path, case: tuple[str, str]) -> list[str]:
    (work / "ref").mkdir(exist_ok=True)
    (work / "ref" / "chunked.json").write_text(case[1])
    before = _tree(work)
    argv = ["regress", "--ci-dir", str(SCENARIOS / "ci"), "--reference-dir", "ref", "--only",
            "chunked", "--quiet", "--workers", "1"]  # fmt: skip
    rc, _, err = _invoke(argv)
    bad = [b for b in _one_error_line(rc, err) if not (rc == 1 and b.startswith("exit code"))]
    if rc == 2 and "chunked.json" not in err:
        bad.append("the error does not name the reference file")
    if _tree(work) != before:
        bad.append("wrote a file")
    return [f"{b}: {err.strip()[-2000:]}" for b in bad]


REFFILE_CASES = reffile_cases(SEED, 4)


@pytest.mark.parametrize("case", REFFILE_CASES, ids=[c[0] for c in REFFILE_CASES])
def test_fuzz_reference_file(work, serial_sweeps, case):
    assert check_reffile(work, case) == []


# ------------------------------------------------------------------ sweeps that stop

# A sweep stopped after a random number of finished runs (a signal to itself, or its run
# raising inside a worker), then run again: without --resume it must refuse kept runs,
# with --resume (over the same or a grown grid) write the table of an uninterrupted
# sweep, in-process, and leave nothing but its result folder (docs/safety.md, "Sweeps
# that stop").
STOP_BASES = ["ci/chunked.yaml", "ci/disaggregated.yaml", "ci/colocated-vllm.yaml"]
STOP_PARAMS = {
    "workload.rate_per_s": [1, 2, 3],
    "kv.block_tokens": [16, 32],
    "slo.itl_ms": [50, 100],
    "sim.warmup_s": [0, 1],
}
STOP_SHORT = ["sim.duration_s=6", "sim.warmup_s=1"]
STOP_CHILD = """
import importlib, os, signal, sys
from disaggsim.cli import main
from disaggsim.errors import UserError
J = importlib.import_module("disaggsim.sweep.journal")
how, at = sys.argv[1], int(sys.argv[2])
# Ctrl-C as a terminal sends it, even where this harness was started in the background (a
# shell's `cmd &` ignores SIGINT, and the child inherited that: seed 10301 "exit 0")
signal.signal(signal.SIGINT, signal.default_int_handler)
# and a hangup as a closing terminal sends it, even where it was started under nohup
# (SIGHUP ignored and inherited: disaggsim then rightly keeps it ignored)
signal.signal(signal.SIGHUP, signal.SIG_DFL)

def stop():
    if how == "raise":  # as a worker's bad-input error comes back (a trace it cannot read)
        raise UserError("stopped by the fuzz case")
    os.kill(os.getpid(), getattr(signal, how))

core = importlib.import_module("disaggsim.sweep.core")
real_run, real_record = core.run_tasks, J.Journal.record
def run_tasks(*a, **k):  # the sweep's runs start: stopped before any finished
    if at == 0:
        stop()
    return real_run(*a, **k)
def record(self, index, summary):
    real_record(self, index, summary)
    if self.num_kept == at:
        stop()
core.run_tasks, J.Journal.record = run_tasks, record
sys.exit(main(sys.argv[3:]))
"""


def stop_cases(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        params = dict(rng.sample(sorted(STOP_PARAMS.items()), rng.randint(1, 2)))
        params = {k: v[: rng.randint(1, len(v))] for k, v in params.items()}
        seeds = rng.choice([1, 1, 2])
        total = seeds * math.prod(len(v) for v in params.values())
        grown = None
        if rng.random() < 0.3:  # resumed over a grid with one more value
            k = rng.choice(sorted(params))
            extra = [v for v in STOP_PARAMS[k] if v not in params[k]]
            if extra:
                grown = {**params, k: [*params[k], extra[0]]}
        cases.append({
            "base": rng.choice(STOP_BASES), "params": params, "seeds": seeds,
            "how": rng.choice(["SIGINT", "SIGTERM", "SIGHUP", "SIGKILL", "raise"]),
            "at": rng.randint(0, total - 1), "workers": rng.choice([1, 2]), "grown": grown,
        })  # fmt: skip
    # the scenario file edited between the stop and --resume (drawn apart, so that the
    # cases drawn before 2026-12-03's fifth session stay as they were): a comment (every
    # kept run reused) or its seed (none reused with one seed: they stay, named, for the other
    # sweep; with two, a kept run of the second seed is the edited file's first-seed run)
    edits = random.Random(seed + 7919)
    for c in cases:
        c["edit"] = edits.choice([None, None, "comment", "seed"])
    return cases


def _stop_scenario(case: dict) -> str:
    # an edited case's file is a copy in the working folder (which the checks expect)
    return "s.yaml" if case.get("edit") else str(SCENARIOS / case["base"])


def _stop_argv(case: dict, params: dict) -> list[str]:
    argv = ["sweep", _stop_scenario(case), "--out", "s", "--quiet", "--no-plots"]
    for k, v in params.items():
        argv += ["--param", f"{k}={','.join(map(str, v))}"]
    argv += ["--seeds", str(case["seeds"])]
    return argv + [a for x in STOP_SHORT for a in ("--set", x)]


def check_stop(work: Path, case: dict) -> list[str]:
    import signal as sig
    import subprocess

    import pandas as pd

    from disaggsim.sweep import SerialExecutor, sweep

    edit = case.get("edit")
    if edit:
        shutil.copy(SCENARIOS / case["base"], work / "s.yaml")
    mine = ["s.yaml"] if edit else []
    argv = _stop_argv(case, case["params"])
    total = case["seeds"] * math.prod(len(v) for v in case["params"].values())
    with open(work.parent / f"{work.name}.stop-err", "w+") as err_file:
        p = subprocess.Popen(
            [sys.executable, "-c", STOP_CHILD, case["how"], str(case["at"]), *argv,
             "--workers", str(case["workers"])],
            cwd=work, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
            stderr=err_file, start_new_session=True,
        )  # fmt: skip
        try:
            rc = p.wait(timeout=300)
        finally:
            try:
                os.killpg(p.pid, sig.SIGKILL)  # a killed sweep's pool (its forkserver)
            except ProcessLookupError:
                pass
        err_file.seek(0)
        err = err_file.read()
    how, at = case["how"], case["at"]
    bad = []
    expected_rc = {"SIGINT": 130, "raise": 2, "SIGKILL": -9}.get(how)
    if expected_rc is None:
        expected_rc = 128 + getattr(sig, how)
    if rc != expected_rc:
        bad.append(f"exit {rc}, expected {expected_rc}")
    kept = f"{at} of {total} runs finished and are kept in s.partial/"
    if how != "SIGKILL":
        lines = err.strip().splitlines()
        if len(lines) != 1:
            bad.append("not one line")
        elif (kept in lines[0]) != (at > 0):
            bad.append("kept runs not said" if at else "kept runs said, none finished")
    names = sorted(x.name for x in work.iterdir())
    want = ["keep.txt", "s.partial"] if at > 0 or how == "SIGKILL" else ["keep.txt"]
    if how == "SIGKILL":  # no cleanup runs: the lock that held s stays, taken over later
        want.append(".s.disaggsim-lock")
    if names != sorted(want + mine):
        bad.append(f"left {names}")
    if at > 0:
        rc2, _, err2 = _invoke([*argv, "--workers", "1"])
        if rc2 != 2 or "--resume" not in err2:
            bad.append(f"kept runs not refused without --resume (exit {rc2})")
    if edit == "comment":
        with open(work / "s.yaml", "a") as f:
            f.write("# edited after the stop\n")
    elif edit == "seed":
        text = (work / "s.yaml").read_text()
        seed = int(re.search(r"^seed: (\d+)$", text, flags=re.M).group(1))  # type: ignore[union-attr]
        (work / "s.yaml").write_text(text.replace(f"seed: {seed}\n", f"seed: {seed + 1}\n"))
    params = case["grown"] or case["params"]
    rc3, out3, err3 = _invoke([*_stop_argv(case, params), "--workers", "1", "--resume"])
    # the kept runs are another sweep's now; but with several seeds the unedited file's run
    # of seed s + k (k >= 1) is the edited file's run of seed (s + 1) + (k - 1): the same
    # resolved scenario and seed, so the same result (journal.fingerprint), and it may be
    # reused; with one seed none may (the resumed table must equal a fresh sweep either way)
    others = edit == "seed" and at > 0
    left = at
    if rc3 != 0:
        bad.append(f"--resume exit {rc3}: {err3.strip()[-300:]}")
    else:
        said = " ".join(out3.split())
        if at > 0 and not others and f"{at} reused from s.partial/" not in said:
            bad.append(f"reuse not said: {out3.strip()[-200:]}")
        if others:
            m = re.search(r"(\d+) reused from s\.partial/", said)
            reused = int(m.group(1)) if m else 0
            left = at - reused
            if (case["seeds"] == 1 and reused) or not 0 <= reused <= at:
                bad.append(f"runs of the unedited file reused: {out3.strip()[-300:]}")
            elif left and f"s.partial/ keeps {left} run" not in said:
                bad.append(f"runs of the unedited file not named: {out3.strip()[-300:]}")
        expected = sweep(
            work / _stop_scenario(case), params, seeds=case["seeds"],
            executor=SerialExecutor(), overrides=STOP_SHORT,
        )  # fmt: skip
        got = pd.read_parquet(work / "s" / "sweep.parquet")
        try:
            pd.testing.assert_frame_equal(got, expected)
        except AssertionError as e:
            bad.append(f"resumed table differs: {str(e).splitlines()[0]}")
        names = sorted(x.name for x in work.iterdir())
        if names != sorted(["keep.txt", "s", *mine, *(["s.partial"] if others and left else [])]):
            bad.append(f"after --resume left {names}")
    return [f"{b}: {err.strip()[-1000:]}" for b in bad]


STOP_CASES = stop_cases(SEED, 2)


@pytest.mark.parametrize("case", STOP_CASES, ids=[f"{c['how']}@{c['at']}" for c in STOP_CASES])
def test_fuzz_stopped_sweep(work, case):
    assert check_stop(work, case) == []


# A goodput comparison stopped after a random number of finished runs (its sweep points
# or the searches' runs), then run again: without --resume it must refuse the kept runs,
# with --resume write what an uninterrupted comparison writes (compare.parquet and
# goodput.csv, the uninterrupted one run after it in-process) and leave nothing else
# (docs/safety.md, "Sweeps that stop": compare and plan keep their runs too).
STOPC_SCENARIOS = ["ci/chunked.yaml", "ci/disaggregated.yaml", "ci/colocated-vllm.yaml"]
STOPC_CHILD = STOP_CHILD.replace(
    """core = importlib.import_module("disaggsim.sweep.core")
real_run, real_record = core.run_tasks, J.Journal.record
def run_tasks(*a, **k):  # the sweep's runs start: stopped before any finished
    if at == 0:
        stop()
    return real_run(*a, **k)
def record(self, index, summary):
    real_record(self, index, summary)
    if self.num_kept == at:
        stop()
core.run_tasks, J.Journal.record = run_tasks, record
""",
    """real_init, real_record = J.KeptRuns.__init__, J.Journal.record_run
def init(self, *a, **k):  # the comparison's runs start: stopped before any finished
    real_init(self, *a, **k)
    if at == 0:
        stop()
def record_run(self, run, summary):
    real_record(self, run, summary)
    if self.num_kept == at:
        stop()
J.KeptRuns.__init__, J.Journal.record_run = init, record_run
""",
)
assert STOPC_CHILD != STOP_CHILD


def stopc_cases(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        scenarios = rng.sample(STOPC_SCENARIOS, rng.randint(1, 2))
        argv = ["compare", *(str(SCENARIOS / x) for x in scenarios), "--quiet", "--no-plots",
                "--set", "sim.duration_s=6", "--set", "sim.warmup_s=1",
                "--min-requests", str(rng.choice([30, 60])), "--service-multiple", "0.5",
                "--rate-lo", "1", "--rate-hi", str(rng.choice([4, 8])),
                "--tol", str(rng.choice([0.5, 1.0]))]  # fmt: skip
        if rng.random() < 0.5:
            argv += ["--param", f"workload.rate_per_s={rng.choice(['1,2', '2'])}"]
        if rng.random() < 0.3:
            argv += ["--param", "kv.block_tokens=16,32"]
        cases.append({
            "argv": argv, "how": rng.choice(["SIGINT", "SIGTERM", "SIGHUP", "SIGKILL", "raise"]),
            "at": rng.randint(0, 12), "workers": rng.choice([1, 2]),
        })  # fmt: skip
    return cases


def _stop_child(work: Path, how: str, at: int, argv: list[str], workers: int) -> tuple[int, str]:
    """Run ``argv`` under STOPC_CHILD (stopped ``how`` after ``at`` finished runs) in
    ``work``, in a session of its own whose processes are all ended after it; its exit
    status and stderr."""
    import signal as sig
    import subprocess

    with open(work.parent / f"{work.name}.stop-err", "w+") as err_file:
        p = subprocess.Popen(
            [sys.executable, "-c", STOPC_CHILD, how, str(at), *argv, "--workers", str(workers)],
            cwd=work, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
            stderr=err_file, start_new_session=True,
        )  # fmt: skip
        try:
            rc = p.wait(timeout=300)
        finally:
            try:
                os.killpg(p.pid, sig.SIGKILL)
            except ProcessLookupError:
                pass
        err_file.seek(0)
        return rc, err_file.read()


def _stopped_as_said(rc: int, how: str, at: int, kept: int, err: str, partial: str) -> list[str]:
    """What is wrong with a command stopped ``how`` after ``at`` finished runs: its exit
    status, fewer than ``at`` runs kept in ``partial``, or (but for SIGKILL) an error that
    is not one line saying how many runs are kept there."""
    import signal as sig

    bad = []
    expected_rc = {"SIGINT": 130, "raise": 2, "SIGKILL": -9}.get(how)
    if expected_rc is None:
        expected_rc = 128 + getattr(sig, how)
    if rc != expected_rc:
        bad.append(f"exit {rc}, expected {expected_rc}")
    if kept < at:
        bad.append(f"{kept} runs kept, {at} finished")
    if how != "SIGKILL":
        lines = err.strip().splitlines()
        said = f"{kept} run{'s' if kept > 1 else ''} finished and {'are' if kept > 1 else 'is'} kept in {partial}"
        if len(lines) != 1:
            bad.append("not one line")
        elif (said in lines[0]) != (kept > 0):
            bad.append("kept runs not said" if kept else "kept runs said, none finished")
    return bad


def check_stopc(work: Path, case: dict) -> list[str]:

    import pandas as pd

    argv, how, at = [*case["argv"], "--out", "c"], case["how"], case["at"]
    rc, err = _stop_child(work, how, at, argv, case["workers"])
    bad = []
    partial = work / "c.partial" / "runs.jsonl"
    kept = len(partial.read_text().splitlines()) if partial.exists() else 0
    names = sorted(x.name for x in work.iterdir())
    if rc == 0:  # the comparison took fewer runs than ``at``: it ended before the stop
        if names != ["c", "keep.txt"]:
            bad.append(f"finished, left {names}")
        return [f"{b}: {err.strip()[-1000:]}" for b in bad]
    bad += _stopped_as_said(rc, how, at, kept, err, "c.partial/")
    want = ["c.partial", "keep.txt"] if kept or how == "SIGKILL" else ["keep.txt"]
    if how == "SIGKILL":  # no cleanup runs: the lock that held c stays, taken over later
        want = sorted([*want, ".c.disaggsim-lock"])
    if names != want:
        bad.append(f"left {names}")
    if kept:
        rc2, _, err2 = _invoke([*argv, "--workers", "1"])
        if rc2 != 2 or "--resume" not in err2:
            bad.append(f"kept runs not refused without --resume (exit {rc2})")
    rc3, out3, err3 = _invoke([*argv, "--workers", "1", "--resume"])
    if rc3 != 0:
        bad.append(f"--resume exit {rc3}: {err3.strip()[-300:]}")
    else:
        if kept and f"{kept} runs reused from c.partial/" not in " ".join(out3.split()):
            bad.append(f"reuse not said: {out3.strip()[-300:]}")
        rc4, _, err4 = _invoke([*case["argv"], "--out", "u", "--workers", "1"])
        if rc4 != 0:
            bad.append(f"uninterrupted exit {rc4}: {err4.strip()[-300:]}")
        else:
            try:
                pd.testing.assert_frame_equal(
                    pd.read_parquet(work / "c" / "compare.parquet"),
                    pd.read_parquet(work / "u" / "compare.parquet"),
                )
            except AssertionError as e:
                bad.append(f"resumed table differs: {str(e).splitlines()[0]}")
            if (work / "c" / "goodput.csv").read_bytes() != (
                work / "u" / "goodput.csv"
            ).read_bytes():
                bad.append("resumed goodput.csv differs")
        names = sorted(x.name for x in work.iterdir())
        if names != ["c", "keep.txt", "u"][: 3 if rc4 == 0 else 2]:
            bad.append(f"after --resume left {names}")
    return [f"{b}: {err.strip()[-1000:]}" for b in bad]


STOPC_CASES = stopc_cases(SEED, 1)


@pytest.mark.parametrize("case", STOPC_CASES, ids=[f"{c['how']}@{c['at']}" for c in STOPC_CASES])
def test_fuzz_stopped_compare(work, case):
    assert check_stopc(work, case) == []


# A plan stopped after a random number of finished simulations, then run again: the same
# rules as a stopped comparison, and with --resume it must write the plan.json and
# ranked.csv of an uninterrupted plan. A one- or two-GPU question with --quick and a short
# run-length rule: 77 simulations in 18 s here (llama-3.1-8b on 1 H100, ISL 200 / OSL 20),
# where the advisor scenarios take minutes. Out of the suite (a case takes about a minute):
# ``python tests/test_fuzz_cli.py SEED N stopp``. Without --out the question's plan goes
# to results/<name>/ and its runs to results/<name>.partial/ (the default output).
STOPP_QUESTIONS = [
    ["--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--isl", "200", "--osl", "20"],
    ["--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--isl", "500", "--osl", "50"],
    ["--model", "mistral-7b", "--gpu", "h100-sxm", "--isl", "lognormal:300:0.5",
     "--osl", "30"],
]  # fmt: skip


def stopp_cases(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        argv = ["plan", *rng.choice(STOPP_QUESTIONS), "--gpus", rng.choice(["1", "2"]),
                "--ttft-ms", rng.choice(["500", "1000"]), "--itl-ms", rng.choice(["50", "100"]),
                "--quick", "--quiet", "--no-plots", "--min-requests", rng.choice(["30", "60"]),
                "--service-multiple", "0.5"]  # fmt: skip
        cases.append({
            "argv": argv, "out": rng.random() < 0.7,
            "how": rng.choice(["SIGINT", "SIGTERM", "SIGHUP", "SIGKILL", "raise"]),
            "at": rng.randint(0, 40), "workers": rng.choice([1, 2]),
        })  # fmt: skip
    return cases


def _plan_name(argv: list[str]) -> str:
    model, gpu, gpus = (argv[argv.index(f) + 1] for f in ("--model", "--gpu", "--gpus"))
    return f"plan-{model}-{gpu}-{gpus}gpu"


def check_stopp(work: Path, case: dict) -> list[str]:

    how, at = case["how"], case["at"]
    out = "p" if case["out"] else f"results/{_plan_name(case['argv'])}"
    argv = [*case["argv"], "--out", "p"] if case["out"] else list(case["argv"])
    rc, err = _stop_child(work, how, at, argv, case["workers"])
    bad = []
    partial = work / f"{out}.partial" / "runs.jsonl"
    kept = len(partial.read_text().splitlines()) if partial.exists() else 0
    result = (rc, f"{kept} kept")
    top = out.split("/")[0]
    names = sorted(x.name for x in work.iterdir())
    global LAST_RC
    if rc == 0:  # the plan took fewer runs than ``at``: it ended before the stop
        if names != sorted(["keep.txt", top]) or os.path.lexists(work / f"{out}.partial"):
            bad.append(f"finished, left {names}")
        LAST_RC = (rc, "finished before the stop")
        return [f"{b}: {err.strip()[-1000:]}" for b in bad]
    bad += _stopped_as_said(rc, how, at, kept, err, f"{out}.partial/")
    left = kept or how == "SIGKILL"
    # no cleanup runs after SIGKILL: the lock that held --out p stays, taken over later
    lock = [".p.disaggsim-lock"] if how == "SIGKILL" and case["out"] else []
    want = ["keep.txt", f"{out}.partial".split("/")[0]] if left else ["keep.txt"]
    if names != sorted(want + lock):
        bad.append(f"left {names}")
    if kept:
        rc2, _, err2 = _invoke([*argv, "--workers", "1"])
        if rc2 != 2 or "--resume" not in err2:
            bad.append(f"kept runs not refused without --resume (exit {rc2})")
    rc3, out3, err3 = _invoke([*argv, "--workers", "1", "--resume"])
    if rc3 != 0:
        bad.append(f"--resume exit {rc3}: {err3.strip()[-300:]}")
        LAST_RC = result
        return [f"{b}: {err.strip()[-1000:]}" for b in bad]
    if kept and f"{kept} runs reused from {out}.partial/" not in " ".join(out3.split()):
        bad.append(f"reuse not said: {out3.strip()[-300:]}")
    rc4, _, err4 = _invoke([*case["argv"], "--out", "u", "--workers", "1"])
    if rc4 != 0:
        bad.append(f"uninterrupted exit {rc4}: {err4.strip()[-300:]}")
    else:
        if json.loads((work / out / "plan.json").read_text()) != json.loads(
            (work / "u" / "plan.json").read_text()
        ):
            bad.append("resumed plan.json differs")
        if (work / out / "ranked.csv").read_bytes() != (work / "u" / "ranked.csv").read_bytes():
            bad.append("resumed ranked.csv differs")
    names = sorted(x.name for x in work.iterdir())
    if names != sorted(["keep.txt", top, "u"][: 3 if rc4 == 0 else 2]):
        bad.append(f"after --resume left {names}")
    if case["out"] is False and sorted(x.name for x in (work / "results").iterdir()) != [
        Path(out).name
    ]:
        bad.append(f"results/ holds {sorted(x.name for x in (work / 'results').iterdir())}")
    LAST_RC = result  # the stopped plan's exit and kept runs, for the printout
    return [f"{b}: {err.strip()[-1000:]}" for b in bad]


# ------------------------------------------------------------------ paths of every kind

# ``run`` or a two-point ``sweep`` whose scenario file and --out are drawn from the kinds
# of paths a machine holds (docs/safety.md "Where results go", "Files disaggsim reads"): a
# folder, a named pipe, a device, an empty file, a symbolic link, names in Unicode or with
# bytes that are not UTF-8, another filesystem (/dev/shm), a result folder inside the
# scenarios' folder, the scenario.yaml of an earlier result replaced by the run reading
# it, a place nothing can be made. A kind no command may use must be one line (exit 2)
# naming the path; the others must run; either way nothing changes but the result folder.
_SCEN_KINDS = ["plain", "unicode", "latin1", "symlink", "dir", "fifo", "device", "empty",
               "in-result"]  # fmt: skip
_OUT_KINDS = ["new", "unicode", "latin1", "symlink-dir", "dangling", "other-fs",
              "in-scenarios", "fifo", "nested", "earlier-result", "unwritable",
              "immutable"]  # fmt: skip
_SCEN_REFUSED = {"dir", "fifo", "device", "empty"}
_OUT_REFUSED = {"latin1", "symlink-dir", "dangling", "fifo", "unwritable", "immutable"}


def paths_cases(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"command": rng.choice(["run", "run", "sweep"]), "scenario": rng.choice(_SCEN_KINDS),
         "out": rng.choice(_OUT_KINDS), "base": rng.choice(SWEEP_BASES)}
        for _ in range(n)
    ]  # fmt: skip


def _paths_setup(work: Path, case: dict) -> tuple[str, str, Path | None]:
    """Make the case's files; (scenario path, --out path, a folder outside ``work`` to
    remove afterwards)."""
    import secrets
    import subprocess

    sc = work / "sc"
    sc.mkdir()
    text = (SCENARIOS / case["base"]).read_text()
    (sc / "s.yaml").write_text(text)
    kind = case["scenario"]
    scen = {"plain": "sc/s.yaml", "unicode": "sc/é名 ☃.yaml", "latin1": "sc/s\udcff.yaml",
            "symlink": "sc/link.yaml", "dir": "sc/d.yaml", "fifo": "sc/f.yaml",
            "device": "sc/n.yaml", "empty": "sc/e.yaml",
            "in-result": "prev/scenario.yaml"}[kind]  # fmt: skip
    if kind in ("unicode", "latin1"):
        (work / scen).write_text(text)
    elif kind == "symlink":
        (sc / "link.yaml").symlink_to("s.yaml")
    elif kind == "dir":
        (sc / "d.yaml").mkdir()
    elif kind == "fifo":
        os.mkfifo(sc / "f.yaml")
    elif kind == "device":
        (sc / "n.yaml").symlink_to("/dev/null")
    elif kind == "empty":
        (sc / "e.yaml").write_text("")
    if kind == "in-result" or case["out"] == "earlier-result":
        rc, _, err = _invoke(["run", str(sc / "s.yaml"), "--out", "prev", *_PATHS_QUICK])
        assert rc == 0, err
    outside = None
    out = {"new": "r", "unicode": "résultat 名", "latin1": "r\udcfe", "symlink-dir": "link",
           "dangling": "dang", "in-scenarios": "sc/r", "fifo": "ff", "nested": "a/b/c",
           "earlier-result": "prev", "unwritable": "/proc/disaggsim-r"}.get(case["out"])  # fmt: skip
    if case["out"] == "symlink-dir":
        (work / "target").mkdir()
        (work / "link").symlink_to("target")
    elif case["out"] == "dangling":
        (work / "dang").symlink_to("nowhere")
    elif case["out"] == "fifo":
        os.mkfifo(work / "ff")
    elif case["out"] == "other-fs":
        outside = Path("/dev/shm") / f"disaggsim-fuzz-{secrets.token_hex(4)}"
        outside.mkdir()
        out = str(outside / "r")
    elif case["out"] == "immutable":  # a folder nothing can be made in, even by root
        (work / "ro").mkdir()
        subprocess.run(["chattr", "+i", str(work / "ro")], check=True, capture_output=True)
        out = "ro/r"
    assert out is not None
    return scen, out, outside


_PATHS_QUICK = ["--set", "sim.duration_s=3", "--set", "sim.warmup_s=0", "--quiet", "--no-plots"]


def _lstat_tree(root: Path) -> dict[str, object]:
    """Every entry under ``root`` (links not followed): a file's bytes, else its kind."""
    import stat as st

    out: dict[str, object] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            mode = os.lstat(p).st_mode
            key = str(p.relative_to(root))
            if st.S_ISREG(mode):
                out[key] = p.read_bytes()
            elif st.S_ISLNK(mode):
                out[key] = ("link", os.readlink(p))
            else:
                out[key] = st.S_IFMT(mode)
    return out


def check_paths(work: Path, case: dict) -> list[str]:
    outside = None
    try:
        scen, out, outside = _paths_setup(work, case)
        argv = [case["command"], scen, "--out", out, *_PATHS_QUICK]
        if case["command"] == "sweep":
            argv += ["--param", "workload.rate_per_s=1,2", "--workers", "1"]
        before = _lstat_tree(work)
        rc, _, err = _invoke(argv)
        bad = _one_error_line(rc, err)
        refused = case["scenario"] in _SCEN_REFUSED or case["out"] in _OUT_REFUSED
        if refused and rc != 2:
            bad.append(f"ran (exit {rc}), where a path of this kind must be refused")
        if not refused and rc != 0:
            bad.append(f"refused (exit {rc}) a path that must run")
        shown = {p.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
                 for p in (scen, out)}  # fmt: skip
        if rc == 2 and not any(p in err for p in shown):
            bad.append("the error names neither the scenario nor --out")
        after = _lstat_tree(work)
        target = Path(out) if Path(out).is_absolute() else work / out
        if rc == 0:
            marker = json.loads((target / ".disaggsim-result.json").read_text())
            names = sorted(os.listdir(target))
            if names != sorted([*marker["files"], ".disaggsim-result.json"]):
                bad.append(f"the result holds {names}, its marker lists {marker['files']}")
            # the result folder (and the folders made above it) is all that changed
            skip = str(target.relative_to(work)) if target.is_relative_to(work) else None
            if skip is not None:
                top = skip.split("/")[0]
                after = {k: v for k, v in after.items()
                         if not (k == skip or k.startswith(skip + "/") or
                                 (k not in before and (skip + "/").startswith(k + "/")))}  # fmt: skip
                before = {k: v for k, v in before.items()
                          if not (k == skip or k.startswith(skip + "/"))}  # fmt: skip
                del top
        if after != before:
            changed = sorted(set(after) ^ set(before)) or sorted(
                k for k in after if after[k] != before.get(k)
            )
            bad.append(f"changed outside the result: {changed[:4]}")
        if outside is not None and rc != 0 and os.listdir(outside):
            bad.append(f"left {os.listdir(outside)} on the other filesystem")
    finally:
        if outside is not None:
            shutil.rmtree(outside, ignore_errors=True)
        if (work / "ro").is_dir():  # deletable again
            import subprocess

            subprocess.run(["chattr", "-i", str(work / "ro")], capture_output=True)
    return [f"{b}: {err.strip()[-600:]}" for b in bad]


PATHS_CASES = paths_cases(SEED, 4)


@pytest.mark.parametrize(
    "case", PATHS_CASES, ids=[f"{c['command']}-{c['scenario']}-{c['out']}" for c in PATHS_CASES]
)
def test_fuzz_paths(work, serial_sweeps, case):
    assert check_paths(work, case) == []


# ------------------------------------------------------------------ YAML as people write it

# A CI scenario written back as YAML with one feature of the language a person may use:
# an anchor and an alias (or a merge key ``<<:``) sharing one pool section with the other,
# a key given twice, or a number written another way (octal-looking, base 60, hex, binary,
# digit groups, a sign, a tag, ``.inf``/``.nan``, far beyond any bound, a boolean, null,
# binary data, a Python object tag). A key given twice and a number no field takes (one
# that is not what it looks like, not finite or beyond every bound) must be refused in
# one line naming the file and the line or the field; an anchor or merge key must be
# read as the mapping it stands for (the same outcome as that mapping given directly).
_NUMBER_TEXTS = {
    # text: whether every numeric field must refuse it
    "010": True, "0100": True, "1:30": True, "-0:30": True, ".inf": True, "-.inf": True,
    ".nan": True, ".NaN": True, "1e400": True, "1.0e+16": True, "99999999999999999999999": True,
    "!!binary aGk=": True, "!!python/object/apply:os.getcwd []": True, "yes": True,
    "!!set {a: null}": True, "0x10": False, "0b11": False, "1_000": False, "+7": False,
    "07": False, "!!float 5": False, "!!int '6'": False, "2.": False, "-0": False,
    "'5'": False, "~": False, "0.": False,
}  # fmt: skip


def yamlx_cases(seed: int, n: int) -> list[dict]:
    import yaml

    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        base = rng.choice(SWEEP_BASES)
        raw = yaml.safe_load((SCENARIOS / base).read_text())
        raw.setdefault("sim", {}).update({"duration_s": 3, "warmup_s": 0})
        kinds = ["number", "number", "duplicate"]
        if "prefill_pool" in raw:
            kinds += ["alias", "merge"]
        kind = rng.choice(kinds)
        case = {"base": base, "kind": kind}
        if kind == "number":
            leaves = [p for p in _leaves(raw)
                      if isinstance(_get(raw, p), (int, float)) and not isinstance(_get(raw, p), bool)]  # fmt: skip
            path = rng.choice(leaves)
            text = rng.choice(sorted(_NUMBER_TEXTS))
            case.update(path=list(path), text=text)
        elif kind == "duplicate":
            path = rng.choice([p for p in _leaves(raw) if not isinstance(_get(raw, p), list)])
            case.update(path=list(path))
        elif kind == "merge":
            case.update(num_workers=rng.choice([1, 2, 3]))
        case["raw"] = raw
        cases.append(case)
    return cases


def _yamlx_text(case: dict) -> tuple[str, dict | None]:
    """The file's text, and the mapping it stands for (None: the file must be refused, or
    a number text whose meaning YAML decides)."""
    import copy

    import yaml

    raw = copy.deepcopy(case["raw"])
    kind = case["kind"]
    if kind == "number":
        parent = _get(raw, case["path"][:-1])
        parent[case["path"][-1]] = "__FUZZ__"
        text = yaml.safe_dump(raw, sort_keys=False, default_flow_style=False)
        return text.replace("__FUZZ__", case["text"]), None
    if kind == "duplicate":
        path = case["path"]
        parent = _get(raw, path[:-1])
        key = path[-1]
        if isinstance(parent, list):  # a list item: give its mapping's first key twice
            return "", None
        value = parent[key]
        dumped = yaml.safe_dump({key: value}, default_flow_style=True, width=10**6).strip()
        dumped = dumped[1:-1]  # "{k: v}" -> "k: v"
        parent[key] = "__FUZZ__"
        text = yaml.safe_dump(raw, sort_keys=False, default_flow_style=False, width=10**6)
        line = next(x for x in text.splitlines() if x.strip().startswith(f"{key}: __FUZZ__"))
        indent = line[: len(line) - len(line.lstrip())]
        return text.replace(line, f"{indent}{dumped}\n{indent}{dumped}"), None
    pool = raw["prefill_pool"]
    flow = yaml.safe_dump(pool, default_flow_style=True, width=10**6).strip()
    raw["prefill_pool"], raw["decode_pool"] = "__ANCHOR__", "__ALIAS__"
    text = yaml.safe_dump(raw, sort_keys=False, default_flow_style=False, width=10**6)
    text = text.replace("__ANCHOR__", f"&p {flow}")
    equiv = copy.deepcopy(case["raw"])
    if kind == "alias":
        equiv["decode_pool"] = copy.deepcopy(pool)
        return text.replace("__ALIAS__", "*p"), equiv
    equiv["decode_pool"] = {**pool, "num_workers": case["num_workers"]}
    return text.replace("__ALIAS__", f"{{<<: *p, num_workers: {case['num_workers']}}}"), equiv


def check_yamlx(work: Path, case: dict) -> list[str]:
    text, equiv = _yamlx_text(case)
    if not text:
        return []
    (work / "s.yaml").write_text(text)
    before = _tree(work)
    # no --set: the file's own values are the case (its run is 3 s already)
    rc, _, err = _invoke(["run", "s.yaml", "--out", "out", "--quiet", "--no-plots"])
    bad = _one_error_line(rc, err)
    kind = case["kind"]
    if rc == 2:
        if not err.startswith(f"{PREFIX}s.yaml: "):
            bad.append("the error does not name the file")
        if _tree(work) != before:
            bad.append("wrote on error")
    if kind == "duplicate":
        if rc != 2 or "duplicate key" not in err:
            bad.append(f"a key given twice not refused as such (exit {rc})")
    elif kind == "number":
        key = str(case["path"][-1])
        if _NUMBER_TEXTS[case["text"]] and rc != 2:
            bad.append(f"{case['text']!r} at {'.'.join(map(str, case['path']))} ran")
        if rc == 2 and not (re.search(r"line \d+", err) or key in err or
                            key.replace("_", " ") in err):  # fmt: skip
            bad.append("the error names neither the line nor the field")
    else:  # the same outcome as the mapping it stands for, written out in full
        import yaml

        assert equiv is not None
        (work / "e.yaml").write_text(yaml.safe_dump(equiv, sort_keys=False))
        rc2, _, err2 = _invoke(["run", "e.yaml", "--out", "out2", "--quiet", "--no-plots"])
        if rc != rc2 or err.replace("s.yaml", "e.yaml") != err2:
            bad.append(f"exit {rc}, the mapping it stands for: {rc2} {err2.strip()[-300:]}")
        elif rc == 0:
            a, b = (json.loads((work / o / "summary.json").read_text()) for o in ("out", "out2"))
            a.pop("wall_s", None), b.pop("wall_s", None)  # the machine's time, not the run's
            if a != b:
                bad.append("summary.json differs from the mapping's")
    return [f"{b}: {err.strip()[-600:]}" for b in bad]


YAMLX_CASES = yamlx_cases(SEED, 6)


@pytest.mark.parametrize(
    "case", YAMLX_CASES,
    ids=[f"{c['kind']}-{c.get('text', '')}-{'.'.join(map(str, c.get('path', [])))}" for c in YAMLX_CASES],
)  # fmt: skip
def test_fuzz_yaml_forms(work, case):
    assert check_yamlx(work, case) == []


# ------------------------------------------------------------------ every numeric field

# Out of the suite: a numeric field of a shipped scenario (every scenarios/**.yaml, every
# leaf holding a number) given NaN, an infinity or a magnitude beyond every bound, loaded
# as the Python API loads a mapping: each must be one UserError line naming the field.
# ``python tests/test_fuzz_cli.py SEED N numbers`` (N = 0: every field and value, 4,823
# cases on 2026-12-03).
_NUMBER_VALUES = [math.nan, math.inf, -math.inf, 1e300, -1e300, 10**30, -(10**30)]


def numbers_cases(seed: int, n: int) -> list[tuple[str, tuple, object]]:
    import yaml

    every = []
    for f in RUN_BASES:
        raw = yaml.safe_load((SCENARIOS / f).read_text())
        for path in _leaves(raw):
            v = _get(raw, path)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                every += [(f, path, x) for x in _NUMBER_VALUES]
    return every if n == 0 else random.Random(seed).sample(every, min(n, len(every)))


def check_numbers(work: Path, case: tuple[str, tuple, object]) -> list[str]:
    import yaml

    from disaggsim.config.loader import load_scenario

    base, path, value = case
    raw = yaml.safe_load((SCENARIOS / base).read_text())
    w = raw.get("workload", {})
    if isinstance(w.get("path"), str):
        w["path"] = str((SCENARIOS / base).parent / w["path"])
    _get(raw, path[:-1])[path[-1]] = value
    global LAST_RC
    LAST_RC = (0, "")
    try:
        load_scenario(raw, base_dir=(SCENARIOS / base).parent)
    except UserError as e:
        key = str(path[-1])
        msg = str(e)
        LAST_RC = (2, msg[-300:])
        if "\n" in msg or (key not in msg and key.replace("_", " ") not in msg):
            return [f"the error names no {key}: {msg[:300]}"]
        return []
    except Exception as e:  # the point of the check
        return [f"{type(e).__name__}: {str(e)[:300]}"]
    return [f"{value!r} at {'.'.join(map(str, path))} was taken"]


# ------------------------------------------------------------------ a disk that fills

# A run (with or without --trace and plots), a sweep or a comparison run in a child
# process under RLIMIT_FSIZE (SIGXFSZ ignored): a file grown past the limit fails with
# EFBIG, as one past a full disk fails with ENOSPC (tests/test_full_disk.py), with or
# without an earlier result at --out. It must exit 0 or 2 in one line naming --out,
# --trace or the journal; leave no temporary sibling and nothing outside --out, --trace
# and OUT.partial; an earlier result is as it was unless replaced whole; a partial
# folder left holds whole lines only, as many as the line says, and --resume without the
# limit writes what an uninterrupted command writes.
_DISK_LIMITS = [0, 512, 2048, 4096, 7000, 12000, 20000, 45000, 60000, 120000, 400000, 2**40]
_DISK_COMMANDS = ["run", "run-trace", "sweep", "compare"]


def disk_cases(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"command": _DISK_COMMANDS[i % len(_DISK_COMMANDS)], "limit": rng.choice(_DISK_LIMITS),
         "earlier": rng.random() < 0.4, "plots": rng.random() < 0.3,
         "base": rng.choice(SWEEP_BASES)}
        for i in range(n)
    ]  # fmt: skip


def _disk_argv(case: dict, out: str) -> list[str]:
    base = str(SCENARIOS / case["base"])
    quick = ["--set", "sim.duration_s=20", "--quiet", *([] if case["plots"] else ["--no-plots"])]
    command = case["command"]
    if command.startswith("run"):
        trace = ["--trace", "t.json"] if command == "run-trace" else []
        return ["run", base, "--out", out, *quick, *trace]
    grid = ["--param", "workload.rate_per_s=1,2,3", "--workers", "1"]
    if command == "sweep":
        return ["sweep", base, "--out", out, *quick, *grid]
    other = str(SCENARIOS / "ci" / "chunked.yaml")
    # shorter goodput searches (what a full disk does to a comparison does not depend on
    # how long its searches run): 15 s -> 8 s a comparison, each case runs up to four
    searches = ["--rate-hi", "12", "--min-requests", "100", "--service-multiple", "1"]
    return ["compare", base, other, "--out", out, *quick, *grid, *searches]


def _disk_child(work: Path, argv: list[str], limit: int | None) -> tuple[int, str]:
    import resource
    import signal
    import subprocess

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    p = subprocess.run(
        [sys.executable, "-m", "disaggsim", *argv], cwd=work, capture_output=True, text=True,
        timeout=300, preexec_fn=None if limit is None else limited,
    )  # fmt: skip
    return p.returncode, p.stderr


def _journal_runs(text: str) -> set[str]:
    """The distinct runs a journal's whole lines hold."""
    return {json.loads(line)["run"] for line in text.splitlines() if line}


def check_disk(work: Path, case: dict) -> list[str]:
    global LAST_RC
    argv = _disk_argv(case, "o")
    if case["earlier"]:
        rc, err = _disk_child(work, argv, None)
        if rc != 0:
            return [f"the earlier result was not written (exit {rc}): {err[-300:]}"]
        (work / "t.json").unlink(missing_ok=True)
    before = _tree(work)
    rc, err = _disk_child(work, argv, case["limit"])
    LAST_RC = rc, err.strip()[-300:]
    bad = _one_error_line(rc, err)
    line = err.strip()
    names = set(os.listdir(work))
    if names - {"keep.txt", "o", "o.partial", "t.json"}:
        bad.append(f"left {sorted(names - {'keep.txt', 'o', 'o.partial', 't.json'})}")
    if (work / "keep.txt").read_bytes() != before["keep.txt"]:
        bad.append("the user's keep.txt changed")
    for folder in ("o", "o.partial"):
        if (work / folder).is_dir():
            marker = json.loads((work / folder / ".disaggsim-result.json").read_text())
            held = sorted(os.listdir(work / folder))
            if held != sorted([*marker["files"], ".disaggsim-result.json"]):
                bad.append(f"{folder} holds {held}, its marker lists {marker['files']}")
    earlier = {k: v for k, v in before.items() if k == "o" or k.startswith("o/")}
    now = {k: v for k, v in _tree(work).items() if k == "o" or k.startswith("o/")}
    if rc == 2:
        said = [w for w in ("--out o:", "--trace t.json:", "o.partial/runs.jsonl:") if w in line]
        if not said:
            bad.append("the error names neither --out, --trace nor the journal")
        if "--trace t.json:" in line:
            if "the run's results were written to o/" not in line or not (work / "o").is_dir():
                bad.append("a refused trace does not say where the run's results are")
            if (work / "t.json").exists():
                bad.append("a refused trace was left")
        elif now != earlier:
            bad.append("the earlier result changed, or a refused result left files")
    partial = work / "o.partial"
    if partial.is_dir():
        text = (partial / "runs.jsonl").read_text()
        kept = re.search(
            r"(\d+) (?:of \d+ )?runs? (?:finished and )?(?:are |is )?kept in o.partial/", line
        )
        if rc != 2 or kept is None:
            bad.append("a partial folder is left, and the line does not say how many runs")
        elif not text.endswith("\n") or len(_journal_runs(text)) != int(kept.group(1)):
            # (a comparison of a scenario with itself runs, and keeps, each run twice)
            bad.append(
                f"the journal holds {len(_journal_runs(text))} runs in whole lines "
                f"(ends with a newline: {text.endswith(chr(10))}), the line says {kept.group(1)}"
            )
        else:  # resumed without the limit: what an uninterrupted command writes
            rc2, err2 = _disk_child(work, [*argv, "--resume"], None)
            rc3, err3 = _disk_child(work, _disk_argv(case, "whole"), None)
            table = "sweep.csv" if case["command"] == "sweep" else "goodput.csv"
            if rc2 != 0 or rc3 != 0:
                bad.append(f"resumed: exit {rc2} / {rc3}: {(err2 + err3)[-300:]}")
            elif (work / "o" / table).read_bytes() != (work / "whole" / table).read_bytes():
                bad.append(f"the resumed {table} differs from an uninterrupted one")
            elif partial.exists():
                bad.append("the partial folder is left after the resumed command")
    return [f"{b}: {line[-400:]}" for b in bad]


DISK_CASES = disk_cases(SEED, 4)  # one of each command


@pytest.mark.parametrize(
    "case", DISK_CASES, ids=[f"{c['command']}-{c['limit']}-{c['earlier']}" for c in DISK_CASES]
)
def test_fuzz_full_disk(work, case):
    assert check_disk(work, case) == []


# ------------------------------------------------------------------ damaged results

# An earlier result (a run's or a sweep's) damaged between commands, then a run or a
# sweep into the same --out: a listed file cut short, emptied, deleted, made a folder, a
# named pipe, a symbolic link to a user's file or folder outside it, or immutable
# (chattr +i, which binds root too); the folder itself immutable; a user's file added;
# the marker cut, emptied, made garbage, a link or a folder, or edited (a name dropped,
# one added that is absent, one no file can have, its written_by or command changed,
# its files a string). It must exit 0 or 2 in one line; nothing outside the result may
# change (the user's file and folder, the targets of the links); on 0 the result is
# whole (its marker lists exactly its files, each a regular file) and no hidden sibling
# is left unless the last line names it; on 2 the damaged folder is as it was, unless
# the line says where the finished result was put instead.
_DAMAGES = ["cut", "empty", "delete", "dir", "fifo", "link-file", "link-dir", "immutable-file",
            "immutable-folder", "user-file", "marker-cut", "marker-empty", "marker-garbage",
            "marker-link", "marker-dir", "marker-drop", "marker-absent", "marker-nul",
            "marker-other", "marker-command", "marker-string"]  # fmt: skip
_DAMAGE_QUICK = ["--set", "sim.duration_s=3", "--set", "sim.warmup_s=0", "--quiet"]


def damaged_cases(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"first": rng.choice(["run", "run", "sweep"]), "then": rng.choice(["run", "sweep"]),
         "damages": rng.sample(_DAMAGES, rng.choice([1, 1, 2, 3])), "pick": rng.random(),
         "plots": rng.random() < 0.3, "base": rng.choice(SWEEP_BASES)}
        for _ in range(n)
    ]  # fmt: skip


def _damage_argv(command: str, case: dict, out: str) -> list[str]:
    argv = [command, str(SCENARIOS / case["base"]), "--out", out, *_DAMAGE_QUICK]
    argv += [] if case["plots"] else ["--no-plots"]
    if command == "sweep":
        argv += ["--param", "workload.rate_per_s=1,2", "--workers", "1"]
    return argv


def _chattr(flag: str, *paths: Path) -> bool:
    import subprocess

    done = subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True)
    return done.returncode == 0


def _damage(work: Path, o: Path, damage: str, pick: float) -> None:
    marker = o / ".disaggsim-result.json"
    doc = None
    if marker.is_file() and not marker.is_symlink():
        with contextlib.suppress(ValueError):  # an earlier damage cut it, or made it garbage
            doc = json.loads(marker.read_bytes())
    listed = (
        sorted(doc["files"]) if isinstance(doc, dict) and isinstance(doc.get("files"), list) else []
    )
    present = [n for n in listed if (o / n).is_file() and not (o / n).is_symlink()]
    victim = o / present[int(pick * len(present))] if present else None
    (work / "mine").mkdir(exist_ok=True)
    (work / "mine" / "notes.txt").write_text("a user's notes\n")
    if damage in ("cut", "empty") and victim is not None:
        data = victim.read_bytes()
        victim.write_bytes(data[: len(data) // 2] if damage == "cut" else b"")
    elif damage == "delete" and victim is not None:
        victim.unlink()
    elif damage == "dir" and victim is not None:
        victim.unlink()
        victim.mkdir()
        (victim / "inner.txt").write_text("x\n")
    elif damage == "fifo" and victim is not None:
        victim.unlink()
        os.mkfifo(victim)
    elif damage in ("link-file", "link-dir") and victim is not None:
        victim.unlink()
        target = work / ("keep.txt" if damage == "link-file" else "mine")
        victim.symlink_to(os.path.relpath(target, victim.parent))
    elif damage == "immutable-file" and victim is not None:
        _chattr("+i", victim)
    elif damage == "immutable-folder":
        _chattr("+i", o)
    elif damage == "user-file":
        with contextlib.suppress(OSError):  # an immutable folder takes none
            (o / "my-notes.txt").write_text("mine\n")
    elif damage.startswith("marker-") and marker.exists() and not marker.is_symlink():
        if marker.is_dir():
            return
        text = marker.read_bytes()
        with contextlib.suppress(OSError):  # an immutable folder: the marker stays
            if damage == "marker-cut":
                marker.write_bytes(text[: len(text) // 2])
            elif damage == "marker-empty":
                marker.write_text("")
            elif damage == "marker-garbage":
                marker.write_bytes(b"\x00\xff garbage \x1b[31m")
            elif damage == "marker-link":
                marker.unlink()
                marker.symlink_to(os.path.relpath(work / "keep.txt", o))
            elif damage == "marker-dir":
                marker.unlink()
                marker.mkdir()
            elif isinstance(doc, dict):
                files = doc.get("files")
                if damage == "marker-drop" and isinstance(files, list) and files:
                    files.pop(int(pick * len(files)))
                elif damage == "marker-absent" and isinstance(files, list):
                    files.append("ghost.parquet")
                elif damage == "marker-nul" and isinstance(files, list):
                    files.append("a\x00b")
                elif damage == "marker-other":
                    doc["written_by"] = "someone"
                elif damage == "marker-command":
                    doc["command"] = "plan"
                elif damage == "marker-string":
                    doc["files"] = "summary.json"
                marker.write_text(json.dumps(doc))


def check_damaged(work: Path, case: dict) -> list[str]:
    global LAST_RC
    o = work / "o"
    rc, _, err = _invoke(_damage_argv(case["first"], case, "o"))
    if rc != 0:
        return [f"the earlier result was not written (exit {rc}): {err[-300:]}"]
    try:
        for damage in case["damages"]:
            with contextlib.suppress(OSError):  # an immutable folder or file takes none
                _damage(work, o, damage, case["pick"])
        before = _lstat_tree(work)
        rc, out, err = _invoke(_damage_argv(case["then"], case, "o"))
        bad = _one_error_line(rc, err)
        said = (err + out).strip().splitlines()[-1] if (err + out).strip() else ""
        after = _lstat_tree(work)
        outside = {k: v for k, v in before.items() if not (k == "o" or k.startswith("o/"))}
        if {k: v for k, v in after.items() if k in outside} != outside:
            bad.append("changed outside the result folder")
        extra = sorted(k for k in after if "/" not in k and k not in before)
        for name in extra:  # a new hidden or kept sibling must be named by the last line
            if name not in said:
                bad.append(f"left {name} without saying so")
        if rc == 0:
            m = o / ".disaggsim-result.json"
            listed = json.loads(m.read_text())["files"]
            held = sorted(os.listdir(o))
            if held != sorted([*listed, ".disaggsim-result.json"]):
                bad.append(f"the result holds {held}, its marker lists {listed}")
            if any(not (o / n).is_file() or (o / n).is_symlink() for n in listed):
                bad.append("a listed file of the new result is not a regular file")
        elif rc == 2:
            if "--out o" not in err:
                bad.append("the error does not name --out o")
            mine = {k: v for k, v in before.items() if k == "o" or k.startswith("o/")}
            now = {k: v for k, v in after.items() if k == "o" or k.startswith("o/")}
            if now != mine and "unplaced" not in said and "written to" not in said:
                bad.append("the damaged folder changed, and the line does not say so")
        LAST_RC = rc, said[-300:]
    finally:
        import subprocess

        subprocess.run(["chattr", "-R", "-i", str(work)], capture_output=True)
    return [f"{b}: {said[-400:]}" for b in bad]


DAMAGED_CASES = damaged_cases(SEED, 4)


@pytest.mark.parametrize(
    "case", DAMAGED_CASES,
    ids=[f"{c['first']}-{'+'.join(c['damages'])}-{c['then']}" for c in DAMAGED_CASES],
)  # fmt: skip
def test_fuzz_damaged_result(work, serial_sweeps, case):
    assert check_damaged(work, case) == []


# ------------------------------------------------------------------ commands racing

# Two to four commands (runs, or runs and a sweep) started together into the same --out
# (new, or an earlier result), each in its own process: each must exit 0 or 2 in one
# line; at the end --out is one whole result (its marker lists exactly its files), no
# hidden sibling or partial folder is left, a kept unplaced result only where a line
# names it, and nothing else in the working folder changed.


def race_cases(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"commands": [rng.choice(["run", "run", "sweep"]) for _ in range(rng.choice([2, 3, 4]))],
         "earlier": rng.random() < 0.5, "plots": rng.random() < 0.3,
         "base": rng.choice(SWEEP_BASES)}
        for _ in range(n)
    ]  # fmt: skip


def check_race(work: Path, case: dict) -> list[str]:
    import subprocess

    global LAST_RC
    if case["earlier"]:
        rc, _, err = _invoke(_damage_argv("run", case, "o"))
        if rc != 0:
            return [f"the earlier result was not written (exit {rc}): {err[-300:]}"]
    before = _lstat_tree(work)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "disaggsim", *_damage_argv(c, case, "o")],
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for c in case["commands"]
    ]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    bad = []
    lines = []
    for rc, out, err in results:
        bad += _one_error_line(rc, err)
        lines.append((err + out).strip().splitlines()[-1] if (err + out).strip() else "")
        if rc == 2 and "--out o" not in err:
            bad.append("an error does not name --out o")
    LAST_RC = [r[0] for r in results], " | ".join(x[-120:] for x in lines)
    if not any(r[0] == 0 for r in results):
        bad.append("no command wrote its result")
    names = sorted(os.listdir(work))
    for name in names:
        if name in ("keep.txt", "o") or name in before:
            continue
        if not any(name in line for line in lines):
            bad.append(f"left {name} without saying so")
    after = _lstat_tree(work)
    outside = {k: v for k, v in before.items() if not (k == "o" or k.startswith("o/"))}
    if {k: v for k, v in after.items() if k in outside} != outside:
        bad.append("changed outside the result folder")
    if (work / "o").is_dir():
        listed = json.loads((work / "o" / ".disaggsim-result.json").read_text())["files"]
        held = sorted(os.listdir(work / "o"))
        if held != sorted([*listed, ".disaggsim-result.json"]):
            bad.append(f"the result holds {held}, its marker lists {listed}")
    else:
        bad.append("no result folder at --out")
    return [f"{b}: {' | '.join(x[-200:] for x in lines)}" for b in bad]


RACE_CASES = race_cases(SEED, 2)


@pytest.mark.parametrize(
    "case", RACE_CASES, ids=[f"{'+'.join(c['commands'])}-{c['earlier']}" for c in RACE_CASES]
)
def test_fuzz_commands_racing(work, case):
    assert check_race(work, case) == []


# ------------------------------------------------------------------ a bigger sample

if __name__ == "__main__":  # python tests/test_fuzz_cli.py SEED N [run|cost|...|compare|tracefile]
    import tempfile

    seed, n = int(sys.argv[1]), int(sys.argv[2])
    kinds = sys.argv[3:] or ["run", "cost", "sweep", "plan", "yaml", "out", "trace", "compare",
                             "tracefile", "flags", "api", "reffile", "stop", "stopc", "stopp",
                             "paths", "yamlx", "numbers", "disk", "damaged", "race"]  # fmt: skip
    draws = {
        "run": (run_cases, lambda w, c: check_run(w, *c)),
        "cost": (cost_cases, check_cost),
        "sweep": (sweep_cases, check_sweep),
        "plan": (plan_cases, check_plan),
        "yaml": (yaml_cases, check_yaml),
        "out": (out_cases, check_out),
        "trace": (trace_cases, check_trace),
        "compare": (compare_cases, check_compare),
        "tracefile": (tracefile_cases, check_tracefile),
        "flags": (flag_cases, check_flags),
        "api": (api_cases, check_api),
        "reffile": (reffile_cases, check_reffile),
        "stop": (stop_cases, check_stop),
        "stopc": (stopc_cases, check_stopc),
        "stopp": (stopp_cases, check_stopp),
        "paths": (paths_cases, check_paths),
        "yamlx": (yamlx_cases, check_yamlx),
        "numbers": (numbers_cases, check_numbers),
        "disk": (disk_cases, check_disk),
        "damaged": (damaged_cases, check_damaged),
        "race": (race_cases, check_race),
    }
    import signal

    class _Slow(Exception):
        pass

    def _alarm(*_):
        raise _Slow

    signal.signal(signal.SIGALRM, _alarm)
    bugs = slow = 0
    for kind in kinds:
        draw, check = draws[kind]
        for i, case in enumerate(draw(seed, n)):
            with tempfile.TemporaryDirectory() as tmp:
                w = Path(tmp)
                (w / "keep.txt").write_text("a user's file\n")
                os.chdir(w)
                # a case still running after 2 minutes (a plan: 10) is reported, not judged
                signal.alarm(600 if kind == "stopp" else 120)
                LAST_RC = None  # a check that records nothing prints None, not the last one's
                try:
                    problems = check(w, case)
                except _Slow:
                    problems, LAST_RC = None, "SLOW"
                finally:
                    signal.alarm(0)
                os.chdir(REPO)
            shown = (case[0] if kind == "reffile" else case[:3] if kind == "yaml" else case["workload"] if kind == "trace"
                     else (case["name"], case["edits"]) if kind == "tracefile"
                     else {k: v for k, v in case.items() if k != "raw"} if kind == "yamlx" else case)  # fmt: skip
            if problems is None:
                slow += 1
                print(kind, i, "SLOW", shown, flush=True)
                continue
            bugs += bool(problems)
            print(kind, i, "BUG" if problems else "ok", LAST_RC, shown, *problems, flush=True)
    print("bugs", bugs, "slow", slow)
