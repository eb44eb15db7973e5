"""Certain misses: when a run's verdict "misses the SLO" is already known (docs/metrics.md,
"Stopping a run that certainly misses").

A run meets the SLO only if its attainment, the share of the *measured* requests
(arrival >= ``warmup_s``; :mod:`disaggsim.metrics.summary`) that completed with TTFT
<= ``slo.ttft_s`` and ITL statistic <= ``slo.itl_s``, is at least
``slo.attainment_target``. The measured requests are known before the run (the arrivals
are generated in advance), so once ``k`` of those ``n`` requests have *provably* missed,
the attainment is at most ``(n − k) / n``; when that is below the target the run misses,
whatever happens after. A request has provably missed at simulated time ``now`` when
(:func:`provable_misses`):

- it was rejected or abandoned (only a completed request can meet the SLO);
- it has no first token and ``now − arrival > ttft target``: its TTFT will be at least
  ``now − arrival`` (or it never completes);
- its first token came late: ``first − arrival > ttft target``;
- it has a first token, ``n_out >= 2`` output tokens, has not finished, and
  ``(now − first) / (n_out − 1) > itl target``: its TPOT, ``(finish − first) / (n_out −
  1)`` with ``finish >= now``, will be at least that. The same bound holds for the
  ``max_gap`` statistic: the largest of the ``n_out − 1`` gaps is at least their mean;
- it completed and missed (TPOT exactly; for ``max_gap`` through its TPOT, unless the
  caller passes the largest gaps).

Every bound is the summary's own float expression with ``now`` in place of a later time
(IEEE subtraction and division are monotone), and the stop rule compares ``(n − k) / n``
as the summary computes the attainment (``met.mean()``, a correctly rounded ``count /
n``), so a stopped run's full-length attainment is below the target bit for bit.

:class:`CertainMiss` is the incremental form the engine calls every
:data:`CHECK_EVERY_S` simulated seconds (``simulate(..., stop_on_certain_miss=True)``):
it keeps a cursor over the measured arrivals and only the requests still open (arrived,
not yet settled), so a check costs in proportion to the requests in flight, not to the
table. This module is pure: numpy over arrays, no simulation.
"""

from __future__ import annotations

import numpy as np

from disaggsim.engine.records import (
    STATUS_ABANDONED,
    STATUS_COMPLETED,
    STATUS_REJECTED,
    RequestView,
)

__all__ = [
    "CHECK_EVERY_S",
    "CertainMiss",
    "attainment_bound",
    "certain_miss",
    "provable_misses",
    "seeds_stop_below",
]

# Simulated seconds between two checks of a run with stop_on_certain_miss. A run stops at
# most this long after its miss became certain; a check costs 0.1-0.2 ms of CPU
# (docs/performance.md, "Stopping runs that certainly miss"), so a run of T simulated
# seconds spends at most T x 0.2 ms on checks: little against the simulation.
CHECK_EVERY_S = 1.0


def provable_misses(
    arrival_s: np.ndarray,
    output_tokens: np.ndarray,
    status: np.ndarray,
    first_token_at_s: np.ndarray,
    finish_at_s: np.ndarray,
    now_s: float,
    ttft_s: float,
    itl_s: float,
    max_itl_s: np.ndarray | None = None,
) -> np.ndarray:
    """Which requests have certainly missed the SLO by ``now_s`` (module docstring):
    a boolean mask over the given rows, False where a request may still meet it.

    ``max_itl_s``: the completed requests' largest gaps (``max_gap`` statistic); when
    given a completed request is judged on it, otherwise on its TPOT (a lower bound of
    the largest gap, and the ``tpot`` statistic itself)."""
    arrival = np.asarray(arrival_s, dtype=np.float64)
    out = np.asarray(output_tokens, dtype=np.int64)
    status = np.asarray(status)
    first = np.asarray(first_token_at_s, dtype=np.float64)
    finish = np.asarray(finish_at_s, dtype=np.float64)
    completed = status == STATUS_COMPLETED
    ended_badly = (status == STATUS_REJECTED) | (status == STATUS_ABANDONED)
    has_first = ~np.isnan(first)
    multi = out >= 2
    with np.errstate(invalid="ignore", divide="ignore"):
        # the TTFT as summary computes it, or its lower bound while no first token came
        ttft_lo = np.where(has_first, first - arrival, now_s - arrival)
        # the TPOT as reconstruct computes it, or its lower bound while unfinished
        end = np.where(completed, finish, now_s)
        tpot_lo = np.where(multi, (end - first) / (out - 1), np.nan)
    late_first = ttft_lo > ttft_s
    slow = has_first & multi & (tpot_lo > itl_s)
    if max_itl_s is not None:
        gap = np.asarray(max_itl_s, dtype=np.float64)
        slow = np.where(completed & multi, gap > itl_s, slow)
    return ended_badly | late_first | slow


def attainment_bound(num_measured: int, num_missed: int) -> float:
    """The largest attainment a run can reach with ``num_missed`` of its
    ``num_measured`` measured requests missed (NaN without measured requests)."""
    if num_measured <= 0:
        return float("nan")
    return (num_measured - num_missed) / num_measured


def certain_miss(num_measured: int, num_missed: int, target: float) -> bool:
    """True when ``num_missed`` provable misses put the attainment below ``target``
    whatever the other requests do (the summary's ``attainment >= target`` fails)."""
    return num_measured > 0 and attainment_bound(num_measured, num_missed) < target


def seeds_stop_below(target: float, num_seeds: int) -> float:
    """The attainment below which one of ``num_seeds`` runs puts the mean of their
    attainments below ``target`` even if every other run reaches 1: ``1 − num_seeds ×
    (1 − target)`` (``target`` itself for one seed; below 0, so never, when the seeds
    together may miss more than one run's worth)."""
    if num_seeds < 1:
        raise ValueError(f"num_seeds must be >= 1, got {num_seeds}")
    if num_seeds == 1:
        return target
    return 1.0 - num_seeds * (1.0 - target)


class CertainMiss:
    """A stop check (:meth:`disaggsim.engine.cluster.Cluster.run`'s ``stop_check``):
    True once the measured requests' provable misses make the run's attainment
    certainly below ``target``.

    Each call adds the measured requests that arrived since the last call (a cursor over
    the arrivals) to the open ones, judges only those, counts the misses and drops every
    settled request (a provable miss stays one; a completed request's verdict is final).

    Parameters
    ----------
    arrival_s, output_tokens:
        The request table's columns (the run's :class:`~disaggsim.workload.requests.Requests`).
    warmup_s:
        Requests arriving at or after it are measured (``sim.warmup_s``).
    ttft_s, itl_s, target:
        ``slo.ttft_s``, ``slo.itl_s`` (seconds) and ``slo.attainment_target``.
    """

    def __init__(
        self,
        arrival_s: np.ndarray,
        output_tokens: np.ndarray,
        warmup_s: float,
        ttft_s: float,
        itl_s: float,
        target: float,
    ) -> None:
        arrival = np.asarray(arrival_s, dtype=np.float64)
        measured = np.flatnonzero(arrival >= warmup_s)
        order = np.argsort(arrival[measured], kind="stable")
        self._ids = measured[order]  # measured requests by arrival
        self._arrival = arrival[self._ids]
        self.num_measured = len(self._ids)
        self.num_missed = 0
        self.num_checks = 0
        self._cursor = 0
        self._open = np.empty(0, dtype=np.int64)
        self._ttft_s, self._itl_s, self._target = ttft_s, itl_s, target

    @property
    def num_open(self) -> int:
        """Measured requests that have arrived and are not settled yet."""
        return len(self._open)

    def __call__(self, now_s: float, view: RequestView) -> bool:
        self.num_checks += 1
        hi = int(np.searchsorted(self._arrival, now_s, side="right"))
        if hi > self._cursor:
            self._open = np.concatenate([self._open, self._ids[self._cursor : hi]])
            self._cursor = hi
        rid = self._open
        if len(rid):
            status = view.status[rid]
            missed = provable_misses(
                view.arrival_s[rid],
                view.output_tokens[rid],
                status,
                view.first_token_at_s[rid],
                view.finish_at_s[rid],
                now_s,
                self._ttft_s,
                self._itl_s,
            )
            self.num_missed += int(missed.sum())
            self._open = rid[~(missed | (status == STATUS_COMPLETED))]
        return certain_miss(self.num_measured, self.num_missed, self._target)
