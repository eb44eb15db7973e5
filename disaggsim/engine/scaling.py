"""Pool sizes over time: GPU allocations, cold starts, drains and the autoscaler loop.

Every pool has ``max(num_workers, autoscale max_workers)`` workers from the start; those
beyond ``num_workers`` are *released* (no GPUs held). A control process per autoscaled
pool wakes every ``interval_s``, fills :class:`disaggsim.autoscale.PoolSignals` from the
pool's state and applies the controller's decision:

- scale up: draining workers return to service first; then released workers are
  allocated (their GPUs count from now) and serve after the cold start (provisioning +
  weights load);
- scale down: starting workers are cancelled first (newest first); then in-service
  workers with the least outstanding work drain: they take no new work, their queued
  (unstarted) requests go back to the router, and their GPUs are released once they hold
  nothing.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from disaggsim.autoscale import PoolSignals, choose_to_drain
from disaggsim.engine.events import call_later
from disaggsim.engine.records import Allocation, PoolSize, StepLog
from disaggsim.engine.workers import WorkerState

if TYPE_CHECKING:
    from disaggsim.autoscale import Autoscaler
    from disaggsim.engine.cluster import Cluster
    from disaggsim.engine.workers import Worker


class Scaling:
    """Allocation bookkeeping for every worker, and the control loops."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.env = cluster.env
        self.alloc_at: dict[int, float] = {}  # worker -> allocated since (open allocation)
        self.allocations: list[Allocation] = []
        self.sizes: list[PoolSize] = []
        self.scale_events = 0
        self._start_token: dict[int, int] = {}
        self._desired: dict[str, int] = {}
        for w in cluster.workers:
            if w.state is not WorkerState.RELEASED:
                self.alloc_at[w.index] = 0.0
        for role in dict.fromkeys(cluster.role_of(w) for w in cluster.workers):  # pool order
            self._desired[role] = len(self._pool(role, WorkerState.IN_SERVICE))
            self.record(role)

    # -- bookkeeping ----------------------------------------------------------------------

    def _pool(self, role: str, state: WorkerState | None = None) -> list[Worker]:
        cl = self.cluster
        return [
            w for w in cl.workers if cl.role_of(w) == role and (state is None or w.state is state)
        ]

    def record(self, role: str, signals: PoolSignals | None = None) -> None:
        """Pool sizes now; at a control instant also the window's TTFT and ITL p99."""
        pool = self._pool(role)
        serving = sum(1 for w in pool if w.state is WorkerState.IN_SERVICE)
        starting = sum(1 for w in pool if w.state is WorkerState.STARTING)
        draining = sum(1 for w in pool if w.state is WorkerState.DRAINING)
        ttft = signals.ttft_p99_s if signals is not None else math.nan
        itl = signals.itl_p99_s if signals is not None else math.nan
        desired = self._desired.get(role, serving)
        self.sizes.append(
            PoolSize(self.env.now, role, serving, starting, draining, desired, ttft, itl)
        )

    def _allocate(self, w: Worker) -> None:
        self.alloc_at[w.index] = self.env.now

    def release(self, w: Worker) -> None:
        at = self.alloc_at.pop(w.index, None)
        if at is not None:
            self.allocations.append(
                Allocation(w.index, self.cluster.role_of(w), w.cost.num_gpus, at, self.env.now)
            )
        w.state = WorkerState.RELEASED
        self.record(self.cluster.role_of(w))

    def close(self) -> list[Allocation]:
        """Allocations, the ones still open ending at +inf."""
        cl = self.cluster
        open_ = [
            Allocation(i, cl.role_of(cl.workers[i]), cl.workers[i].cost.num_gpus, at, math.inf)
            for i, at in sorted(self.alloc_at.items())
        ]
        return self.allocations + open_

    # -- the control loop ----------------------------------------------------------------

    def control(
        self, role: str, scaler: Autoscaler, cold_start_s: float, interval_s: float
    ) -> Generator[Any, Any, None]:
        env = self.env
        prev_tokens = self.cluster.arrived_prompt_tokens
        while True:
            yield env.timeout(interval_s)
            if self.cluster.all_done.triggered:
                return
            tokens = self.cluster.arrived_prompt_tokens
            signals = self.signals(role, interval_s, (tokens - prev_tokens) / interval_s)
            prev_tokens = tokens
            current = signals.num_in_service + signals.num_starting
            desired = scaler.recommend(env.now, current, signals).desired
            self._desired[role] = desired
            if desired != current:
                self.scale_events += 1
                self._apply(role, desired - current, cold_start_s)
            self.record(role, signals)

    def _apply(self, role: str, delta: int, cold_start_s: float) -> None:
        cl = self.cluster
        if delta > 0:
            for w in sorted(self._pool(role, WorkerState.DRAINING), key=lambda x: -x.index)[:delta]:
                w.state = WorkerState.IN_SERVICE
                delta -= 1
            for w in self._pool(role, WorkerState.RELEASED)[:delta]:
                self._allocate(w)
                w.state = WorkerState.STARTING
                token = self._start_token[w.index] = self._start_token.get(w.index, 0) + 1
                call_later(self.env, cold_start_s, partial(self._started, w, token))
            cl.router.drain_queue()
            return
        n = -delta
        starting = self._pool(role, WorkerState.STARTING)
        for w in sorted(starting, key=lambda x: -self.alloc_at[x.index])[:n]:
            self._start_token[w.index] = self._start_token.get(w.index, 0) + 1  # cancel
            self.release(w)
            n -= 1
        if n <= 0:
            return
        serving = [w for w in self._pool(role, WorkerState.IN_SERVICE) if w.alive]
        n = min(n, len(serving) - 1)  # never drain the last serving worker
        if n <= 0:
            return
        load = [
            (w.index, float(getattr(w, "queued_tokens", 0) + w.num_outstanding)) for w in serving
        ]
        for idx in choose_to_drain(load, n):
            cl.drain_worker(cl.workers[idx])

    def _started(self, w: Worker, token: int) -> None:
        if self._start_token.get(w.index) != token or w.state is not WorkerState.STARTING:
            return
        w.state = WorkerState.IN_SERVICE
        role = self.cluster.role_of(w)
        self.record(role)
        self.cluster.router.drain_queue()
        if role == "decode":
            self.cluster.router.decode_freed()

    # -- signals ------------------------------------------------------------------------

    def signals(self, role: str, window_s: float, arrived_tokens_per_s: float) -> PoolSignals:
        cl = self.cluster
        pool = self._pool(role)
        serving = [w for w in pool if w.state is WorkerState.IN_SERVICE and w.alive]
        starting = sum(
            1
            for w in pool
            if w.state is WorkerState.STARTING
            or (w.state is WorkerState.IN_SERVICE and not w.alive)
        )
        draining = sum(1 for w in pool if w.state is WorkerState.DRAINING)
        # requests the router holds because no decode worker can promise them room
        # (kv_aware) wait for both pools: the decode pool's room first, then a prefill
        # worker (prefill signals count every held request; the decode pool's counted
        # none, so a pool short of KV to promise saw no queue)
        router = cl.router
        if role == "decode":
            queued = list(router.pending) + [r for w in pool for r in getattr(w, "waiting", ())]
            if router.held_for_decode():
                queued += router.queue
        else:
            queued = list(router.queue) + [r for w in pool for r in getattr(w, "queue", ())]
        queued_tokens = sum(cl.requests.prefill_len(r) for r in queued)
        occ = [getattr(w, "batch", 0) / w.max_batch_seqs for w in serving]
        kv = [w.kv_used_blocks / max(w.kv_capacity_blocks, 1) for w in serving]
        now = self.env.now
        ttft = [t for at, t in reversed(cl.ttft_log) if at >= now - window_s] if cl.ttft_log else []
        gaps = _WindowGaps()
        for w in serving:
            w.flush_steps()  # its step-log rows held since the last flush
            gaps.add_worker(w.steps, now - window_s)
        return PoolSignals(
            queue_depth=len(queued),
            queued_prompt_tokens=int(queued_tokens),
            batch_occupancy=float(np.mean(occ)) if occ else 0.0,
            kv_util=float(np.mean(kv)) if kv else 0.0,
            ttft_p99_s=float(np.percentile(ttft, 99)) if ttft else math.nan,
            itl_p99_s=gaps.quantile(0.99),
            num_in_service=len(serving),
            num_starting=starting,
            num_draining=draining,
            running_seqs=int(sum(getattr(w, "batch", 0) for w in serving)),
            context_tokens=float(sum(getattr(w, "context_tokens", 0) for w in serving)),
            arrived_prompt_tokens_per_s=arrived_tokens_per_s,
        )


class _WindowGaps:
    """The inter-token gaps of a pool's token steps in a window, as weighted runs.

    A run of ``k`` steps (``StepLog``) over ``b`` sequences gives ``b`` tokens per step,
    each with the step's duration as its gap: ``d0 + j × delta`` for step ``j`` (context
    grows by ``b`` tokens a step). Stalls (prefill-only iterations, swap copies) between
    two runs hold back the next token of every sequence that kept running: those tokens'
    gap runs from the stall's start to the end of the next run's first step; sequences that
    joined in the stall (the prefilled ones) count that first step alone. A run cut by the
    window start is left out, like the first decode token of a sequence (whose gap starts
    at its first token, not at a step). Work per run, not per token or step.
    """

    def __init__(self) -> None:
        self.d0: list[float] = []
        self.delta: list[float] = []
        self.k: list[int] = []
        self.weight: list[float] = []

    def _add(self, d0: float, delta: float, k: int, weight: float) -> None:
        if k > 0 and weight > 0:
            self.d0.append(d0)
            self.delta.append(delta)
            self.k.append(k)
            self.weight.append(weight)

    def add_worker(self, log: StepLog, since_s: float) -> None:
        first = len(log.run_start_at_s)
        while first > 0 and log.run_start_at_s[first - 1] >= since_s:
            first -= 1
        iters = log.prefill_iters
        k0 = len(iters)
        while k0 > 0 and iters[k0 - 1][0] >= since_s:  # from the end: work per window
            k0 -= 1
        stalls = [(t, n) for t, _, n, _ in iters[k0:]]
        si = 0
        for i in range(first, len(log.run_start_at_s)):
            start, b, k = log.run_start_at_s[i], log.run_batch[i], log.run_steps[i]
            per = log.run_per_token_s[i]
            d0 = log.run_base_s[i] + per * log.run_context0[i]
            stall_start, joined = None, 0
            while si < len(stalls) and stalls[si][0] < start:
                if stall_start is None:
                    stall_start = stalls[si][0]
                joined += stalls[si][1]
                si += 1
            held = 0
            if stall_start is not None:
                held = max(b - joined, 0)
                self._add(start - stall_start + d0, 0.0, 1, held)
            self._add(d0, 0.0, 1, b - held)
            self._add(d0 + per * b, per * b, k - 1, b)

    def quantile(self, q: float) -> float:
        """The smallest gap at or below which a share ``q`` of the tokens' gaps lie (the
        inverted-CDF quantile of the tokens); NaN when the window has no token gap."""
        if not self.k:
            return math.nan
        d0 = np.asarray(self.d0)
        delta = np.asarray(self.delta)
        k = np.asarray(self.k, float)
        w = np.asarray(self.weight)
        total = float(np.sum(w * k))
        allowed_above = (1.0 - q) * total + 1e-9 * total  # ties at the share: the lower gap
        safe = np.where(delta > 0, delta, 1.0)

        def weight_above(t: float) -> float:
            at_or_below = np.where(
                delta > 0,
                np.clip(np.floor((t - d0) / safe) + 1.0, 0.0, k),
                np.where(d0 <= t, k, 0.0),
            )
            return float(np.sum(w * (k - at_or_below)))

        lo, hi = float(d0.min()), float(np.max(d0 + delta * (k - 1)))
        if weight_above(lo) <= allowed_above:
            return lo
        for _ in range(100):  # weight_above(lo) > allowed >= weight_above(hi)
            mid = 0.5 * (lo + hi)
            if mid <= lo or mid >= hi:
                break
            if weight_above(mid) <= allowed_above:
                hi = mid
            else:
                lo = mid
        return hi
