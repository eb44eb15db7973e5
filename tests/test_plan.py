"""disaggsim plan: the analytic first guess follows the traffic, the advisor's verdict
flips where docs/design.md ("When disaggregation should win or lose") says it should on
the four advisor scenarios (quick mode), the --json structure, the recommended YAML runs,
and bad budgets are one-line errors."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from disaggsim.cli import main
from disaggsim.config.loader import load_scenario
from disaggsim.errors import UserError
from disaggsim.metrics.summary_table import SUMMARY_KEYS, Summary
from disaggsim.plan import PlanOptions, analytic_guess, plan
from disaggsim.plan.analytic import split_budget
from disaggsim.plan.report import pareto_front, recommended_scenario
from disaggsim.plan.search import KINDS, Candidate, CandidateResult
from disaggsim.run import simulate
from disaggsim.sweep import SerialExecutor
from tests.conftest import REPO

ADVISOR = REPO / "scenarios" / "advisor"
# quick mode, shorter still: the verdicts below hold with a wide margin
FAST = dataclasses.replace(PlanOptions.quick(), duration_s=30.0, warmup_s=5.0)


def _mix(prompt: dict, output: dict) -> dict:
    return {
        "name": "mix",
        "seed": 3,
        "model": "llama-3.1-8b",  # 16k prompts need a 128k-context model
        "architecture": "colocated",
        "pool": {"gpu": "h100-sxm", "num_workers": 8, "scheduler": "chunked"},
        "slo": {"ttft_ms": 2000, "itl_ms": 100},
        "workload": {
            "kind": "synthetic",
            "rate_per_s": 5.0,
            "prompt_tokens": prompt,
            "output_tokens": output,
        },
        "sim": {"duration_s": 60},
    }


SUMMARISATION = _mix({"dist": "fixed", "value": 16000}, {"dist": "fixed", "value": 200})
CHAT = _mix(
    {"dist": "lognormal", "median": 200, "sigma": 0.6, "min": 16, "max": 2048},
    {"dist": "lognormal", "median": 500, "sigma": 0.5, "min": 32, "max": 2048},
)


def test_analytic_ratio_follows_the_traffic():
    summ = analytic_guess(load_scenario(SUMMARISATION), prefill_tp=1, decode_tp=1, gpu_budget=8)
    chat = analytic_guess(load_scenario(CHAT), prefill_tp=1, decode_tp=1, gpu_budget=8)
    assert summ.pd_gpu_ratio > 3 * chat.pd_gpu_ratio
    assert summ.num_prefill_workers > chat.num_prefill_workers
    assert summ.num_decode_workers < chat.num_decode_workers
    # the inputs it reports are the histograms' own
    assert summ.prompt_tokens_mean == 16000 and summ.output_tokens_mean == 200
    # 16k-token prompts do not share a batch of the default 8192-token budget
    assert summ.prefill_batch_prompts_mean == 1.0


def test_analytic_target_rate_scales_the_fleet():
    loaded = load_scenario(SUMMARISATION)
    small = analytic_guess(loaded, prefill_tp=1, decode_tp=1, target_rate_per_s=1.0)
    big = analytic_guess(loaded, prefill_tp=1, decode_tp=1, target_rate_per_s=10.0)
    assert big.num_prefill_workers > small.num_prefill_workers
    assert big.num_gpus > small.num_gpus


@pytest.mark.parametrize(
    ("gpus", "share", "expected"),
    [(8, 0.75, (6, 2)), (8, 0.2, (2, 6)), (2, 0.9, (1, 1)), (10, 0.5, (5, 5))],
)
def test_split_budget_by_hand(gpus, share, expected):
    assert split_budget(gpus, share, 1, 1) == expected


def test_split_budget_with_tp():
    # tp2 prefill, tp1 decode, 8 GPUs, half on prefill: 2 x tp2 + 4 x tp1
    assert split_budget(8, 0.5, 2, 1) == (2, 4)


@pytest.fixture(scope="module")
def verdicts():
    out = {}
    with SerialExecutor() as ex:
        for name in ("long-prompt-infiniband", "short-prompt", "pcie-only", "two-gpus"):
            out[name] = plan(ADVISOR / f"{name}.yaml", options=FAST, executor=ex)
    return out


def test_long_prompts_tight_itl_rdma_many_gpus_disaggregate(verdicts):
    res, advice = verdicts["long-prompt-infiniband"]
    assert advice.verdict == "disaggregate"
    assert advice.reason.startswith("disaggregate: +")
    assert res.ranked[0].candidate.kind == "disaggregate"
    assert (
        advice.best_disaggregated.goodput_per_gpu_per_s
        > 1.2 * advice.best_chunked.goodput_per_gpu_per_s
    )
    held = {c.name for c in advice.conditions if c.holds}
    assert {"long_prompts", "tight_itl_tail", "large_fleet", "fast_fabric"} <= held


def test_short_prompts_use_chunked(verdicts):
    _, advice = verdicts["short-prompt"]
    assert advice.verdict == "colocate_chunked"
    assert advice.reason.startswith("use chunked prefill on one pool")
    assert not {c.name: c.holds for c in advice.conditions}["long_prompts"]


def test_pcie_only_uses_chunked(verdicts):
    _, advice = verdicts["pcie-only"]
    assert advice.verdict == "colocate_chunked"
    assert not {c.name: c.holds for c in advice.conditions}["fast_fabric"]
    assert "pcie" in advice.reason


def test_two_gpus_cannot_disaggregate(verdicts):
    res, advice = verdicts["two-gpus"]
    assert advice.verdict == "colocate_chunked"
    assert advice.best_disaggregated is None
    assert all(r.candidate.kind != "disaggregate" for r in res.ranked)
    assert "cannot exist" in advice.reason
    assert not {c.name: c.holds for c in advice.conditions}["large_fleet"]


def test_candidates_respect_the_budget(verdicts):
    for res, _ in verdicts.values():
        assert res.ranked
        for r in res.ranked:
            assert r.candidate.num_gpus <= res.gpu_budget
        g = [r.goodput_per_gpu_per_s for r in res.ranked]
        assert g == sorted(g, reverse=True)


def test_recommended_yaml_loads_and_runs(verdicts, tmp_path):
    res, advice = verdicts["long-prompt-infiniband"]
    path = tmp_path / "recommended.yaml"
    path.write_text(yaml.safe_dump(recommended_scenario(res, advice)))
    loaded = load_scenario(path)
    assert loaded.scenario.architecture == "disaggregated"
    rec = advice.recommended.candidate
    assert loaded.scenario.prefill_pool.num_workers == rec.num_prefill_workers
    assert loaded.scenario.decode_pool.num_workers == rec.num_decode_workers
    s = simulate(loaded, ["sim.duration_s=20", "sim.warmup_s=2"]).summary
    assert s["num_completed"] > 0
    assert s["num_gpus"] == rec.num_gpus


def _cr(g: float, itl: float) -> CandidateResult:
    c = Candidate("colocate_chunked", 1, 1, chunk_tokens=512)
    zeros = {k.key: k.kind() for k in SUMMARY_KEYS if k.required}  # 0, 0.0, "", False
    return CandidateResult(c, g, g, "found", Summary.from_dict({**zeros, "itl_p99_s": itl}))


def test_pareto_front_by_hand():
    a, b, c, d = _cr(2.0, 0.05), _cr(1.0, 0.01), _cr(1.5, 0.06), _cr(0.5, 0.02)
    # c is beaten by a on both; d by b on both
    assert pareto_front([a, b, c, d]) == [a, b]


def test_cli_json_structure(tmp_path, capsys):
    rc = main(
        [
            "plan",
            str(ADVISOR / "two-gpus.yaml"),
            "--quick",
            "--duration",
            "30",
            "--workers",
            "1",
            "--json",
            "--price-per-gpu-hour",
            "2.5",
            "--out",
            str(tmp_path / "out"),
            "--no-plots",
        ]
    )
    assert rc == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["verdict"] in KINDS
    assert isinstance(obj["reason"], str) and obj["reason"]
    assert obj["ranked"]
    for row in obj["ranked"]:
        assert {"deployment", "goodput_per_gpu", "kind", "num_gpus"} <= set(row)
        assert row["deployment"]["architecture"] in ("disaggregated", "colocated")
    per_gpu = [r["goodput_per_gpu"] for r in obj["ranked"]]
    assert per_gpu == sorted(per_gpu, reverse=True)
    assert {
        "pd_gpu_ratio",
        "prompt_tokens_mean",
        "output_tokens_mean",
        "prefill_gpu_s_per_request",
        "decode_gpu_s_per_request",
    } <= set(obj["analytic"])
    assert obj["ranked"][0]["usd_per_m_output_tokens"] > 0
    assert {"plan.json", "ranked.csv", "recommended.yaml"} <= {
        p.name for p in (tmp_path / "out").iterdir()
    }
    load_scenario(tmp_path / "out" / "recommended.yaml")


def test_budget_smaller_than_one_worker_is_one_line_error(capsys):
    rc = main(["plan", str(ADVISOR / "two-gpus.yaml"), "--gpus", "1", "--quick", "--quiet"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("disaggsim: error:") and "\n" not in err
    assert "smaller than one worker" in err and "tp 2" in err


def test_bad_numbers_are_user_errors():
    loaded = load_scenario(ADVISOR / "two-gpus.yaml")
    with pytest.raises(UserError, match="--gpus 0"):
        plan(loaded, gpus=0, options=FAST, executor=SerialExecutor())
    with pytest.raises(UserError, match="--target-rate"):
        plan(loaded, target_rate_per_s=-1.0, options=FAST, executor=SerialExecutor())
