"""Prefix chains: canonical prefix ids in columnar form (disaggsim/workload/chains.py)."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsim.workload.chains import (
    PrefixChains,
    _already_canonical,
    _canonical_loop,
    blocks_for,
    canonical_chains,
)
from tests.conftest import SHARED_DATA


def prefix_property_holds(chains: PrefixChains, prompt_tokens: np.ndarray) -> bool:
    """Checked from the definition: an id has one position, one parent, one token count."""
    seen: dict[int, tuple[int, int, int]] = {}
    b = chains.block_tokens
    for i in range(len(chains)):
        parent = -1
        chain = chains.chain(i)
        for k, cid in enumerate(chain):
            cover = min(b, int(prompt_tokens[i]) - k * b)
            if seen.setdefault(cid, (k, parent, cover)) != (k, parent, cover):
                return False
            parent = cid
    return True


def test_real_trace_fast_path_equals_the_loop(shared_data) -> None:
    path = shared_data / "traces" / "mooncake_synthetic_trace.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    raw = [r["hash_ids"] for r in rows]
    prompt = np.array([r["input_length"] for r in rows], dtype=np.int64)
    counts = blocks_for(prompt, 512)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    fast = _already_canonical(raw, counts, offsets, prompt, 512)
    assert fast is not None  # the published hashes are prefix hashes
    slow = _canonical_loop(raw, counts, offsets, prompt, 512)
    assert np.array_equal(fast.ids, slow.ids) and fast.num_ids == slow.num_ids
    assert prefix_property_holds(fast, prompt)


chains_strategy = st.lists(
    st.tuples(st.integers(1, 2000), st.lists(st.integers(0, 5), min_size=4, max_size=4)),
    min_size=1,
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(rows=chains_strategy, block=st.sampled_from([1, 7, 512]))
def test_any_raw_hashes_give_canonical_ids(rows, block) -> None:
    """Raw hashes from a tiny alphabet repeat at other positions and after other parents;
    canonical ids still satisfy the prefix property, both paths agree, and two blocks
    share an id exactly when their raw prefixes (and token counts) are equal."""
    prompt = np.array([min(n, 4 * block) for n, _ in rows], dtype=np.int64)
    raw = [h for _, h in rows]
    chains = canonical_chains(raw, prompt, block)
    assert np.array_equal(chains.num_blocks, blocks_for(prompt, block))
    assert prefix_property_holds(chains, prompt)
    counts = blocks_for(prompt, block)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    slow = _canonical_loop(raw, counts, offsets, prompt, block)
    assert np.array_equal(chains.ids, slow.ids)
    key_of: dict[int, tuple] = {}
    for i in range(len(rows)):
        for k, cid in enumerate(chains.chain(i)):
            cover = min(block, int(prompt[i]) - k * block)
            key = (tuple(raw[i][: k + 1]), cover)
            assert key_of.setdefault(cid, key) == key
    assert len(set(key_of.values())) == len(key_of) == chains.num_ids


def test_take_selects_rows_in_order() -> None:
    # request 1's only block covers 3 tokens, request 0's first covers 4: not the same
    chains = canonical_chains([[1, 2, 9], [1], [3, 4, 5]], np.array([10, 3, 12]), 4)
    assert [chains.chain(i) for i in range(3)] == [[0, 1, 2], [3], [4, 5, 6]]
    sub = chains.take(np.array([2, 0, 2]))
    assert [sub.chain(i) for i in range(3)] == [[4, 5, 6], [0, 1, 2], [4, 5, 6]]
    assert sub.num_ids == chains.num_ids
    empty = chains.take(np.array([], dtype=np.int64))
    assert len(empty) == 0 and len(empty.ids) == 0


def test_real_trace_loads_with_canonical_chains() -> None:
    path = SHARED_DATA / "traces" / "mooncake_conversation_trace.jsonl"
    if not path.is_file():
        return
    from disaggsim.workload import read_trace

    r = read_trace(path)
    assert r.prefix_chains is not None
    # 182,790 distinct published hashes (counted with a set over the file's hash_ids)
    distinct = {h for line in path.read_text().splitlines() for h in json.loads(line)["hash_ids"]}
    assert r.prefix_chains.num_ids == len(distinct) == 182_790
