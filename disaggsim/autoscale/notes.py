"""Notes on autoscale settings that cannot act as written, from the scenario alone.

A ``target`` policy on ``batch_occupancy`` adds workers only while the pool's mean
occupancy (running sequences / ``max_batch_seqs``) is above ``target_value × (1 +
tolerance)`` (docs/autoscaling.md, "Policy target"). Each running sequence holds at least
its prompt's KV blocks, so a worker seats at most ``KV blocks // blocks of the shortest
prompt`` sequences: when that seat ceiling is at or below ``target_value × (1 +
tolerance) × max_batch_seqs`` the signal can never rise above the band, and the target
never adds a worker (the mix-shift scenario's decode pool saturated near 0.72 against a
0.6 ± 10 % target). A prefill worker runs no decode batch at all: its occupancy reads 0.
The run says so in a ``note:`` line, as it does for the clients' default cap
(:mod:`disaggsim.cap_notes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from disaggsim.config.loader import LoadedScenario

__all__ = ["occupancy_notes", "seat_ceiling", "shortest_prompt_tokens"]

_ADVICE = "use policy slo, or a queue signal (docs/autoscaling.md)"


def shortest_prompt_tokens(loaded: LoadedScenario) -> int | None:
    """The shortest prompt the scenario's workload can produce at any rate and duration
    (None: not bounded here, as for sessions, whose prompts share cached prefixes).
    Traces are read (the whole window)."""
    from disaggsim.workload import generate_requests
    from disaggsim.workload.config import PresetWorkload, SyntheticWorkload, TraceWorkload
    from disaggsim.workload.presets import load_preset

    w = loaded.scenario.workload
    match w:
        case SyntheticWorkload():
            dists = [w.prompt_tokens]
            if w.mix_shift is not None and w.mix_shift.prompt_tokens is not None:
                dists.append(w.mix_shift.prompt_tokens)
            return min(d.smallest for d in dists)
        case PresetWorkload():
            low = max(int(np.rint(load_preset(w.preset).prompt_tokens_quantiles[0][1])), 1)
            return low if w.max_prompt_tokens is None else min(low, w.max_prompt_tokens)
        case TraceWorkload():
            reqs = generate_requests(
                w, duration_s=float("inf"), seed=loaded.scenario.seed, base_dir=loaded.base_dir
            )
            return int(np.min(reqs.prompt_tokens)) if len(reqs) else None
    return None


def seat_ceiling(kv_capacity_tokens: int, block_tokens: int, prompt_tokens: int) -> int:
    """The most sequences a worker's KV can hold at once when each holds at least
    ``prompt_tokens`` tokens in ``block_tokens``-token blocks: ``(kv_capacity_tokens //
    block_tokens) // ceil(prompt_tokens / block_tokens)``."""
    per_seq_blocks = -(-prompt_tokens // block_tokens)
    return (kv_capacity_tokens // block_tokens) // per_seq_blocks


def occupancy_notes(loaded: LoadedScenario, kv_capacity_tokens: Mapping[str, int]) -> list[str]:
    """``note:`` lines for each autoscaled pool whose ``batch_occupancy`` target can never
    add a worker. ``kv_capacity_tokens``: one worker's KV capacity by pool role."""
    s = loaded.scenario
    if s.autoscale is None:
        return []
    notes = []
    shortest: list[int | None] = []  # computed once, when a pool needs it
    for role, pool in s.pools.items():
        cfg = s.autoscale.for_role(role)
        if cfg is None or cfg.policy != "target" or cfg.target is None:
            continue
        t = cfg.target
        if t.signal != "batch_occupancy":
            continue
        where = f"note: autoscale.{role}: batch_occupancy target {t.target_value:g}"
        if role == "prefill":
            notes.append(
                f"{where}: the signal counts running decode sequences, which a prefill worker "
                f"never holds: it reads 0, so this target only removes workers (down to "
                f"min_workers {cfg.min_workers}); {_ADVICE}"
            )
            continue
        if s.cache is not None or (role == "colocated" and pool.scheduler == "chunked"):
            continue  # shared prefix blocks, or sequences seated mid-prompt: no bound here
        if not shortest:
            shortest.append(shortest_prompt_tokens(loaded))
        prompt, capacity = shortest[0], kv_capacity_tokens.get(role)
        if prompt is None or capacity is None:
            continue
        bt = s.kv.block_tokens
        seats = seat_ceiling(capacity, bt, prompt)
        band = t.target_value * (1 + t.tolerance)
        needed = band * pool.max_batch_seqs
        if seats > needed:
            continue
        notes.append(
            f"{where} × (1 + tolerance {t.tolerance:g}) × max_batch_seqs "
            f"{pool.max_batch_seqs} = {needed:.4g} running sequences per worker, but a "
            f"worker's KV seats at most {seats:,} ({capacity // bt:,} blocks of {bt} tokens "
            f"in its {capacity:,} KV tokens, {-(-prompt // bt):,} per sequence of the "
            f"shortest prompt, {prompt:,} tokens): the signal stays at or below "
            f"{seats / pool.max_batch_seqs:.3g}, so this target never adds a worker; {_ADVICE}"
        )
    return notes
