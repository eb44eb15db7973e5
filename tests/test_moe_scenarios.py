"""MoE workers in the engine: whole EP units as workers, conservation and determinism
when a unit fails (a lost GPU takes its whole EP unit down), and the shipped MoE
scenarios' layouts. (Every scenario also runs a short slice in test_scenarios.py.)"""

from __future__ import annotations

import copy

import pandas as pd
import pytest

from disaggsim.config.loader import load_scenario
from disaggsim.costmodel.interface import context_kv_bytes
from disaggsim.costmodel.moe import MoeWorkerCost
from disaggsim.run import build_costs, simulate
from tests.conftest import REPO

MOE = REPO / "scenarios" / "moe"

EP_UNITS = {
    "name": "moe-ep-failure",
    "seed": 5,
    "model": "qwen3-30b-a3b",
    "weight_dtype": "fp8-block",
    "architecture": "disaggregated",
    "prefill_pool": {"gpu": "h100-sxm", "num_workers": 1, "tp": 1, "dp": 2},
    "decode_pool": {"gpu": "h100-sxm", "num_workers": 2, "tp": 1, "dp": 4, "ep": 4},
    "fabric": {"link": "infiniband"},
    "failures": {"workers": [{"at_s": 8.0, "worker": "decode:0"}], "provision_s": 5.0},
    "slo": {"ttft_ms": 2000, "itl_ms": 100},
    "workload": {
        "kind": "synthetic",
        "rate_per_s": 20.0,
        "prompt_tokens": {"dist": "lognormal", "median": 800, "sigma": 0.6, "max": 4096},
        "output_tokens": {"dist": "lognormal", "median": 150, "sigma": 0.5, "max": 600},
        "max_tokens": 600,
    },
    "sim": {"duration_s": 20.0, "max_drain_s": 120.0},
}


def test_an_ep_unit_is_one_worker_of_all_its_gpus():
    s = load_scenario(copy.deepcopy(EP_UNITS)).scenario
    costs = build_costs(s)
    assert isinstance(costs["decode"], MoeWorkerCost)
    assert costs["decode"].num_gpus == 4 and costs["prefill"].num_gpus == 2
    assert s.num_gpus == 2 + 2 * 4


@pytest.mark.parametrize("seed", [5, 6])
def test_losing_an_ep_unit_loses_nothing_and_repeats_exactly(seed):
    raw = copy.deepcopy(EP_UNITS)
    raw["seed"] = seed
    a = simulate(raw)
    b = simulate(copy.deepcopy(raw))
    pd.testing.assert_frame_equal(a.requests, b.requests)
    s = a.summary
    assert s["num_completed"] + s["num_rejected"] + s["num_unfinished"] == s["num_requests"]
    req = a.requests
    # the sequences the failed unit held went back to the router and were prefilled again
    # and finished after it; the unit's 4 GPUs failed as one worker
    redone = req[req.num_prefills > 1]
    assert len(redone) > 0
    assert (redone.finish_at_s.dropna() > 8.0).all()
    assert (redone.arrival_at_s < 8.0).all()
    assert req.finish_at_s.notna().sum() == s["num_completed"]


def test_deepseek_units_as_published():
    s = load_scenario(MOE / "deepseek-v3-pd.yaml").scenario
    costs = build_costs(s)
    pre, dec = costs["prefill"], costs["decode"]
    assert isinstance(pre, MoeWorkerCost) and isinstance(dec, MoeWorkerCost)
    assert (pre.num_gpus, pre.ep, pre.nodes, pre.local_experts) == (32, 32, 4, 9)
    assert (dec.num_gpus, dec.ep, dec.nodes, dec.local_experts) == (144, 144, 18, 2)
    assert pre.weight_format == dec.weight_format == "fp8-block"
    assert pre.layout.two_batch_overlap and dec.layout.two_batch_overlap
    # MLA: a handoff moves 576 values x 61 layers per token
    assert pre.kv_bytes_per_token == dec.kv_bytes_per_token == 70_272


def test_qwen3_pair_uses_the_same_gpus():
    d = load_scenario(MOE / "qwen3-235b-disaggregated.yaml").scenario
    c = load_scenario(MOE / "qwen3-235b-colocated.yaml").scenario
    assert d.num_gpus == c.num_gpus == 16
    assert d.workload == c.workload and d.slo == c.slo


LLAMA_4 = {
    "name": "llama-4",
    "seed": 5,
    "architecture": "disaggregated",
    "prefill_pool": {"gpu": "h100-sxm", "num_workers": 1, "tp": 4, "max_batch_tokens": 32768},
    "decode_pool": {"gpu": "h100-sxm", "num_workers": 1, "tp": 4, "max_batch_seqs": 64},
    "fabric": {"link": "infiniband"},
    "slo": {"ttft_ms": 3000, "itl_ms": 50},
    "workload": {
        "kind": "synthetic",
        "rate_per_s": 1.0,
        # prompts past the 8,192-token attention chunk
        "prompt_tokens": {"dist": "lognormal", "median": 9000, "sigma": 0.5, "max": 32768},
        "output_tokens": {"dist": "lognormal", "median": 100, "sigma": 0.5, "max": 400},
        "max_tokens": 400,
    },
    "sim": {"duration_s": 20.0, "max_drain_s": 120.0},
}


@pytest.mark.parametrize(
    ("model", "weight_dtype", "tp", "moe_layers"),
    [("llama-4-scout", "bf16", 4, 48), ("llama-4-maverick", "fp8", 8, 24)],
)
def test_llama_4_scenarios_run_with_their_layers(model, weight_dtype, tp, moe_layers):
    """Llama 4 Scout (16 experts in every layer) and Maverick (128 experts on the odd
    layers, interleave_moe_layer_step 2), each with a shared expert and chunked attention
    on 36 of 48 layers, served disaggregated on TP4 H100s: the step model prices their
    MoE layers as config.json places them, a handoff moves the chunked layers' KV capped
    at the chunk, and every request is accounted for."""
    raw = {**copy.deepcopy(LLAMA_4), "model": model, "weight_dtype": weight_dtype}
    raw["prefill_pool"]["tp"] = raw["decode_pool"]["tp"] = tp
    s = load_scenario(raw).scenario
    costs = build_costs(s)
    pre = costs["prefill"]
    assert isinstance(pre, MoeWorkerCost)
    assert pre.num_moe_layers == moe_layers
    # 48 layers of 8 KV heads x 128 in bf16: 4,096 B a token a layer; a 20,000-token
    # context keeps 8,192 tokens in the 36 chunked layers, all 20,000 in the 12 global ones
    assert context_kv_bytes(pre, 20_000) == (12 * 20_000 + 36 * 8192) * 4096
    r = simulate(raw)
    sm = r.summary
    assert sm["num_completed"] > 0
    assert sm["num_completed"] + sm["num_rejected"] + sm["num_unfinished"] == sm["num_requests"]
    assert (r.requests.prompt_tokens > 8192).any()
