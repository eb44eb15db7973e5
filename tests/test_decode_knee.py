"""A decode step takes the larger of the cost model's two lines (KV-stream bound and
per-item bound, ``decode_coeffs`` / ``decode_item_coeffs``); the engine's closed-form runs
are piecewise (at most two affine segments) and must equal the per-step sum of the max."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest

from disaggsim.costmodel.testing import ConstantCost
from disaggsim.engine.cluster import EngineConfig, PoolSpec, run_cluster
from disaggsim.engine.records import StepLog
from disaggsim.engine.workers import DecodeLines
from disaggsim.metrics.reconstruct import token_times
from disaggsim.workload.requests import Requests


def _per_step(lines: DecodeLines, k: int, b: int, c: int) -> np.ndarray:
    """Each step's time, one by one: max of the two lines at that step's context."""
    out = []
    for i in range(k):
        ctx = c + i * b
        t = lines.base_s + lines.per_token_s * ctx
        if lines.has_item:
            t = max(t, lines.item_base_s + lines.item_per_token_s * ctx)
        out.append(t)
    return np.array(out)


def _cases():
    rng = np.random.default_rng(11)
    # item line above first (flat item line, steeper stream line), and the reverse
    yield DecodeLines(0.010, 2e-5, True, 0.0115, 0.0), 1, 10, 200
    yield DecodeLines(0.010, 2e-5, True, 0.0115, 0.0), 8, 0, 40
    yield DecodeLines(0.012, 0.0, True, 0.010, 1e-5), 2, 10, 300
    yield DecodeLines(0.010, 2e-5, False, 0.0, 0.0), 4, 100, 50
    yield DecodeLines(0.010, 2e-5, True, 0.009, 0.0), 4, 100, 50  # item never above
    yield DecodeLines(0.010, 0.0, True, 0.011, 0.0), 4, 100, 50  # item always above
    for _ in range(40):
        base, per = rng.uniform(0.005, 0.02), rng.uniform(0, 5e-5)
        ib, ip = base + rng.uniform(-0.005, 0.005), rng.uniform(0, 5e-5)
        yield (
            DecodeLines(base, per, True, ib, ip),
            int(rng.integers(1, 64)),
            int(rng.integers(0, 2000)),
            int(rng.integers(1, 400)),
        )


@pytest.mark.parametrize(("lines", "b", "c", "k"), list(_cases()))
def test_run_time_is_the_per_step_sum_of_the_larger_line(lines, b, c, k):
    run = lines.split(5.0, k, b, c)
    cum = np.cumsum(_per_step(lines, k, b, c))
    got = np.array([run.time_s(j) for j in range(1, k + 1)])
    np.testing.assert_allclose(got, cum, rtol=1e-12, atol=0)
    assert run.time_s(0) == 0.0
    # the step covering an instant, and the steps done by it (a cut run, a failure)
    for tau in np.concatenate([cum[:: max(1, k // 7)], cum[:: max(1, k // 5)] - 1e-4, [1e-9]]):
        covering = int(np.searchsorted(cum, tau - 1e-12)) + 1  # first j with T(j) >= tau
        assert run.steps_covering(tau) == min(k, covering)
        assert run.steps_done_by(tau) == int(np.searchsorted(cum, tau + 1e-12, side="right"))
    # logged as affine runs whose step ends are the same instants
    log = StepLog()
    run.log_to(log)
    assert len(log.run_steps) <= 2 and sum(log.run_steps) == k
    np.testing.assert_allclose(log.step_end_times(), 5.0 + cum, rtol=0, atol=1e-12)


def test_segments_cover_the_run_and_switch_line_once():
    """A run that crosses the knee is two segments, the first on the item line."""
    lines = DecodeLines(0.010, 2e-5, True, 0.0115, 0.0)  # item above while C < 75
    run = lines.split(0.0, 100, 1, 11)
    assert run.lead_steps == 64  # contexts 11..74
    assert (run.lead_base_s, run.lead_per_token_s) == (0.0115, 0.0)
    assert (run.base_s, run.per_token_s) == (0.010, 2e-5)
    # below the crossing for the whole run: the item line only, no lead segment
    short = lines.split(0.0, 20, 1, 11)
    assert short.lead_steps == 0 and short.base_s == 0.0115


@dataclass(frozen=True, slots=True)
class TwoLineCost(ConstantCost):
    """ConstantCost with a second, per-item decode line: a step takes
    ``max(decode_base_s + 0.001·b + per_token·C, item_base_s + 0.001·b)``."""

    item_base_s: float = 0.0115

    def decode_coeffs(self, batch):
        return self.decode_base_s + 0.001 * batch, self.decode_per_context_token_s

    def decode_item_coeffs(self, batch):
        return self.item_base_s + 0.001 * batch, 0.0


def _reference_decode(kv_at, prompt, out, cost) -> dict[int, list[float]]:
    """Token times of one decode worker, step by step: requests join at the first step
    boundary after their KV arrives (at once when the worker is idle); each step lasts
    the larger of the item line and the kernel line at the batch's context (the smallest
    of the kernel lines where the cost offers ``decode_min_coeffs``); a request leaves
    after its last token."""
    times = {r: [kv_at[r]] for r in range(len(kv_at))}
    pending = sorted(range(len(kv_at)), key=lambda r: kv_at[r])
    running: list[int] = []
    t = kv_at[pending[0]]
    while pending or running:
        while pending and kv_at[pending[0]] <= t:
            running.append(pending.pop(0))
        if not running:
            t = kv_at[pending[0]]
            continue
        b = len(running)
        ctx = sum(prompt[r] + len(times[r]) for r in running)
        more = getattr(cost, "decode_min_coeffs", None)
        lines = [cost.decode_coeffs(b), *(more(b) if more is not None else ())]
        ib, ip = cost.decode_item_coeffs(b)
        t += max(min(b0 + k0 * ctx for b0, k0 in lines), ib + ip * ctx)
        for r in running:
            times[r].append(t)
        running = [r for r in running if len(times[r]) < out[r]]
    return times


def test_engine_token_times_follow_the_larger_line_step_by_step():
    """A lone request decodes below the knee, a second one cuts its run there and the
    batch crosses the knee inside the next run: every token time equals the step-by-step
    sum of the larger line (the stream line alone would be early by ~1.5 ms a step)."""
    cost = TwoLineCost(prefill_base_s=0.1, decode_base_s=0.010, decode_per_context_token_s=2e-5)
    reqs = Requests(
        arrival_s=np.array([0.0, 0.5, 1.23]),
        prompt_tokens=np.array([10, 5, 400]),
        output_tokens=np.array([120, 40, 30]),
    )
    cfg = EngineConfig(
        pools=(PoolSpec("prefill", 1, cost, 8, 10_000), PoolSpec("decode", 1, cost, 8, 10_000))
    )
    raw = run_cluster(reqs, cfg, lambda nbytes, s, d: 0.001)
    kv_at = raw.log.first_token_at_s.tolist()
    ref = _reference_decode(kv_at, reqs.prompt_tokens.tolist(), reqs.output_tokens.tolist(), cost)
    item_steps = 0
    for rid in range(len(reqs)):
        got = token_times(raw, rid)
        np.testing.assert_allclose(got, ref[rid], rtol=0, atol=1e-9)
    # the knee mattered: many steps ran on the item line
    r0 = np.diff(ref[0])
    stream = cost.decode_coeffs(1)[0] + cost.decode_per_context_token_s * (11 + np.arange(20))
    item_steps = int(np.sum(r0[:20] > stream + 1e-4))
    assert item_steps == 20
    # and more than one run crossed it or was cut (lead segments were logged)
    runs = [w for w in raw.workers if w.role == "decode"][0].steps
    assert len(runs.run_steps) >= 4


def test_failure_mid_run_counts_the_steps_of_both_segments():
    """Settling a run cut by a failure counts the piecewise steps done (no step lost or
    invented): the steps logged end before the failure instant."""
    lines = DecodeLines(0.010, 2e-5, True, 0.0115, 0.0)
    run = lines.split(2.0, 150, 1, 11)
    cum = np.cumsum(_per_step(lines, 150, 1, 11))
    for fail_after in (cum[10] + 1e-6, cum[63] + 1e-6, cum[64] - 1e-6, cum[100] + 1e-6):
        j = run.steps_done_by(fail_after)
        assert cum[j - 1] <= fail_after < cum[j]
        log = StepLog()
        run._replace(steps=j).log_to(log)
        ends = log.step_end_times()
        assert len(ends) == j and ends[-1] <= 2.0 + fail_after + 1e-12


def test_no_item_line_is_the_single_affine_run():
    """Without ``decode_item_coeffs`` (MoE workers, the test double) a run is one line."""
    lines = DecodeLines(0.01, 1e-5, False, 0.0, 0.0)
    for b, c, k in itertools.product((1, 7), (0, 900), (1, 33)):
        run = lines.split(0.0, k, b, c)
        assert run.lead_steps == 0 and (run.base_s, run.per_token_s) == (0.01, 1e-5)
        assert run.time_s(k) == k * 0.01 + 1e-5 * (k * c + b * k * (k - 1) / 2)
