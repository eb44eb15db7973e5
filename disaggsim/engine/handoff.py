"""The KV handoff: moving a prefilled request's KV cache to its decode worker.

Two fabrics (docs/fabric.md). A ``kind: link`` fabric gives each transfer a time from the
transfer-time function, uncontended; link windows slow it (``factor``) or hold it until
the link is back (outage), and an outage's start loses every transfer in flight, which is
sent again. A topology fabric moves each transfer as flows over shared links
(:class:`disaggsim.fabric.flows.FlowNetwork`, max-min fair), optionally streamed layer by
layer while the prefill runs (overlap); link windows set link capacities, and an outage
re-sends only the transfers whose paths cross the failed links. KV swap copies to host
memory (``preemption: swap``) run here too: over each GPU's PCIe link on a topology built
with host paths, else for the profile's pinned-copy time.

A transfer is identified by its request id and its start time (``token``): a re-send
supersedes the earlier copy, whose late completion is ignored. When a transfer lands,
:class:`Handoff` calls ``delivered(rid, src, dst)`` (the cluster decides what the
request does next).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

import simpy

from disaggsim.costmodel.interface import context_kv_bytes, kv_copy_gpus
from disaggsim.engine.config import EngineConfig, LinkWindow, TransferTime
from disaggsim.engine.events import call_in
from disaggsim.engine.records import RequestLogColumns
from disaggsim.engine.request_state import RequestState

if TYPE_CHECKING:
    from disaggsim.engine.workers import DecodeWorker, PrefillWorker, Worker
    from disaggsim.fabric.flows import FlowHandle, FlowNetwork
    from disaggsim.fabric.topology import Topology


class Handoff:
    """KV transfers in flight, link windows and swap copies."""

    def __init__(
        self,
        env: simpy.Environment,
        cfg: EngineConfig,
        requests: RequestState,
        log: RequestLogColumns,
        transfer_time: TransferTime,
        counters: dict[str, int],
        delivered: Callable[[int, PrefillWorker, DecodeWorker], None],
    ) -> None:
        self.env = env
        self.cfg = cfg
        self.requests = requests
        self.log = log
        self.transfer_time = transfer_time
        self.counters = counters
        self.delivered = delivered
        self.topology: Topology | None = cfg.topology
        self.net: FlowNetwork | None = None
        if cfg.topology is not None:
            from disaggsim.fabric.flows import FlowNetwork

            self.net = FlowNetwork(env, cfg.topology)
        # in flight: rid -> (source, destination, start time of this copy)
        self.transfers: dict[int, tuple[PrefillWorker, DecodeWorker, float]] = {}
        self._flows: dict[int, FlowHandle] = {}  # rid -> its flow (topology fabric)
        self._swaps: dict[int, FlowHandle] = {}  # worker -> its swap copy (topology fabric)

    def processes(self) -> Iterable[Generator[simpy.Event, Any, None]]:
        """The link-window processes to start with the run."""
        for win in self.cfg.link_windows:
            if self.net is not None:
                yield self._link_window(win)
            elif win.factor == 0:
                yield self._link_outage(win)

    # -- transfers ----------------------------------------------------------------------

    def kv_bytes(self, rid: int, w: Worker) -> int:
        """Bytes of ``rid``'s KV on ``w`` (its prompt and the tokens so far): the KV the
        model holds for that context (windowed layers at most their window)."""
        return context_kv_bytes(w.cost, self.requests.prefill_len(rid))

    def in_flight(self, rid: int) -> bool:
        return rid in self.transfers

    def path_rank_and_load(self, src: int, dst: int) -> tuple[int, float]:
        """Topology fabric: (path kind rank, current load) from worker ``src`` to
        ``dst`` (the fastest-path routing key)."""
        assert self.topology is not None and self.net is not None
        topo = self.topology
        return topo.path_rank(src, dst), self.net.path_load(topo.path(src, dst))

    def start_transfer(
        self, rid: int, src: PrefillWorker, dst: DecodeWorker, prefill_s: float | None = None
    ) -> None:
        """Move ``rid``'s KV from ``src`` to ``dst``; ``prefill_s`` given: the prefill is
        starting now and lasts that long (overlap: the KV streams while it runs)."""
        env = self.env
        token = env._now
        started = self.log.transfer_start_at_s
        t = started[rid]  # one read (an array read makes a float)
        if t != t:  # NaN: the first transfer
            started[rid] = token
        rs = self.requests
        nbytes = context_kv_bytes(src.cost, rs.prompt_tokens[rid] + rs.generated[rid])  # kv_bytes
        self.transfers[rid] = (src, dst, token)
        done = partial(self._transfer_done, rid, token)
        if self.net is not None:
            from disaggsim.fabric.overlap import send_plan

            assert self.topology is not None
            path = self.topology.path(src.index, dst.index)
            early = prefill_s is not None
            end = env._now + prefill_s if prefill_s is not None else env._now
            plan = send_plan(nbytes, env._now, end, prefill_s or 0.0, self.cfg.num_layers, early)
            extra = (
                self.topology.transfer_latency_s(path, self.requests.prefill_len(rid))
                - path.latency_s
            )
            self._flows[rid] = self.net.start(
                nbytes,
                path,
                tag=rid,
                extra_latency_s=max(extra, 0.0),
                start_delay_s=plan.start_delay_s,
                source_rate_cap_bytes_per_s=plan.source_rate_cap_bytes_per_s,
                cap_until_s=plan.cap_until_s,
                ready_at_s=plan.ready_at_s,
                on_done=lambda _rec: done(),
            )
            return
        delay, factor = self._link_state(token) if self.cfg.link_windows else (0.0, 1.0)
        call_in(env, delay + self.transfer_time(nbytes, src.index, dst.index) / factor, done)

    def cancel_transfer(self, rid: int) -> tuple[PrefillWorker, DecodeWorker] | None:
        """Stop ``rid``'s transfer (if any); returns its (source, destination)."""
        tr = self.transfers.pop(rid, None)
        if tr is None:
            return None
        handle = self._flows.pop(rid, None)
        if handle is not None:
            assert self.net is not None
            self.net.cancel(handle)
        return tr[0], tr[1]

    def _transfer_done(self, rid: int, token: float, _ev: simpy.Event | None = None) -> None:
        """The transfer ``token`` of ``rid`` ended (also the callback of its end event:
        ``_ev`` is ignored)."""
        tr = self.transfers.get(rid)
        if tr is None or tr[2] != token:
            return  # cancelled, or superseded by a re-send
        src, dst, _ = tr
        if rid in src.in_batch:
            # streamed KV landed before its prefill ended (as it ends, or earlier after a
            # re-send lifted the overlap cap): take it once the prefill batch is over
            wait = max(src.batch_end_at_s - self.env._now, 0.0)
            call_in(self.env, wait, partial(self._transfer_done, rid, token))
            return
        del self.transfers[rid]
        self._flows.pop(rid, None)
        self.log.transfer_end_at_s[rid] = self.env._now
        self.delivered(rid, src, dst)

    # -- link windows -----------------------------------------------------------------------

    def _link_state(self, now: float) -> tuple[float, float]:
        """(seconds until the link is up, bandwidth factor then) for a transfer at ``now``."""
        windows = self.cfg.link_windows
        t = now
        for _ in range(len(windows) + 1):
            for w in windows:
                if w.factor == 0 and w.start_s <= t < w.end_s:
                    t = w.end_s
                    break
            else:
                break
        factor = 1.0
        for w in windows:
            if w.factor > 0 and w.start_s <= t < w.end_s:
                factor = min(factor, w.factor)
        return t - now, factor

    def _resend(self, rid: int) -> None:
        src, dst, _ = self.transfers[rid]
        handle = self._flows.pop(rid, None)
        if handle is not None:
            assert self.net is not None
            self.net.cancel(handle)
        self.counters["num_resent_transfers"] += 1
        self.start_transfer(rid, src, dst)

    def _link_outage(self, window: LinkWindow) -> Generator[simpy.Event, Any, None]:
        """At an outage's start, every transfer in flight is lost and sent again (it
        waits for the link, then starts over)."""
        yield self.env.timeout(window.start_s)
        for rid in list(self.transfers):
            self._resend(rid)

    def _link_window(self, window: LinkWindow) -> Generator[simpy.Event, Any, None]:
        """Topology fabric: the window's links (default every link) run at ``factor``; an
        outage cancels the transfers in flight across them and sends them again."""
        assert self.topology is not None and self.net is not None
        topo, net = self.topology, self.net
        yield self.env.timeout(window.start_s)
        links = window.links if window.links is not None else range(len(topo.links))
        for i in links:
            net.set_link_capacity(i, window.factor)
        if window.factor == 0:
            hit = set(links)
            for rid in list(self.transfers):
                src, dst, _ = self.transfers[rid]
                path = topo.path(src.index, dst.index)
                if window.links is not None and not any(
                    i in hit for r in path.routes for i in r.links
                ):
                    continue
                self._resend(rid)
        yield self.env.timeout(window.duration_s)
        for i in links:
            net.set_link_capacity(i, 1.0)

    # -- swap copies ----------------------------------------------------------------------

    def swap_copy(self, w: Worker, nbytes: float, direction: str, num_seqs: int = 0) -> simpy.Event:
        """An event that fires when ``w`` has copied ``nbytes`` of KV (``num_seqs``
        sequences) out to host memory (``direction`` ``out``) or back in. On a topology
        fabric built with host paths every GPU copies its shard over its own PCIe link as
        a flow sharing the link with KV handoffs; otherwise it takes the profile's
        pinned-copy time, uncontended. Both spread a copy over all the worker's GPUs, so
        a worker whose GPUs do not all hold a shard of every sequence (data-parallel
        ranks, MLA's replicated latent: :func:`kv_copy_gpus`) copies the bytes its
        busiest GPU holds on each: ``nbytes × num_gpus / kv_copy_gpus`` spread evenly
        (on a topology, the idle GPUs' PCIe links then carry a share too)."""
        if num_seqs > 0:
            nbytes = nbytes * w.cost.num_gpus / kv_copy_gpus(w.cost, num_seqs)
        path = None
        if self.topology is not None:
            path = self.topology.host_path(w.index, "d2h" if direction == "out" else "h2d")
        if path is None:
            return self.env.timeout(self.cfg.swap_time(w.cost, nbytes, direction))
        assert self.net is not None
        done = self.env.event()
        index = w.index

        def finished(_rec: object) -> None:
            self._swaps.pop(index, None)
            done.succeed()

        self._swaps[index] = self.net.start(nbytes, path, on_done=finished, record=False)
        return done

    def cache_copy(
        self, w: Worker, nbytes: float, kind: str, done: Callable[[], None] | None = None
    ) -> FlowHandle | None:
        """A copy on a topology fabric, on the worker's path of ``kind``: prefix cache
        ``h2d`` (promotion from host DRAM), ``d2h`` (demotion), ``nic.in`` (promotion
        from the remote store), ``nic.out`` (write-through), every GPU its own shard; or
        ``a2a`` (an EP unit's all-to-all between its nodes), sharing the links with KV
        handoffs. None (and no ``done``) when there is no such
        path: the caller times the copy itself."""
        if self.topology is None or nbytes <= 0:
            return None
        path = self.topology.host_path(w.index, kind)
        if path is None:
            return None
        assert self.net is not None
        on_done = None if done is None else (lambda _rec: done())
        return self.net.start(nbytes, path, on_done=on_done, record=False)

    def cancel_copy(self, handle: FlowHandle) -> float:
        """Stop a copy; returns the bytes it had delivered."""
        assert self.net is not None
        return self.net.cancel(handle)

    def cancel_swap(self, w: Worker) -> None:
        """``w`` failed during a swap copy: its flow stops using the links."""
        handle = self._swaps.pop(w.index, None)
        if handle is not None:
            assert self.net is not None
            self.net.cancel(handle)
