"""The run's invariants, checked on its records after the run and before anything is
derived from them or written (docs/safety.md, "No wrong result is written").

A violation is a bug in disaggsim, not bad input: :func:`check_run` raises
:class:`~disaggsim.errors.InvariantError` naming the first request that breaks an
invariant and which one; the CLI prints that one line and exits 3 without writing.

The checks are vectorised numpy over the per-request arrays, the decode segments and
the workers' step logs (work per request, segment and step, done once at the end; the
engine's hot loop is untouched). They are:

- ``lengths``: every request has at least one prompt and one output token, within
  :data:`~disaggsim.config.bounds.MAX_TOKENS`;
- ``arrival``: every arrival time is finite and >= 0;
- ``status``: every request has one of the four statuses (it ended at most once:
  completed, rejected or abandoned; or is unfinished at the horizon);
- ``finite times``: a completed request has a finite first-token and finish time, with
  arrival <= first token <= finish; an unfinished one has no finish time; a rejected or
  abandoned one carries its reason;
- ``token count``: a completed request received exactly its output tokens (the first
  token plus every token of its decode segments); no request received more;
- ``token order``: every worker's step end times are finite and non-decreasing, every
  segment lies inside its worker's steps (a re-prefill's one token, a point segment, at
  its delivery time), each segment starts no earlier than the
  request's previous token, and a completed request's last token is its finish time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from disaggsim.config.bounds import MAX_TOKENS
from disaggsim.engine.cluster import RawResult
from disaggsim.engine.records import (
    STATUS_ABANDONED,
    STATUS_COMPLETED,
    STATUS_NAMES,
    STATUS_REJECTED,
    STATUS_UNFINISHED,
)
from disaggsim.errors import InvariantError

# Float slack for times compared across separately accumulated sums (seconds).
_EPS_S = 1e-9


def _fail(mask: np.ndarray, invariant: str, describe) -> None:
    """Raise for the first request where ``mask`` holds (if any)."""
    hit = np.flatnonzero(mask)
    if len(hit):
        rid = int(hit[0])
        more = f" (+{len(hit) - 1} more requests)" if len(hit) > 1 else ""
        raise InvariantError(f"request {rid}: {describe(rid)}{more} (invariant: {invariant})")


def check_run(raw: RawResult, step_ends: Sequence[np.ndarray] | None = None) -> None:
    """Raise :class:`InvariantError` if the run's records break an invariant.

    ``step_ends``: each worker's :meth:`StepLog.step_end_times`, when the caller has
    them already (:func:`disaggsim.run.simulate` expands them once for this check and
    the request frame); otherwise expanded here."""
    req, log = raw.requests, raw.log
    n = len(req)
    prompt = np.asarray(req.prompt_tokens)
    out = np.asarray(req.output_tokens)
    arrival = np.asarray(req.arrival_s, dtype=np.float64)
    _fail(
        (prompt < 1) | (prompt > MAX_TOKENS) | (out < 1) | (out > MAX_TOKENS),
        "lengths",
        lambda r: (
            f"prompt_tokens {prompt[r]}, output_tokens {out[r]} (each must be 1..{MAX_TOKENS:,})"
        ),
    )
    _fail(
        ~np.isfinite(arrival) | (arrival < 0),
        "arrival",
        lambda r: f"arrival at {arrival[r]} s",
    )
    cols = log.columns()
    status = np.asarray(cols["status"])
    _fail(
        ~np.isin(status, list(STATUS_NAMES)),
        "status",
        lambda r: f"status code {status[r]}",
    )
    first = np.asarray(cols["first_token_at_s"], dtype=np.float64)
    finish = np.asarray(cols["finish_at_s"], dtype=np.float64)
    done = status == STATUS_COMPLETED
    _fail(
        done & ~(np.isfinite(first) & np.isfinite(finish)),
        "finite times",
        lambda r: f"completed with first token at {first[r]} s and finish at {finish[r]} s",
    )
    with np.errstate(invalid="ignore"):
        _fail(
            done & ((first < arrival - _EPS_S) | (finish < first - _EPS_S)),
            "finite times",
            lambda r: (
                f"arrival {arrival[r]} s, first token {first[r]} s, finish {finish[r]} s "
                "out of order"
            ),
        )
    _fail(
        (status == STATUS_UNFINISHED) & np.isfinite(finish),
        "finite times",
        lambda r: f"unfinished but finished at {finish[r]} s",
    )
    ended = (status == STATUS_REJECTED) | (status == STATUS_ABANDONED)
    if ended.any():
        _fail(
            ended & np.array([not log.reason.get(i) for i in range(n)]),
            "status",
            lambda r: f"{STATUS_NAMES[int(status[r])]} without a reason",
        )

    seg = raw.segments
    rid = np.asarray(seg.rid, dtype=np.int64)
    worker = np.asarray(seg.worker, dtype=np.int64)
    start = np.asarray(seg.start_step, dtype=np.int64)
    tokens = np.asarray(seg.tokens, dtype=np.int64)
    if len(rid) and (rid.min() < 0 or rid.max() >= n):
        bad = int(rid[(rid < 0) | (rid >= n)][0])
        raise InvariantError(
            f"request {bad}: a decode segment names a request that does not exist "
            "(invariant: token count)"
        )
    # a point segment (worker -1): the one token a re-prefill delivered at its at_s
    point = worker == -1
    at_s = np.asarray(seg.at_s, dtype=np.float64)
    bad_worker = (worker < -1) | (worker >= len(raw.workers)) | (point & (tokens != 1))
    if len(worker) and bad_worker.any():
        r = int(rid[bad_worker][0])
        raise InvariantError(
            f"request {r}: a decode segment names a worker that does not exist "
            "(invariant: token order)"
        )
    _fail(
        np.bincount(rid[tokens < 1], minlength=n) > 0,
        "token count",
        lambda r: "a decode segment with no tokens",
    )
    received = np.bincount(rid, weights=tokens, minlength=n).astype(np.int64)
    received += np.isfinite(first)  # the first token
    _fail(
        done & (received != out),
        "token count",
        lambda r: f"completed with {received[r]} of {out[r]} output tokens timestamped",
    )
    _fail(
        received > out,
        "token count",
        lambda r: f"received {received[r]} tokens, more than its {out[r]} output tokens",
    )
    _fail(
        ~np.isfinite(first) & (received > 0),
        "token order",
        lambda r: "decode tokens without a first token",
    )

    # token order: step end times of each worker, then segments against them
    first_t = np.where(point, at_s, np.nan)
    last_t = first_t.copy()
    # each worker's segments in recorded order: one stable sort (16-bit keys: a radix
    # sort) instead of a scan of every segment per worker
    key = worker.astype(np.int16) if len(raw.workers) < 1 << 15 else worker
    by_worker = np.argsort(key, kind="stable")
    bounds = np.searchsorted(worker[by_worker], [w.index for w in raw.workers] + [len(raw.workers)])
    for j, w in enumerate(raw.workers):
        sel = by_worker[bounds[j] : bounds[j + 1]]
        ends = np.asarray(
            w.steps.step_end_times() if step_ends is None else step_ends[j], dtype=np.float64
        )
        if len(ends) and not (np.isfinite(ends).all() and (np.diff(ends) >= -_EPS_S).all()):
            r = int(rid[sel[0]]) if len(sel) else -1
            raise InvariantError(
                f"request {r}: worker {w.index}'s step end times are not finite and "
                "non-decreasing (invariant: token order)"
            )
        if not len(sel):
            continue
        s0, k = start[sel], tokens[sel]
        outside = (s0 < 0) | (s0 + k > len(ends))
        if outside.any():
            r = int(rid[sel[np.argmax(outside)]])
            raise InvariantError(
                f"request {r}: a decode segment on worker {w.index} runs past its "
                f"{len(ends)} steps (invariant: token order)"
            )
        first_t[sel] = ends[s0]
        last_t[sel] = ends[s0 + k - 1]
    # each segment starts no earlier than the request's previous token
    order = np.argsort(rid, kind="stable")
    r_sorted = rid[order]
    prev = first[r_sorted]
    same = np.zeros(len(rid), dtype=bool)
    same[1:] = r_sorted[1:] == r_sorted[:-1]
    prev[same] = last_t[order][np.flatnonzero(same) - 1]
    early = np.zeros(n, dtype=bool)
    with np.errstate(invalid="ignore"):
        early[r_sorted[first_t[order] < prev - _EPS_S]] = True
    _fail(early, "token order", lambda r: "a token timestamped before the one before it")
    # a completed request's last token is its finish
    last_token = first.copy()
    if len(rid):
        is_last = np.ones(len(rid), dtype=bool)
        is_last[:-1] = r_sorted[1:] != r_sorted[:-1]
        last_token[r_sorted[is_last]] = last_t[order][is_last]
    with np.errstate(invalid="ignore"):
        _fail(
            done & ~(np.abs(last_token - finish) <= _EPS_S * np.maximum(1.0, np.abs(finish))),
            "token order",
            lambda r: f"last token at {last_token[r]} s but finish at {finish[r]} s",
        )
