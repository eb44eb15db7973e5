"""Fluid max-min fair bandwidth sharing of KV transfers, as a SimPy component.

A transfer is split into one flow per shard route of its :class:`~disaggsim.fabric.
topology.Path`. Every active flow gets its max-min fair rate over the links it crosses
(progressive filling: raise all rates together; a link that fills freezes the flows on
it; a flow that reaches its own cap freezes alone). Rates are recomputed only when a flow
starts or ends, a source cap lifts, or a link's capacity changes — O(flows × links) per
change, never per byte or per time tick — and each recomputation schedules the next such
instant as one SimPy timeout (stale wake-ups are ignored by a generation counter).

Life of a transfer started at ``t``: it waits ``start_delay_s`` (overlap: the first
layer's compute), sends at its fair rate (capped at ``source_rate_cap_bytes_per_s`` in
total until ``cap_until_s``: the source can only send KV already computed), and, when
its last byte leaves, arrives ``latency_s`` later (hop latencies + setup + block gather,
a pipeline delay that occupies no bandwidth). Then ``on_done(record)`` runs.

Records: one :class:`TransferRecord` per finished or cancelled transfer; per-link
utilisation as piecewise-constant samples ``(at_s, link, load / nominal capacity)``
appended when a link's load changes, and each link's exact busy integral
(``∫ load dt``, bytes). :func:`fabric_summary` derives the summary keys.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import simpy

from disaggsim.fabric.topology import Path, Topology

__all__ = [
    "FlowHandle",
    "FlowNetwork",
    "LinkUtilisation",
    "TransferRecord",
    "fabric_summary",
    "max_min_rates",
]

# A flow within this many seconds of its last byte counts as finished (float residue).
_FINISH_TOL_S = 1e-12


def _ignore_event(fn: Callable[[Any], None], arg: Any, _event: simpy.Event) -> None:
    """A SimPy callback that calls ``fn(arg)``."""
    fn(arg)


def _before(now: float, at_s: float) -> bool:
    """``now`` is earlier than ``at_s`` by more than float residue."""
    return now < at_s - _FINISH_TOL_S * max(1.0, abs(at_s))


def max_min_rates(
    flow_links: Sequence[Sequence[int]],
    flow_caps: Sequence[float],
    link_capacity: Sequence[float],
) -> list[float]:
    """Max-min fair rates (bytes/s) by progressive filling.

    Parameters
    ----------
    flow_links
        For each flow, the link indices it crosses.
    flow_caps
        For each flow, its own rate limit (``math.inf`` for none).
    link_capacity
        Capacity of each link, bytes/s (0: the link is down; its flows get 0).

    Ties go to the lowest link index, then the flow's own cap; the result does not
    depend on them. A flow with no links and no cap is an error (its rate is unbounded).
    """
    n = len(flow_links)
    rates = [0.0] * n
    cap_left = [float(c) for c in link_capacity]
    users: dict[int, list[int]] = {}
    for f, links in enumerate(flow_links):
        if not links and not math.isfinite(flow_caps[f]):
            raise ValueError(f"flow {f} crosses no link and has no cap")
        for link in links:
            users.setdefault(link, []).append(f)
    count = {link: len(fs) for link, fs in users.items()}
    active = set(range(n))
    while active:
        best, best_link, best_flow = math.inf, -1, -1
        for link in sorted(count):
            share = max(cap_left[link], 0.0) / count[link]
            if share < best:
                best, best_link = share, link
        for f in sorted(active):
            if flow_caps[f] < best:
                best, best_flow = flow_caps[f], f
        if best_flow >= 0:
            frozen = [best_flow]
        else:
            frozen = [f for f in users[best_link] if f in active]
        for f in frozen:
            rates[f] = best
            active.discard(f)
            for link in flow_links[f]:
                cap_left[link] -= best
                count[link] -= 1
                if count[link] == 0:
                    del count[link]
    return rates


@dataclass(frozen=True, slots=True)
class TransferRecord:
    """One KV transfer. ``exposed_s = end_at_s − max(ready_at_s, start_at_s)``: the part
    of the transfer after the KV was complete at the source."""

    transfer_id: int
    tag: int  # the caller's id (e.g. request id); -1 when not given
    nbytes: float
    path_kind: str
    num_hops: int
    num_shards: int
    src_worker: int
    dst_worker: int
    start_at_s: float  # start() was called
    ready_at_s: float  # the whole KV existed at the source (prefill end)
    end_at_s: float  # last byte arrived (or the cancel instant)
    exposed_s: float
    delivered_bytes: float
    cancelled: bool

    @property
    def transfer_s(self) -> float:
        return self.end_at_s - self.start_at_s


@dataclass(frozen=True, slots=True)
class FlowHandle:
    transfer_id: int


@dataclass(frozen=True, slots=True)
class LinkUtilisation:
    """Piecewise-constant utilisation samples: from ``at_s[i]`` on, link ``link[i]`` ran
    at ``util[i]`` × its nominal capacity (until that link's next sample)."""

    link_ids: tuple[str, ...]
    at_s: np.ndarray
    link: np.ndarray
    util: np.ndarray
    busy_bytes: np.ndarray  # ∫ load dt per link, bytes
    capacity_bytes_per_s: np.ndarray  # nominal


class _Flow:
    __slots__ = ("links", "remaining_bytes", "rate_bytes_per_s", "route_cap", "size_bytes", "xfer")

    def __init__(self, xfer: _Transfer, links: tuple[int, ...], size: float, cap: float) -> None:
        self.xfer = xfer
        self.links = links
        self.size_bytes = size
        self.remaining_bytes = size
        self.rate_bytes_per_s = 0.0
        self.route_cap = cap


class _Transfer:
    __slots__ = (
        "cap_until_s", "flows", "id", "latency_s", "nbytes", "on_done", "path", "ready_at_s",
        "record", "source_cap", "start_at_s", "state", "tag",
    )  # fmt: skip

    def __init__(self, id_: int, nbytes: float, path: Path, tag: int, start_at_s: float) -> None:
        self.id = id_
        self.nbytes = nbytes
        self.path = path
        self.tag = tag
        self.start_at_s = start_at_s
        self.ready_at_s = start_at_s
        self.latency_s = 0.0
        self.source_cap = math.inf
        self.cap_until_s = -math.inf
        self.on_done: Callable[[TransferRecord | None], None] | None = None
        self.flows: list[_Flow] = []
        self.state = "pending"  # pending → active → tail → done | cancelled
        self.record = True


class FlowNetwork:
    """Transfers sharing the links of ``topology`` in simulated time on ``env``."""

    def __init__(self, env: simpy.Environment, topology: Topology) -> None:
        self.env = env
        self.topology = topology
        nominal = [link.capacity_bytes_per_s for link in topology.links]
        self._nominal = np.asarray(nominal, dtype=float)
        self._capacity = list(nominal)
        self._load = [0.0] * len(nominal)
        self._busy = [0.0] * len(nominal)
        self._flows: list[_Flow] = []
        self._transfers: dict[int, _Transfer] = {}
        self._next_id = 0
        self._last_at_s = env.now
        self._generation = 0
        self.records: list[TransferRecord] = []
        self._util_at: list[float] = []
        self._util_link: list[int] = []
        self._util_value: list[float] = []

    # -- public API ---------------------------------------------------------------------

    def start(
        self,
        nbytes: float,
        path: Path,
        *,
        on_done: Callable[[TransferRecord | None], None] | None = None,
        start_delay_s: float = 0.0,
        source_rate_cap_bytes_per_s: float | None = None,
        cap_until_s: float | None = None,
        ready_at_s: float | None = None,
        extra_latency_s: float = 0.0,
        tag: int = -1,
        record: bool = True,
    ) -> FlowHandle:
        """Start moving ``nbytes`` along ``path`` now.

        Parameters
        ----------
        start_delay_s
            Seconds before the first byte may leave.
        source_rate_cap_bytes_per_s, cap_until_s
            The whole transfer sends at most this fast until ``cap_until_s`` (absolute
            simulated time); split evenly over its shards.
        ready_at_s
            When the KV is complete at the source (default: now); exposure is measured
            from it.
        extra_latency_s
            Fixed time added to the path's hop latency (setup, block gather).
        record
            False: not a KV transfer (e.g. a swap copy); it shares the links but leaves no
            :class:`TransferRecord` (``on_done`` then gets None).
        """
        if nbytes < 0 or start_delay_s < 0 or extra_latency_s < 0:
            raise ValueError("nbytes, start_delay_s and extra_latency_s must be >= 0")
        now = self.env.now
        xfer = _Transfer(self._next_id, float(nbytes), path, tag, now)
        self._next_id += 1
        xfer.latency_s = path.latency_s + extra_latency_s
        xfer.ready_at_s = now if ready_at_s is None else ready_at_s
        xfer.on_done = on_done
        xfer.record = record
        if source_rate_cap_bytes_per_s is not None and cap_until_s is not None:
            if source_rate_cap_bytes_per_s <= 0:
                raise ValueError("source_rate_cap_bytes_per_s must be > 0")
            xfer.source_cap = source_rate_cap_bytes_per_s
            xfer.cap_until_s = cap_until_s
        self._transfers[xfer.id] = xfer
        if start_delay_s > 0:
            ev = self.env.timeout(start_delay_s)
            ev.callbacks.append(partial(_ignore_event, self._activate, xfer))
        else:
            self._activate(xfer)
        return FlowHandle(xfer.id)

    def cancel(self, handle: FlowHandle) -> float:
        """Stop a transfer (no ``on_done``); returns the bytes it had delivered."""
        xfer = self._transfers.get(handle.transfer_id)
        if xfer is None:
            raise ValueError(f"transfer {handle.transfer_id} is not in flight")
        if xfer.state == "active":
            self._advance()
            delivered = sum(f.size_bytes - f.remaining_bytes for f in xfer.flows)
            self._flows = [f for f in self._flows if f.xfer is not xfer]
            self._reschedule()
        else:
            delivered = xfer.nbytes if xfer.state == "tail" else 0.0
        xfer.state = "cancelled"
        self._record(xfer, self.env.now, delivered, cancelled=True)
        return delivered

    def set_link_capacity(self, link: str | int, factor: float) -> None:
        """Scale a link to ``factor`` × its nominal capacity (0: outage, flows on it
        stall; 1: restored). Takes effect now."""
        idx = self.topology.link_index[link] if isinstance(link, str) else link
        if factor < 0:
            raise ValueError(f"capacity factor must be >= 0, got {factor}")
        self._advance()
        self._capacity[idx] = float(self._nominal[idx]) * factor
        self._reschedule()

    def in_flight(self) -> int:
        """Transfers started and not yet finished or cancelled."""
        return len(self._transfers)

    def path_load(self, path: Path) -> int:
        """Most active flows on any link of ``path`` (a congestion signal for routing)."""
        counts: dict[int, int] = {}
        for f in self._flows:
            for link in f.links:
                counts[link] = counts.get(link, 0) + 1
        return max((counts.get(i, 0) for r in path.routes for i in r.links), default=0)

    def link_utilisation(self) -> LinkUtilisation:
        """Utilisation samples and busy integrals up to now."""
        self._advance()
        return LinkUtilisation(
            link_ids=tuple(link.id for link in self.topology.links),
            at_s=np.asarray(self._util_at, dtype=float),
            link=np.asarray(self._util_link, dtype=np.int64),
            util=np.asarray(self._util_value, dtype=float),
            busy_bytes=np.asarray(self._busy, dtype=float),
            capacity_bytes_per_s=self._nominal.copy(),
        )

    # -- internals ----------------------------------------------------------------------

    def _activate(self, xfer: _Transfer) -> None:
        if xfer.state != "pending":
            return  # cancelled while waiting
        self._advance()
        xfer.state = "active"
        routes = xfer.path.routes
        share = xfer.nbytes / len(routes)
        xfer.flows = [_Flow(xfer, r.links, share, r.rate_cap_bytes_per_s) for r in routes]
        self._flows.extend(xfer.flows)
        self._reschedule()

    def _advance(self) -> None:
        """Move every flow forward at its current rate up to now."""
        now = self.env.now
        dt = now - self._last_at_s
        if dt > 0:
            for f in self._flows:
                f.remaining_bytes = max(0.0, f.remaining_bytes - f.rate_bytes_per_s * dt)
            for i, load in enumerate(self._load):
                self._busy[i] += load * dt
        self._last_at_s = now

    def _flow_cap(self, f: _Flow, now: float) -> float:
        x = f.xfer
        if _before(now, x.cap_until_s):
            return min(f.route_cap, x.source_cap / len(x.flows))
        return f.route_cap

    def _reschedule(self) -> None:
        """Retire finished flows, recompute fair rates, schedule the next change."""
        now = self.env.now
        tol_s = _FINISH_TOL_S * max(1.0, now)
        finished = [
            f for f in self._flows
            if f.remaining_bytes <= f.rate_bytes_per_s * tol_s or f.remaining_bytes == 0
        ]  # fmt: skip
        if finished:
            gone = {id(f) for f in finished}
            self._flows = [f for f in self._flows if id(f) not in gone]
            for f in finished:
                f.remaining_bytes = 0.0
                x = f.xfer
                if x.state == "active" and all(g.remaining_bytes == 0.0 for g in x.flows):
                    x.state = "tail"
                    ev = self.env.timeout(x.latency_s)
                    ev.callbacks.append(partial(_ignore_event, self._arrive, x))
        rates = max_min_rates(
            [f.links for f in self._flows],
            [self._flow_cap(f, now) for f in self._flows],
            self._capacity,
        )
        load = [0.0] * len(self._load)
        for f, r in zip(self._flows, rates, strict=True):
            f.rate_bytes_per_s = r
            for link in f.links:
                load[link] += r
        for i, (old, new) in enumerate(zip(self._load, load, strict=True)):
            if old != new:
                self._util_at.append(now)
                self._util_link.append(i)
                self._util_value.append(new / self._nominal[i])
        self._load = load
        next_at = math.inf
        for f in self._flows:
            if f.rate_bytes_per_s > 0:
                next_at = min(next_at, now + f.remaining_bytes / f.rate_bytes_per_s)
            if _before(now, f.xfer.cap_until_s):
                next_at = min(next_at, f.xfer.cap_until_s)
        self._generation += 1
        if math.isfinite(next_at):
            gen = self._generation
            ev = self.env.timeout(max(0.0, next_at - now))
            ev.callbacks.append(partial(_ignore_event, self._wake, gen))

    def _wake(self, generation: int) -> None:
        if generation != self._generation:
            return  # superseded by a later recomputation
        self._advance()
        self._reschedule()

    def _arrive(self, xfer: _Transfer) -> None:
        if xfer.state != "tail":
            return  # cancelled during its latency
        xfer.state = "done"
        rec = self._record(xfer, self.env.now, xfer.nbytes, cancelled=False)
        if xfer.on_done is not None:
            xfer.on_done(rec)

    def _record(
        self, xfer: _Transfer, end: float, delivered: float, cancelled: bool
    ) -> TransferRecord | None:
        del self._transfers[xfer.id]
        if not xfer.record:
            return None
        p = xfer.path
        rec = TransferRecord(
            transfer_id=xfer.id,
            tag=xfer.tag,
            nbytes=xfer.nbytes,
            path_kind=p.kind,
            num_hops=p.num_hops,
            num_shards=p.num_shards,
            src_worker=p.src_worker,
            dst_worker=p.dst_worker,
            start_at_s=xfer.start_at_s,
            ready_at_s=xfer.ready_at_s,
            end_at_s=end,
            exposed_s=max(0.0, end - max(xfer.ready_at_s, xfer.start_at_s)),
            delivered_bytes=delivered,
            cancelled=cancelled,
        )
        self.records.append(rec)
        return rec


def fabric_summary(
    records: Sequence[TransferRecord], util: LinkUtilisation, end_at_s: float
) -> dict[str, float]:
    """Summary keys over finished (not cancelled) transfers.

    ``kv_transfer_p50_s``/``kv_transfer_p99_s``: percentiles of ``end_at_s − start_at_s``;
    ``kv_exposed_p50_s``/``kv_exposed_p99_s``: of ``exposed_s``; ``link_util_max``: the
    busiest link's mean utilisation over ``[0, end_at_s]``, ``busy_bytes / (capacity ×
    end_at_s)``. NaN where there is nothing to measure.
    """
    done = [r for r in records if not r.cancelled]
    xfer = np.asarray([r.transfer_s for r in done], dtype=float)
    exposed = np.asarray([r.exposed_s for r in done], dtype=float)
    nan = float("nan")

    def pct(a: np.ndarray, q: float) -> float:
        return float(np.percentile(a, q)) if len(a) else nan

    mean_util = nan
    if len(util.busy_bytes) and end_at_s > 0:
        mean_util = float(np.max(util.busy_bytes / (util.capacity_bytes_per_s * end_at_s)))
    return {
        "kv_transfer_p50_s": pct(xfer, 50),
        "kv_transfer_p99_s": pct(xfer, 99),
        "kv_exposed_p50_s": pct(exposed, 50),
        "kv_exposed_p99_s": pct(exposed, 99),
        "kv_transfer_bytes_total": float(sum(r.nbytes for r in done)),
        "link_util_max": mean_util,
    }
