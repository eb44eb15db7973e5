"""The prefix reuse a trace allows, computed from the trace file alone.

This is the reference figure for prefix caching: what an unbounded store shared by every
worker could hit if a block became reusable the moment an earlier request carried it. It
reads the JSONL itself (not :func:`~disaggsim.workload.traces.read_trace`) and uses no
cache code, so it checks both.

Definition (``docs/prefix-caching.md``): requests are taken in arrival order (by
``timestamp``, ties in file order). Block ``k`` of a request (tokens ``[512 k, 512 (k+1))``
of its prompt, the last one partial) is a *hit* when an earlier request had the same hash
at the same position ``k``. A request's hit tokens are the tokens its hit blocks cover,
capped at ``input_length - 1``: the last prompt token is always computed, because its
forward pass yields the first output token (vLLM caps a cache hit at the prompt length
minus one, SGLang matches the prefix of all but the last token). A partial last block
counts in full when its hash matched: a hash names the block's content, so an equal hash
covers the same tokens (both published Mooncake traces agree: every hash covers one token
count wherever it appears). ``prefix_hit_share = hit tokens / prompt tokens``, summed over
all requests.

``prefix_hit_tokens`` counts only the hits before a request's first miss, which is what a
prefix cache can use; on a trace whose hashes are prefix hashes it equals ``hit_tokens``.

Run ``python -m disaggsim.workload.reuse TRACE.jsonl`` to print the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from disaggsim.errors import UserError
from disaggsim.inputs import regular_file
from disaggsim.workload.traces import mooncake_number, mooncake_records


@dataclass(frozen=True, slots=True)
class TraceReuse:
    """Prefix reuse of one trace (see the module docstring for the definitions)."""

    num_requests: int
    prompt_tokens: int  # sum of input_length
    hit_tokens: int  # blocks matched at their position by an earlier request
    prefix_hit_tokens: int  # the same, stopping at each request's first miss

    @property
    def prefix_hit_share(self) -> float:
        """``prefix_hit_tokens / prompt_tokens``: the share a prefix cache can hit."""
        return self.prefix_hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def hit_share(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def trace_prefix_reuse(
    path: str | Path,
    block_tokens: int = 512,
    min_age_s: float = 0.0,
    same_time_hits: bool = False,
) -> TraceReuse:
    """Prefix reuse of a Mooncake-format JSONL trace with ``hash_ids``.

    Parameters
    ----------
    path : the trace (``timestamp`` in ms, ``input_length``, ``hash_ids``).
    block_tokens : tokens per hash block (Mooncake: 512).
    min_age_s : a block counts as a hit only when the first earlier request carrying it
        (same hash, same position) arrived at least this long before. 0: any earlier
        request in arrival order, ties included. A positive value gives a lower bound for
        a cache where KV becomes reusable only after the earlier prefill finished.
    same_time_hits : also count a block carried by a request with the *same* timestamp
        later in the file (an upper bound for a simulation that may serve requests
        arriving together in any order). Only with ``min_age_s = 0``.
    """
    if same_time_hits and min_age_s != 0:
        raise ValueError("same_time_hits needs min_age_s = 0")
    path = Path(path)
    regular_file(path, UserError, "trace file")
    rows: list[tuple[float, int, int, list[int]]] = []
    # the trace reader's checks (run reads the same file): a bad line is one line, not a
    # JSONDecodeError / KeyError / TypeError traceback
    for line_no, record in mooncake_records(path):
        if "hash_ids" not in record:
            raise UserError(f"{path}:{line_no}: hash_ids missing; reuse needs prefix hashes")
        ids = record["hash_ids"]
        if not isinstance(ids, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) for h in ids
        ):
            raise UserError(f"{path}:{line_no}: hash_ids must be a list of integers")
        arrival_ms = mooncake_number(path, line_no, record, "timestamp")
        length = mooncake_number(path, line_no, record, "input_length")
        rows.append((arrival_ms / 1e3, line_no, int(length), ids))
    rows.sort(key=lambda r: (r[0], r[1]))  # arrival order, ties by line (stable)

    first_seen_s: dict[tuple[int, int], float] = {}  # (position, hash) -> first arrival
    # keys carried by two or more requests at the time they first appear
    together: dict[tuple[int, int], float] = {}
    if same_time_hits:
        first_s: dict[tuple[int, int], float] = {}
        count: dict[tuple[int, int], int] = {}
        for t_s, _, _, hashes in rows:
            for key in enumerate(hashes):
                if first_s.setdefault(key, t_s) == t_s:
                    count[key] = count.get(key, 0) + 1
        together = {key: first_s[key] for key, c in count.items() if c >= 2}
    prompt_total = hit_total = prefix_total = 0
    for t_s, _, length, hashes in rows:
        prompt_total += length
        hit = prefix_hit = 0
        missed = False
        for k, h in enumerate(hashes):
            seen_s = first_seen_s.get((k, h))
            covered = min(block_tokens, length - k * block_tokens)
            if (seen_s is not None and t_s - seen_s >= min_age_s) or together.get((k, h)) == t_s:
                hit += covered
                if not missed:
                    prefix_hit += covered
            else:
                missed = True
        cap = max(length - 1, 0)
        hit_total += min(hit, cap)
        prefix_total += min(prefix_hit, cap)
        for k, h in enumerate(hashes):
            first_seen_s.setdefault((k, h), t_s)
    return TraceReuse(len(rows), prompt_total, hit_total, prefix_total)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m disaggsim.workload.reuse",
        description="Prefix reuse an unbounded shared store allows on a Mooncake JSONL trace.",
    )
    parser.add_argument("trace", type=Path)
    parser.add_argument("--block-tokens", type=int, default=512)
    parser.add_argument("--min-age-s", type=float, default=0.0)
    parser.add_argument("--same-time-hits", action="store_true")
    args = parser.parse_args(argv)
    try:
        reuse = trace_prefix_reuse(
            args.trace, args.block_tokens, args.min_age_s, args.same_time_hits
        )
    except UserError as err:
        print(f"disaggsim: error: {err}", file=sys.stderr)
        return 2
    out = asdict(reuse) | {
        "prefix_hit_share": round(reuse.prefix_hit_share, 6),
        "hit_share": round(reuse.hit_share, 6),
        "block_tokens": args.block_tokens,
        "min_age_s": args.min_age_s,
        "same_time_hits": args.same_time_hits,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
