"""Bad input of every class (issue 11), through the real CLI entry point in-process: each
case exits 2 with exactly one line on stderr naming what is wrong, no traceback, and
leaves the working folder byte for byte as it was — a user's file is planted there, and
the whole tree above it is listed before and after (nothing written, nothing deleted).

The classes: output paths; unreadable or pathological YAML; misspelt keys (reported
first, with the nearest allowed key); non-finite numbers; booleans where numbers belong;
sizes beyond their documented bounds (docs/safety.md); the same bounds in ``cost``,
sweep grids and trace files.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from disaggsim.cli import main
from disaggsim.output import MARKER
from tests.conftest import REPO

CI = REPO / "scenarios" / "ci"
DISAGG = "disagg.yaml"  # copies of scenarios/ci/disaggregated.yaml etc. in the work folder
COLOC = "coloc.yaml"
FABRIC = "fabric.yaml"
CUT = ["--set", "sim.duration_s=20", "--set", "sim.warmup_s=2", "--quiet", "--no-plots"]

Setup = Callable[[Path], None]


def _nothing(work: Path) -> None:
    return None


def _file(name: str, data: bytes | str) -> Setup:
    def make(work: Path) -> None:
        p = work / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            p.write_text(data)
        else:
            p.write_bytes(data)

    return make


def _scenario(name: str, replace: dict[str, str]) -> Setup:
    """A copy of the CI disaggregated scenario with some text replaced."""

    def make(work: Path) -> None:
        text = (CI / "disaggregated.yaml").read_text()
        for a, b in replace.items():
            assert a in text, a
            text = text.replace(a, b)
        (work / name).write_text(text)

    return make


def _earlier_result_plus_user_file(work: Path) -> None:
    out = work / "old"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    (out / MARKER).write_text(
        '{"written_by": "disaggsim", "command": "run", "files": ["summary.json"]}'
    )
    (out / "notes.txt").write_text("mine")


def _symlink(work: Path) -> None:
    (work / "target").mkdir()
    (work / "link").symlink_to(work / "target")


_NESTED = "a: " + "[" * 100_000 + "]" * 100_000 + "\n"
_LAUGHS = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 9)
)
_SESSIONS = (
    "kind: sessions, user_tokens: {dist: fixed, value: 10}, output_tokens: {dist: fixed, value: 10}"
)
_THINK = "think_time_s: {dist: fixed, value_s: 1}"
_AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _reference(**changes: object) -> str:
    """The committed chunked reference with some top-level fields replaced (a point's
    field: ``point0_<metric>``)."""
    import json

    doc = json.loads((REPO / "results" / "reference" / "chunked.json").read_text())
    for key, value in changes.items():
        if key.startswith("point0_"):
            doc["points"][0][key.removeprefix("point0_")] = value
        else:
            doc[key] = value
    return json.dumps(doc)


def _regress(*extra: str) -> list[str]:
    return ["regress", "--ci-dir", str(CI), "--reference-dir", "ref", "--only", "chunked",
            "--quiet", *extra]  # fmt: skip


def run_args(*extra: str, scenario: str = DISAGG) -> list[str]:
    return ["run", scenario, *CUT, *extra]


def sets(*items: str, scenario: str = DISAGG) -> list[str]:
    out = ["run", scenario, *CUT]
    for s in items:
        out += ["--set", s]
    return out


def cost(*argv: str) -> list[str]:
    return ["cost", *argv]


PREFILL = ["prefill", "--model", "llama-3-70b", "--gpu", "h100-sxm", "--tp", "4"]
DECODE = ["decode", "--model", "llama-3-70b", "--gpu", "h100-sxm", "--tp", "4", "--batch", "8"]

# (id, setup, argv, fragment expected in the error line)
CASES: list[tuple[str, Setup, list[str], str]] = [
    # ---- output paths
    ("out-dot", _nothing, run_args("--out", "."), "--out .: names an existing folder"),
    ("out-dotdot", _nothing, run_args("--out", ".."), "--out ..: names an existing folder"),
    ("out-root", _nothing, run_args("--out", "/"), "--out /: names an existing folder"),
    ("out-cwd-absolute", _nothing, run_args("--out", "{work}"), "is the working folder"),
    ("out-parent-absolute", _nothing, run_args("--out", "{parent}"), "is the working folder"),
    ("out-user-file", _nothing, run_args("--out", "keep.txt"), "exists and is not a folder"),
    ("out-through-file", _nothing, run_args("--out", "keep.txt/x"), "is a file, not a folder"),
    ("out-user-folder", _file("mine/a.txt", "x"), run_args("--out", "mine"), "did not write (a.txt)"),
    ("out-checkout", _nothing, run_args("--out", str(REPO)), "did not write"),
    ("out-result-plus-user-file", _earlier_result_plus_user_file, run_args("--out", "old"),
     "plus files it did not write (notes.txt)"),
    ("out-symlink", _symlink, run_args("--out", "link"), "symbolic link"),
    ("out-name-too-long", _nothing, run_args("--out", "r" * 240), "name longer than"),
    ("name-dotdot", _nothing, sets("name=.."), "name: '..' is not a folder name"),
    ("name-dot", _nothing, sets("name=."), "'.' is not a folder name"),
    ("name-slash", _nothing, sets("name=a/b"), "'a/b' is not a folder name"),
    ("name-dash", _nothing, sets("name=-rf"), "'-rf' is not a folder name"),
    ("trace-user-file", _nothing, run_args("--out", "r", "--trace", "keep.txt"),
     "--trace keep.txt: exists and is not a trace disaggsim wrote"),
    ("trace-folder", _file("mine/a.txt", "x"), run_args("--out", "r", "--trace", "mine"),
     "--trace mine: is a folder"),
    ("sweep-out-dot", _nothing, ["sweep", DISAGG, "--param", "workload.rate_per_s=1,2", "--out",
     ".", "--quiet"], "--out .: names an existing folder"),
    ("compare-out-user-folder", _file("mine/a.txt", "x"), ["compare", DISAGG, COLOC, "--out",
     "mine", "--quiet"], "did not write (a.txt)"),
    ("plan-out-dotdot", _nothing, ["plan", DISAGG, "--quick", "--out", "..", "--quiet"],
     "--out ..: names an existing folder"),
    ("regress-update-user-reference", _file("ref/chunked.json", '{"mine": 1}'),
     ["regress", "--update", "--reference-dir", "ref", "--ci-dir", str(CI), "--only", "chunked",
      "--param", "workload.rate_per_s=1", "--quiet"], "not a reference disaggsim wrote"),
    ("calibrate-fit-user-file", _nothing, ["calibrate", "fit",
     str(REPO / "calibration" / "runs" / "h200-2026-11-29"), "--gpu", "h200-sxm", "--out",
     "keep.txt"], "--out keep.txt: exists and is not a profile disaggsim wrote"),
    ("calibrate-raw-dot", _nothing, ["calibrate", "--device", "cpu", "--out", "."],
     "--out .: names an existing folder"),
    # ---- unreadable or pathological YAML
    ("yaml-latin1", _file("s.yaml", b"name: caf\xe9\n"), ["run", "s.yaml"], "not UTF-8 text (byte 0xe9"),
    ("yaml-utf16", _file("s.yaml", "name: x\n".encode("utf-16")), ["run", "s.yaml"], "not UTF-8 text"),
    ("yaml-random-bytes", _file("s.yaml", bytes(range(128, 256)) * 8), ["run", "s.yaml"],
     "not UTF-8 text"),
    ("yaml-nul-byte", _file("s.yaml", b"name: a\x00b\n"), ["run", "s.yaml"], "malformed YAML"),
    ("yaml-nested-100k", _file("s.yaml", _NESTED), ["run", "s.yaml"], "nested more than 64 levels"),
    ("yaml-duplicate-key", _file("s.yaml", "name: a\nseed: 1\nname: b\n"), ["run", "s.yaml"],
     "line 3: duplicate key 'name' (first given on line 1)"),
    ("yaml-duplicate-nested-key", _scenario(DISAGG, {"num_workers: 1, tp: 4, max_batch_seqs":
     "num_workers: 1, tp: 4, tp: 2, max_batch_seqs"}), run_args(), "duplicate key 'tp'"),
    ("yaml-billion-laughs", _file("s.yaml", _LAUGHS), ["run", "s.yaml"],
     "values once YAML aliases are expanded"),
    ("yaml-recursive-alias", _file("s.yaml", "a: &x [1, *x]\n"), ["run", "s.yaml"],
     "refers to itself"),
    ("yaml-malformed", _file("s.yaml", "name: [x\n"), ["run", "s.yaml"], "malformed YAML"),
    ("yaml-top-level-list", _file("s.yaml", "- a\n- b\n"), ["run", "s.yaml"],
     "expected a mapping"),
    ("yaml-empty", _file("s.yaml", ""), ["run", "s.yaml"], "expected a mapping"),
    ("yaml-too-large", _file("s.yaml", "# x\n" * (2**20 + 1)), ["run", "s.yaml"],
     "larger than the 4,194,304 bytes"),
    ("yaml-missing-file", _nothing, ["run", "nope.yaml"], "nope.yaml: scenario file not found"),
    ("set-duplicate-key", _nothing, sets("decode_pool={gpu: h100-sxm, gpu: a100-80gb}"),
     "duplicate key 'gpu'"),
    # YAML 1.1 numbers in another base than their digits suggest: read silently as 8, 64
    # and 90 (a leading 0 is octal, colons base 60)
    ("yaml-octal-looking", _scenario(DISAGG, {"num_workers: 1, tp: 4, max_batch_seqs: 128":
     "num_workers: 1, tp: 4, max_batch_seqs: 0100"}), run_args(),
     "disagg.yaml: line 12: '0100' is not the number it looks like (YAML 1.1 reads a leading 0 "
     "as octal: 64; write 100 without the leading 0, or quote it for text)"),
    ("set-octal-looking", _nothing, sets("seed=010"), "--set seed=010: '010' is not the number "
     "it looks like (YAML 1.1 reads a leading 0 as octal: 8; write 10"),
    ("set-base-60", _nothing, sets("sim.duration_s=1:30"), "--set sim.duration_s=1:30: '1:30' is "
     "not the number it looks like (YAML 1.1 reads digits separated by ':' in base 60: 90;"),
    # a null where a value belongs named neither the null nor the values the field takes
    ("set-null-gpu", _nothing, sets("decode_pool.gpu=~"), "disagg.yaml: decode_pool.gpu: Input "
     "should be a valid string, got null (YAML reads ~, null and a key with no value as null) "
     "(allowed: a100-80gb, h100-sxm,"),
    ("yaml-null-count", _scenario(DISAGG, {"num_workers: 1, tp: 4, max_batch_seqs: 128":
     "num_workers: , tp: 4, max_batch_seqs: 128"}), run_args(), "disagg.yaml: "
     "decode_pool.num_workers: Input should be a valid integer, got null (YAML reads ~, null "
     "and a key with no value as null)"),
    # ---- misspelt keys: reported first, with the nearest allowed key
    ("misspelt-required-key", _scenario(DISAGG, {"num_workers: 1, tp: 4, max_batch_seqs":
     "num_worker: 1, tp: 4, max_batch_seqs"}), run_args(),
     "decode_pool.num_worker: unknown key (did you mean num_workers?)"),
    ("misspelt-top-level", _scenario(DISAGG, {"seed: 11": "sed: 11"}), run_args(),
     "sed: unknown key (did you mean seed?)"),
    ("misspelt-nested-workload", _scenario(DISAGG, {"arrival: poisson": "arival: poisson"}),
     run_args(), "workload.arival: unknown key (did you mean arrival?)"),
    ("set-misspelt", _nothing, sets("decode_pool.num_workerz=2"),
     "unknown key 'num_workerz' at decode_pool (did you mean num_workers?)"),
    # ---- a scalar where a mapping belongs: the forms the field takes are named
    ("length-scalar", _scenario(DISAGG, {"{dist: lognormal, median: 2048, sigma: 0.6, min: 64, "
     "max: 8192}": "2048"}), run_args(), "workload.prompt_tokens: expected a mapping, one of "
     "{dist: fixed, value}, {dist: uniform, low, high}, {dist: lognormal, median, sigma}, "
     "{dist: empirical, quantiles}, got 2048"),
    # a mapping without its tag (dist, kind) names the tag and the forms (it read
    # "expected a mapping" of a mapping); a wrong tag names the tag and its values (it read
    # pydantic's "Input tag 'fixd' found using 'dist' does not match any of the expected
    # tags"; the fabric's "found using _fabric_kind()")
    ("length-no-tag", _nothing, sets("workload.output_tokens={value: 12}"),
     "workload.output_tokens.dist: required key is missing (give a mapping, one of "
     "{dist: fixed, value}, {dist: uniform, low, high}"),
    ("length-wrong-tag", _nothing, sets("workload.output_tokens={dist: fixd, value: 12}"),
     "workload.output_tokens.dist: unknown value 'fixd' (did you mean fixed?) (allowed: "
     "fixed, uniform, lognormal, empirical)"),
    ("length-null-tag", _nothing, sets("workload.output_tokens={dist: null, value: 12}"),
     "workload.output_tokens.dist: unknown value null (allowed: fixed"),
    ("workload-no-kind", _nothing, sets("workload={rate_per_s: 3}"),
     "workload.kind: required key is missing (give a mapping, one of {kind: synthetic, "),
    ("fabric-wrong-kind", _nothing, sets("fabric={kind: topolgy}"),
     "fabric.kind: unknown value 'topolgy' (did you mean topology?) (allowed: link, topology)"),
    ("rate-shape-no-kind", _nothing, sets("workload.rate_shape={period_s: 3}"),
     "workload.rate_shape.kind: required key is missing (allowed: diurnal, step)"),
    ("length-null", _nothing, sets("workload.output_tokens=null"), "got null"),
    ("slo-scalar", _nothing, sets("slo=5"), "slo: expected a mapping with keys ttft_ms, itl_ms, "
     "itl_statistic, percentile, attainment_target (required: ttft_ms, itl_ms), got 5"),
    ("workload-scalar", _nothing, sets("workload=azure"), "workload: expected a mapping, one of "
     "{kind: synthetic, prompt_tokens, output_tokens}, {kind: preset, preset}"),
    ("fabric-scalar", _nothing, sets("fabric=nvlink", scenario=FABRIC),
     "fabric: expected a mapping, one of {kind: link, link, bandwidth_gb_per_s, latency_us}"),
    # ---- non-finite numbers: the field is named
    ("inf-duration", _nothing, sets("sim.duration_s=.inf"), "sim.duration_s: Input should be a finite"),
    ("nan-duration", _nothing, sets("sim.duration_s=.nan"), "sim.duration_s: Input should be a finite"),
    ("inf-drain", _nothing, sets("sim.max_drain_s=.inf"), "sim.max_drain_s: Input should be a finite"),
    ("inf-provision", _nothing, sets("failures.provision_s=.inf"), "failures.provision_s"),
    ("inf-repair", _nothing, sets("failures.workers=[{at_s: 1, worker: 'decode:0', repair_s: .inf}]"),
     "failures.workers.0.repair_s: Input should be a finite"),
    ("inf-latency", _nothing, sets("fabric.latency_us=.inf"), "fabric.latency_us: Input should be a finite"),
    # a wrong value of a field whose type is a literal of several values (fabric.link) is
    # that field's error, not an unknown key of the union's other member (topology)
    ("fabric-link-wrong-value", _nothing, sets("fabric.link=abc"),
     "fabric.link: Input should be 'nvlink', 'infiniband', 'roce' or 'pcie', got 'abc'"),
    ("fabric-link-list", _nothing, sets("fabric.link=[]"), "fabric.link: Input should be 'nvlink'"),
    ("inf-bandwidth", _nothing, sets("fabric.bandwidth_gb_per_s=.inf"), "fabric.bandwidth_gb_per_s"),
    ("nan-slo", _nothing, sets("slo.ttft_ms=.nan"), "slo.ttft_ms: Input should be a finite"),
    ("inf-rate", _nothing, sets("workload.rate_per_s=.inf"), "workload.rate_per_s"),
    ("inf-topology-nvlink", _nothing, sets("fabric.nvlink_gb_per_s=.inf", scenario=FABRIC),
     "fabric.nvlink_gb_per_s"),
    ("inf-autoscale-interval", _nothing, sets(
     "autoscale={prefill: {min_workers: 1, max_workers: 2, policy: slo, interval_s: .inf}}"),
     "autoscale.prefill.interval_s"),
    ("huge-provision", _nothing, sets("failures.provision_s=1e300"),
     "failures.provision_s: 1e+300 is beyond 1e+15"),
    # ---- booleans where a number belongs
    ("bool-true-workers", _nothing, sets("decode_pool.num_workers=true"),
     "decode_pool.num_workers: true is a boolean, not a number"),
    ("bool-yes-workers", _nothing, sets("decode_pool.num_workers=yes"), "is a boolean"),
    ("bool-on-tp", _nothing, sets("prefill_pool.tp=on"), "prefill_pool.tp: true is a boolean"),
    ("bool-rate", _nothing, sets("workload.rate_per_s=true"), "workload.rate_per_s: true is a boolean"),
    ("bool-in-file", _scenario(DISAGG, {"seed: 11": "seed: no"}), run_args(),
     "seed: false is a boolean"),
    # ---- sizes beyond their bounds
    ("workers-1e30", _nothing, sets("decode_pool.num_workers=1000000000000000000000000000000"),
     "decode_pool.num_workers: must be <= 1,024"),
    ("workers-1e6", _nothing, sets("decode_pool.num_workers=1000000"), "must be <= 1,024"),
    ("tp-1000", _nothing, sets("decode_pool.tp=1000"), "decode_pool.tp: must be <= 64"),
    ("batch-seqs-1e9", _nothing, sets("decode_pool.max_batch_seqs=1000000000"),
     "decode_pool.max_batch_seqs: must be <= 16,384"),
    ("autoscale-max-1e9", _nothing, sets(
     "autoscale={prefill: {min_workers: 1, max_workers: 1000000000, policy: slo}}"),
     "autoscale.prefill.max_workers: must be <= 1,024"),
    ("total-gpus", _nothing, sets("decode_pool.num_workers=1024", "decode_pool.tp=64"),
     "GPUs (num_workers or autoscale max_workers × tp"),
    ("rate-times-duration", _nothing, sets("workload.rate_per_s=1e7"),
     "requests expected (rate × sim.duration_s), more than the 2,000,000"),
    ("burstiness-1e6", _nothing, sets("workload.arrival=gamma", "workload.burstiness_cv=1e6"),
     "workload.burstiness_cv: must be <= 100"),
    ("lognormal-no-max", _nothing, sets("workload.output_tokens={dist: lognormal, median: 100, sigma: 40}"),
     "draws lengths beyond 1,048,576 tokens; give max"),
    ("fixed-tokens-1e30", _nothing, sets(
     "workload.output_tokens={dist: fixed, value: 1000000000000000000000000000000}"),
     "workload.output_tokens.value: must be <= 1,048,576"),
    ("uniform-high-1e9", _nothing, sets("workload.prompt_tokens={dist: uniform, low: 1, high: 1000000000}"),
     "workload.prompt_tokens.high: must be <= 1,048,576"),
    ("num-requests-1e12", _nothing, sets("workload.num_requests=1000000000000"),
     "workload.num_requests: must be <= 2,000,000"),
    ("drain-1e9", _nothing, sets("sim.max_drain_s=1e9"), "sim.max_drain_s: must be <= 2,592,000"),
    ("seed-2e64", _nothing, sets("seed=36893488147419103232"), "seed: must be <="),
    ("random-failures-storm", _nothing, sets(
     "failures.random=[{pool: decode, mtbf_s: 0.000001, mttr_s: 0.000001}]"),
     "failures.random.0: about"),
    ("autoscale-interval-tiny", _nothing, sets(
     "autoscale={prefill: {min_workers: 1, max_workers: 2, policy: slo, interval_s: 0.000001}}"),
     "autoscale.prefill.interval_s: "),
    ("gpus-per-node-1e6", _nothing, sets("fabric.gpus_per_node=1000000", scenario=FABRIC),
     "fabric.gpus_per_node: must be <= 64"),
    # vLLM refuses max_num_batched_tokens < max_num_seqs (SchedulerConfig): each running
    # sequence takes a token of an iteration's budget
    ("tokens-below-seqs", _nothing, sets("pool.scheduler=chunked", "pool.max_batch_tokens=64",
     "pool.max_batch_seqs=128", scenario=COLOC),
     "pool.max_batch_tokens: 64 is below pool.max_batch_seqs (128), which vLLM refuses"),
    ("tokens-below-seqs-vllm", _nothing, sets("pool.max_batch_tokens=100",
     "pool.max_batch_seqs=101", scenario=COLOC),
     "pool.max_batch_tokens: 100 is below pool.max_batch_seqs (101)"),
    # every vLLM instance, a disaggregated prefill or decode one too (a decode step
    # forwards a token per running sequence; its budget sizes the activation memory)
    ("tokens-below-seqs-prefill", _nothing, sets("prefill_pool.max_batch_seqs=16384"),
     "prefill_pool.max_batch_tokens: 8192 is below prefill_pool.max_batch_seqs (16384)"),
    ("tokens-below-seqs-decode", _nothing, sets("decode_pool.max_batch_tokens=64",
     "decode_pool.max_batch_seqs=128"),
     "decode_pool.max_batch_tokens: 64 is below decode_pool.max_batch_seqs (128), which vLLM "
     "refuses (max_num_batched_tokens must be >= max_num_seqs: a decode step of "
     "max_batch_seqs sequences forwards that many tokens"),
    # work, not only requests: 2,000,000 prompts of 1,048,576 tokens in 16-token chunks
    # ran (1.3e11 iterations, about two months at the measured 25,000 a second)
    ("prefill-iterations", _nothing, sets("pool.scheduler=chunked", "pool.max_batch_tokens=16",
     "pool.max_batch_seqs=16",
     "workload.rate_per_s=99999", "workload.prompt_tokens={dist: fixed, value: 1048576}",
     scenario=COLOC), "pool.max_batch_tokens: 16 gives about 1.31e+11 prefill iterations"),
    ("empirical-2e6", _nothing, sets(
     "workload.output_tokens={dist: empirical, quantiles: [[0, 1], [1, 2000000]]}"),
     "values must be <= 1,048,576"),
    ("empirical-1e30", _nothing, sets(
     "workload.output_tokens={dist: empirical, quantiles: [[0, 1], [1, 1.0e+30]]}"),
     "workload.output_tokens.quantiles: 1e+30 is beyond 1e+15"),
    ("sessions-expected-requests", _nothing, sets(f"workload={{{_SESSIONS}, {_THINK}, rate_per_s: "
     "1000, turns: {dist: fixed, value: 1000}}"), "requests expected"),
    ("sessions-tool-calls", _nothing, sets(f"workload={{{_SESSIONS}, {_THINK}, rate_per_s: 1, turns: "
     "{dist: fixed, value: 2}, agent: {tool_calls_mean: 1e9, tool_call_tokens: {dist: fixed, value: 5}, "
     "tool_result_tokens: {dist: fixed, value: 5}, tool_latency_s: {dist: fixed, value_s: 1}}}"),
     "workload.agent.tool_calls_mean: 1e+09 tool calls per turn"),
    ("sessions-inf-think", _nothing, sets(f"workload={{{_SESSIONS}, rate_per_s: 1, turns: "
     "{dist: fixed, value: 2}, think_time_s: {dist: fixed, value_s: .inf}}"),
     "think_time_s"),
    # ---- other files a command reads
    ("profile-nested-json", _file("p.json", "[" * 100_000 + "]" * 100_000),
     ["calibrate", "show", "h100-sxm", "--profile", "p.json"], "p.json: JSON nested too deeply"),
    ("profile-not-utf8", _file("p.json", bytes(range(128, 256))),
     cost(*PREFILL, "--batch", "1", "--prompt-tokens", "512", "--profile", "p.json"),
     "p.json: not UTF-8 text"),
    # a profile fitted on another GPU ran with --gpu's catalog figures, silently (found by
    # hand probes of every cost flag: --gpu h100-sxm --profile .../a100_80gb.json)
    ("profile-of-another-gpu", _nothing, cost(*PREFILL, "--batch", "1", "--prompt-tokens",
     "512", "--profile", str(REPO / "disaggsim" / "hardware" / "profiles" / "a100_80gb.json")),
     "a100_80gb.json: gpu is 'a100-80gb', expected 'h100-sxm'"),
    ("base-profile-nested", _file("p.json", "[" * 100_000 + "]" * 100_000),
     ["calibrate", "fit", str(REPO / "calibration" / "runs" / "h200-2026-11-29"), "--gpu",
      "h200-sxm", "--base", "p.json", "--out", "new.json"], "p.json: JSON nested too deeply"),
    ("raw-csv-not-utf8", _file("raw/gemm.csv", bytes(range(128, 256)) * 4),
     ["calibrate", "fit", "raw", "--gpu", "h200-sxm", "--out", "new.json"],
     "raw/gemm.csv: not a readable CSV"),
    ("steps-csv-not-utf8", _file("raw/steps.csv", bytes(range(128, 256)) * 4),
     ["calibrate", "validate-steps", "raw"], "raw/steps.csv: not a readable CSV"),
    ("cost-input-not-utf8", _file("q.csv", bytes(range(128, 256)) * 4),
     cost("prefill", "--input", "q.csv"), "q.csv: not a readable CSV"),
    # ---- cost: the same bounds
    ("cost-batch-1e400", _nothing, cost(*PREFILL, "--batch", "1" + "0" * 400, "--prompt-tokens",
     "512"), "--batch: must be <= 16,384"),
    ("cost-prompt-1e30", _nothing, cost(*PREFILL, "--batch", "1", "--prompt-tokens", "1" + "0" * 30),
     "--prompt-tokens: must be <= 1,048,576"),
    ("cost-tp-1000", _nothing, cost("prefill", "--model", "llama-3-70b", "--gpu", "h100-sxm", "--tp",
     "1000", "--batch", "1", "--prompt-tokens", "512"), "--tp: must be <= 64"),
    ("cost-context-1e30", _nothing, cost(*DECODE, "--context-tokens", "1" + "0" * 30),
     "--context-tokens: must be <= 1,048,576"),
    # ---- sweep grids
    ("sweep-billion-points", _nothing, ["sweep", DISAGG, "--param",
     "workload.rate_per_s=1:2:1000000000", "--quiet"], "1,000,000,000 points, more than the 10,000"),
    ("sweep-product", _nothing, ["sweep", DISAGG, "--param", "workload.rate_per_s=1:2:1000",
     "--param", "decode_pool.max_batch_seqs=1:1000:1000", "--quiet"], "1000 × 1000 simulations"),
    ("sweep-seeds", _nothing, ["sweep", DISAGG, "--param", "workload.rate_per_s=1,2", "--seeds",
     "100000", "--quiet"], "--seeds 100000: must be an integer from 1 to 1,000"),
    ("compare-grid", _nothing, ["compare", DISAGG, COLOC, "--param",
     "workload.rate_per_s=1:2:6000", "--quiet"], "more than the 10,000"),
    # ---- physical validity (docs/validity.md) and the one-command plan (docs/planning.md)
    ("nvlink-across-nodes", _nothing, sets("decode_pool.num_workers=2"),
     "fabric.link: nvlink needs both pools in one node's NVLink domain (8 x h100-sxm)"),
    ("nvlink-autoscaled", _nothing, sets("autoscale={decode: {min_workers: 1, max_workers: 2, "
     "policy: target, interval_s: 1, target: {signal: kv_util, target_value: 0.5}}}"),
     "decode_pool (2 x tp4 at autoscale.decode.max_workers) = 12 GPUs"),
    ("nvlink-two-gpu-types", _nothing, sets("decode_pool.gpu=h200-sxm"),
     "fabric.link: nvlink cannot join prefill_pool.gpu h100-sxm and decode_pool.gpu h200-sxm"),
    ("nvlink-sweep-point", _nothing, ["sweep", DISAGG, "--param", "decode_pool.num_workers=1,2",
     "--quiet"], "= 12 GPUs: use fabric.link infiniband or roce"),
    # TP beyond a node on a topology fabric: refused by run, sweep and compare alike (kind
    # link prices it hierarchically instead: docs/validity.md)
    ("topology-tp-beyond-node-run", _nothing, sets("prefill_pool.tp=16", scenario=FABRIC),
     "fabric.gpus_per_node: prefill_pool.tp 16 is larger than the node's NVLink domain (8 "
     "GPUs) (allowed: tp <= 8 on a topology fabric"),
    ("topology-tp-beyond-node-sweep", _nothing, ["sweep", FABRIC, "--param",
     "prefill_pool.tp=8,16", "--quiet"], "fabric.yaml: fabric.gpus_per_node: prefill_pool.tp 16"
     " is larger than the node's NVLink domain (8 GPUs) (allowed: tp <= 8"),
    ("topology-tp-beyond-node-compare", _nothing, ["compare", FABRIC, FABRIC, "--set",
     "decode_pool.tp=16", "--param", "workload.rate_per_s=0.5,1", "--quiet"],
     "fabric.yaml: fabric.gpus_per_node: decode_pool.tp 16 is larger than the node's NVLink "
     "domain (8 GPUs) (allowed: tp <= 8"),
    ("prefill-budget-below-prompt", _nothing, sets("prefill_pool.max_batch_tokens=1024"),
     "prefill_pool.max_batch_tokens: 1024 is below the largest prompt"),
    ("plan-question-model", _nothing, ["plan", "--model", "gpt-9", "--gpu", "h100-sxm", "--gpus",
     "16", "--isl", "8000", "--osl", "300", "--ttft-ms", "2000", "--itl-ms", "100", "--quick"],
     "--model gpt-9: unknown model"),
    ("plan-question-isl", _nothing, ["plan", "--model", "llama-3-70b", "--gpu", "h100-sxm",
     "--gpus", "16", "--isl", "8k", "--osl", "300", "--ttft-ms", "2000", "--itl-ms", "100"],
     "--isl 8k: expected N, uniform:LO:HI or lognormal:MEDIAN:SIGMA[:MAX]"),
    ("plan-question-nvlink", _nothing, ["plan", "--model", "llama-3-70b", "--gpu", "h100-sxm",
     "--gpus", "16", "--isl", "8000", "--osl", "300", "--ttft-ms", "2000", "--itl-ms", "100",
     "--fabric", "nvlink"], "--fabric nvlink: 16 GPUs do not fit one node of 8 x h100-sxm"),
    ("plan-question-statistic", _nothing, ["plan", "--model", "llama-3-70b", "--gpu", "h100-sxm",
     "--gpus", "16", "--isl", "8000", "--osl", "300", "--ttft-ms", "2000", "--itl-ms", "100",
     "--itl-statistic", "p99"], "--itl-statistic p99: allowed: tpot, max_gap"),
    ("plan-question-and-scenario", _nothing, ["plan", DISAGG, "--isl", "100"],
     "plan: give a scenario file or the question flags, not both"),
    # ---- goodput run lengths (plan, compare) and flags argparse cannot parse
    ("plan-min-requests-0", _nothing, ["plan", DISAGG, "--quick", "--min-requests", "0",
     "--quiet"], "--min-requests 0: must be an integer >= 1 and at most 2,000,000"),
    ("plan-min-requests-float", _nothing, ["plan", DISAGG, "--min-requests", "1.5"],
     "argument --min-requests: invalid int value: '1.5' (see disaggsim plan --help)"),
    ("plan-seeds-0", _nothing, ["plan", DISAGG, "--quick", "--seeds", "0", "--quiet"],
     "--seeds 0: must be an integer from 1 to 1,000"),
    ("compare-service-multiple-0", _nothing, ["compare", DISAGG, COLOC, "--param",
     "workload.rate_per_s=1,2", "--service-multiple", "0", "--quiet"],
     "--service-multiple 0: must be a number > 0 and at most 1000"),
    # a swept rate that is no number: a ValueError (a word) or TypeError (null) traceback,
    # or NaN left out of the bracket ("the lowest swept ... 1 and the highest ... 1")
    *[(f"compare-swept-rate-{name}", _nothing, ["compare", DISAGG, COLOC, "--param",
       f"workload.rate_per_s={text}", "--quiet"], f"--param workload.rate_per_s: {shown} is "
       "not a finite number of requests per second") for name, text, shown in
      [("word", "abc,1", "'abc'"), ("null", "null,2", "null"), ("nan", "1,nan", "nan")]],
    # NaN swept in any field is refused by the field (it was "param PATH: value nan cannot
    # be written as a scenario value", naming no flag and no field)
    ("sweep-nan", _nothing, ["sweep", DISAGG, "--param", "slo.ttft_ms=1,nan", "--quiet"],
     "slo.ttft_ms: Input should be a finite number, got nan (at sweep point slo.ttft_ms=nan)"),
    # ---- goodput searches: an event at a fixed time falls inside some runs, after others
    ("compare-fixed-failure", _scenario(DISAGG, {"sim: {": "failures: {workers: [{at_s: 40, "
     "worker: 'decode:0'}]}\nsim: {"}), ["compare", DISAGG, "--rate-lo", "1", "--rate-hi",
     "4", "--quiet", "--no-plots"], "disagg.yaml: failures.workers.0.at_s = 40 s: a goodput "
     "search sets each run's length from its rate"),
    ("compare-fixed-link-failure", _scenario(DISAGG, {"sim: {": "failures: {links: [{start_s: "
     "30, duration_s: 5}]}\nsim: {"}), ["compare", DISAGG, "--param",
     "workload.rate_per_s=1,2", "--quiet", "--no-plots"], "failures.links.0.start_s = 30 s"),
    ("compare-mix-shift", _scenario(DISAGG, {"  max_tokens: 256": "  max_tokens: 256\n  "
     "mix_shift: {at_s: 60, prompt_tokens: {dist: fixed, value: 100}}"}), ["compare", DISAGG,
     "--rate-lo", "1", "--rate-hi", "4", "--quiet", "--no-plots"],
     "workload.mix_shift.at_s = 60 s: a goodput search"),
    # ---- a pool section of the other architecture, named before its own fields
    ("pool-on-disaggregated", _nothing, sets("pool.num_workers=3"),
     "disagg.yaml: architecture disaggregated takes prefill_pool/decode_pool, not pool"),
    ("prefill-pool-on-colocated", _nothing, sets("prefill_pool.num_workers=2", scenario=COLOC),
     "coloc.yaml: architecture colocated takes pool, not prefill_pool/decode_pool"),
    ("run-unknown-flag", _nothing, run_args("--gpus", "4"),
     "unrecognized arguments: --gpus 4"),
    # ---- plan budgets
    ("plan-gpus-1e9", _nothing, ["plan", DISAGG, "--quick", "--gpus", "1000000000", "--quiet"],
     "--gpus 1000000000: a budget of 1,000,000,000 GPUs, more than the 16,384"),
    ("plan-target-rate-1e9", _nothing, ["plan", DISAGG, "--quick", "--target-rate", "1e9",
     "--quiet"], "GPUs, more than the 16,384 a plan may size"),
    ("plan-target-rate-inf", _nothing, ["plan", DISAGG, "--quick", "--target-rate", "inf",
     "--quiet"], "--target-rate inf: must be a finite rate"),
    # ---- trace cells
    ("trace-azure-1e30", _file("t.csv", _AZURE_HEAD + "2023-11-16 18:17:03.9799600,100,20\n"
     "2023-11-16 18:17:04.0,1000000000000000000000000000000,20\n"),
     sets("workload={kind: trace, path: t.csv}"), "t.csv:3: ContextTokens"),
    ("trace-mooncake-1e30", _file("t.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
     '{"timestamp": 5, "input_length": 1e30, "output_length": 5}\n'),
     sets("workload={kind: trace, path: t.jsonl, format: mooncake}"), "t.jsonl:2: input_length"),
    ("trace-mooncake-nested", _file("t.jsonl", "[" * 100_000 + "]" * 100_000 + "\n"),
     sets("workload={kind: trace, path: t.jsonl, format: mooncake}"), "t.jsonl:1: JSON nested too deeply"),
    ("trace-azure-random-bytes", _file("t.csv", bytes(range(128, 256)) * 8),
     sets("workload={kind: trace, path: t.csv, format: azure}"), "t.csv: not UTF-8 text, not a trace"),
    # ---- keys and values YAML reads as something else than text (2026-12-03, second session)
    ("yaml-binary-value", _scenario(DISAGG, {"name: ci-disaggregated": "name: !!binary "
     "aGVsbG8="}), run_args(), "disagg.yaml: name: binary data (a YAML !!binary value"),
    ("yaml-binary-cache-policy", _scenario(DISAGG, {"sim: {": "cache: {policy: !!binary "
     "cmFkaXg=}\nsim: {"}), run_args(), "disagg.yaml: cache.policy: binary data"),
    ("yaml-null-key", _scenario(DISAGG, {"seed: 11": "seed: 11\nnull: 3"}), run_args(),
     "disagg.yaml: null: unknown key (YAML reads this key as null, not a name) (allowed: "),
    ("yaml-tilde-key-nested", _scenario(DISAGG, {"tp: 4, max_batch_seqs": "tp: 4, ~: 1, "
     "max_batch_seqs"}), run_args(), "disagg.yaml: decode_pool.null: unknown key (YAML reads"),
    ("yaml-yes-key", _scenario(DISAGG, {"seed: 11": "seed: 11\nyes: 3"}), run_args(),
     "disagg.yaml: true: unknown key (YAML reads this key as a boolean, not a name)"),
    ("yaml-date-key", _scenario(DISAGG, {"seed: 11": "seed: 11\n2001-01-01: 3"}), run_args(),
     "disagg.yaml: 2001-01-01: unknown key (YAML reads this key as a date"),
    ("yaml-null-key-cache", _scenario(DISAGG, {"sim: {": "cache: {policy: radix, null: 1}\n"
     "sim: {"}), run_args(), "disagg.yaml: cache.null: unknown key (YAML reads this key as "
     "null, not a name) (allowed: policy, routing, tiers)"),
    ("yaml-number-key-cache-tiers", _scenario(DISAGG, {"sim: {": "cache: {policy: radix, "
     "tiers: {3: {}}}\nsim: {"}), run_args(), "disagg.yaml: cache.tiers.3: unknown key (YAML "
     "reads this key as a number"),
    ("yaml-duplicate-null-key", _scenario(DISAGG, {"seed: 11": "seed: 11\nnull: 3\n~: 4"}),
     run_args(), "disagg.yaml: line 8: duplicate key 'null' (first given on line 7)"),
    # ---- --set through a list: an item the list holds, else one line saying so
    ("set-index-missing-list", _nothing, sets("failures.workers.0.at_s=3"),
     "--set failures.workers.0.at_s=3: failures.workers is not in the scenario, so it has no "
     "item 0 to set; give the whole list instead: --set 'failures.workers=[...]'"),
    ("set-index-beyond-list", _scenario(DISAGG, {"sim: {": "failures: {workers: [{at_s: 40, "
     "worker: 'decode:0'}]}\nsim: {"}), sets("failures.workers.1.at_s=3"),
     "failures.workers has items 0..0, no item 1"),
    ("set-index-not-a-number", _scenario(DISAGG, {"sim: {": "failures: {workers: [{at_s: 40, "
     "worker: 'decode:0'}]}\nsim: {"}), sets("failures.workers.first.at_s=3"),
     "failures.workers is a list: index its items by number (0..0)"),
    ("set-index-unknown-item-key", _scenario(DISAGG, {"sim: {": "failures: {workers: [{at_s: "
     "40, worker: 'decode:0'}]}\nsim: {"}), sets("failures.workers.0.at=3"),
     "unknown key 'at' at failures.workers.0 (did you mean at_s?) (allowed: at_s, repair_s, "
     "worker)"),
    ("set-index-item-value", _scenario(DISAGG, {"sim: {": "failures: {workers: [{at_s: 40, "
     "worker: 'decode:0'}]}\nsim: {"}), sets("failures.workers.0.at_s=-1"),
     "disagg.yaml: failures.workers.0.at_s: "),
    ("sweep-param-index-beyond-list", _nothing, ["sweep", DISAGG, "--param",
     "failures.workers.0.at_s=5,10", "--quiet"], "disagg.yaml: --param failures.workers.0.at_s: "
     "failures.workers is not in the scenario"),
    # ---- a default output names itself as the default, not a --out the user never gave
    ("run-default-out-user-folder", _file("results/ci-disaggregated/mine.txt", "x"), run_args(),
     "results/ci-disaggregated (the default output; choose another with --out): folder holds "
     "files disaggsim did not write (mine.txt)"),
    ("sweep-default-out-user-folder", _file("results/ci-disaggregated-sweep/mine.txt", "x"),
     ["sweep", DISAGG, "--param", "workload.rate_per_s=1,2", "--quiet"],
     "results/ci-disaggregated-sweep (the default output; choose another with --out)"),
    ("compare-default-out-user-folder", _file("results/compare/mine.txt", "x"), ["compare",
     DISAGG, COLOC, "--quiet"], "results/compare (the default output; choose another with "
     "--out)"),
    ("run-default-out-trace-inside", _nothing, run_args("--trace", "results/ci-disaggregated/x/"
     "t.json"), "in a folder inside the result folder results/ci-disaggregated (the default "
     "--out)"),
    ("regress-default-reference-dir", _nothing, ["regress", "--ci-dir", str(CI), "--quiet"],
     "results/reference (the default --reference-dir): no such folder"),
    # ---- output places (2026-12-03, second session; more in tests/test_output_places.py)
    ("trace-trailing-slash", _nothing, run_args("--out", "r", "--trace", "t/"),
     "--trace t/: ends with '/', so names a folder; give a trace file name"),
    ("sweep-out-inside-earlier-result", _earlier_result_plus_user_file, ["sweep", DISAGG,
     "--param", "workload.rate_per_s=1,2", "--quiet", "--out", "old/sub"],
     "--out old/sub: lies inside "),
    ("sweep-workers-100000", _nothing, ["sweep", DISAGG, "--param", "workload.rate_per_s=1,2",
     "--quiet", "--out", "s", "--workers", "100000"], "--workers 100000: at most "),
    ("run-out-tilde", _nothing, run_args("--out", "~/r"), "--out ~/r: starts with '~', which "
     "the shell did not expand"),
    # ---- regress references (2026-12-03, second session): the file and field named
    ("regress-reference-metric-not-a-number", _file("ref/chunked.json",
     _reference(point0_ttft_p99_s="x")), _regress(),
     "ref/chunked.json: points.0.ttft_p99_s: expected a number or null, got 'x'"),
    ("regress-reference-seeds-beyond-bound", _file("ref/chunked.json", _reference(seeds=10**9)),
     _regress(), "ref/chunked.json: seeds: expected an integer from 1 to 1,000, got 1000000000"),
    ("regress-reference-grid-beyond-bound", _file("ref/chunked.json", _reference(grid={
     "workload.rate_per_s": list(range(1, 20001))})), _regress(), "ref/chunked.json: grid: "
     "20,000 simulations, more than the 10,000"),
    ("regress-reference-grid-unknown-path", _file("ref/chunked.json", _reference(grid={
     "bogus.key": [1]})), _regress(), "ref/chunked.json: grid: bogus.key: unknown key 'bogus'"),
    ("regress-reference-grid-bad-value", _file("ref/chunked.json", _reference(grid={
     "workload.rate_per_s": ["x"]})), _regress(), "ref/chunked.json: grid: "),
    ("regress-reference-not-an-object", _file("ref/chunked.json", "[1, 2]"), _regress(),
     "ref/chunked.json: not a reference file (expected a JSON object)"),
    ("regress-reference-dir-a-file", _nothing, ["regress", "--ci-dir", str(CI),
     "--reference-dir", "keep.txt", "--quiet"], "--reference-dir keep.txt: a file, not a folder"),
    ("regress-empty-ci-dir", _file("ci/notes.txt", "x"), ["regress", "--ci-dir", "ci",
     "--reference-dir", "ci", "--quiet"], "ci: no CI scenarios (*.yaml) in this folder"),
    # ---- calibrate fit (2026-12-03, second session)
    ("calibrate-fit-run-of-another-gpu", _nothing, ["calibrate", "fit", str(REPO / "calibration"
     / "runs" / "h200-2026-11-29"), "--gpu", "h100-sxm", "--out", "p.json"],
     "h200-2026-11-29: measured on NVIDIA H200, not --gpu h100-sxm (NVIDIA H100 80GB HBM3 "
     "(SXM5)); give the --gpu the run measured"),
    ("calibrate-fit-out-trailing-slash", _nothing, ["calibrate", "fit", str(REPO / "calibration"
     / "runs" / "h200-2026-11-29"), "--gpu", "h200-sxm", "--out", "d/"],
     "--out d/: ends with '/', so names a folder; give a profile file name"),
    ("sweep-scheduler-without-port", _nothing, ["sweep", DISAGG, "--param",
     "workload.rate_per_s=1", "--quiet", "--out", "s", "--scheduler", "tcp://host"],
     "--scheduler tcp://host: not a scheduler address (missing port number in address 'host'); "
     "expected tcp://host:port"),
    ("sweep-scheduler-unknown-scheme", _nothing, ["sweep", DISAGG, "--param",
     "workload.rate_per_s=1", "--quiet", "--out", "s", "--scheduler", "a://b"],
     "--scheduler a://b: not a scheduler address (unknown address scheme 'a'"),
]  # fmt: skip


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (hidden ones included) with a file's bytes."""
    out: dict[str, bytes | None] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = p.read_bytes() if p.is_file() and not p.is_symlink() else None
    return out


def test_at_least_sixty_cases():
    assert len(CASES) >= 60
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(
    ("setup", "argv", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input(tmp_path, monkeypatch, capsys, setup, argv, fragment):
    work = tmp_path / "work"
    work.mkdir()
    (work / "keep.txt").write_text("a user's file\n")
    shutil.copy(CI / "disaggregated.yaml", work / DISAGG)
    shutil.copy(CI / "colocated-vllm.yaml", work / COLOC)
    shutil.copy(REPO / "scenarios" / "fabric" / "nvlink.yaml", work / FABRIC)
    setup(work)
    monkeypatch.chdir(work)
    argv = [a.replace("{work}", str(work)).replace("{parent}", str(tmp_path)) for a in argv]
    before = tree(tmp_path)
    rc = main(argv)
    captured = capsys.readouterr()
    err = captured.err
    assert rc == 2, (rc, err, captured.out[-500:])
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith("disaggsim: error: "), err
    assert "Traceback" not in err
    assert fragment in err, err
    assert tree(tmp_path) == before  # nothing written, nothing deleted


# ---- the counterparts that must work (2026-12-03, second session)


def _with_failures(tmp_path: Path) -> Path:
    text = (
        (CI / "disaggregated.yaml")
        .read_text()
        .replace(
            "sim: {",
            "failures: {workers: [{at_s: 40, worker: 'decode:0'}, {at_s: 50, worker: "
            "'prefill:0'}]}\nsim: {",
        )
    )
    path = tmp_path / "f.yaml"
    path.write_text(text)
    return path


def test_set_indexes_an_item_the_list_holds(tmp_path):
    """`--set failures.workers.0.at_s=3` said "failures.workers is a value, not a section"
    where the list existed and "Input should be a valid list" where it did not: --set
    now indexes the items a list holds (and refuses the rest in one line, CASES)."""
    from disaggsim.config.loader import load_scenario

    path = _with_failures(tmp_path)
    s = load_scenario(path, ["failures.workers.1.at_s=7", "failures.workers.0.worker=decode:0"])
    assert [(w.at_s, w.worker) for w in s.scenario.failures.workers] == [
        (40.0, "decode:0"),
        (7.0, "prefill:0"),
    ]
    whole = load_scenario(path, ["failures.workers.0={at_s: 9, worker: 'prefill:0'}"])
    assert [w.at_s for w in whole.scenario.failures.workers] == [9.0, 50.0]
    assert path.read_text().count("at_s: 40") == 1  # the file is read, never written


def test_sweep_param_through_a_list_item(tmp_path, monkeypatch, capsys):
    import pandas as pd

    path = _with_failures(tmp_path)
    monkeypatch.chdir(tmp_path)
    rc = main(
        ["sweep", str(path), "--param", "failures.workers.0.at_s=5,10", "--out", "sw",
         *CUT]
    )  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    table = pd.read_parquet(tmp_path / "sw" / "sweep.parquet")
    assert list(table["failures.workers.0.at_s"]) == [5, 10]


def test_python_bytes_value_is_refused_naming_the_field():
    """The Python API took bytes as text (pydantic reads b"x" as "x"), as a YAML
    !!binary value was."""
    import yaml

    from disaggsim.config.loader import load_scenario
    from disaggsim.errors import UserError

    raw = yaml.safe_load((CI / "disaggregated.yaml").read_text())
    raw["decode_pool"]["gpu"] = b"h100-sxm"
    with pytest.raises(UserError) as e:
        load_scenario(raw)
    assert (
        str(e.value)
        == "<scenario>: decode_pool.gpu: binary data (a YAML !!binary value or bytes), not text"
    )


def test_set_reaches_the_fields_of_the_distribution_the_scenario_gives():
    """`--set workload.prompt_tokens.median=1000` on a lognormal was refused as "unknown
    key 'median' at workload.prompt_tokens (allowed: dist, value)": the path check read
    only a `kind` tag and took the first member of the union (`{dist: fixed, value}`),
    so no field of any other distribution could be set or swept."""
    from disaggsim.config.loader import load_scenario
    from disaggsim.errors import UserError

    s = load_scenario(
        CI / "disaggregated.yaml",
        ["workload.prompt_tokens.median=1000", "workload.output_tokens.high=100"],
    ).scenario
    assert (s.workload.prompt_tokens.median, s.workload.output_tokens.high) == (1000, 100)
    with pytest.raises(UserError) as e:  # a key of another distribution: that one's keys
        load_scenario(CI / "disaggregated.yaml", ["workload.output_tokens.median=3"])
    assert "unknown key 'median' at workload.output_tokens (allowed: dist, high, low)" in str(
        e.value
    )
