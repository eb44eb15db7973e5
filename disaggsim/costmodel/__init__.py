"""The cost model: step times and memory of one worker, and KV transfer times.

Pure library (no simpy): the engine talks to it through
:class:`~disaggsim.costmodel.interface.WorkerCost`; notebooks and ``disaggsim cost`` call
it directly. Operator formulas live in :mod:`.ops`, the per-layer roofline sum in
:mod:`.step`, KV handoff sizes and link times in :mod:`.kv`.
"""

from disaggsim.costmodel.interface import WorkerCost, decode_step_time_s
from disaggsim.costmodel.kv import LINK_CLASSES, KvTransfer, kv_bytes, kv_transfer
from disaggsim.costmodel.step import RooflineWorkerCost, StepBreakdown, build_worker_cost

__all__ = [
    "LINK_CLASSES",
    "KvTransfer",
    "RooflineWorkerCost",
    "StepBreakdown",
    "WorkerCost",
    "build_worker_cost",
    "decode_step_time_s",
    "kv_bytes",
    "kv_transfer",
]
