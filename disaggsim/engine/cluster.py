"""The cluster: a SimPy environment with a router, worker pools and the KV fabric.

:func:`run_cluster` is the engine's entry point. It takes already-built parts (the
request table, a :class:`WorkerCost` per pool, the fabric's transfer-time function) and
returns the raw records; it does no file I/O and reads no configuration files.

Flow (DESIGN.md §2): arrival → router → prefill worker (or colocated worker) → KV handoff
over the fabric → decode worker → finish. The router picks the decode worker when a
prefill finishes, by free KV; when no decode worker has room, the finished prefill waits
(its KV held on the prefill worker) in the router's handoff queue, FIFO.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy

from disaggsim.costmodel.interface import WorkerCost
from disaggsim.engine.records import (
    STATUS_COMPLETED,
    STATUS_REJECTED,
    RequestLog,
    Samples,
    StepLog,
)
from disaggsim.engine.workers import ColocatedWorker, DecodeWorker, PrefillWorker, _Worker
from disaggsim.workload.requests import Requests


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """What the engine needs to know about one pool."""

    role: str  # "prefill", "decode" or "colocated"
    num_workers: int
    cost: WorkerCost
    max_batch_seqs: int
    max_batch_tokens: int
    scheduler: str | None = None  # colocated: "vllm" or "chunked"


@dataclass(frozen=True, slots=True)
class EngineConfig:
    pools: tuple[PoolSpec, ...]
    prefill_policy: str = "least_tokens"  # round_robin | least_tokens | shortest_queue
    decode_policy: str = "most_free_kv"  # most_free_kv | round_robin
    first_token_from: str = "decode"  # disaggregated: "decode" or "prefill"
    block_tokens: int = 16
    horizon_s: float = float("inf")  # stop here even if requests are still running


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    index: int
    role: str
    pool_index: int  # index within its pool
    num_gpus: int
    kv_capacity_tokens: int
    kv_used_end_tokens: int  # KV still held when the run stopped (0 once drained)
    steps: StepLog


@dataclass(frozen=True, slots=True)
class RawResult:
    """Everything the engine recorded; metrics are derived from it afterwards."""

    requests: Requests
    log: RequestLog
    workers: tuple[WorkerInfo, ...]
    samples: Samples
    end_at_s: float
    kv_bytes_per_token: dict[str, int]  # per role


TransferTime = Callable[[int, int, int], float]  # (nbytes, prefill worker, decode worker) -> s


class Router:
    """Routes arrivals to prefill (or colocated) workers, and finished prefills to
    decode workers by free KV. Ties are broken by worker index."""

    def __init__(self, cluster: Cluster, cfg: EngineConfig) -> None:
        self.cluster = cluster
        self.prefill_policy = cfg.prefill_policy
        self.decode_policy = cfg.decode_policy
        self._rr_prefill = 0
        self._rr_decode = 0
        self.pending: deque[int] = deque()  # finished prefills waiting for decode KV room
        self._pending_prefill: dict[int, PrefillWorker] = {}

    def route(self, rid: int) -> None:
        workers = self.cluster.front_workers
        if self.prefill_policy == "round_robin":
            w = workers[self._rr_prefill % len(workers)]
            self._rr_prefill += 1
        elif self.prefill_policy == "least_tokens":
            w = min(workers, key=lambda x: (x.queued_tokens, x.num_outstanding, x.index))
        else:  # shortest_queue
            w = min(workers, key=lambda x: (x.num_outstanding, x.index))
        w.submit(rid)

    def handoff(self, rid: int, src: PrefillWorker) -> None:
        if self.pending or not self._try_handoff(rid, src):
            self.pending.append(rid)
            self._pending_prefill[rid] = src

    def _try_handoff(self, rid: int, src: PrefillWorker) -> bool:
        cl = self.cluster
        need = cl.reserve_tokens(rid)
        workers = cl.decode_workers
        if self.decode_policy == "round_robin":
            n = len(workers)
            for i in range(n):
                w = workers[(self._rr_decode + i) % n]
                if w.free_kv_tokens >= need:
                    self._rr_decode = (self._rr_decode + i + 1) % n
                    break
            else:
                return False
        else:
            w = max(workers, key=lambda x: (x.free_kv_tokens, -x.index))
            if w.free_kv_tokens < need:
                return False
        w.reserve(rid)
        cl.start_transfer(rid, src, w)
        return True

    def decode_freed(self) -> None:
        while self.pending:
            rid = self.pending[0]
            if not self._try_handoff(rid, self._pending_prefill[rid]):
                return
            self.pending.popleft()
            del self._pending_prefill[rid]


class Cluster:
    def __init__(self, requests: Requests, cfg: EngineConfig, transfer_time: TransferTime) -> None:
        self.env = simpy.Environment()
        self.cfg = cfg
        self.requests = requests
        self.prompt_tokens: list[int] = requests.prompt_tokens.tolist()
        self.output_tokens: list[int] = requests.output_tokens.tolist()
        self.log = RequestLog(len(requests))
        self.samples = Samples()
        self.transfer_time = transfer_time
        self.block_tokens = cfg.block_tokens
        self.num_done = 0
        self.all_done = self.env.event()
        self.router = Router(self, cfg)
        self.workers: list[_Worker] = []
        self.prefill_workers: list[PrefillWorker] = []
        self.decode_workers: list[DecodeWorker] = []
        self.colocated_workers: list[ColocatedWorker] = []
        self._pool_of: list[tuple[str, int]] = []
        for pool in cfg.pools:
            for i in range(pool.num_workers):
                idx = len(self.workers)
                args = (self, idx, pool.cost, pool.max_batch_seqs, pool.max_batch_tokens)
                if pool.role == "prefill":
                    w: _Worker = PrefillWorker(*args)
                    self.prefill_workers.append(w)  # type: ignore[arg-type]
                elif pool.role == "decode":
                    w = DecodeWorker(*args)
                    self.decode_workers.append(w)  # type: ignore[arg-type]
                elif pool.role == "colocated":
                    w = ColocatedWorker(*args, scheduler=pool.scheduler or "vllm")
                    self.colocated_workers.append(w)  # type: ignore[arg-type]
                else:
                    raise ValueError(f"unknown pool role {pool.role!r}")
                self.workers.append(w)
                self._pool_of.append((pool.role, i))
        self.disaggregated = bool(self.prefill_workers)
        if self.disaggregated and not self.decode_workers:
            raise ValueError("a disaggregated cluster needs decode workers")
        self.front_workers = self.prefill_workers if self.disaggregated else self.colocated_workers
        # The largest request any worker on its path can ever hold; longer ones are rejected.
        if self.disaggregated:
            self._max_prompt = min(w.kv_capacity_tokens for w in self.prefill_workers)
            self._max_seq = max(w.kv_capacity_tokens for w in self.decode_workers)
        else:
            self._max_prompt = self._max_seq = max(w.kv_capacity_tokens for w in self.colocated_workers)

    # -- request lifecycle ------------------------------------------------------------

    def reserve_tokens(self, rid: int) -> int:
        """KV tokens reserved for a request's whole sequence, rounded up to blocks."""
        b = self.block_tokens
        n = self.prompt_tokens[rid] + self.output_tokens[rid]
        return -(-n // b) * b

    def _arrivals(self):
        env = self.env
        arrival = self.requests.arrival_s.tolist()
        for rid, at in enumerate(arrival):
            if at > env.now:
                yield env.timeout(at - env.now)
            if self.prompt_tokens[rid] > self._max_prompt or self.reserve_tokens(rid) > self._max_seq:
                self.reject(rid, "exceeds_kv_capacity")
                continue
            self.router.route(rid)

    def reject(self, rid: int, reason: str) -> None:
        self.log.status[rid] = STATUS_REJECTED
        self.log.reason[rid] = reason
        self._done()

    def prefill_done(self, rid: int, src: PrefillWorker) -> None:
        now = self.env.now
        self.log.prefill_end_at_s[rid] = now
        if self.cfg.first_token_from == "prefill":
            self.log.first_token_at_s[rid] = now
        self.router.handoff(rid, src)

    def start_transfer(self, rid: int, src: PrefillWorker, dst: DecodeWorker) -> None:
        env = self.env
        self.log.transfer_start_at_s[rid] = env.now
        nbytes = self.prompt_tokens[rid] * src.cost.kv_bytes_per_token
        ev = env.timeout(self.transfer_time(nbytes, src.index, dst.index))
        ev.callbacks.append(lambda _e, rid=rid, src=src, dst=dst: self._transfer_done(rid, src, dst))

    def _transfer_done(self, rid: int, src: PrefillWorker, dst: DecodeWorker) -> None:
        now = self.env.now
        self.log.transfer_end_at_s[rid] = now
        if self.cfg.first_token_from == "decode":
            self.log.first_token_at_s[rid] = now
        src.release_kv(rid)
        if self.output_tokens[rid] <= 1:
            dst.kv_used_tokens -= self.reserve_tokens(rid)
            dst.num_outstanding -= 1
            self.finish(rid, now)
            self.router.decode_freed()
        else:
            dst.kv_arrived(rid)

    def finish(self, rid: int, now: float) -> None:
        self.log.finish_at_s[rid] = now
        self.log.status[rid] = STATUS_COMPLETED
        self._done()

    def _done(self) -> None:
        self.num_done += 1
        if self.num_done == len(self.requests) and not self.all_done.triggered:
            self.all_done.succeed()

    def run(self, progress: Callable[[float, int, int], None] | None = None,
            progress_every_s: float = 0.0) -> RawResult:
        """Run until every request has ended or the horizon. ``progress(now, done, total)``
        is called every ``progress_every_s`` simulated seconds when given."""
        env = self.env
        env.process(self._arrivals())
        if len(self.requests) == 0:
            self.all_done.succeed()
        horizon = self.cfg.horizon_s
        if progress is None or progress_every_s <= 0:
            stop = self.all_done
            if np.isfinite(horizon):
                stop = self.all_done | env.timeout(horizon)
            env.run(until=stop)
        else:
            while not self.all_done.triggered and env.now < horizon:
                tick = env.timeout(min(progress_every_s, horizon - env.now))
                env.run(until=self.all_done | tick)
                progress(env.now, self.num_done, len(self.requests))
        kv_bpt = {p.role: p.cost.kv_bytes_per_token for p in self.cfg.pools}
        workers = tuple(
            WorkerInfo(
                index=w.index,
                role=self._pool_of[w.index][0],
                pool_index=self._pool_of[w.index][1],
                num_gpus=w.cost.num_gpus,
                kv_capacity_tokens=w.kv_capacity_tokens,
                kv_used_end_tokens=w.kv_used_tokens,
                steps=w.steps,
            )
            for w in self.workers
        )
        return RawResult(
            requests=self.requests, log=self.log, workers=workers, samples=self.samples,
            end_at_s=env.now, kv_bytes_per_token=kv_bpt,
        )


def run_cluster(
    requests: Requests,
    cfg: EngineConfig,
    transfer_time: TransferTime | None = None,
    progress: Callable[[float, int, int], None] | None = None,
    progress_every_s: float = 0.0,
) -> RawResult:
    """Simulate ``requests`` on the cluster described by ``cfg``.

    ``transfer_time(nbytes, src_worker, dst_worker)`` gives the KV handoff seconds
    (disaggregated only; default: instantaneous)."""
    cluster = Cluster(requests, cfg, transfer_time or (lambda nbytes, s, d: 0.0))
    return cluster.run(progress, progress_every_s)
