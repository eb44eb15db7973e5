"""Workers: SimPy processes that batch requests and advance in forward-pass steps.

A worker is a TP group holding one copy of the weights. Three kinds:

- :class:`PrefillWorker` (disaggregated): FCFS prefill batches under a token budget; the
  KV of a finished prefill stays resident (counted against its memory) until the handoff
  to a decode worker completes.
- :class:`DecodeWorker` (disaggregated): continuous batching; KV arrives from the fabric,
  is admitted at an iteration boundary when its blocks fit.
- :class:`ColocatedWorker`: one pool doing both, with the ``vllm`` scheduler (a prefill
  runs as its own iteration and stalls every running decode) or ``chunked`` (each
  iteration mixes one token per running sequence with prompt chunks under a token budget).

Speed rule: between state changes (an admission or a completion) a batch of decoding
sequences does not change, so its steps are advanced as one *run* in closed form
(``WorkerCost.decode_coeffs`` makes each step's time affine in the context), cut short
at the next step boundary when new work arrives. A run costs one or two SimPy events
whatever its length and batch size.

KV memory: admission reserves the blocks of the request's whole sequence (prompt +
output, rounded up to ``block_tokens``), so a running sequence never outgrows memory and
is never preempted.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import TYPE_CHECKING

import simpy

from disaggsim.costmodel.interface import WorkerCost
from disaggsim.engine.records import STATUS_COMPLETED, StepLog

if TYPE_CHECKING:
    from disaggsim.engine.cluster import Cluster

_EPS = 1e-12


class _Worker:
    """State and bookkeeping shared by all worker kinds."""

    role = "worker"

    def __init__(self, cluster: Cluster, index: int, cost: WorkerCost, max_batch_seqs: int,
                 max_batch_tokens: int) -> None:
        self.cluster = cluster
        self.env: simpy.Environment = cluster.env
        self.index = index  # global worker index (unique across pools)
        self.cost = cost
        self.max_batch_seqs = max_batch_seqs
        self.max_batch_tokens = max_batch_tokens
        self.kv_capacity_tokens = cost.kv_capacity_tokens
        self.kv_used_tokens = 0
        self.steps = StepLog()
        self._wake: simpy.Event | None = None
        self.queued_tokens = 0  # prompt tokens assigned here and not yet prefilled
        self.num_outstanding = 0  # requests assigned here and not yet finished/handed off

    def notify(self) -> None:
        """Wake the worker if it is idle or in an interruptible run."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _sample(self, queue_len: int, batch: int) -> None:
        s = self.cluster.samples
        s.at_s.append(self.env.now)
        s.worker.append(self.index)
        s.queue_len.append(queue_len)
        s.batch.append(batch)
        s.kv_used_tokens.append(self.kv_used_tokens)


class _TokenBatch(_Worker):
    """A continuous batch of decoding sequences advanced in closed-form runs of steps."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batch = 0  # running sequences
        self.context_tokens = 0  # their total context (KV tokens read per step)
        self.step_idx = 0  # token steps completed so far
        self._finishing: list[tuple[int, int]] = []  # heap of (finish step, request id)
        self._ctx_of: dict[int, int] = {}  # request id -> context tokens now (at admission)
        self._coeffs: dict[int, tuple[float, float]] = {}

    def _coeffs_for(self, batch: int) -> tuple[float, float]:
        c = self._coeffs.get(batch)
        if c is None:
            c = self._coeffs[batch] = self.cost.decode_coeffs(batch)
        return c

    def _join(self, rid: int) -> None:
        """Add a request whose first token is out to the running batch (at a step boundary)."""
        cl = self.cluster
        out = cl.output_tokens[rid]
        cl.log.first_token_step[rid] = self.step_idx
        cl.log.decode_worker[rid] = self.index
        ctx = cl.prompt_tokens[rid] + 1
        self._ctx_of[rid] = ctx
        self.batch += 1
        self.context_tokens += ctx
        heapq.heappush(self._finishing, (self.step_idx + out - 1, rid))

    def _pop_finished(self) -> None:
        cl = self.cluster
        now = self.env.now
        while self._finishing and self._finishing[0][0] <= self.step_idx:
            fin_step, rid = heapq.heappop(self._finishing)
            steps_run = fin_step - cl.log.first_token_step[rid]
            self.batch -= 1
            self.context_tokens -= self._ctx_of.pop(rid) + steps_run
            self._release(rid)
            cl.finish(rid, now)

    def _release(self, rid: int) -> None:
        self.kv_used_tokens -= self.cluster.reserve_tokens(rid)
        self.num_outstanding -= 1

    def _steps_covering(self, tau: float, k: int, base: float, per: float) -> int:
        """Smallest j in [1, k] whose run time T(j) >= tau (T as in :meth:`_run`)."""
        b, c = self.batch, self.context_tokens

        def run_time(j: int) -> float:
            return j * base + per * (j * c + b * j * (j - 1) / 2)

        a2 = per * b / 2
        b1 = base + per * c - a2
        if a2 > 0:
            j = math.ceil((-b1 + math.sqrt(b1 * b1 + 4 * a2 * tau)) / (2 * a2))
        else:
            j = math.ceil(tau / b1) if b1 > 0 else 1
        j = min(max(j, 1), k)
        while j > 1 and run_time(j - 1) >= tau - _EPS:
            j -= 1
        while j < k and run_time(j) < tau - _EPS:
            j += 1
        return j

    def _run(self, interruptible: bool):
        """Advance the running batch to its next completion (or to the step boundary after
        new work arrives, when ``interruptible``)."""
        env = self.env
        b, c = self.batch, self.context_tokens
        k = self._finishing[0][0] - self.step_idx
        base, per = self._coeffs_for(b)
        total = k * base + per * (k * c + b * k * (k - 1) / 2)
        start = env.now
        if interruptible:
            self._wake = env.event()
            yield env.timeout(total) | self._wake
            self._wake = None
            tau = env.now - start
            if tau < total - _EPS:
                k = self._steps_covering(tau, k, base, per)
                done = k * base + per * (k * c + b * k * (k - 1) / 2)
                if done - tau > 0:
                    yield env.timeout(done - tau)
        else:
            yield env.timeout(total)
        self.steps.add_run(start, k, b, c, base, per)
        self.step_idx += k
        self.context_tokens += k * b
        self._pop_finished()


class PrefillWorker(_Worker):
    role = "prefill"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.queue: deque[int] = deque()
        self.held_tokens = 0  # KV of finished prefills awaiting handoff (and the running batch)
        self.proc = self.env.process(self._loop())

    def submit(self, rid: int) -> None:
        self.queue.append(rid)
        self.queued_tokens += self.cluster.prompt_tokens[rid]
        self.num_outstanding += 1
        self.notify()

    def release_kv(self, rid: int) -> None:
        """The handoff of ``rid`` completed: its KV leaves this worker."""
        self.kv_used_tokens -= self.cluster.prompt_tokens[rid]
        self.num_outstanding -= 1
        self.notify()

    def _form_batch(self) -> list[int]:
        cl = self.cluster
        batch: list[int] = []
        tokens = 0
        free = self.kv_capacity_tokens - self.kv_used_tokens
        while self.queue and len(batch) < self.max_batch_seqs:
            p = cl.prompt_tokens[self.queue[0]]
            if batch and tokens + p > self.max_batch_tokens:
                break
            if tokens + p > free:
                break  # KV memory full of prompts awaiting handoff: wait for releases
            batch.append(self.queue.popleft())
            tokens += p
        return batch

    def _loop(self):
        env = self.env
        cl = self.cluster
        while True:
            batch = self._form_batch()
            if not batch:
                self._sample(len(self.queue), 0)
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            tokens = sum(cl.prompt_tokens[r] for r in batch)
            pairs = sum(cl.prompt_tokens[r] * (cl.prompt_tokens[r] + 1) / 2 for r in batch)
            self.queued_tokens -= tokens
            self.kv_used_tokens += tokens
            self._sample(len(self.queue), len(batch))
            now = env.now
            for r in batch:
                cl.log.prefill_start_at_s[r] = now
                cl.log.prefill_worker[r] = self.index
            dur = self.cost.prefill_time_s(len(batch), tokens, pairs)
            self.steps.prefill_iters.append((now, dur, len(batch), tokens))
            yield env.timeout(dur)
            for r in batch:
                cl.prefill_done(r, self)


class DecodeWorker(_TokenBatch):
    role = "decode"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.waiting: deque[int] = deque()
        self.proc = self.env.process(self._loop())

    @property
    def free_kv_tokens(self) -> int:
        return self.kv_capacity_tokens - self.kv_used_tokens

    def reserve(self, rid: int) -> None:
        """Claim KV blocks for an incoming handoff (called by the router)."""
        self.kv_used_tokens += self.cluster.reserve_tokens(rid)
        self.num_outstanding += 1

    def kv_arrived(self, rid: int) -> None:
        self.waiting.append(rid)
        self.notify()

    def _release(self, rid: int) -> None:
        super()._release(rid)
        self.cluster.router.decode_freed()

    def _loop(self):
        env = self.env
        cl = self.cluster
        while True:
            while self.waiting and self.batch < self.max_batch_seqs:
                rid = self.waiting.popleft()
                cl.log.decode_admit_at_s[rid] = env.now
                self._join(rid)
            if self.batch == 0:
                self._sample(len(self.waiting), 0)
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            self._sample(len(self.waiting), self.batch)
            yield from self._run(interruptible=self.batch < self.max_batch_seqs)


class ColocatedWorker(_TokenBatch):
    role = "colocated"

    def __init__(self, *args, scheduler: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.scheduler = scheduler
        self.queue: deque[int] = deque()  # waiting for prefill (no KV yet)
        self.prefilling: list[list[int]] = []  # chunked: [rid, tokens done]
        self.proc = self.env.process(
            self._loop_vllm() if scheduler == "vllm" else self._loop_chunked()
        )

    def submit(self, rid: int) -> None:
        self.queue.append(rid)
        self.queued_tokens += self.cluster.prompt_tokens[rid]
        self.num_outstanding += 1
        self.notify()

    def _admissible(self, seats_used: int) -> bool:
        """Can the head of the queue start its prefill (a seat and its KV blocks free)?"""
        if not self.queue or seats_used >= self.max_batch_seqs:
            return False
        need = self.cluster.reserve_tokens(self.queue[0])
        return self.kv_used_tokens + need <= self.kv_capacity_tokens

    def _start_prefill(self, rid: int) -> None:
        cl = self.cluster
        self.queue.popleft()
        self.kv_used_tokens += cl.reserve_tokens(rid)
        self.queued_tokens -= cl.prompt_tokens[rid]
        cl.log.prefill_start_at_s[rid] = self.env.now
        cl.log.prefill_worker[rid] = self.index

    def _prefill_finished(self, rid: int) -> None:
        cl = self.cluster
        now = self.env.now
        cl.log.prefill_end_at_s[rid] = now
        cl.log.first_token_at_s[rid] = now
        if cl.output_tokens[rid] <= 1:
            self._release(rid)
            cl.finish(rid, now)
        else:
            cl.log.decode_admit_at_s[rid] = now
            self._join(rid)

    def _loop_vllm(self):
        """Prefill-prioritising continuous batching: waiting prompts run first, as a
        prefill-only iteration that stalls every running decode."""
        env = self.env
        cl = self.cluster
        while True:
            batch: list[int] = []
            tokens = 0
            while self._admissible(self.batch + len(batch)):
                p = cl.prompt_tokens[self.queue[0]]
                if batch and tokens + p > self.max_batch_tokens:
                    break
                batch.append(self.queue[0])
                self._start_prefill(self.queue[0])
                tokens += p
            if batch:
                self._sample(len(self.queue), self.batch + len(batch))
                pairs = sum(cl.prompt_tokens[r] * (cl.prompt_tokens[r] + 1) / 2 for r in batch)
                dur = self.cost.prefill_time_s(len(batch), tokens, pairs)
                self.steps.prefill_iters.append((env.now, dur, len(batch), tokens))
                yield env.timeout(dur)
                for r in batch:
                    self._prefill_finished(r)
                continue
            if self.batch == 0:
                self._sample(len(self.queue), 0)
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            self._sample(len(self.queue), self.batch)
            # A new arrival can only start at a boundary if a seat is free; memory may
            # still block it, in which case the next completion ends the run anyway.
            yield from self._run(interruptible=self.batch < self.max_batch_seqs)

    def _loop_chunked(self):
        """Sarathi-style: each iteration carries one token per running sequence plus
        prompt chunks filling the rest of the token budget."""
        env = self.env
        cl = self.cluster
        while True:
            while self._admissible(self.batch + len(self.prefilling)):
                rid = self.queue[0]
                self._start_prefill(rid)
                self.prefilling.append([rid, 0])
            budget = self.max_batch_tokens - self.batch
            if self.prefilling and budget > 0:
                chunk_tokens = 0
                pairs = 0.0
                cached = 0
                chunk_seqs = 0
                done_now: list[int] = []
                for entry in self.prefilling:
                    if chunk_tokens >= budget:
                        break
                    rid, done = entry
                    c = min(cl.prompt_tokens[rid] - done, budget - chunk_tokens)
                    pairs += c * done + c * (c + 1) / 2
                    cached += done
                    chunk_tokens += c
                    chunk_seqs += 1
                    entry[1] = done + c
                    if entry[1] >= cl.prompt_tokens[rid]:
                        done_now.append(rid)
                b, ctx = self.batch, self.context_tokens
                self._sample(len(self.queue), b + len(self.prefilling))
                dur = self.cost.mixed_time_s(b, ctx, chunk_seqs, chunk_tokens, pairs, cached)
                start = env.now
                yield env.timeout(dur)
                if b:
                    self.steps.add_run(start, 1, b, ctx, dur, 0.0, chunk_tokens)
                    self.step_idx += 1
                    self.context_tokens += b
                else:
                    self.steps.prefill_iters.append((start, dur, chunk_seqs, chunk_tokens))
                self._pop_finished()
                if done_now:
                    finished = set(done_now)
                    self.prefilling = [e for e in self.prefilling if e[0] not in finished]
                    for rid in done_now:
                        self._prefill_finished(rid)
                continue
            if self.batch == 0:
                self._sample(len(self.queue), 0)
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            self._sample(len(self.queue), self.batch)
            yield from self._run(interruptible=self.batch < self.max_batch_seqs)


def finish_step_of(first_token_step: int, output_tokens: int) -> int:
    """Token-step index whose end delivers the last token."""
    return first_token_step + output_tokens - 2


__all__ = ["PrefillWorker", "DecodeWorker", "ColocatedWorker", "STATUS_COMPLETED"]
