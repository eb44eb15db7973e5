"""`disaggsim plan` asked in one command (issue 12, item 5): the flags build a scenario,
the plan writes it as question.yaml, and the SLO model is said in the same words in the
help, the YAML comments, the output and docs/metrics.md. Bad flags: one line naming the
flag and the allowed values, exit 2, nothing written."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from disaggsim.cli import build_parser, main
from disaggsim.config.loader import load_scenario
from disaggsim.errors import UserError
from disaggsim.metrics.slo_model import describe_slo, slo_model_help
from disaggsim.plan.question import Question, build_question, parse_lengths, question_yaml
from tests.conftest import REPO

ASK = dict(
    model="llama-3-70b",
    gpu="h100-sxm",
    gpus=16,
    isl="8000",
    osl="300",
    ttft_ms=2000.0,
    itl_ms=100.0,
)


def _flat(text: str) -> str:
    """Whitespace-normalised text, and YAML comment markers dropped."""
    return " ".join(re.sub(r"^\s*#\s?", "", text, flags=re.M).split())


def test_the_issue_question_builds_a_valid_scenario():
    raw = build_question(Question(**ASK))
    s = load_scenario(raw).scenario
    assert s.model == "llama-3-70b"
    assert s.workload.prompt_tokens.value == 8000 and s.workload.output_tokens.value == 300
    assert (s.slo.ttft_ms, s.slo.itl_ms, s.slo.itl_statistic) == (2000, 100, "tpot")
    assert s.slo.attainment_target == 0.9
    # 70B in BF16 (141 GB) needs two 80 GB H100s per worker: 8 x tp2 states the budget
    assert (s.pool.tp, s.pool.num_workers, s.num_gpus) == (2, 8, 16)
    # 16 GPUs span two 8-GPU nodes: auto picks InfiniBand, not NVLink
    assert s.fabric.link == "infiniband"
    assert load_scenario(build_question(Question(**{**ASK, "gpus": 8}))).scenario.fabric.link == (
        "nvlink"
    )
    assert (
        load_scenario(
            build_question(Question(**{**ASK, "gpu": "l40s", "gpus": 8}))
        ).scenario.fabric.link
        == "infiniband"  # no NVLink on L40S
    )


def test_a_moe_model_too_large_for_one_node_states_a_data_parallel_worker():
    # DeepSeek-V3 in bf16 (1.34 TB of weights) fits no TP group of one 8-GPU H200 node:
    # the question states 16 GPUs as one worker of tp 8 x dp 2, experts over all 16
    raw = build_question(Question(**{**ASK, "model": "deepseek-v3", "gpu": "h200-sxm", "gpus": 16}))
    s = load_scenario(raw).scenario
    assert (s.pool.tp, s.pool.dp, s.pool.num_workers, s.num_gpus) == (8, 2, 1, 16)
    # its released fp8-block weights (671 GB) fit one node: plain tp 8, two workers
    raw = build_question(
        Question(
            **{**ASK, "model": "deepseek-v3", "gpu": "h200-sxm", "gpus": 16},
            weight_dtype="released",
        )
    )
    s = load_scenario(raw).scenario
    assert (s.pool.tp, s.pool.dp, s.pool.num_workers, s.weight_dtype) == (8, 1, 2, "released")
    # a dense model keeps plain TP
    s = load_scenario(build_question(Question(**ASK))).scenario
    assert (s.pool.tp, s.pool.dp) == (2, 1)


def test_length_specs():
    assert parse_lengths("--isl", "8000") == {"dist": "fixed", "value": 8000}
    assert parse_lengths("--isl", "uniform:6000:10000") == {
        "dist": "uniform",
        "low": 6000,
        "high": 10000,
    }
    assert parse_lengths("--osl", "lognormal:300:0.5") == {
        "dist": "lognormal",
        "median": 300,
        "sigma": 0.5,
    }
    assert parse_lengths("--osl", "lognormal:300:0.5:2048")["max"] == 2048


def test_preset_and_trace_questions(tmp_path):
    preset = build_question(
        Question(**{**ASK, "isl": None, "osl": None, "preset": "azure-code-2023"})
    )
    # Llama 3's 8,192-token context cannot hold the longest prompt (7,437) with the
    # longest reply (1,899): the default cap; Llama 3.1's 128k can: clients cap at 1,899
    assert preset["workload"] == {"kind": "preset", "preset": "azure-code-2023"}
    preset = build_question(
        Question(
            **{**ASK, "model": "llama-3.1-70b", "isl": None, "osl": None},
            preset="azure-code-2023",
        )
    )
    assert preset["workload"] == {"kind": "preset", "preset": "azure-code-2023", "max_tokens": 1899}
    assert "the longest reply of the preset azure-code-2023" in question_yaml(
        preset,
        Question(**{**ASK, "model": "llama-3.1-70b", "isl": None, "osl": None},
                 preset="azure-code-2023"),
    )  # fmt: skip
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:00.0,100,5\n2023-11-16 18:00:01.0,300,7\n"
    )
    raw = build_question(
        Question(**{**ASK, "isl": None, "osl": None, "trace": "t.csv", "target_rate_per_s": 3}),
        base_dir=tmp_path,
    )
    assert raw["workload"] == {
        "kind": "trace", "path": str(trace.resolve()), "rate_per_s": 3, "max_tokens": 7
    }  # fmt: skip
    assert load_scenario(raw).scenario.workload.kind == "trace"


def test_a_bucketed_trace_question_spreads_its_arrivals(shared_data):
    trace = shared_data / "traces" / "mooncake_conversation_trace.jsonl"
    q = Question(**{**ASK, "model": "llama-3.1-70b", "isl": None, "osl": None}, trace=str(trace))
    raw = build_question(q)
    assert raw["workload"]["bucketed_timestamps"] == "spread"
    assert "# Trace timestamps: bucketed" in question_yaml(raw, q)
    azure = shared_data / "traces" / "AzureLLMInferenceTrace_code.csv"
    q = Question(**{**ASK, "model": "llama-3.1-70b", "isl": None, "osl": None}, trace=str(azure))
    raw = build_question(q)
    assert "bucketed_timestamps" not in raw["workload"]
    assert "Trace timestamps" not in question_yaml(raw, q)


def test_one_command_plan_writes_the_question_and_says_the_slo_model(tmp_path, capsys):
    out = tmp_path / "plan"
    argv = [
        "plan",
        "--model",
        "llama-3-8b",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "2",
        "--isl",
        "uniform:500:1500",
        "--osl",
        "50",
        "--ttft-ms",
        "1000",
        "--itl-ms",
        "50",
        "--itl-statistic",
        "max_gap",
        "--quick",
        "--min-requests",
        "100",
        "--service-multiple",
        "1",
        "--workers",
        "1",
        "--quiet",
        "--no-plots",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    question = (out / "question.yaml").read_text()
    s = load_scenario(out / "question.yaml").scenario
    assert s.workload.prompt_tokens.low == 500 and s.slo.itl_statistic == "max_gap"
    words = _flat(describe_slo(s.slo))
    assert "largest gap between two consecutive tokens" in words
    assert "is <= 1000 ms" in words and "is <= 50 ms" in words
    assert words in _flat(question)  # the YAML comments
    assert words in _flat(stdout)  # the output
    assert words in _flat((out / "recommended.yaml").read_text())
    assert json.loads((out / "plan.json").read_text())["slo_model"] == describe_slo(s.slo)
    from disaggsim.plan.deploy import DEPLOY_FILES

    for name in DEPLOY_FILES:  # launch configurations of the recommendation (test_deploy.py)
        assert "meta-llama/Meta-Llama-3-8B" in (out / name).read_text()
    # the comment names the command that asks the same question again
    assert "disaggsim plan --model llama-3-8b --gpu h100-sxm --gpus 2" in question
    assert "--itl-statistic max_gap" in question
    # plan it again from the file: same question, same scenario
    assert yaml.safe_load(question) == load_scenario(out / "question.yaml").raw


def test_the_help_and_docs_say_the_same_slo_model():
    sub = next(
        a
        for a in build_parser()._subparsers._group_actions  # type: ignore[union-attr]
    )
    helptext = sub.choices["plan"].format_help()
    assert _flat(slo_model_help()) in _flat(helptext)
    assert _flat(slo_model_help(flags=False)) in _flat(sub.choices["compare"].format_help())
    assert _flat(slo_model_help()) in _flat((REPO / "docs" / "metrics.md").read_text())


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--model", "gpt-9"], ["--model gpt-9", "allowed:", "llama-3-70b"]),
        (["--gpu", "tpu-v5"], ["--gpu tpu-v5", "allowed:", "h100-sxm"]),
        (["--gpus", "0"], ["--gpus 0", ">= 1"]),
        (["--isl", "abc"], ["--isl abc", "uniform:LO:HI", "lognormal:MEDIAN:SIGMA"]),
        (["--isl", "uniform:9:3"], ["--isl uniform:9:3", "LO <= HI"]),
        (["--osl", "lognormal:x:1"], ["--osl lognormal:x:1", "lognormal:MEDIAN:SIGMA"]),
        (["--osl", "lognormal:300:-1"], ["--osl lognormal:300:-1", "sigma >= 0"]),
        (["--ttft-ms", "-5"], ["--ttft-ms -5", "> 0"]),
        (["--itl-ms", "0"], ["--itl-ms 0", "> 0"]),
        (["--itl-statistic", "p99"], ["--itl-statistic p99", "allowed: tpot, max_gap"]),
        (["--max-tokens", "0"], ["--max-tokens 0", "whole number of tokens >= 1"]),
        (["--fabric", "ethernet"], ["--fabric ethernet", "auto, nvlink, infiniband, roce, pcie"]),
        (["--fabric", "nvlink"], ["--fabric nvlink", "16 GPUs", "infiniband, roce"]),
        (["--attainment", "1.5"], ["--attainment 1.5", "(0, 1]"]),
        (["--percentile", "0"], ["--percentile 0", "(0, 100]"]),
        (["--weight-dtype", "int4"], ["--weight-dtype int4", "bf16, fp16, fp8, fp8-block"]),
        (["--kv-dtype", "released"], ["--kv-dtype released", "bf16, fp16, fp8"]),
        (["--target-rate", "-1"], ["--target-rate -1", "> 0"]),
        (["--preset", "nope", "--isl", None, "--osl", None], ["--preset nope", "azure-conv-2023"]),
        (["--preset", "azure-conv-2023"], ["--isl", "--preset", "one of"]),
        (["--osl", None], ["--osl is needed"]),
        (
            ["--trace", "missing.csv", "--isl", None, "--osl", None],
            ["--trace missing.csv", "not found"],
        ),
        (["--ttft-ms", None], ["--ttft-ms is needed"]),
        (["--gpus", None], ["--gpus N", "--target-rate"]),
        (["--model", None], ["--model is needed"]),
        # a scenario bound broken by a flag's value names the flag (it named the field of
        # a '<scenario>' the user never wrote)
        (["--isl", "2000000"], ["--isl 2000000: workload.prompt_tokens.value", "1,048,576"]),
        (["--osl", "uniform:1:2000000"], ["--osl uniform:1:2000000: workload.output_tokens"]),
        (["--isl", "lognormal:1000:9"], ["--isl lognormal:1000:9: ", "give max"]),
        (["--max-tokens", "5000000"], ["--max-tokens 5000000: workload.max_tokens"]),
        (["--ttft-ms", "1e300"], ["--ttft-ms 1e+300: slo.ttft_ms: ", "1e+15"]),
        (["--itl-ms", "1e20"], ["--itl-ms 1e+20: slo.itl_ms: "]),
        (["--seed", "99999999999999999999"], ["--seed 99999999999999999999: seed: must be <="]),
        (
            ["--gpus", None, "--target-rate", "1e300"],
            ["--target-rate 1e+300: must be between 0.00334 and 6,666 req/s", "2,000,000"],
        ),
        (["--gpus", None, "--target-rate", "1e-9"], ["--target-rate 1e-09: ", "no request"]),
        (["--set", "slo.ttft_ms=-1"], ["plan question: slo.ttft_ms: ", "greater than 0"]),
    ],
)
def test_bad_question_flags(tmp_path, capsys, args, needles):
    flags = {
        "--model": "llama-3-70b",
        "--gpu": "h100-sxm",
        "--gpus": "16",
        "--isl": "8000",
        "--osl": "300",
        "--ttft-ms": "2000",
        "--itl-ms": "100",
    }
    for k, v in zip(args[::2], args[1::2], strict=True):
        flags[k] = v
    argv = ["plan"]
    for k, v in flags.items():
        if v is not None:
            argv += [k, v]
    out = tmp_path / "out"
    rc = main([*argv, "--quick", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert "\n" not in err and "Traceback" not in err
    assert "<scenario>" not in err
    for n in needles:
        assert n in err, err
    assert not out.exists()


def test_scenario_and_question_flags_are_not_mixed(tmp_path, capsys):
    path = REPO / "scenarios" / "advisor" / "two-gpus.yaml"
    out = tmp_path / "out"
    rc = main(["plan", str(path), "--isl", "100", "--fabric", "roce", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "not both" in err and "--isl" in err and "--fabric" in err
    assert not out.exists()


def test_question_errors_raise_before_any_work():
    with pytest.raises(UserError, match=r"^--isl 0: expected"):
        build_question(Question(**{**ASK, "isl": "0"}))


@pytest.mark.parametrize(
    "model, isl, osl, max_tokens, expected",
    [
        # the longest reply, when every prompt still fits the context with it
        ("qwen3-30b-a3b", "2000", "uniform:100:300", None, 300),
        ("llama-3-8b", "lognormal:2000:0.5:6000", "lognormal:200:0.5:900", None, 900),
        # 8000 + 300 > Llama 3's 8,192: a constant cap would refuse every prompt, so the
        # default (context - prompt) stays; an unbounded reply length has no longest
        ("llama-3-70b", "8000", "300", None, None),
        ("llama-3-8b", "2000", "lognormal:200:0.5", None, None),
        ("llama-3-70b", "8000", "300", 150, 150),  # --max-tokens wins
    ],
)
def test_question_max_tokens(model, isl, osl, max_tokens, expected):
    """Routing and KV admission plan on max_tokens (issue 12 item 3): the question gives the
    clients' cap so a long-context model's default (context - prompt) does not reserve KV
    for replies the workload never asks for."""
    q = Question(**{**ASK, "model": model, "isl": isl, "osl": osl, "max_tokens": max_tokens})
    raw = build_question(q)
    assert raw["workload"].get("max_tokens") == expected
    text = question_yaml(load_scenario(raw).raw, q)
    assert "# max_tokens: " in text


def _deepseek_plan(tmp_path, capsys, *budget: str) -> dict:
    """A quick plan of DeepSeek-V3 (bf16) on H200 with ``budget`` flags; its plan.json."""
    out = tmp_path / "plan"
    argv = [
        "plan", "--model", "deepseek-v3", "--gpu", "h200-sxm", *budget,
        "--isl", "4000", "--osl", "500", "--ttft-ms", "3000", "--itl-ms", "80",
        "--quick", "--quiet", "--no-plots", "--workers", "1", "--json", "--out", str(out),
    ]  # fmt: skip
    rc = main(argv)
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    # --json prints the object plan.json holds (tests/test_plan.py reads the file)
    assert captured.out == (out / "plan.json").read_text()
    return json.loads((out / "plan.json").read_text())


def test_a_moe_model_that_fits_only_with_data_parallel_ranks_is_planned(tmp_path, capsys):
    # DeepSeek-V3 in bf16 fits 16 H200s only as tp x dp ranks with experts over all 16;
    # the search refused it ("smaller than one worker that fits") while plain TP was the
    # only fit it tried
    plan = _deepseek_plan(tmp_path, capsys, "--gpus", "16")
    best = plan["ranked"][0]["deployment"]["pool"]
    assert best["tp"] * best["dp"] == 16 and best["dp"] > 1
    assert plan["ranked"][0]["goodput_per_s"] > 0


def test_a_target_rate_is_sized_for_a_moe_model_that_fits_only_with_data_parallel_ranks(
    tmp_path, capsys
):
    # sizing a budget for --target-rate took the smallest plain TP of one node and
    # refused DeepSeek-V3 in bf16 ("no TP on one node of h200-sxm fits"); it now sizes
    # the fleet with the smallest worker that fits, tp x dp ranks here
    plan = _deepseek_plan(tmp_path, capsys, "--target-rate", "2")
    assert plan["gpu_budget"] % 16 == 0 and plan["gpu_budget"] >= 32
    best = plan["ranked"][0]["deployment"]
    pools = [best[k] for k in ("pool", "prefill_pool", "decode_pool") if k in best]
    assert any(p.get("dp", 1) > 1 for p in pools)


def test_a_budget_beyond_a_pool_of_small_workers_is_still_a_question():
    """Before: ``--gpus 1500`` of Llama-3.1-8B (tp 1 workers) ended with ``pool.num_workers:
    must be <= 1,024, got 1500``: the question's placeholder pool stated the budget as
    1,500 workers, more than a pool may hold (the plan sizes up to 16,384 GPUs). The pool
    holds at most 1,024 workers; question.yaml says to plan with --gpus."""
    q = Question(**{**ASK, "model": "llama-3.1-8b", "gpus": 1500})
    raw = build_question(q)
    assert raw["pool"]["num_workers"] == 1024 and raw["pool"]["tp"] == 1
    text = _flat(question_yaml(raw, q))
    assert "It holds at most 1,024 workers, 1,024 GPUs: plan with --gpus 1500." in text
    assert "Plan it again: disaggsim plan question.yaml --gpus 1500" in text
    small = Question(**{**ASK, "model": "llama-3.1-8b", "gpus": 15})
    assert build_question(small)["pool"]["num_workers"] == 15
    assert "at most 1,024" not in question_yaml(build_question(small), small)


def test_a_plan_whose_every_worker_is_refused_says_why(monkeypatch, capsys, tmp_path):
    """When no worker can be built at any TP for a reason other than memory, the plan's
    refusal carries that reason (was: only 'it needs more GPU memory than any TP on one
    node gives', the moe-defaults case of 1d7de20)."""
    import disaggsim.plan.analytic as analytic

    def refuse(loaded, gpu, tp, gpu_mem_util=0.9, limits=None):
        raise UserError("decode_pool: moe: the reason the cost model gave")

    monkeypatch.setattr(analytic, "worker_cost", refuse)
    argv = "plan --model llama-3.1-8b --gpu h100-sxm --gpus 8 --isl 512 --osl 64"
    argv += f" --ttft-ms 1000 --itl-ms 50 --quick --quiet --no-plots --out {tmp_path / 'p'}"
    assert main(argv.split()) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    # the question's smallest worker: every layout refused, the last (largest) one's reason
    assert err.endswith(
        "data-parallel attention with experts over all GPUs) (no worker could be built; at "
        "tp 32: decode_pool: moe: the reason the cost model gave)"
    ), err


def test_a_scenario_plan_whose_every_worker_is_refused_says_why(monkeypatch, capsys, tmp_path):
    """The same through a scenario file: the budget's TP search finds nothing and says why."""
    import disaggsim.plan.analytic as analytic

    def refuse(loaded, gpu, tp, gpu_mem_util=0.9, limits=None):
        raise UserError("pool: moe: the reason the cost model gave")

    monkeypatch.setattr(analytic, "worker_cost", refuse)
    argv = ["plan", "scenarios/quickstart.yaml", "--gpus", "4", "--quick", "--quiet"]
    argv += ["--no-plots", "--out", str(tmp_path / "p")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    # not memory: the reason alone, no advice to add memory (every size up to tp 32 tried)
    assert err.endswith(
        "fits llama-3.1-8b with room for a p99 request's KV (4814 tokens) (no worker could be "
        "built; at tp 32: pool: moe: the reason the cost model gave)"
    ), err


def test_a_rate_question_is_asked_again_with_its_rate():
    """question.yaml of ``--target-rate 0.2`` said 'Plan it again: disaggsim plan
    question.yaml', which plans the budget its placeholder pool states (one worker), not
    the rate; it now gives the rate."""
    q = Question(**{**ASK, "gpus": None, "target_rate_per_s": 0.2})
    text = _flat(question_yaml(build_question(q), q))
    assert "Plan it again: disaggsim plan question.yaml --target-rate 0.2 " in text
