"""Trace readers on the real traces and on small bad files; trace-replay workloads."""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
from pydantic import TypeAdapter

from disaggsim.errors import UserError
from disaggsim.workload import TraceWorkload, WorkloadConfig, generate_requests, read_trace

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "traces"
ADAPTER = TypeAdapter(WorkloadConfig)

# Row counts from ../shared/data/README.md
ROWS = {
    "AzureLLMInferenceTrace_code.csv": 8_819,
    "AzureLLMInferenceTrace_conv.csv": 19_366,
    "mooncake_conversation_trace.jsonl": 12_031,
    "mooncake_synthetic_trace.jsonl": 3_993,
}

needs_traces = pytest.mark.skipif(
    not TRACES.is_dir(), reason=f"real traces not found at {TRACES} (../shared/data/traces)"
)


def trace_cfg(**fields: object) -> TraceWorkload:
    cfg = ADAPTER.validate_python({"kind": "trace", **fields})
    assert isinstance(cfg, TraceWorkload)
    return cfg


def _azure_stamp_s(text: str) -> float:
    """Seconds since midnight from '2023-11-16 18:17:03.9799600', parsed by hand."""
    whole, frac = text.split(".")
    t = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    return t.hour * 3600 + t.minute * 60 + t.second + int(frac) / 10 ** len(frac)


@needs_traces
@pytest.mark.parametrize("name", sorted(ROWS))
def test_real_trace_rows_and_order(name: str) -> None:
    r = read_trace(TRACES / name)
    assert len(r) == ROWS[name]
    assert r.arrival_s[0] == 0.0
    assert np.all(np.diff(r.arrival_s) >= 0)
    assert r.prompt_tokens.min() >= 1 and r.output_tokens.min() >= 1
    lines = (TRACES / name).read_text().splitlines()
    if name.endswith(".csv"):
        first, last = lines[1].split(","), lines[-1].split(",")
        span = _azure_stamp_s(last[0]) - _azure_stamp_s(first[0])
        assert r.arrival_s[-1] == pytest.approx(span, abs=1e-6)
        assert r.prompt_tokens[-1] == int(last[1]) and r.output_tokens[-1] == int(last[2])
        assert r.prefix_chains is None
    else:
        first, last = json.loads(lines[0]), json.loads(lines[-1])
        assert r.arrival_s[-1] == pytest.approx((last["timestamp"] - first["timestamp"]) / 1e3)
        assert r.prefix_chains is not None and len(r.prefix_chains) == len(r)
        # README: one hash per 512-token block (the reader refuses any other count)
        assert np.array_equal(r.prefix_chains.num_blocks, np.ceil(r.prompt_tokens / 512))
        # canonical ids rename the published hashes one to one (they are prefix hashes)
        raw = [json.loads(line)["hash_ids"] for line in lines]
        order = np.argsort([json.loads(line)["timestamp"] for line in lines], kind="stable")
        pairs = {
            (h, c)
            for i, row in enumerate(order)
            for h, c in zip(raw[row], r.prefix_chains.chain(i), strict=True)
        }
        assert len({h for h, _ in pairs}) == len({c for _, c in pairs}) == len(pairs)


@needs_traces
def test_code_trace_is_bursty_and_conv_is_not() -> None:
    code = np.diff(read_trace(TRACES / "AzureLLMInferenceTrace_code.csv").arrival_s)
    conv = np.diff(read_trace(TRACES / "AzureLLMInferenceTrace_conv.csv").arrival_s)
    assert code.std() / code.mean() > 5
    assert 0.8 < conv.std() / conv.mean() < 1.5


@needs_traces
def test_window_and_rate_scale() -> None:
    path = TRACES / "AzureLLMInferenceTrace_conv.csv"
    raw = read_trace(path).arrival_s
    cfg = trace_cfg(path=str(path), start_s=600, window_s=300, rate_scale=2)
    r = generate_requests(cfg, duration_s=1000, seed=0)
    in_window = raw[(raw >= 600) & (raw < 900)]
    assert len(r) == len(in_window) > 0
    np.testing.assert_allclose(r.arrival_s, (in_window - 600) / 2)
    # duration shorter than the compressed window: L = duration * rate_scale = 100 s
    short = generate_requests(cfg, duration_s=50, seed=0)
    assert len(short) == np.count_nonzero((raw >= 600) & (raw < 700))
    assert short.arrival_s.max() < 50


@needs_traces
def test_rate_per_s_hits_the_target_on_the_window() -> None:
    path = TRACES / "mooncake_conversation_trace.jsonl"
    cfg = trace_cfg(path=str(path), start_s=100, window_s=1200, rate_per_s=10)
    r = generate_requests(cfg, duration_s=math.inf, seed=0)
    raw = read_trace(path).arrival_s
    n = np.count_nonzero((raw >= 100) & (raw < 1300))
    assert len(r) == n
    # n arrivals over the compressed window 1200 / rate_scale, rate_scale = 10 / (n / 1200)
    assert n / (1200 / (10 / (n / 1200))) == pytest.approx(10)
    assert r.arrival_s.max() < 1200 / (10 / (n / 1200))


@needs_traces
def test_relative_path_resolves_against_base_dir_and_clipping() -> None:
    cfg = trace_cfg(
        path="mooncake_synthetic_trace.jsonl",
        max_prompt_tokens=4096,
        max_output_tokens=64,
        num_requests=100,
    )
    r = generate_requests(cfg, duration_s=math.inf, seed=0, base_dir=TRACES)
    assert len(r) == 100
    assert r.prompt_tokens.max() == 4096 and r.output_tokens.max() == 64
    assert r.prefix_chains is not None and len(r.prefix_chains) == 100
    # clipped prompts keep ceil(4096 / 512) = 8 blocks at most
    assert r.prefix_chains.num_blocks.max() == 8


def test_replay_of_a_small_file_by_hand(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    rows = [(1000, 10, 0), (1500, 20, 5), (3000, 30, 6), (4000, 40, 7)]
    f.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": i, "output_length": o}) + "\n"
            for t, i, o in rows
        )
    )
    r = read_trace(f)
    np.testing.assert_allclose(r.arrival_s, [0, 0.5, 2.0, 3.0])
    np.testing.assert_array_equal(r.output_tokens, [1, 5, 6, 7])  # 0 clamped to 1
    assert r.prefix_chains is None
    cfg = trace_cfg(path="t.jsonl", start_s=0.5, rate_scale=0.5)
    g = generate_requests(cfg, duration_s=4.0, seed=0, base_dir=tmp_path)
    # window [0.5, 0.5 + 4 * 0.5) holds 0.5 and 2.0; times (t - 0.5) / 0.5
    np.testing.assert_allclose(g.arrival_s, [0.0, 3.0])
    # rate_per_s without window: native rate = 3 arrivals from 0.5 over 2.5 s = 1.2/s
    g = generate_requests(
        trace_cfg(path=str(f), start_s=0.5, rate_per_s=2.4), duration_s=math.inf, seed=0
    )
    np.testing.assert_allclose(g.arrival_s, [0.0, 0.75, 1.25])


def test_unsorted_trace_is_sorted(tmp_path: Path) -> None:
    f = tmp_path / "u.csv"
    f.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:02.5,20,2\n"
        "2023-11-16 18:00:01,10,1\n"
        "2023-11-16 18:00:03.1234567,30,3\n"
    )
    r = read_trace(f)
    np.testing.assert_allclose(r.arrival_s, [0, 1.5, 2.1234567])
    np.testing.assert_array_equal(r.prompt_tokens, [10, 20, 30])


HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GOOD = "2023-11-16 18:17:03.9799600,4808,10\n"


@pytest.mark.parametrize(
    ("body", "line", "words"),
    [
        (GOOD + GOOD + "2023-11-16 18:17:04.0,abc,3\n", 4, "ContextTokens"),
        (GOOD + "2023-11-16 18:17:04.0,12,-3\n", 3, "GeneratedTokens"),
        (GOOD + "2023-11-16 18:17:04.0,12\n", 3, "GeneratedTokens"),
        (GOOD + "2023-11-16 18:17:04.0,12.5,3\n", 3, "ContextTokens"),
        (GOOD + "yesterday,12,3\n", 3, "TIMESTAMP"),
        (GOOD + "\n" + GOOD + "2023-11-16 18:17:04.0,,3\n", 5, "ContextTokens"),
        (GOOD + "2023-11-16 18:17:04.0,1,2,3\n", 3, "fields"),
    ],
)
def test_bad_azure_rows(tmp_path: Path, body: str, line: int, words: str) -> None:
    f = tmp_path / "bad.csv"
    f.write_text(HEADER + body)
    with pytest.raises(UserError) as err:
        read_trace(f)
    message = str(err.value)
    assert message.startswith(f"{f}:{line}:") and words in message and "\n" not in message


def test_azure_missing_column(tmp_path: Path) -> None:
    f = tmp_path / "cols.csv"
    f.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,4808\n")
    with pytest.raises(UserError, match=r"cols\.csv:1: missing column\(s\) GeneratedTokens"):
        read_trace(f)


M_GOOD = '{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [1]}\n'


@pytest.mark.parametrize(
    ("body", "line", "words"),
    [
        (M_GOOD + '{"timestamp": 1, "input_length": 5\n', 2, "invalid JSON"),
        (M_GOOD + M_GOOD + '{"timestamp": 1, "output_length": 2, "hash_ids": []}\n', 3, "input_length"),
        (M_GOOD + '{"timestamp": 1, "input_length": -5, "output_length": 2, "hash_ids": []}\n', 2, "input_length"),
        (M_GOOD + '{"timestamp": "x", "input_length": 5, "output_length": 2, "hash_ids": []}\n', 2, "timestamp"),
        (M_GOOD + '{"timestamp": 1, "input_length": 5, "output_length": 2}\n', 2, "hash_ids"),
        (M_GOOD + "[1, 2]\n", 2, "JSON object"),
        # hash_ids must hold ceil(input_length / 512) ids
        (M_GOOD + '{"timestamp": 1, "input_length": 513, "output_length": 2, "hash_ids": [1]}\n', 2, "hash_ids has 1 ids but input_length 513 needs ceil(513/512) = 2"),
        (M_GOOD + '{"timestamp": 1, "input_length": 512, "output_length": 2, "hash_ids": [1, 2]}\n', 2, "hash_ids has 2 ids"),
        (M_GOOD + '{"timestamp": 1, "input_length": 7, "output_length": 2, "hash_ids": []}\n', 2, "hash_ids has 0 ids"),
    ],
)  # fmt: skip
def test_bad_mooncake_rows(tmp_path: Path, body: str, line: int, words: str) -> None:
    f = tmp_path / "bad.jsonl"
    f.write_text(body)
    with pytest.raises(UserError) as err:
        read_trace(f)
    message = str(err.value)
    assert message.startswith(f"{f}:{line}:") and words in message and "\n" not in message


def test_missing_file_and_unknown_extension(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="trace file not found"):
        read_trace(tmp_path / "nope.csv")
    odd = tmp_path / "trace.txt"
    odd.write_text("x")
    with pytest.raises(UserError, match=r"\.csv \(azure\) or \.jsonl \(mooncake\)"):
        read_trace(odd)
    empty = tmp_path / "empty.csv"
    empty.write_text(HEADER)
    with pytest.raises(UserError, match="no requests"):
        read_trace(empty)


@pytest.mark.parametrize("fmt", ["auto", "azure", "mooncake"])
@pytest.mark.parametrize(
    ("head", "words"),
    [
        (b"PAR1\x15\x04\x15\x10\x15\x14L\x15\x04\x15\x00\x12\x00\x00", "a Parquet file"),
        (b"\x1f\x8b\x08\x00\x00\x00\x00\x00", "a compressed file"),
        (b"TIMESTAMP,ContextTokens\x00\x00\x01", "a binary file"),
        (b"TIMESTAMP,ContextTokens,GeneratedTokens\n\xff\xfe,1,2\n", "not UTF-8 text"),
    ],
)
def test_a_binary_file_is_named_as_such_whatever_the_format(
    tmp_path: Path, head: bytes, words: str, fmt: str
) -> None:
    # was: "not an Azure trace CSV ('utf-8' codec ...)", "invalid JSON", or, for a Parquet
    # file read as Mooncake, "not JSON lines (a CSV: azure?)"
    for name in ("t.csv", "t.jsonl"):
        path = tmp_path / name
        path.write_bytes(head * 10)
        with pytest.raises(UserError, match=f"{name}: {words}.*not a trace") as e:
            read_trace(path, format=fmt)
        assert "azure, mooncake, auto" in str(e.value)


def test_a_multibyte_character_cut_by_the_sniffed_head_is_text(tmp_path: Path) -> None:
    # the format check reads 4096 bytes: a UTF-8 character across that edge is still text
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "2023-11-16 18:17:03.9799600,100,20\n" + "#" * 4000 + "é" * 100)
    with pytest.raises(UserError) as e:
        read_trace(path)
    assert "not a trace" not in str(e.value)


def test_mooncake_hashes_become_canonical_prefix_ids(tmp_path: Path) -> None:
    """Hand-built: equal raw hashes after different parents, or covering a different
    token count, are different prefixes; equal prefixes share ids."""
    f = tmp_path / "h.jsonl"
    rows = [
        (0, 1024, [7, 8]),  # A: blocks 7, 8 (512 + 512 tokens)
        (1, 1000, [7, 8]),  # B: same first block; its last block covers 488 tokens
        (2, 1024, [9, 8]),  # C: raw 8 after another parent
        (3, 1536, [7, 8, 5]),  # D: extends A
        (4, 0, []),  # E: empty prompt (clamped to 1 token), a block of its own
    ]
    f.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": n, "output_length": 1, "hash_ids": h})
            + "\n"
            for t, n, h in rows
        )
    )
    r = read_trace(f)
    c = r.prefix_chains
    assert c is not None and c.block_tokens == 512
    chains = [c.chain(i) for i in range(len(r))]
    assert chains == [[0, 1], [0, 2], [3, 4], [0, 1, 5], [6]]
    assert c.num_ids == 7
    # a subset keeps the ids
    sub = c.take(np.array([3, 0]))
    assert [sub.chain(0), sub.chain(1)] == [[0, 1, 5], [0, 1]]
    clipped = generate_requests(
        trace_cfg(path=str(f), max_prompt_tokens=1000), duration_s=math.inf, seed=0
    )
    assert clipped.prefix_chains is not None
    got = [clipped.prefix_chains.chain(i) for i in range(5)]
    # A and D cut to 1000 tokens end in the same shortened block; B's 488-token block
    # is its own content (the trace cannot say it equals A's first 488 tokens)
    assert got[0] == got[3] and got[0][0] == got[1][0] and got[0][1] != got[1][1]
    assert len({got[0][1], got[1][1], got[2][1]}) == 3
