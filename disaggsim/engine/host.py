"""What a worker sees of the cluster around it: :class:`WorkerHost`.

Workers form batches and advance them; everything else about a request's path — where it
goes next, its records, the fabric, failures and pool sizes — belongs to the cluster.
This protocol is the whole of what workers may call or read there, so a worker can be
read (and tested) on its own; :class:`disaggsim.engine.cluster.Cluster` implements it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import simpy

from disaggsim.engine.config import Preemption
from disaggsim.engine.events import Environment
from disaggsim.engine.records import RequestLogColumns, Rows, Samples, Segments
from disaggsim.engine.request_state import RequestState

if TYPE_CHECKING:
    from disaggsim.engine.workers import ColocatedWorker, DecodeWorker, PrefillWorker, Worker
    from disaggsim.fabric.flows import FlowHandle


class WorkerHost(Protocol):
    env: Environment  # the engine's (events due now in its FIFO: call_soon)
    early_handoffs: bool  # prefill_batch_started may start handoffs (else it does nothing)
    requests: RequestState  # token counts and KV block arithmetic
    log: RequestLogColumns
    segments: Segments
    samples: Samples
    sample_rows: Rows  # the rows of samples' first five columns, as the workers write them
    segment_rows: Rows  # the segments' rows, as the workers write them
    preemption: Preemption

    # -- a request's path -------------------------------------------------------------

    def prefill_started(self, rid: int, worker: int, tokens: int = -1) -> None: ...

    def prefill_batch_started(
        self, batch: list[int], src: PrefillWorker, prefill_s: float
    ) -> None: ...

    def prefill_done(self, rid: int, src: PrefillWorker) -> None: ...

    def prefill_token(self, rid: int, now: float) -> int: ...

    def finish(self, rid: int, now: float) -> None: ...

    def bury(self, rid: int) -> None: ...

    def reprefill(self, rid: int, why: str) -> None: ...

    def decode_freed(self) -> None:
        """A decode worker released KV blocks: handoffs waiting for room may go."""
        ...

    # -- KV copies to host memory (swap) ------------------------------------------------

    def swap_copy(
        self, w: Worker, nbytes: float, direction: str, num_seqs: int = 0
    ) -> simpy.Event: ...

    def cancel_swap(self, w: Worker) -> None: ...

    # -- prefix cache copies (topology fabric) -----------------------------------------

    def cache_copy(
        self, w: Worker, nbytes: float, kind: str, done: Callable[[], None] | None = None
    ) -> FlowHandle | None: ...

    def cancel_copy(self, handle: FlowHandle) -> float: ...

    # -- pool sizes and failures --------------------------------------------------------

    def worker_drained(self, w: Worker) -> None: ...

    def worker_recovered(self, w: Worker) -> None: ...

    def prefill_worker_lost(
        self, w: PrefillWorker, queued: list[int], in_batch: list[int], held: list[int]
    ) -> None: ...

    def decode_worker_lost(self, w: DecodeWorker, lost: list[int]) -> None: ...

    def colocated_worker_lost(
        self, w: ColocatedWorker, queued: list[int], lost: list[int]
    ) -> None: ...
