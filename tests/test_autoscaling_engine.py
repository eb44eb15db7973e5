"""The autoscaler inside the simulation: burst reaction, cold start, drains, conservation."""

from __future__ import annotations

import numpy as np
import pytest

from disaggsim.autoscale import PoolAutoscaleConfig, cold_start_s
from disaggsim.run import pool_sizes_frame, simulate, transfers_frame
from tests.conftest import REPO

BURST = REPO / "scenarios" / "autoscaling" / "burst.yaml"


@pytest.fixture(scope="module")
def burst():
    return simulate(BURST)


def test_burst_prefill_scales_before_decode_and_beats_static(burst):
    sizes = pool_sizes_frame(burst.raw)
    grown = sizes[
        sizes["num_in_service"] + sizes["num_starting"]
        > sizes.groupby("role")["num_in_service"].transform("first")
    ]
    first = grown.groupby("role")["at_s"].min()
    # the burst starts at 60 s: prompts queue first, decode batches fill later
    assert 60 <= first["prefill"] < first["decode"]
    static = simulate(BURST, ["autoscale={}"]).summary
    s = burst.summary
    assert s["scale_events"] > 0 and static["scale_events"] == 0
    assert s["slo_attainment"] > static["slo_attainment"] + 0.3
    assert s["mean_workers_prefill"] > static["mean_workers_prefill"]
    # everything served, nothing lost, KV returned
    assert s["num_completed"] == s["num_requests"]
    assert [w.kv_used_end_tokens for w in burst.raw.workers] == [0] * len(burst.raw.workers)


def test_cold_start_delays_service_by_provision_plus_weights_load(burst):
    sizes = pool_sizes_frame(burst.raw)
    pre = sizes[sizes["role"] == "prefill"].reset_index(drop=True)
    # first decision that starts a worker, and the first instant it serves
    start_at = pre.loc[pre["num_starting"] > 0, "at_s"].iloc[0]
    serve_at = pre.loc[(pre["at_s"] > start_at) & (pre["num_in_service"] > 1), "at_s"].iloc[0]
    cfg = PoolAutoscaleConfig.model_validate(
        {
            "min_workers": 1,
            "max_workers": 4,
            "policy": "target",
            "target": {"signal": "queued_prompt_tokens", "target_value": 12000},
            "provision_s": 10,
        }
    )
    cost = burst.raw.workers[0]
    # Llama-3-8B bf16: 16.06e9 bytes of weights on one GPU at 5 GB/s, plus 10 s
    expected = 10.0 + 16.06e9 / 5e9
    assert cold_start_s(16.06e9, cfg) == pytest.approx(expected)
    assert serve_at - start_at == pytest.approx(expected, rel=0.01)
    assert cost.num_gpus == 1


def test_no_scale_down_while_the_slo_signal_is_above_target(burst):
    """The prefill pool scales on its TTFT (policy slo, margin 0.8, SLO 1.5 s): it never
    shrinks at a control instant whose measured TTFT p99 is above 0.8 x 1.5 s."""
    sizes = pool_sizes_frame(burst.raw)
    ctl = sizes[(sizes["role"] == "prefill") & sizes["window_ttft_p99_s"].notna()].reset_index(
        drop=True
    )
    shrink = ctl["desired"].diff() < 0
    assert shrink.any()  # it does scale down once the burst is absorbed
    assert (ctl.loc[shrink, "window_ttft_p99_s"] <= 0.8 * 1.5).all()
    hot = ctl["window_ttft_p99_s"] > 0.8 * 1.5
    assert hot.any()
    assert not (shrink & hot).any()


def test_drained_workers_release_their_gpus_and_lose_nothing():
    res = simulate(BURST, ["sim.duration_s=200"])
    sizes = pool_sizes_frame(res.raw)
    assert (sizes["num_draining"] > 0).any()  # some worker drained after the burst
    assert res.summary["num_completed"] == res.summary["num_requests"]
    # GPU-hours below the peak fleet held for the whole run
    peak = (
        (sizes["num_in_service"] + sizes["num_starting"] + sizes["num_draining"])
        .groupby(sizes["role"])
        .max()
        .sum()
    )
    assert res.summary["gpu_hours"] < peak * res.summary["sim_end_s"] / 3600


def test_mix_shift_moves_the_ratio_and_autoscaling_follows():
    path = REPO / "scenarios" / "autoscaling" / "mix-shift.yaml"
    auto = simulate(path).summary
    static = simulate(path, ["autoscale={}"]).summary
    assert auto["slo_attainment"] > static["slo_attainment"]
    assert auto["gpu_hours"] < static["gpu_hours"] * 1.2
    assert auto["mean_workers_prefill"] > static["mean_workers_prefill"]


def _expanded_gaps(log, since_s: float) -> tuple[list[float], list[float]]:
    """Every token's gap, one by one (the slow way the engine avoids): steps of runs in
    the window, with stalls folded into the next run's first step for the sequences that
    kept running (see ``_WindowGaps``)."""
    gaps: list[float] = []
    stalls = sorted((t, n) for t, _, n, _ in log.prefill_iters if t >= since_s)
    si = 0
    for i, start in enumerate(log.run_start_at_s):
        if start < since_s:
            continue
        b = log.run_batch[i]
        step = [
            log.run_base_s[i] + log.run_per_token_s[i] * (log.run_context0[i] + j * b)
            for j in range(log.run_steps[i])
        ]
        first_stall, joined = None, 0
        while si < len(stalls) and stalls[si][0] < start:
            first_stall = stalls[si][0] if first_stall is None else first_stall
            joined += stalls[si][1]
            si += 1
        held = max(b - joined, 0) if first_stall is not None else 0
        gaps += [start - first_stall + step[0]] * held if held else []
        gaps += [step[0]] * (b - held)
        for d in step[1:]:
            gaps += [d] * b
    return gaps, stalls


def test_window_gap_quantile_is_the_token_quantile_without_expanding_tokens():
    import numpy as np

    from disaggsim.engine.records import StepLog
    from disaggsim.engine.scaling import _WindowGaps

    rng = np.random.default_rng(5)
    for _ in range(40):
        log = StepLog()
        t = 0.0
        for _ in range(int(rng.integers(1, 12))):
            if rng.random() < 0.3:  # a prefill-only iteration stalls the running decodes
                dur = float(rng.uniform(0.05, 0.4))
                log.prefill_iters.append((t, dur, int(rng.integers(0, 3)), 512))
                t += dur
            k, b = int(rng.integers(1, 40)), int(rng.integers(1, 9))
            base, per, c0 = float(rng.uniform(5e-3, 2e-2)), float(rng.uniform(0, 1e-7)), 2000 * b
            log.add_run(t, k, b, c0, base, per)
            t += k * base + per * (k * c0 + b * k * (k - 1) / 2)
        since = float(rng.uniform(0, t / 3))
        want, _ = _expanded_gaps(log, since)
        g = _WindowGaps()
        g.add_worker(log, since)
        for q in (0.5, 0.9, 0.99):
            got = g.quantile(q)
            if not want:
                assert np.isnan(got)
                continue
            ref = float(np.percentile(want, 100 * q, method="inverted_cdf"))
            assert got == pytest.approx(ref, rel=1e-9, abs=1e-12), (q, got, ref)


def test_window_gaps_by_hand():
    from disaggsim.engine.records import StepLog
    from disaggsim.engine.scaling import _WindowGaps

    log = StepLog()
    log.add_run(0.0, 5, 2, 100, 0.010, 0.0)  # 10 tokens with 10 ms gaps
    log.prefill_iters.append((0.05, 0.2, 1, 4096))  # 200 ms prefill, one sequence joins
    log.add_run(0.25, 1, 3, 300, 0.012, 0.0)  # 2 held back: 50 → 262 ms = 212 ms; 1 new: 12 ms
    g = _WindowGaps()
    g.add_worker(log, 0.0)
    assert g.quantile(0.5) == pytest.approx(0.010)  # 13 tokens: 10 × 10 ms, 12 ms, 2 × 212 ms
    assert g.quantile(0.85) == pytest.approx(0.212)
    assert g.quantile(0.99) == pytest.approx(0.212)
    assert np.isnan(_WindowGaps().quantile(0.99))


def test_autoscaling_on_a_topology_fabric_places_scale_ups_drains_and_failures():
    """Issue 11's crash class: every worker an autoscaler starts has a placement, so its
    handoffs take the path its GPUs give; scheduled failures name the worker they say
    (global indices count every worker a pool may have); nothing is lost.

    Pack on 4-GPU nodes, TP1: initial prefill.0 (index 0), decode.0 and decode.1 (4, 5)
    fill node 0's GPUs 0-2; then prefill.1 (1) takes node 0's GPU 3, prefill.2, prefill.3,
    decode.2, decode.3 (2, 3, 6, 7) node 1, decode.4 and decode.5 (8, 9) node 2."""
    res = simulate(
        BURST,
        [
            "fabric={kind: topology, gpus_per_node: 4, placement: {policy: pack}}",
            "sim.duration_s=200",
            "failures={workers: [{worker: 'decode:1', at_s: 100, repair_s: 5}],"
            " random: [{pool: prefill, mtbf_s: 150, mttr_s: 5}]}",
        ],
    )
    s = res.summary
    assert s["num_completed"] == s["num_requests"]
    assert [w.kv_used_end_tokens for w in res.raw.workers] == [0] * 10
    node = {0: 0, 1: 0, 4: 0, 5: 0, 2: 1, 3: 1, 6: 1, 7: 1, 8: 2, 9: 2}
    tr = transfers_frame(res.raw)
    pairs = set(zip(tr["src_worker"], tr["dst_worker"], strict=True))
    assert {1, 2, 3} <= {src for src, _ in pairs}  # scaled-up prefill workers hand off
    assert {6, 7} <= {dst for _, dst in pairs}  # scaled-up decode workers receive
    expected = [
        "nvlink" if node[a] == node[b] else "rdma"
        for a, b in zip(tr["src_worker"], tr["dst_worker"], strict=True)
    ]
    assert list(tr["path_kind"]) == expected
    sizes = pool_sizes_frame(res.raw)
    assert (sizes.groupby("role")["num_draining"].max() > 0).all()  # both pools drained
    assert (100.0, 5) in res.raw.failures  # decode:1 is worker 5, not prefill.2 (index 2)
    assert res.raw.workers[5].role == "decode"
    # a worker fails only while it holds GPUs (random failures are drawn for every worker
    # a pool may have; a released one has nothing to lose)
    held = [(w, a, r) for w, _, _, a, r in res.raw.allocations]
    assert all(any(w == i and a <= at < r for w, a, r in held) for at, i in res.raw.failures)
