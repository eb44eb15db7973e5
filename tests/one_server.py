"""The single-server scenario the goodput-search tests share: one colocated worker serving
one 100-token prompt per batch at 1 ms per token (with :func:`patch_constant_cost`),
each reply one token: a single server with deterministic service 0.1 s, FCFS, whose
capacity is exactly 10 req/s."""

from __future__ import annotations

import pytest

from disaggsim.costmodel.testing import ConstantCost

SERVICE_S = 0.1  # seconds per request


def one_server(ttft_s: float, arrival: dict | None = None, name: str = "one-server") -> dict:
    """The scenario dict with TTFT target ``ttft_s`` (seconds) and ``arrival`` (the
    workload's arrival fields; default Poisson)."""
    return {
        "name": name,
        "seed": 3,
        "model": "llama-3-8b",
        "architecture": "colocated",
        # one 100-token prompt per prefill batch; at most as many sequences as tokens
        "pool": {"gpu": "h100-sxm", "num_workers": 1, "tp": 1, "scheduler": "vllm",
                 "max_batch_tokens": 100, "max_batch_seqs": 100},
        "slo": {"ttft_ms": ttft_s * 1e3, "itl_ms": 1000, "attainment_target": 0.9},
        "workload": {
            "kind": "synthetic", "rate_per_s": 1.0, **(arrival or {"arrival": "poisson"}),
            "prompt_tokens": {"dist": "fixed", "value": 100},
            "output_tokens": {"dist": "fixed", "value": 1},
        },
        "sim": {"duration_s": 60, "warmup_s": 0},
    }  # fmt: skip


def patch_constant_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every scenario's colocated worker costs ``SERVICE_S`` per 100-token prompt."""
    cost = ConstantCost(prefill_base_s=0.0, prefill_per_token_s=SERVICE_S / 100)
    monkeypatch.setattr("disaggsim.run.build_costs", lambda scenario, label="": {"colocated": cost})
