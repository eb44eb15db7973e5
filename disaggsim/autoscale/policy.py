"""The autoscaling controller of one pool: pure, deterministic, no simpy.

The engine fills a :class:`PoolSignals` every ``interval_s`` and calls
:meth:`Autoscaler.decide`, which returns the desired number of workers (in service plus
starting). The engine then starts or drains workers to match. The only state is the
controller's own recommendation history (for the stabilisation windows), so one
sequence of calls always gives one sequence of answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from disaggsim.autoscale.config import PoolAutoscaleConfig, Role
from disaggsim.errors import UserError


@dataclass(frozen=True, slots=True)
class PoolSignals:
    """One pool's state at a control instant (``docs/autoscaling.md`` defines each).

    Pool totals unless stated; ``_s`` fields are seconds; means are over in-service
    workers (0 when there are none).
    """

    queue_depth: int
    """Requests waiting for this pool that no worker has started: for prefill (and
    colocated) requests not yet prefilling; for decode, prefilled requests waiting for
    decode admission (held at the router, in transfer queues or holding KV on prefill)."""
    queued_prompt_tokens: int
    """Prompt tokens of those requests (for decode: the context each will bring)."""
    batch_occupancy: float
    """Mean over in-service workers of running sequences / ``max_batch_seqs``, in [0, 1]."""
    kv_util: float
    """Mean over in-service workers of KV tokens (blocks) in use / KV capacity, in [0, 1]."""
    ttft_p99_s: float
    """p99 TTFT of requests whose first token came in the last interval; NaN if none."""
    itl_p99_s: float
    """p99 of the inter-token gaps emitted in the last interval; NaN if none."""
    num_in_service: int
    """Workers taking new work."""
    num_starting: int
    """Workers provisioning or loading weights (they count towards the pool's size)."""
    num_draining: int
    """Workers finishing their work before release (they do not count)."""
    running_seqs: int = 0
    """Sequences in running batches (decode and colocated pools)."""
    context_tokens: float = 0.0
    """KV tokens held by those running sequences."""
    arrived_prompt_tokens_per_s: float = math.nan
    """Prompt tokens that arrived for this pool in the last interval / interval_s (slo
    policy, prefill and colocated: the load term); NaN: not measured, term skipped."""


@dataclass(frozen=True, slots=True)
class Decision:
    """``desired``: what :meth:`Autoscaler.decide` returns; ``recommendation``: the
    policy's raw answer before stabilisation, step limits and bounds; ``reason``: a
    short human-readable account for the scale-event log."""

    desired: int
    recommendation: int
    reason: str


class Autoscaler:
    """The controller of one pool.

    Parameters
    ----------
    cfg : the pool's ``autoscale`` entry.
    role : ``prefill``, ``decode`` or ``colocated``.
    ttft_slo_s, itl_slo_s : the scenario's SLO targets in seconds (``slo`` policy:
        prefill needs TTFT, decode ITL, colocated both).
    prefill_tokens_per_s_per_worker : sustained prefill throughput of one worker
        (``slo``: prefill and colocated), e.g. from
        :func:`disaggsim.autoscale.inputs.prefill_tokens_per_s`.
    decode_step_s : ``f(batch_seqs, context_tokens) -> seconds`` of one decode step of
        one worker (``slo``: decode and colocated), e.g.
        :func:`disaggsim.autoscale.inputs.decode_step_fn`.
    max_batch_seqs : the pool's ``max_batch_seqs`` (``slo``: decode and colocated).
    kv_capacity_tokens_per_worker : KV capacity of one worker (``slo``: decode and
        colocated).
    """

    def __init__(
        self,
        cfg: PoolAutoscaleConfig,
        role: Role,
        *,
        ttft_slo_s: float | None = None,
        itl_slo_s: float | None = None,
        prefill_tokens_per_s_per_worker: float | None = None,
        decode_step_s: Callable[[int, float], float] | None = None,
        max_batch_seqs: int | None = None,
        kv_capacity_tokens_per_worker: float | None = None,
    ) -> None:
        if role not in ("prefill", "decode", "colocated"):
            raise UserError(f"autoscale: unknown pool role {role!r} (prefill, decode, colocated)")
        self.cfg = cfg
        self.role = role
        self.ttft_slo_s = ttft_slo_s
        self.itl_slo_s = itl_slo_s
        self.prefill_tokens_per_s_per_worker = prefill_tokens_per_s_per_worker
        self.decode_step_s = decode_step_s
        self.max_batch_seqs = max_batch_seqs
        self.kv_capacity_tokens_per_worker = kv_capacity_tokens_per_worker
        if cfg.policy == "slo":
            self._check_slo_inputs()
        self._history: list[tuple[float, int]] = []  # (at_s, clamped recommendation)

    def _check_slo_inputs(self) -> None:
        needs: dict[str, object] = {}
        if self.role in ("prefill", "colocated"):
            needs["ttft_slo_s"] = self.ttft_slo_s
            needs["prefill_tokens_per_s_per_worker"] = self.prefill_tokens_per_s_per_worker
        if self.role in ("decode", "colocated"):
            needs["itl_slo_s"] = self.itl_slo_s
            needs["decode_step_s"] = self.decode_step_s
            needs["max_batch_seqs"] = self.max_batch_seqs
            needs["kv_capacity_tokens_per_worker"] = self.kv_capacity_tokens_per_worker
        missing = [k for k, v in needs.items() if v is None]
        if missing:
            raise UserError(
                f"autoscale.{self.role}: policy slo needs {', '.join(missing)} "
                "(from the scenario's slo section and the cost model)"
            )
        for k, v in needs.items():
            if isinstance(v, (int, float)) and not v > 0:
                raise UserError(f"autoscale.{self.role}: {k} must be > 0, got {v}")

    # ------------------------------------------------------------------ public

    def decide(self, now_s: float, current_workers: int, signals: PoolSignals) -> int:
        """Desired workers (in service + starting) from ``now_s`` on.

        ``current_workers`` must equal ``signals.num_in_service + signals.num_starting``.
        Calls must come in non-decreasing ``now_s``.
        """
        return self.recommend(now_s, current_workers, signals).desired

    def recommend(self, now_s: float, current_workers: int, signals: PoolSignals) -> Decision:
        """:meth:`decide` with the raw recommendation and the reason."""
        if current_workers != signals.num_in_service + signals.num_starting:
            raise ValueError(
                f"current_workers ({current_workers}) must equal num_in_service "
                f"({signals.num_in_service}) + num_starting ({signals.num_starting})"
            )
        if self._history and now_s < self._history[-1][0]:
            raise ValueError(f"decide called at {now_s} s after {self._history[-1][0]} s")
        if self.cfg.policy == "target":
            raw, reason = self._target(current_workers, signals)
        else:
            raw, reason = self._slo(current_workers, signals)
        cfg = self.cfg
        rec = min(max(raw, cfg.min_workers), cfg.max_workers)
        self._history.append((now_s, rec))
        horizon_s = max(cfg.scale_up_stabilization_s, cfg.scale_down_stabilization_s)
        self._history = [(t, r) for t, r in self._history if t > now_s - horizon_s or t == now_s]
        # HPA stabilisation: never above the smallest recommendation of the scale-up
        # window, never below the largest of the scale-down window (each window
        # includes the current recommendation).
        up = min(
            r for t, r in self._history if t > now_s - cfg.scale_up_stabilization_s or t == now_s
        )
        down = max(
            r for t, r in self._history if t > now_s - cfg.scale_down_stabilization_s or t == now_s
        )
        desired = current_workers
        if desired < up:
            desired = up
        if desired > down:
            desired = down
        if cfg.max_step_up is not None:
            desired = min(desired, current_workers + cfg.max_step_up)
        if cfg.max_step_down is not None:
            desired = max(desired, current_workers - cfg.max_step_down)
        desired = min(max(desired, cfg.min_workers), cfg.max_workers)
        return Decision(desired=desired, recommendation=raw, reason=reason)

    # ------------------------------------------------------------------ policies

    def _target(self, current: int, s: PoolSignals) -> tuple[int, str]:
        t = self.cfg.target
        assert t is not None  # the config validator guarantees it for policy target
        value = signal_value(s, t.signal)
        name = t.signal
        if math.isnan(value):
            return current, f"{name}: no data, hold"
        if s.num_in_service == 0:
            return current, f"{name}: no worker in service yet, hold"
        ratio = value / t.target_value
        if abs(ratio - 1.0) <= t.tolerance:
            return current, f"{name} {value:.4g} within ±{t.tolerance:.0%} of {t.target_value:.4g}"
        # Metrics come from in-service workers only; for the additive signals
        # in_service × per-worker value is the pool's load, so starting workers are
        # neither double-counted nor assumed busy (HPA's not-ready-pod rule gives the same).
        desired = math.ceil(s.num_in_service * ratio - 1e-9)
        return (
            desired,
            f"{name} {value:.4g} vs target {t.target_value:.4g}: ceil({s.num_in_service} × {ratio:.4g})",
        )

    def _slo(self, current: int, s: PoolSignals) -> tuple[int, str]:
        parts: list[str] = []
        need = 1
        measured_over = False
        margin = self.cfg.slo.margin
        if self.role in ("prefill", "colocated"):
            n, why = self._slo_prefill(s)
            need = max(need, n)
            parts.append(why)
            assert self.ttft_slo_s is not None
            measured_over |= s.ttft_p99_s > margin * self.ttft_slo_s  # NaN compares False
        if self.role in ("decode", "colocated"):
            n, why = self._slo_decode(s)
            need = max(need, n)
            parts.append(why)
            assert self.itl_slo_s is not None
            measured_over |= s.itl_p99_s > margin * self.itl_slo_s
        if measured_over and need < current:
            need = current
            parts.append("measured p99 above margin × SLO: no scale-down")
        return need, "; ".join(parts)

    def _slo_prefill(self, s: PoolSignals) -> tuple[int, str]:
        tps = self.prefill_tokens_per_s_per_worker
        slo = self.ttft_slo_s
        assert tps is not None and slo is not None
        budget_s = self.cfg.slo.margin * slo
        q = float(s.queued_prompt_tokens)
        one_prefill_s = q / s.queue_depth / tps if s.queue_depth > 0 else 0.0
        # predicted TTFT(n) = q / (n × tps) + one_prefill_s <= budget_s
        wait_budget_s = budget_s - one_prefill_s
        if wait_budget_s <= 0:  # one prefill alone breaks the SLO: bound the wait only
            wait_budget_s = budget_s
        n_queue = math.ceil(q / (tps * wait_budget_s) - 1e-9) if q > 0 else 0
        n_load = 0
        if not math.isnan(s.arrived_prompt_tokens_per_s):
            util = self.cfg.slo.max_utilization
            n_load = math.ceil(s.arrived_prompt_tokens_per_s / (tps * util) - 1e-9)
        return max(n_queue, n_load), f"prefill: queue needs {n_queue}, load needs {n_load}"

    def _slo_decode(self, s: PoolSignals) -> tuple[int, str]:
        step = self.decode_step_s
        slo = self.itl_slo_s
        max_batch = self.max_batch_seqs
        kv_cap = self.kv_capacity_tokens_per_worker
        assert step is not None and slo is not None and max_batch is not None and kv_cap is not None
        seqs = s.running_seqs + s.queue_depth
        context = s.context_tokens + s.queued_prompt_tokens
        n_batch = math.ceil(seqs / max_batch)
        n_kv = math.ceil(context / (self.cfg.slo.max_kv_util * kv_cap) - 1e-9) if context else 0
        budget_s = self.cfg.slo.margin * slo
        n_itl = 0
        if seqs > 0:
            # The smallest n whose per-worker step meets the budget; the step time does
            # not grow as n grows (smaller batch, less context), so bisect.
            def ok(n: int) -> bool:
                return step(math.ceil(seqs / n), context / n) <= budget_s

            hi = max(self.cfg.max_workers, 1)
            if not ok(hi):
                n_itl = hi
            else:
                lo = 0  # ok(0) is false by convention
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if ok(mid):
                        hi = mid
                    else:
                        lo = mid
                n_itl = hi
        return (
            max(n_batch, n_kv, n_itl),
            f"decode: ITL needs {n_itl}, batch slots {n_batch}, KV {n_kv}",
        )


def signal_value(s: PoolSignals, signal: str) -> float:
    """The value a ``target`` policy compares with ``target_value``: queue depth and
    queued prompt tokens per in-service worker (NaN with none in service), occupancy and
    KV utilisation as given, latencies in seconds."""
    match signal:
        case "queue_depth":
            return s.queue_depth / s.num_in_service if s.num_in_service else math.nan
        case "queued_prompt_tokens":
            return s.queued_prompt_tokens / s.num_in_service if s.num_in_service else math.nan
        case "batch_occupancy":
            return s.batch_occupancy
        case "kv_util":
            return s.kv_util
        case "ttft_p99":
            return s.ttft_p99_s
        case "itl_p99":
            return s.itl_p99_s
    raise ValueError(f"unknown autoscale signal {signal!r}")
