"""The steady-state test sees a decode pool that cannot keep up (docs/metrics.md,
"stability"). A disaggregated request gets its first token from its prefill; when the
decode pool is the bottleneck the requests then wait for a decode batch, their TTFT stays
flat and only the queue in front of decode (and their TPOT) grow. Such a run once
passed as steady: a 16-GPU plan recommended 2 prefill + 14 decode workers at 596.8 req/s
that a 300 s run of its own recommended.yaml served at 11.9 % attainment (decode
capacity about 465 req/s)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import yaml

from disaggsim.config.loader import load_scenario
from disaggsim.metrics.steady import stability
from disaggsim.run import simulate


def _frame(arrival, first, admit, finish, tpot) -> pd.DataFrame:
    n = len(arrival)
    return pd.DataFrame(
        {
            "arrival_at_s": arrival,
            "first_token_at_s": first,
            "decode_admit_at_s": admit,
            "finish_at_s": finish,
            "tpot_s": tpot,
            "status": pd.Series(["completed"] * n, dtype="category"),
        }
    )


def test_a_growing_decode_queue_is_a_trend_with_flat_ttft():
    # a request a second, first token 0.1 s later, then a wait for a decode batch that
    # grows by 0.1 s per request (the decode pool falls behind): TTFT constant
    n = 60
    arrival = np.arange(n, dtype=float)
    first = arrival + 0.1
    admit = first + 0.1 * arrival
    finish = admit + 5.0
    tpot = (finish - first) / 100
    f = _frame(arrival, first, admit, finish, tpot)
    s = stability(f, 10.0, 60.0, ttft_target_s=1.0)
    assert not s.stable
    assert s.slope("ttft") == 0.0 or abs(s.slope("ttft")) < 1e-12
    assert s.slope("waiting") > 0
    # the same wait, constant: steady
    steady = _frame(arrival, first, first + 0.5, first + 5.5, np.full(n, 0.055))
    assert stability(steady, 10.0, 60.0, ttft_target_s=1.0).stable
    # a reply that needed no decode batch (finished, never admitted) waited for none
    one_token = _frame(arrival, first, np.full(n, np.nan), first, np.full(n, np.nan))
    s = stability(one_token, 10.0, 60.0, ttft_target_s=1.0)
    assert s.stable and abs(s.slope("waiting")) < 1e-9


def _decode_bound(rate_per_s: float) -> dict:
    """One prefill and one decode H100 worker of Llama-3.1-8B, the decode worker limited
    to 16 sequences: about 8 req/s of 256-token replies, while prefill serves hundreds."""
    return {
        "name": "decode-bound",
        "seed": 4,
        "model": "llama-3.1-8b",
        "architecture": "disaggregated",
        "prefill_pool": {"gpu": "h100-sxm", "num_workers": 1, "tp": 1},
        "decode_pool": {"gpu": "h100-sxm", "num_workers": 1, "tp": 1, "max_batch_seqs": 16},
        "fabric": {"link": "nvlink"},
        "slo": {"ttft_ms": 500, "itl_ms": 100, "itl_statistic": "tpot"},
        "workload": {
            "kind": "synthetic",
            "rate_per_s": rate_per_s,
            "arrival": "poisson",
            "prompt_tokens": {"dist": "fixed", "value": 128},
            "output_tokens": {"dist": "fixed", "value": 256},
            "max_tokens": 256,
        },
        "sim": {"duration_s": 60, "warmup_s": 10},
    }


def test_a_decode_bound_run_above_capacity_is_not_steady(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_decode_bound(11.0)))
    s = simulate(load_scenario(path)).summary
    # the overload hides from TTFT and, over this short run, from attainment
    assert s.ttft_p99_s < 0.5 and s.slo_attained
    assert not s.stable and not s.meets_slo
    assert s.waiting_trend_per_s > 1.0
    path.write_text(yaml.safe_dump(_decode_bound(5.0)))  # well under capacity
    s = simulate(load_scenario(path)).summary
    assert s.stable and s.meets_slo
