"""The batch-level interface between the engine and the cost model.

The engine never sees operators: it asks a :class:`WorkerCost` (one TP group holding one
copy of the weights) for the time of one forward pass. Three shapes of iteration exist:

- a prefill batch: ``num_seqs`` prompts, ``new_tokens`` tokens in total, ``attn_pairs``
  causal query-key pairs in total (``sum(L*(L+1)/2)`` for whole prompts; a chunk of c
  tokens after p cached ones adds ``c*p + c*(c+1)/2``), ``cached_tokens`` previously cached
  tokens whose KV the chunk re-reads;
- a decode step: ``batch`` sequences holding ``context_tokens`` cached tokens in total.
  Its time is **affine in context_tokens at fixed batch** above a knee: ``base + per_token
  * C``. :meth:`WorkerCost.decode_coeffs` returns ``(base_s, per_context_token_s)`` so the
  engine can advance a worker over a run of steps in closed form (docs/design.md, "The
  speed rule"). A cost model whose attention kernel is bound by per-sequence work at short
  contexts may also offer ``decode_item_coeffs(batch)``, a second line: the step then takes
  the larger of the two (:func:`decode_step_time_s`), still a closed form per run (the
  larger line changes at most once as C grows). A kernel that picks among a few
  configurations by the context (TensorRT-LLM's XQA: how many thread blocks split each
  sequence) may offer ``decode_min_coeffs(batch)``, more lines: the kernel-bound part is
  the smallest of those and ``decode_coeffs``' line (the active one changes at contexts
  the engine computes once per run, and cuts the run there). A kernel whose cost per
  token changes with the tokens per sequence (TensorRT-LLM's masked MHA: fewer thread blocks
  fit an SM's shared memory as the sequences grow) may offer
  ``decode_interval_coeffs(batch)``: the stream-bound line over each further context
  interval, which replaces ``decode_coeffs``' from its first context on (the engine cuts a
  run where the batch's context enters the next interval); the kernel sizes that by the
  batch's longest sequence, so such a model also offers ``decode_longest_coeffs(batch)``,
  the same lines keyed by the longest sequence's cached tokens (``decode_interval_coeffs``
  is their form for sequences of equal length);
- a mixed (chunked-prefill) step: both at once, ``decode_batch`` decode tokens over
  ``decode_context_tokens`` and a prefill part (``prefill_seqs``, ``prefill_tokens``,
  ``prefill_attn_pairs``, ``prefill_cached_tokens`` as a prefill batch's). Its decode part
  is the decode step above (every line the model has) and ``decode_longest_history_tokens``
  is the cached tokens of the batch's longest decoding sequence (None: sequences of equal
  length), for a model with ``decode_longest_coeffs``; a model without them ignores it.

A cost model whose decode step is set by a part that holds whole sequences (attention
data parallelism: each DP rank holds its sequences whole, and the busiest one holds at
least the longest) may offer ``decode_longest_context_coeffs(batch)``, ``(u, v)``: its
decode lines are then taken at ``max(C, u × C + v × L)`` instead of ``C``, ``L`` the
longest sequence's context (its cached tokens + 1). The engine keeps the longest
sequence for such a model too and cuts a run where the larger of the two changes (at most
once a run: ``u × b + v <= b``, the second grows no faster than C).

:class:`disaggsim.costmodel.testing.ConstantCost` is the constant-time test double.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class WorkerCost(Protocol):
    num_gpus: int
    kv_bytes_per_token: int  # all layers, all TP shards together (bytes per token of context)
    kv_capacity_tokens: int  # tokens of KV this worker can hold
    weights_bytes: int  # weights held by the whole worker (all GPUs), bytes

    def prefill_time_s(
        self, num_seqs: int, new_tokens: int, attn_pairs: float, cached_tokens: int = 0
    ) -> float: ...

    def decode_coeffs(self, batch: int) -> tuple[float, float]: ...

    def mixed_time_s(
        self,
        decode_batch: int,
        decode_context_tokens: int,
        prefill_seqs: int,
        prefill_tokens: int,
        prefill_attn_pairs: float,
        prefill_cached_tokens: int = 0,
        decode_longest_history_tokens: float | None = None,
    ) -> float: ...


def context_kv_bytes(cost: WorkerCost, tokens: int) -> int:
    """Bytes of KV one sequence of ``tokens`` tokens holds on a worker (all GPUs
    together): what a handoff or a swap copy moves. A cost model whose layers keep a
    bounded window (sliding or chunked attention) offers ``context_kv_bytes(tokens)``;
    otherwise every layer keeps every token, ``tokens × kv_bytes_per_token``."""
    f = getattr(cost, "context_kv_bytes", None)
    if f is not None:
        return int(f(tokens))
    return tokens * cost.kv_bytes_per_token


def kv_copy_gpus(cost: WorkerCost, num_seqs: int) -> float:
    """How many GPUs' worth of links a copy of ``num_seqs`` sequences' KV runs over in
    parallel: the copy ends when the busiest GPU has copied its share. Every GPU holds a
    shard of every sequence (``num_gpus``) unless the cost model says otherwise
    (``kv_copy_gpus(num_seqs)``: data-parallel ranks hold whole sequences, MLA's latent
    is replicated across a rank's TP group)."""
    f = getattr(cost, "kv_copy_gpus", None)
    if f is not None:
        return float(f(num_seqs))
    return float(cost.num_gpus)


class DecodeLines(Protocol):
    """What :func:`decode_step_time_s` needs of a cost model (``decode_item_coeffs``,
    the optional second line, is looked up on the object)."""

    def decode_coeffs(self, batch: int) -> tuple[float, float]: ...


def decode_step_time_s(
    cost: DecodeLines,
    batch: int,
    context_tokens: float,
    longest_history_tokens: float | None = None,
) -> float:
    """Seconds of one decode step: the stream-bound line (the smallest of it and the
    ``decode_min_coeffs`` lines where the cost model has them), or the item-bound line
    where the cost model has one and it is larger (short contexts). A stream line that
    changes with the tokens per sequence is the one of the batch's longest sequence
    (``longest_history_tokens`` cached tokens, with ``decode_longest_coeffs``), or, None,
    of sequences of equal length (the context interval holding C). A cost model whose
    busiest part holds the longest sequence whole (attention data parallelism:
    ``decode_longest_context_coeffs(batch)``, ``(u, v)``) takes every line at
    ``max(C, u × C + v × L)``, ``L`` the longest sequence's context
    (``longest_history_tokens`` + 1)."""
    widen = getattr(cost, "decode_longest_context_coeffs", None)
    if longest_history_tokens is not None and widen is not None:
        u, v = widen(batch)
        context_tokens = max(
            context_tokens, u * context_tokens + v * (longest_history_tokens + 1.0)
        )
    base, per_token = cost.decode_coeffs(batch)
    longest = getattr(cost, "decode_longest_coeffs", None)
    intervals = getattr(cost, "decode_interval_coeffs", None)
    if longest_history_tokens is not None and longest is not None:
        for start, line in longest(batch):  # the line of the longest sequence's regime
            if longest_history_tokens < start:
                break
            base, per_token = line
    elif intervals is not None:  # the stream line of the context interval holding C
        for start, line in intervals(batch):
            if context_tokens < start:
                break
            base, per_token = line
    t = base + per_token * context_tokens
    alts = getattr(cost, "decode_min_coeffs", None)
    if alts is not None:
        for b2, k2 in alts(batch):
            t = min(t, b2 + k2 * context_tokens)
    item = getattr(cost, "decode_item_coeffs", None)
    if item is not None:
        b1, k1 = item(batch)
        t = max(t, b1 + k1 * context_tokens)
    return t


def decode_knee_tokens(stream: tuple[float, float], item: tuple[float, float]) -> float:
    """Context tokens where the stream-bound line ``stream`` and the item-bound line
    ``item`` (each ``(base_s, per_context_token_s)``) cross; 0 when the item line never
    lies above the stream line at a positive context."""
    (b0, k0), (b1, k1) = stream, item
    return (b1 - b0) / (k0 - k1) if k0 > k1 and b1 > b0 else 0.0
