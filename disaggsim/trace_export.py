"""Chrome trace-event JSON of one run, for ui.perfetto.dev or chrome://tracing.

Layout (Trace Event Format, times in microseconds of simulated time):

- one *process* per worker (``pid = worker index + 1``, named e.g. ``decode 0 (4 GPUs)``)
  with one thread ``iterations`` holding complete (``X``) spans: each prefill-only
  iteration (``prefill 3 seqs / 6144 tok``), each run of token steps over a constant
  batch (``decode ×17 (batch 12)``; one span per run, as the engine logs it) and each
  mixed chunked iteration (``mixed (batch 12 + 512 prefill tok)``);
- counter (``C``) events on each worker's process from the time series: ``queue_len``,
  ``batch`` and ``kv_util`` (share of the worker's KV capacity in use);
- disaggregated runs: process ``fabric`` (``pid 0``) with one async span (``b``/``e``,
  ``id`` = request id) per KV handoff, named ``KV r<id> p<src>→d<dst>``;
- ``M`` metadata events name processes and threads and keep the pools in order.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from disaggsim.output import Written, check_file, prefix_owned, write_file

if TYPE_CHECKING:
    from disaggsim.run import SimulationResult

US_PER_S = 1e6
FABRIC_PID = 0
ITER_TID = 1
COUNTERS = ("queue_len", "batch", "kv_util")


def _meta(pid: int, name: str, value: Any, tid: int | None = None) -> dict:
    """``process_name``/``thread_name`` carry ``args.name``; ``*_sort_index`` ``args.sort_index``."""
    key = "sort_index" if name.endswith("sort_index") else "name"
    ev: dict[str, Any] = {"ph": "M", "pid": pid, "name": name, "args": {key: value}}
    if tid is not None:
        ev["tid"] = tid
    return ev


def _us(t_s: float) -> float:
    return round(float(t_s) * US_PER_S, 3)


def _span(start_s: float, end_s: float) -> dict:
    """``ts`` and ``dur`` from rounded ends, so back-to-back iterations abut exactly."""
    ts = _us(start_s)
    return {"ts": ts, "dur": round(_us(end_s) - ts, 3)}


def worker_spans(result: SimulationResult) -> list[dict]:
    """``X`` events: prefill-only iterations and token-step runs of every worker."""
    events: list[dict] = []
    for w in result.raw.workers:
        pid = w.index + 1
        log = w.steps
        for start, dur, seqs, tokens in log.prefill_iters:
            events.append(
                {
                    "ph": "X",
                    "pid": pid,
                    "tid": ITER_TID,
                    **_span(start, start + dur),
                    "name": f"prefill {seqs} seq{'s' if seqs != 1 else ''} / {tokens} tok",
                    "cat": "prefill",
                    "args": {"num_seqs": int(seqs), "num_tokens": int(tokens)},
                }
            )
        if not log.run_steps:
            continue
        ends = log.step_end_times()
        last = np.cumsum(np.asarray(log.run_steps, dtype=np.int64)) - 1
        for i, (start, steps, batch, prefill_tokens) in enumerate(
            zip(
                log.run_start_at_s,
                log.run_steps,
                log.run_batch,
                log.run_prefill_tokens,
                strict=True,
            )
        ):
            if steps <= 0:
                continue
            end = float(ends[last[i]])
            if prefill_tokens:
                name, cat = f"mixed (batch {batch} + {prefill_tokens} prefill tok)", "mixed"
            else:
                name, cat = f"decode ×{steps} (batch {batch})", "decode"
            events.append(
                {
                    "ph": "X",
                    "pid": pid,
                    "tid": ITER_TID,
                    **_span(start, end),
                    "name": name,
                    "cat": cat,
                    "args": {
                        "steps": int(steps),
                        "batch": int(batch),
                        "prefill_tokens": int(prefill_tokens),
                    },
                }
            )
    return events


def transfer_spans(result: SimulationResult) -> list[dict]:
    """Async ``b``/``e`` pairs, one per completed KV handoff (disaggregated runs)."""
    df = result.requests
    if "transfer_start_at_s" not in df:
        return []
    done = df[np.isfinite(df["transfer_start_at_s"]) & np.isfinite(df["transfer_end_at_s"])]
    events = []
    for r in done.itertuples(index=False):
        name = f"KV r{r.request_id} p{r.prefill_worker}→d{r.decode_worker}"
        common = {
            "pid": FABRIC_PID,
            "tid": ITER_TID,
            "cat": "kv_transfer",
            "id": int(r.request_id),
            "name": name,
        }
        events.append(
            {
                "ph": "b",
                "ts": _us(r.transfer_start_at_s),
                **common,
                "args": {"prompt_tokens": int(r.prompt_tokens)},
            }
        )
        events.append({"ph": "e", "ts": _us(r.transfer_end_at_s), **common})
    return events


def counter_events(result: SimulationResult) -> list[dict]:
    """Worker rows: ``COUNTERS`` on the worker's process; router rows (``worker`` -1):
    held requests and orphaned KV on the router's process."""
    ts = result.timeseries
    events = []
    router_pid = len(result.raw.workers) + 1
    worker = ts["worker"].to_numpy(np.int64)
    at_s = ts["at_s"].to_numpy(np.float64)
    router_counters: tuple[str, ...] = ("queue_len", "orphaned_kv_bytes")
    cols = {c: ts[c].to_numpy(np.float64) for c in (*COUNTERS, *router_counters)}
    for i in range(len(ts)):
        if worker[i] < 0:
            pid, names = router_pid, router_counters
        else:
            pid, names = int(worker[i]) + 1, COUNTERS
        for name in names:
            v = float(cols[name][i])
            events.append(
                {
                    "ph": "C",
                    "pid": pid,
                    "tid": ITER_TID,
                    "ts": _us(float(at_s[i])),
                    "name": name,
                    "args": {name: v if math.isfinite(v) else 0.0},
                }
            )
    return events


def metadata_events(result: SimulationResult) -> list[dict]:
    events = []
    if result.scenario.architecture == "disaggregated":
        events += [
            _meta(
                FABRIC_PID,
                "process_name",
                f"fabric ({getattr(result.scenario.fabric, 'link', 'topology')})",
            ),
            _meta(FABRIC_PID, "process_sort_index", 10**6),
        ]
    router_pid = len(result.raw.workers) + 1
    events += [
        _meta(router_pid, "process_name", "router"),
        _meta(router_pid, "process_sort_index", router_pid),
    ]
    for w in result.raw.workers:
        pid = w.index + 1
        events += [
            _meta(
                pid,
                "process_name",
                f"{w.role} {w.pool_index} ({w.num_gpus} GPU{'s' if w.num_gpus != 1 else ''})",
            ),
            _meta(pid, "process_sort_index", pid),
            _meta(pid, "thread_name", "iterations", tid=ITER_TID),
        ]
    return events


def trace_events(result: SimulationResult) -> dict:
    """The whole trace as a JSON-ready mapping (``traceEvents`` + ``displayTimeUnit``)."""
    events = (
        metadata_events(result)
        + worker_spans(result)
        + transfer_spans(result)
        + counter_events(result)
    )
    return {  # otherData first: a file starting with TRACE_HEAD is one disaggsim wrote
        "otherData": {
            "written_by": "disaggsim",
            "scenario": result.scenario.name,
            "time": "simulated; ts/dur in microseconds",
        },
        "traceEvents": events,
        "displayTimeUnit": "ms",
    }


# Every trace disaggsim writes starts with this text, so ``--trace`` can recognise (and
# replace) its own earlier trace and refuse any other file.
TRACE_HEAD = '{"otherData":{"written_by":"disaggsim"'


def check_trace_path(path: str | Path) -> None:
    """Fail before simulating when the trace cannot be written there (see
    :mod:`disaggsim.output`: a new file, or an earlier trace disaggsim wrote)."""
    check_file(path, "--trace", prefix_owned(TRACE_HEAD), what="trace")


def write_trace(result: SimulationResult, path: str | Path) -> Path:
    """Write :func:`trace_events` as JSON (:func:`write_trace_file`); returns the path."""
    return write_trace_file(result, path).path


def write_trace_file(result: SimulationResult, path: str | Path) -> Written:
    """Write :func:`trace_events` as JSON (atomically: a temporary file, then renamed),
    over nothing but an earlier disaggsim trace; says what it replaced."""

    def write(tmp: Path) -> None:
        with open(tmp, "w") as f:
            json.dump(trace_events(result), f, separators=(",", ":"), allow_nan=False)

    return write_file(path, write, "--trace", prefix_owned(TRACE_HEAD), what="trace")
