"""``disaggsim cost`` with MoE layouts: --tp/--dp/--ep/--gpus, the MoE, MLA and all-to-all
parts of a step, MLA bytes per token from ``cost kv``, and one-line errors."""

from __future__ import annotations

import pytest

from disaggsim.costmodel.moe import build_moe_worker_cost
from tests.test_cli_cost import _fail, _run

DS_DECODE = (
    "cost decode --model deepseek-v3 --gpu h800-sxm --tp 1 --dp 144 --batch 9216 "
    "--context-tokens 4000 --weight-dtype fp8-block --redundant-experts 32"
)


def test_wide_ep_decode_reports_moe_mla_and_all_to_all_parts(capsys):
    (obj,) = _run(capsys, DS_DECODE.split())
    assert (obj["tp"], obj["dp"], obj["ep"], obj["gpus"]) == (1, 144, 144, 144)
    assert obj["layout"]["nodes"] == 18 and obj["layout"]["local_experts"] == 2
    bd = obj["breakdown"]
    assert sum(bd.values()) == pytest.approx(obj["time_s"], rel=1e-9)
    assert obj["moe_s"] == pytest.approx(
        bd["router_s"] + bd["shared_expert_s"] + bd["expert_gemm_s"], rel=1e-12
    )
    assert obj["all_to_all_s"] == pytest.approx(bd["dispatch_s"] + bd["combine_s"], rel=1e-12)
    assert obj["mla_s"] == pytest.approx(bd["attention_gemm_s"] + bd["attention_s"], rel=1e-12)
    assert obj["all_to_all_s"] > 0 and bd["allreduce_s"] == 0
    # the same worker built in Python: the CLI adds nothing of its own
    c = build_moe_worker_cost(
        "deepseek-v3", "h800-sxm", 1, dp=144, weight_dtype="fp8-block", redundant_experts=32
    )
    assert obj["time_s"] == pytest.approx(c.decode_time_s(9216, 9216 * 4000), rel=1e-12)
    assert obj["kv_capacity_tokens"] == 144 * obj["kv_capacity_tokens_per_rank"]


def test_gpus_flag_sets_the_layout(capsys):
    base = "cost prefill --model qwen3-235b-a22b --gpu h100-sxm --batch 4 --prompt-tokens 2048"
    (a,) = _run(capsys, (base + " --gpus 16 --dp 4").split())
    (b,) = _run(capsys, (base + " --tp 4 --dp 4").split())
    (c,) = _run(capsys, (base + " --tp 4 --gpus 16").split())
    assert a["time_s"] == b["time_s"] == c["time_s"]
    assert (a["tp"], a["dp"], a["ep"]) == (4, 4, 16)
    (d,) = _run(capsys, (base + " --gpus 8").split())
    assert (d["tp"], d["dp"], d["ep"]) == (8, 1, 1)
    # a TP-only MoE worker all-reduces the MoE output instead of an all-to-all
    assert d["all_to_all_s"] == 0 and d["breakdown"]["allreduce_s"] > 0


def test_dense_model_keeps_its_output(capsys):
    (obj,) = _run(
        capsys,
        "cost decode --model llama-3-70b --gpu h100-sxm --tp 4 --batch 8 --context-tokens 100".split(),
    )
    assert "tp_layout" in obj and "moe_s" not in obj and "dp" not in obj


def test_kv_shows_mla_bytes_per_token(capsys):
    (obj,) = _run(capsys, "cost kv --model deepseek-v3 --tokens 8192".split())
    assert obj["bytes_per_token"] == 61 * (512 + 64) * 2 == 70_272
    assert obj["kv_cache"]["kind"] == "mla"
    assert obj["kv_cache"]["values_per_token_per_layer"] == 576
    assert obj["bytes"] == 8192 * 70_272
    (oss,) = _run(capsys, "cost kv --model gpt-oss-120b --tokens 10000".split())
    assert oss["kv_cache"]["window"] == {"kind": "sliding", "tokens": 128, "layers": 18}
    assert oss["bytes"] == (18 * 10_000 + 18 * 128) * 2 * 8 * 64 * 2


@pytest.mark.parametrize(
    "args, pattern",
    [
        ("--model llama-3-70b --tp 4 --ep 2", "ep: model llama-3-70b is dense"),
        ("--model llama-3-70b --tp 4 --two-batch-overlap", "moe: model llama-3-70b is dense"),
        ("--model deepseek-v3 --tp 1 --dp 16 --ep 5", "ep: 5 does not divide the worker's 16 GPUs"),
        ("--model qwen3-235b-a22b --gpus 16 --tp 4 --dp 2", "--gpus: 16 GPUs per worker must"),
        ("--model qwen3-235b-a22b --tp 5", "tp: 5 does not shard the 64 attention heads"),
        ("--model deepseek-v3 --tp 1 --dp 4", "deepseek-v3 does not fit on 4 x h100-sxm"),
        ("--model mixtral-8x7b --tp 2 --routing zipf", "--routing: unknown value 'zipf'"),
        ("--model mixtral-8x7b --batch 1", "missing --tp"),
        # the scenario's bounds (a ratio of 1e300 gave time_s inf, printed as Infinity)
        ("--model mixtral-8x7b --tp 2 --imbalance-factor 1e300", "must be <= 1e+15 (docs/safe"),
        ("--model mixtral-8x7b --tp 2 --redundant-experts 20000", "must be <= 16,384 (docs/saf"),
    ],
)
def test_bad_layouts_exit_2_with_one_line(capsys, args, pattern):
    argv = f"cost decode --gpu h100-sxm --batch 4 --context-tokens 10 {args}".split()
    assert pattern in _fail(capsys, argv)
