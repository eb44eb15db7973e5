"""Hypothesis over whole random scenarios, through the same path as ``disaggsim run``:
load (validation), cost models, workload generation, the engine, the invariant check
and the frames. Where the engine strategies in test_engine_failures.py draw engine
configurations directly, this draws scenario mappings, so it reaches what only a
scenario has: rate shapes (schedules, diurnal, step, bursty gamma arrivals), mix shifts,
autoscaling (on link and topology fabrics), random and scheduled failures with KV
preemption (recompute and swap) under tight memory, and extreme but valid values (one
sequence per batch, 1- and 256-token KV blocks, CV 100 arrivals, tiny and high rates).

Every drawn scenario either is refused with a one-line :class:`UserError` (some
combinations are physically impossible, e.g. no KV room) or runs; a run must pass the
invariant check (it raises otherwise), end every request within the finite horizon
(nothing lost), keep KV within capacity and return every block.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from disaggsim.errors import UserError
from disaggsim.run import simulate

MAX_PROMPT = 3000  # keeps every prompt inside one prefill iteration (validity check)
# gpu_mem_util leaving ~1,100 to ~6,000 tokens of KV per worker, by tp (the rest: plenty)
TIGHT_MEM = {1: (0.202, 0.203, 0.206, 0.21), 2: (0.114, 0.115, 0.117)}


@st.composite
def lengths(draw, high: int):
    kind = draw(st.sampled_from(["fixed", "uniform", "lognormal", "lognormal-max", "empirical"]))
    if kind == "fixed":
        return {"dist": "fixed", "value": draw(st.integers(1, high))}
    if kind == "uniform":
        lo = draw(st.integers(1, high))
        return {"dist": "uniform", "low": lo, "high": draw(st.integers(lo, high))}
    if kind == "lognormal":  # no max: median * exp(6 sigma) within the bound
        return {
            "dist": "lognormal",
            "median": draw(st.floats(1, 50)),
            "sigma": draw(st.floats(0, 0.5)),
        }
    if kind == "lognormal-max":
        return {"dist": "lognormal", "median": draw(st.floats(1, high)),
                "sigma": draw(st.floats(0, 3)), "max": high}  # fmt: skip
    top = draw(st.integers(1, high))
    return {"dist": "empirical", "quantiles": [[0, 1], [0.5, max(1, top // 2)], [1, top]]}


@st.composite
def rates(draw):
    kind = draw(st.sampled_from(["constant", "schedule", "diurnal", "step"]))
    if kind == "constant":
        return {"rate_per_s": draw(st.sampled_from([0.01, 0.5, 3.0, 50.0]))}
    if kind == "schedule":
        return {"rate_schedule": [[0, draw(st.floats(0, 5))], [2.0, draw(st.floats(0.1, 20))],
                                  [4.0, draw(st.floats(0, 5))]]}  # fmt: skip
    if kind == "diurnal":
        return {"rate_shape": {"kind": "diurnal", "mean_per_s": draw(st.floats(0.1, 10)),
                               "amplitude": draw(st.floats(0, 1)), "period_s": draw(st.floats(1, 20)),
                               "phase_s": draw(st.floats(-5, 5))}}  # fmt: skip
    return {"rate_shape": {"kind": "step", "base_per_s": draw(st.floats(0, 2)),
                           "burst_per_s": draw(st.floats(0.5, 30)), "start_s": draw(st.floats(0, 3)),
                           "duration_s": draw(st.floats(0.1, 3))}}  # fmt: skip


@st.composite
def scenarios(draw):
    arch = draw(st.sampled_from(["disaggregated", "disaggregated", "vllm", "chunked"]))

    def pool(max_workers: int = 3) -> dict:
        tp = draw(st.sampled_from([1, 2]))
        return {
            "gpu": "h100-sxm",
            "num_workers": draw(st.integers(1, max_workers)),
            "tp": tp,
            "max_batch_seqs": draw(st.sampled_from([1, 2, 8, 64])),
            "max_batch_tokens": draw(st.sampled_from([MAX_PROMPT, 8192])),
            # KV room per worker (Llama-3-8B on H100): a few thousand tokens, or plenty
            "gpu_mem_util": draw(st.sampled_from(TIGHT_MEM[tp] + (0.9,))),
        }

    s: dict = {
        "name": "prop",
        "seed": draw(st.integers(0, 2**32)),
        "model": "llama-3-8b",
        "slo": {"ttft_ms": 1000, "itl_ms": 100},
        "kv": {
            "block_tokens": draw(st.sampled_from([1, 16, 256])),
            "admission": draw(st.sampled_from(["on_demand", "reserve_full"])),
            "preemption": draw(st.sampled_from(["recompute", "swap"])),
            "watermark": draw(st.sampled_from([0.0, 0.01, 0.2])),
        },
        "router": {
            "backpressure": draw(st.sampled_from(["kv_aware", "none"])),
            "max_queue": draw(st.one_of(st.none(), st.integers(1, 20))),
            "client_timeout_s": draw(st.one_of(st.none(), st.floats(0.05, 30))),
        },
        "sim": {"duration_s": draw(st.floats(2, 20)), "max_drain_s": 600.0},
    }
    if arch == "disaggregated":
        s["architecture"] = "disaggregated"
        s["prefill_pool"], s["decode_pool"] = pool(), pool()
        roles = ["prefill", "decode"]
        if draw(st.booleans()):
            s["fabric"] = {
                "kind": "topology",
                "gpus_per_node": 8,
                "placement": {"policy": draw(st.sampled_from(["pack", "spread", "pair"]))},
                "overlap": draw(st.booleans()),
                "nic": {"gbit_per_s": draw(st.sampled_from([1.0, 400.0]))},
            }
        else:
            s["fabric"] = {"link": draw(st.sampled_from(["nvlink", "infiniband", "pcie"]))}
    else:
        s["architecture"] = "colocated"
        s["pool"] = {**pool(), "scheduler": arch}
        roles = ["colocated"]
    workers = {r: s[f"{r}_pool" if r != "colocated" else "pool"]["num_workers"] for r in roles}
    # autoscaling (on either fabric): one or every pool
    auto = {}
    for r in roles:
        if draw(st.integers(0, 2)) == 0:
            n = workers[r]
            auto[r] = {
                "min_workers": 1,
                "max_workers": draw(st.integers(n, n + 2)),
                "interval_s": draw(st.floats(0.5, 5)),
                "policy": draw(st.sampled_from(["slo", "target"])),
                "target": {
                    "signal": draw(st.sampled_from(["queue_depth", "kv_util"])),
                    "target_value": draw(st.floats(0.1, 4)),
                },  # fmt: skip
                "scale_down_stabilization_s": draw(st.floats(0, 5)),
                "provision_s": draw(st.floats(0, 2)),
                "weights_load_gb_per_s": 100.0,
            }
    s["autoscale"] = auto
    # failures: scheduled, random and (disaggregated) link outages; restarts are quick
    failures: dict = {"provision_s": draw(st.floats(0, 2)), "weights_load_gb_per_s": 100.0}
    failures["workers"] = [
        {
            "at_s": draw(st.floats(0, 10)),
            "worker": f"{r}:{draw(st.integers(0, workers[r] - 1))}",
            "repair_s": draw(st.floats(0, 3)),
        }  # fmt: skip
        for r in draw(st.lists(st.sampled_from(roles), max_size=3))
    ]
    failures["random"] = [
        {"pool": r, "mtbf_s": draw(st.floats(2, 30)), "mttr_s": draw(st.floats(0.1, 3))}
        for r in draw(st.lists(st.sampled_from(roles), max_size=1, unique=True))
    ]
    if arch == "disaggregated":
        failures["links"] = [
            {
                "start_s": draw(st.floats(0, 10)),
                "duration_s": draw(st.floats(0.1, 3)),
                "factor": draw(st.sampled_from([0.0, 0.3])),
            }  # fmt: skip
            for _ in range(draw(st.integers(0, 2)))
        ]
    s["failures"] = failures
    workload = {
        "kind": "synthetic",
        **draw(rates()),
        "prompt_tokens": draw(lengths(draw(st.sampled_from([300, MAX_PROMPT])))),
        "output_tokens": draw(lengths(1000)),
        "num_requests": draw(st.integers(1, 40)),
    }
    if draw(st.booleans()):
        workload["arrival"] = "gamma"
        workload["burstiness_cv"] = draw(st.sampled_from([0.3, 2.0, 13.0, 100.0]))
    if draw(st.integers(0, 3)) == 0:
        workload["mix_shift"] = {"at_s": draw(st.floats(0, 10)),
                                 "output_tokens": draw(lengths(1000))}  # fmt: skip
    if draw(st.integers(0, 2)) == 0:
        # memory pressure: many long-output sequences at once on little KV, so decodes
        # are preempted (recompute or swap), also while workers fail
        workload.update(rate_per_s=50.0, prompt_tokens={"dist": "uniform", "low": 50, "high": 300},
                        output_tokens={"dist": "uniform", "low": 400, "high": 1000},
                        num_requests=max(workload["num_requests"], 20))  # fmt: skip
        workload.pop("mix_shift", None)
        for k in ("rate_schedule", "rate_shape"):
            workload.pop(k, None)
        s["kv"]["admission"] = "on_demand"
        for key in ("prefill_pool", "decode_pool", "pool"):
            if key in s:
                tp = s[key]["tp"]
                s[key].update(max_batch_seqs=64, gpu_mem_util=TIGHT_MEM[tp][0])
    s["workload"] = workload
    return s


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_scenarios_lose_nothing(s):
    try:
        res = simulate(s)  # runs the invariant check; a violation raises InvariantError
    except UserError as e:
        event(f"refused: {str(e).split(': ', 2)[-1][:40]}")
        assume(False)  # refused with a one-line error (e.g. no KV room at this memory)
        return
    frame = res.requests
    assert len(frame) == len(res.raw.requests)
    for what, n in (("preempted", frame["num_preemptions"].sum()),
                    ("retried", frame["num_retries"].sum()), ("scaled", res.raw.scale_events),
                    ("rejected", (frame["status"] == "rejected").sum()),
                    ("abandoned", (frame["status"] == "abandoned").sum()),
                    ("topology", res.raw.link_util is not None)):  # fmt: skip
        if n:
            event(what)
    # nothing lost: every request ended well inside the 600 s drain (no livelock)
    assert set(frame["status"]) <= {"completed", "rejected", "abandoned"}, frame[
        "status"
    ].value_counts()
    # KV within capacity at every sample; every block returned at the end
    ts = res.timeseries[res.timeseries["worker"] >= 0]
    assert (ts["kv_util"] <= 1.0 + 1e-12).all() and (ts["kv_used_tokens"] >= 0).all()
    assert [w.kv_used_end_tokens for w in res.raw.workers] == [0] * len(res.raw.workers)
    done = frame["status"] == "completed"
    assert np.isfinite(frame.loc[done, ["first_token_at_s", "finish_at_s"]].to_numpy()).all()
