"""Trace files the mutated-trace fuzz (tests/test_fuzz_cli.py, kind ``tracefile``) and
hand probes found read wrongly: each was a traceback out of ``disaggsim run`` or a wrong
value read silently; each is one line naming the file and line now (docs/safety.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from disaggsim.cli import main
from disaggsim.errors import UserError
from disaggsim.workload.traces import read_trace

BIG = "1" + "0" * 400  # an integer beyond any float
HUGE = "1" + "0" * 5000  # beyond Python's 4,300-digit limit for int(str)
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _mooncake(*records: str) -> str:
    return "".join(r + "\n" for r in records)


OK = '{"timestamp": 0, "input_length": 5, "output_length": 3}'


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        # OverflowError out of math.isfinite (a traceback)
        ("t.jsonl", _mooncake(f'{{"timestamp": {BIG}, "input_length": 5, "output_length": 3}}'),
         "t.jsonl:1: timestamp: an integer of 401 digits is beyond any number"),
        ("t.jsonl", _mooncake(OK, f'{{"timestamp": 1, "input_length": {BIG}, "output_length": 3}}'),
         "t.jsonl:2: input_length: an integer of 401 digits"),
        ("t.jsonl", _mooncake(f'{{"timestamp": 0, "input_length": 5, "output_length": 3, '
                              f'"max_tokens": {BIG}}}'), "t.jsonl:1: max_tokens: an integer"),
        # ValueError out of json.loads (a traceback)
        ("t.jsonl", _mooncake(OK, f'{{"timestamp": {HUGE}, "input_length": 5, "output_length": 3}}'),
         "t.jsonl:2: invalid JSON (Exceeds the limit (4300 digits)"),
        # read silently: the last of two values; a key absent on the first line ignored
        ("t.jsonl", _mooncake('{"timestamp": 0, "input_length": 5, "input_length": 7, '
                              '"output_length": 3}'),
         "t.jsonl:1: key 'input_length' given twice in one object"),
        ("t.jsonl", _mooncake(OK, '{"timestamp": 1, "input_length": 5, "output_length": 3, '
                              '"max_tokens": 2}'),
         "t.jsonl:2: max_tokens given, but not on the first line; give it on every line or on none"),
        ("t.jsonl", _mooncake(OK, '{"timestamp": 1, "input_length": 5, "output_length": 3, '
                              '"hash_ids": [1]}'),
         "t.jsonl:2: hash_ids given, but not on the first line"),
        # pandas' "Mixed timezones detected" (a traceback)
        ("t.csv", HEADER + "2023-11-16 18:17:03+01:00,5,3\n2023-11-16 18:17:04,5,3\n",
         "t.csv:3: TIMESTAMP '2023-11-16 18:17:04' has no UTC offset, but other rows have one"),
        # year 1 parsed at a coarser unit, then wrapped in nanoseconds: arrivals 8.5e9 s
        # apart instead of 6.4e10 (a wrong value, silently)
        ("t.csv", HEADER + "0001-01-01 00:00:00,5,3\n2023-11-16 18:17:04,5,3\n",
         "t.csv:2: TIMESTAMP '0001-01-01 00:00:00' is outside the years 1678-2261"),
        # pandas renamed the second ContextTokens to ContextTokens.1 and read the first
        ("t.csv", "TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n"
                  "2023-11-16 18:17:03,5,3,7\n",
         "t.csv:1: column 'ContextTokens' given twice"),
    ],
    ids=["big-timestamp", "big-input", "big-max-tokens", "5000-digits", "duplicate-key",
         "max-tokens-later", "hash-ids-later", "mixed-time-zones", "year-1", "duplicate-column"],
)  # fmt: skip
def test_a_bad_trace_is_one_line_naming_the_file_and_line(
    tmp_path, monkeypatch, name, text, message
):
    monkeypatch.chdir(tmp_path)
    Path(name).write_text(text)
    with pytest.raises(UserError) as e:
        read_trace(Path(name))
    assert str(e.value).startswith(message), str(e.value)


def test_time_stamps_with_utc_offsets_are_compared_in_utc(tmp_path):
    """Every row with an offset is a valid trace: 18:17:03 at +01:00 is 17:17:03 UTC,
    two seconds before 17:17:05Z."""
    p = tmp_path / "t.csv"
    p.write_text(HEADER + "2023-11-16 18:17:03+01:00,5,3\n2023-11-16T17:17:05Z,6,4\n")
    r = read_trace(p)
    assert r.arrival_s.tolist() == [0.0, 2.0]
    assert r.prompt_tokens.tolist() == [5, 6]


def test_a_plain_trace_reads_as_before(tmp_path):
    """The nanosecond arithmetic is unchanged for a trace in the usual range."""
    p = tmp_path / "t.csv"
    p.write_text(HEADER + "2023-11-16 18:17:03.9799600,5,3\n2023-11-16 18:17:04.0319600,6,4\n")
    assert np.array_equal(read_trace(p).arrival_s, [0.0, 52_000_000 * 1e-9])


def test_the_cli_turns_each_into_one_line(tmp_path, monkeypatch, capsys):
    """Through `disaggsim run`: exit 2, one line, no traceback."""
    monkeypatch.chdir(tmp_path)
    Path("t.jsonl").write_text(_mooncake(f'{{"timestamp": {BIG}, "input_length": 5, '
                                         '"output_length": 3}'))  # fmt: skip
    Path("s.yaml").write_text(
        "name: t\nseed: 1\nmodel: llama-3.1-8b\narchitecture: colocated\n"
        "pool: {gpu: h100-sxm, num_workers: 1, scheduler: chunked}\n"
        "slo: {ttft_ms: 1000, itl_ms: 100}\nworkload: {kind: trace, path: t.jsonl}\n"
        "sim: {duration_s: 10}\n"
    )
    rc = main(["run", "s.yaml", "--out", "out", "--quiet", "--no-plots"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "t.jsonl:1: timestamp: an integer of 401 digits" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml", "t.jsonl"]


def test_a_mooncake_trace_saved_with_a_byte_order_mark_is_read(tmp_path):
    """A UTF-8 byte-order mark (an editor's "UTF-8 with BOM") was "invalid JSON (Unexpected
    UTF-8 BOM)" at line 1 of a Mooncake trace (tracefile fuzz, seed 9201 case 4), while
    the Azure reader and the scenario reader skip it."""
    p = tmp_path / "t.jsonl"
    p.write_bytes(
        b"\xef\xbb\xbf" + _mooncake(OK, OK.replace('"timestamp": 0', '"timestamp": 5')).encode()
    )
    r = read_trace(p)
    assert r.arrival_s.tolist() == [0.0, 0.005] and r.prompt_tokens.tolist() == [5, 5]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json\n", "t.jsonl:1: invalid JSON (Expecting value)"),
        ('{"timestamp": 0, "hash_ids": [1]}\n', "t.jsonl:1: missing key 'input_length'"),
        ('{"timestamp": "x", "input_length": 5, "hash_ids": [1]}\n',
         "t.jsonl:1: timestamp 'x' must be a non-negative number"),
        ('{"timestamp": 0, "input_length": 5, "hash_ids": "abc"}\n',
         "t.jsonl:1: hash_ids must be a list of integers"),
    ],
    ids=["invalid-json", "missing-key", "text-timestamp", "hash-ids-text"],
)  # fmt: skip
def test_the_reuse_tool_reads_a_trace_with_the_trace_readers_checks(
    tmp_path, capsys, text, message
):
    """`python -m disaggsim.workload.reuse` (docs/prefix-caching.md) parsed lines itself:
    JSONDecodeError, KeyError and TypeError tracebacks on lines the trace reader refuses
    in one line. It reads through the same records now."""
    from disaggsim.workload import reuse

    p = tmp_path / "t.jsonl"
    p.write_text(text)
    assert reuse.main([str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"disaggsim: error: {p.parent}/{message}" in err, err
