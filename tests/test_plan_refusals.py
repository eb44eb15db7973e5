"""What a plan says when it cannot answer: no worker fits the budget (a fix it can act
on: a budget the fabric can place, FP8 weights, or the cost model's reason), no MoE
layout kept for a pool (a note naming why), and no deployment meeting the SLOs (the
target one request alone already misses). The runs are stubbed where a plan runs."""

from __future__ import annotations

import importlib
import types

from disaggsim.cli import main
from disaggsim.plan import PlanOptions, plan
from disaggsim.plan.question import Question, build_question
from disaggsim.sweep import SerialExecutor
from tests.conftest import REPO
from tests.plan_fakes import fake_run_points

ASK = "--isl 2000 --osl 200 --ttft-ms 2000 --itl-ms 50 --quick --quiet --no-plots"


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("disaggsim: error: plan: ") and "\n" not in err, err
    return err


def test_a_budget_smaller_than_one_worker_names_the_budget_that_fits(capsys, tmp_path):
    """Llama-3.1-405B in bf16 (812 GB) on 8 H100s: no TP of one node holds it, tp 16 does
    (a link fabric prices TP across nodes, so a budget of 16 is a plan). Before: 'it
    needs more GPU memory than any TP on one node gives (... use tp >= 16)', a TP the
    user cannot pass to plan, and no word of FP8, which fits tp 8."""
    argv = ["plan", "--model", "llama-3.1-405b", "--gpu", "h100-sxm", "--gpus", "8"]
    err = _error(capsys, [*argv, *ASK.split(), "--out", str(tmp_path / "p")])
    assert err.endswith(
        "is smaller than one worker that fits llama-3.1-405b with room for a p99 request's KV "
        "(2200 tokens): it needs tp 16 (16 GPUs, 2 nodes of 8): plan with --gpus 16 or more; "
        "or use fp8 weights (weight_dtype: fp8, or --weight-dtype fp8: they fit tp 8)"
    ), err
    # and the budget it names is one the plan takes (the search starts)
    from disaggsim.config.loader import load_scenario
    from disaggsim.plan.analytic import sample_lengths
    from disaggsim.plan.search import tp_options

    q = Question(model="llama-3.1-405b", gpu="h100-sxm", gpus=16, isl="2000", osl="200",
                 ttft_ms=2000, itl_ms=50)  # fmt: skip
    loaded = load_scenario(build_question(q))
    assert tp_options(loaded, 16, sample_lengths(loaded)) == [16]


def test_an_moe_model_needing_several_nodes_names_its_worker(capsys, tmp_path):
    argv = ["plan", "--model", "deepseek-v3", "--gpu", "l40s", "--gpus", "8"]
    err = _error(capsys, [*argv, *ASK.split(), "--out", str(tmp_path / "p")])
    assert "it needs tp 8 x dp 8 (64 GPUs, 8 nodes of 8): plan with --gpus 64 or more" in err
    assert "they fit tp 8 x dp 4 with --gpus 32 or more" in err


def test_on_a_topology_fabric_no_tp_beyond_a_node_is_offered(capsys, tmp_path):
    """A ``kind: topology`` fabric keeps each worker inside one node: Llama-3.1-405B on
    32 H100s (8 a node) has no worker there. Before: 'a budget of 32 x h100-sxm is
    smaller than one worker ...: it needs tp 16' — false (32 >= 16) and no fix (the
    fabric cannot place tp 16)."""
    path = REPO / "scenarios" / "fabric" / "pcie.yaml"
    argv = ["plan", str(path), "--set", "model=llama-3.1-405b", "--gpus", "32"]
    err = _error(capsys, [*argv, "--quick", "--quiet", "--no-plots", "--out", str(tmp_path)])
    assert "smaller than one worker" not in err and "it needs tp 16" not in err
    assert "no worker within a budget of 32 x h100-sxm fits llama-3.1-405b" in err
    assert "keeps each worker's TP group inside one node of 8 GPUs" in err
    assert "tp 16 (16 GPUs) would fit across nodes (a fabric of kind: link" in err
    assert err.endswith(
        "use fp8 weights (weight_dtype: fp8, or --weight-dtype fp8: they fit tp 8); or use a "
        "GPU with more memory or shorter requests"
    ), err


def _always_miss(monkeypatch):
    return fake_run_points(monkeypatch, lambda sc: False)


def _none_reason(monkeypatch, **ask) -> tuple:
    _always_miss(monkeypatch)
    q = Question(**{"gpu": "h100-sxm", "gpus": 2, "isl": "2000", "osl": "200",
                    "ttft_ms": 2000, "itl_ms": 50, **ask})  # fmt: skip
    opts = PlanOptions.quick()
    res, advice = plan(build_question(q), options=opts, executor=SerialExecutor())
    assert advice.verdict == "none"
    return res, advice.reason


def test_no_deployment_meets_a_target_one_request_alone_misses(monkeypatch):
    """The reason of a plan that meets nothing names the target one request alone
    misses on the fastest worker searched. Before: 'relax the SLO targets (a prompt's
    prefill alone may exceed the TTFT target)' also where the prefill was far inside the
    TTFT target and a decode step over the ITL target (Llama-3.1-405B on 32 A100s at 50
    ms: a step of 57 ms at batch 1)."""
    _, reason = _none_reason(monkeypatch, model="llama-3.1-8b", itl_ms=2)
    assert "a decode step of one request alone (2100 tokens of context) takes" in reason
    assert "over the ITL target of 2 ms: relax that target" in reason
    assert "prefill" not in reason
    _, reason = _none_reason(monkeypatch, model="llama-3.1-8b", isl="30000", ttft_ms=100)
    assert "a mean prompt's prefill alone (30000 tokens) takes" in reason
    assert "over the TTFT target of 100 ms: relax that target" in reason
    assert "decode step of one request alone" not in reason
    # neither: the generic advice, with the figures that rule those out
    _, reason = _none_reason(monkeypatch, model="llama-3.1-8b")
    assert (
        reason.endswith("against the TTFT target of 2,000 ms)")
        and "relax the SLO targets or change the model or GPU (one request alone fits" in reason
    )


def test_an_moe_pool_without_a_layout_says_why(monkeypatch):
    """Qwen3-30B-A3B at an ITL target of 3 ms: no MoE decode layout steps within it, so
    the decode pool is searched with plain TP workers; the plan says so and why (before:
    nothing said, the layouts were dropped silently)."""
    res, reason = _none_reason(monkeypatch, model="qwen3-30b-a3b", gpus=4, itl_ms=3)
    note = next(n for n in res.notes if n.startswith("the decode pool: "))
    assert "no MoE layout kept (at 4 GPUs tp" in note
    assert "a decode step of one 2100-token sequence takes" in note
    assert note.endswith("over the ITL target of 3 ms); it was searched with plain TP workers only")
    assert not any(n.startswith("the prefill pool") for n in res.notes)


def test_the_search_submodule_is_the_module():
    """``import disaggsim.plan.search as S`` gave the function ``search`` (the package
    re-exported it under the submodule's name); ``plan`` is the package's entry."""
    import disaggsim.plan.search as S

    assert isinstance(S, types.ModuleType) and callable(S.search)
    assert S is importlib.import_module("disaggsim.plan.search")
    import disaggsim.plan

    assert "search" not in disaggsim.plan.__all__


def test_an_moe_model_that_fits_but_steps_over_the_itl_target_says_so(capsys, tmp_path):
    """Qwen3-235B-A22B fits 16 L40S (tp 8 x dp 2), but no MoE layout's decode step is
    within 3 ms: the error names that, from a layout that could be built (not the memory
    refusal of a 16-rank layout of tp 1, the largest tried)."""
    argv = ["plan", "--model", "qwen3-235b-a22b", "--gpu", "l40s", "--gpus", "16"]
    argv += ASK.replace("--itl-ms 50", "--itl-ms 3").split()
    err = _error(capsys, [*argv, "--out", str(tmp_path / "p")])
    assert "qwen3-235b-a22b fits tp 8 x dp 2 on l40s with room for a p99 request's KV" in err
    assert "but the MoE layout search kept no worker for the decode pool: no MoE layout kept" in err
    assert err.endswith("over the ITL target of 3 ms)"), err
    assert "does not fit" not in err


def test_a_target_rate_is_sized_with_a_worker_the_fabric_can_place(capsys, tmp_path):
    """--target-rate sized the budget with the smallest worker of any TP (tp 16 for
    Llama-3.1-405B), which a kind: topology fabric of 8-GPU nodes cannot place, then
    refused 'a budget of 80 x h100-sxm', a budget never asked for. Now no worker of any
    size fits there, and the error says so with its fixes."""
    path = REPO / "scenarios" / "fabric" / "pcie.yaml"
    argv = ["plan", str(path), "--set", "model=llama-3.1-405b", "--target-rate", "2"]
    err = _error(capsys, [*argv, "--quick", "--quiet", "--no-plots", "--out", str(tmp_path)])
    assert "budget" not in err
    assert "no worker of any size on h100-sxm fits llama-3.1-405b" in err
    assert "inside one node of 8 GPUs; tp 16 (16 GPUs) would fit across nodes" in err
