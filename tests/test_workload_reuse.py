"""The independent hit-share computation (disaggsim/workload/reuse.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from disaggsim.errors import UserError
from disaggsim.workload.reuse import main, trace_prefix_reuse


def write(path: Path, rows: list[tuple[int, int, list[int]]]) -> Path:
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": n, "output_length": 1, "hash_ids": h})
            + "\n"
            for t, n, h in rows
        )
    )
    return path


def test_hand_built_trace(tmp_path: Path) -> None:
    f = write(
        tmp_path / "t.jsonl",
        [
            (0, 1000, [1, 2]),  # nothing earlier: 0 hits
            (0, 1300, [1, 2, 3]),  # same ms, later line: blocks 1, 2 (1024 tokens)
            (5, 600, [1, 9]),  # block 1 (512)
            (7, 1000, [1, 2]),  # a repeat of line 1: 1000 tokens, capped at 999
            (9, 900, [4, 2]),  # hash 2 at position 1, but block 0 missed: 388 / 0
        ],
    )
    r = trace_prefix_reuse(f)
    assert r.num_requests == 5
    assert r.prompt_tokens == 1000 + 1300 + 600 + 1000 + 900
    assert r.prefix_hit_tokens == 1024 + 512 + 999
    assert r.hit_tokens == 1024 + 512 + 999 + 388
    assert r.prefix_hit_share == pytest.approx(2535 / 4800)
    # min_age_s: only blocks first seen at least that long before count (timestamps
    # are ms: the 600-token request's block is 5 ms old, the repeat's 7 ms)
    assert trace_prefix_reuse(f, min_age_s=0.005).prefix_hit_tokens == 512 + 999
    assert trace_prefix_reuse(f, min_age_s=0.006).prefix_hit_tokens == 999
    # same_time_hits: the first line also hits the second's blocks (same ms): 999 more
    both = trace_prefix_reuse(f, same_time_hits=True)
    assert both.prefix_hit_tokens == 999 + 1024 + 512 + 999
    with pytest.raises(ValueError, match="min_age_s = 0"):
        trace_prefix_reuse(f, min_age_s=1, same_time_hits=True)


def test_arrival_order_not_file_order(tmp_path: Path) -> None:
    f = write(tmp_path / "t.jsonl", [(10, 512, [1]), (0, 1024, [1, 2])])
    r = trace_prefix_reuse(f)
    # the 1024-token request arrived first; the later 512-token one hits 511 (cap)
    assert r.prefix_hit_tokens == 511


def test_needs_hash_ids(tmp_path: Path, capsys) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n')
    with pytest.raises(UserError, match=r"t\.jsonl:1: hash_ids missing"):
        trace_prefix_reuse(f)
    assert main([str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "hash_ids missing" in err


def reuse_by_first_occurrence(path: Path) -> tuple[int, int]:
    """A second implementation: a block is a hit when its (position, hash) pair first
    occurs in an earlier row of the arrival-sorted table (numpy, no per-request dict)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    order = np.argsort([r["timestamp"] for r in rows], kind="stable")
    rows = [rows[i] for i in order]
    lengths = np.array([r["input_length"] for r in rows], dtype=np.int64)
    counts = np.array([len(r["hash_ids"]) for r in rows], dtype=np.int64)
    row = np.repeat(np.arange(len(rows)), counts)
    pos = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    hashes = np.concatenate([np.asarray(r["hash_ids"], dtype=np.int64) for r in rows])
    pairs = pos * (hashes.max() + 1) + hashes
    _, first = np.unique(pairs, return_index=True)
    first_row = np.empty_like(row)
    _, inverse = np.unique(pairs, return_inverse=True)
    first_row = row[first][inverse]
    covered = np.minimum(512, lengths[row] - 512 * pos)
    hit = np.where(first_row < row, covered, 0)
    per_request = np.bincount(row, weights=hit, minlength=len(rows)).astype(np.int64)
    return int(lengths.sum()), int(np.minimum(per_request, np.maximum(lengths - 1, 0)).sum())


@pytest.mark.parametrize("name", ["mooncake_conversation_trace", "mooncake_synthetic_trace"])
def test_real_traces_agree_with_a_second_implementation(shared_data, name) -> None:
    path = shared_data / "traces" / f"{name}.jsonl"
    r = trace_prefix_reuse(path)
    prompt, hit = reuse_by_first_occurrence(path)
    assert (r.prompt_tokens, r.hit_tokens) == (prompt, hit)
    # the published hashes are prefix hashes: no hit after a miss
    assert r.prefix_hit_tokens == r.hit_tokens
    # docs/prefix-caching.md quotes these shares
    assert (
        round(r.prefix_hit_share, 4)
        == {
            "mooncake_conversation_trace": 0.3736,
            "mooncake_synthetic_trace": 0.6512,
        }[name]
    )
