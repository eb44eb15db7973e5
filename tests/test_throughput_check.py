"""The max-load throughput check (calibration/throughput.py): its rows, the benchmark's
limits, one small benchmark end to end, and bad rows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from calibration import throughput as tput
from calibration.throughput import ThroughputRow
from disaggsim.errors import UserError

HEADER = ",".join(tput.COLUMNS)
GOOD = "r1,src,trtllm,h100-sxm,llama-3.1-8b,fp8,fp8,1,1,128,128,64,,,28836.77"


BASE = ThroughputRow(
    row_id="t",
    source="test",
    engine="trtllm",
    gpu="h100-sxm",
    model="llama-3.1-8b",
    weight_dtype="fp8",
    kv_dtype="fp8",
    tp=1,
    pp=1,
    isl=128,
    osl=128,
    num_requests=64,
    max_batch_size=None,
    max_num_tokens=None,
    output_tokens_per_s=1.0,
)


def row(**kw: Any) -> ThroughputRow:
    return replace(BASE, **kw)


def test_shipped_rows_read():
    rows = tput.read_rows()
    assert len(rows) == 690
    assert {r.gpu for r in rows} == {"h200-sxm", "h100-sxm", "l40s", "a100-80gb"}
    assert all(r.engine == "trtllm" for r in rows)


def test_build_heuristic_by_hand():
    # Llama-3.1-8B FP8 on one H100, 20000/2000 (worked by hand from tuning.py):
    # KV per token 2 x 32 layers x 8 heads x 128 x 1 B = 65,536 B = 6.1035e-5 GiB;
    # memory 81,559 MiB = 79.647 GiB, engine 8.030 (1e9 params x 1 B) -> 71.617;
    # x 0.95 / 6.1035e-5 / 22,000 = 50.67 requests -> batch 64 (multiple of 32, at least
    # 64), tokens 50.67 x 11 = 557 -> 2048 (the minimum).
    bs, tokens, req = tput.trtllm_bench_limits(row(isl=20000, osl=2000))
    assert (bs, tokens) == (64, 2048)
    assert req == pytest.approx(50.67, abs=0.01)
    # Llama-2-7B FP8 (32 KV heads), 128/128: 2 x 32 x 32 x 128 B = 2.441e-4 GiB a token;
    # (79.647 - 6.738) x 0.95 / 2.441e-4 / 256 = 1108.2 requests -> batch 1280 (multiple
    # of 256 above 1024), tokens 1108.2 x 2 = 2216 -> 2304 (multiple of 256).
    assert tput.trtllm_bench_limits(row(model="llama-2-7b"))[:2] == (1280, 2304)
    # a row's own limits win
    assert tput.trtllm_bench_limits(row(max_batch_size=8, max_num_tokens=512))[:2] == (8, 512)


def test_kv_share_is_095_of_free_memory():
    """Llama-3.1-70B FP8 at TP 2 on H100s, 128/128: the build heuristic gives 4,608 tokens
    (test above's rule); TensorRT-LLM's reserve per GPU is its base 0.513 GiB + the TP
    group's 0.383 GiB + its execution context 3.02 x 4608 x (2 x 8192 + 3 x 28672 / 2)
    x 2 bytes = 1.653e9 bytes (disaggsim/costmodel/reserve.py); the KV memory is 0.95
    of what that and the weights leave of CUDA's total (81090 MiB: gpus.yaml cuda_mib).
    The weights per GPU: half the catalog's FP8 bytes, half the 161 replicated norms
    (80 layers x 2 + 1 final) of 8,192, and one more byte for each of the 128,256 x 8,192
    embedding and LM-head parameters a GPU holds (16-bit in FP8 checkpoints)."""
    r = row(model="llama-3.1-70b", tp=2)
    from disaggsim.catalog import get_gpu, get_model
    from disaggsim.units import GiB

    assert tput.trtllm_bench_limits(r)[1] == 4608
    reserve = (0.513 + 0.383) * GiB + 3.02 * 4608 * (2 * 8192 + 3 * 28672 / 2) * 2
    assert tput.runtime_reserve(r) == pytest.approx(reserve, rel=1e-9)
    cuda = 81090 * 2**20
    assert get_gpu("h100-sxm").usable_bytes == cuda
    weights = get_model("llama-3.1-70b").weights_bytes("fp8") / 2 + 161 * 8192 / 2
    weights += 128_256 * 8192
    used = weights + reserve
    kv = cuda * tput.kv_gpu_mem_util(r) - used
    assert kv == pytest.approx(0.95 * (cuda - used), rel=1e-12)
    # the simulated worker holds the same reserve (scenario_for passes it on)
    pool = tput.scenario_for(r)["pool"]
    assert pool["activation_reserve_gib"] * GiB == pytest.approx(reserve, rel=1e-12)


def test_small_benchmark_end_to_end_within_roofline_band():
    """64 requests of 128 in / 128 out, Llama-3.1-8B FP8 on one H100, all at t = 0.

    The heuristic gives batch 4096 / 8192 tokens: all 64 prompts (8192 tokens) prefill in
    one iteration, then 127 decode steps at batch 64. Bounds by hand:
    fastest: prefill 2 x 8.03e9 x 8192 FLOP at the 1979 TFLOP/s FP8 peak = 66.5 ms; a
    step streams 8.03 GB of weights + 64 x ~192 x 64 KiB of KV at 3.35 TB/s = 2.64 ms;
    0.0665 + 127 x 2.64 ms = 0.402 s -> at most 8192 / 0.402 = 20,400 tokens/s.
    slowest plausible: half the peaks and 1 ms of host time per step: 0.133 + 127 x
    6.3 ms = 0.933 s -> at least 8,780 tokens/s."""
    r = row()
    res = tput.simulate_row(r)
    assert res.note == ""
    assert res.mean_batch == pytest.approx(64.0)
    assert 8_780 <= res.simulated_output_tokens_per_s <= 20_400
    # throughput is every output token over the run: 64 x 128 / makespan
    assert res.simulated_output_tokens_per_s == pytest.approx(64 * 128 / res.makespan_s)


def test_compare_reports_ratio_and_ape():
    r = row(output_tokens_per_s=10_000.0)
    df = tput.compare([r])
    sim = df.loc[0, "simulated_output_tokens_per_s"]
    assert df.loc[0, "ratio"] == pytest.approx(sim / 10_000.0)
    assert df.loc[0, "ape"] == pytest.approx(abs(sim / 10_000.0 - 1))


def test_row_the_build_would_refuse_is_not_simulated():
    # Llama-3.1-405B FP8 on one H100: the weights alone exceed its memory
    res = tput.simulate_row(row(model="llama-3.1-405b"))
    assert res.note.startswith("trtllm-bench build would refuse")


def _write(tmp_path: Path, *lines: str) -> Path:
    p = tmp_path / "rows.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (GOOD.replace("h100-sxm", "h100"), "field gpu: 'h100' is not one of"),
        (GOOD.replace("llama-3.1-8b", "llama-9"), "field model: 'llama-9' is not one of"),
        (GOOD.replace(",trtllm,", ",tensorrt,"), "field engine: 'tensorrt' is not one of"),
        (GOOD.replace("fp8,fp8", "int4,fp8"), "field weight_dtype: 'int4' is not one of"),
        (GOOD.replace(",128,128,", ",128.5,128,"), "field isl: expected a whole number"),
        (GOOD.replace(",128,128,", ",0,128,"), "field isl: must be 1.."),
        (GOOD.replace(",1,1,128", ",1,2,128"), "field pp: must be 1..1"),
        (GOOD.replace("28836.77", "-5"), "field output_tokens_per_s: expected a number > 0"),
        (GOOD.replace("28836.77", "nan"), "field output_tokens_per_s: expected a number > 0"),
        (GOOD.replace(",,,", ",x,,"), "field max_batch_size: expected a whole number"),
        (GOOD + ",extra", "expected 15 fields"),
        (GOOD.rsplit(",", 1)[0], "expected 15 fields"),
    ],
)
def test_bad_row_is_one_line_error(tmp_path, line, expected):
    p = _write(tmp_path, HEADER, GOOD.replace("r1", "r0"), line)
    with pytest.raises(UserError) as e:
        tput.read_rows(p)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{p}:3: ")
    assert expected in msg


def test_bad_header_duplicate_and_empty(tmp_path):
    p = _write(tmp_path, HEADER.replace("isl", "input_len"), GOOD)
    with pytest.raises(UserError, match="missing isl; unknown input_len"):
        tput.read_rows(p)
    p = _write(tmp_path, HEADER, GOOD, GOOD)
    with pytest.raises(UserError, match="row_id: 'r1' appears twice"):
        tput.read_rows(p)
    p = _write(tmp_path, HEADER)
    with pytest.raises(UserError, match="no rows"):
        tput.read_rows(p)
    with pytest.raises(UserError, match="cannot read"):
        tput.read_rows(tmp_path / "missing.csv")


def test_cli_bad_rows_exit_2_one_line(tmp_path, capsys):
    p = _write(tmp_path, HEADER, GOOD.replace("h100-sxm", "h100"))
    assert tput.main(["--rows", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "field gpu" in err
    assert tput.main(["--rows", str(p), "--every", "0"]) == 2
    assert tput.main(["--only", "no-such-gpu"]) == 2
    before = tput.DOC.read_text() if tput.DOC.exists() else None
    assert tput.main(["--only", "a100", "--write-doc"]) == 2  # a sample never writes the doc
    assert (tput.DOC.read_text() if tput.DOC.exists() else None) == before


def test_what_if_changes_only_inside_and_restores():
    from disaggsim.costmodel import step

    before = (step._prefill_attention_s, step.FP8_QUANT_BYTES_PER_ELEM)
    # a 20000-token prompt under a 2048-token budget: chunks over a growing prefix
    r = row(isl=20000, osl=16, num_requests=4)
    shipped = tput.simulate_row(r).simulated_output_tokens_per_s
    with tput.what_if(["prefix-attention", "fused-fp8-quant"]):
        assert step.FP8_QUANT_BYTES_PER_ELEM == 0.0
        changed = tput.simulate_row(r).simulated_output_tokens_per_s
    assert (step._prefill_attention_s, step.FP8_QUANT_BYTES_PER_ELEM) == before
    assert changed > shipped  # cheaper chunks and no quantisation passes
    assert tput.simulate_row(r).simulated_output_tokens_per_s == shipped


def test_shipped_summary_is_of_the_shipped_rows(tmp_path):
    """The summary the doc's run wrote (and docs/validation.md quotes) covers the CSV as
    shipped: regenerate it (`--write-doc`) when rows change."""
    import json

    rows = tput.read_rows()
    d = json.loads(tput.SUMMARY.read_text())
    assert d["rows"] == len(rows)
    assert d["sources"] == sorted({r.source for r in rows})
    text = tput.validation_sentence()
    assert f"{d['compared']} rows" in text and "\n" not in text
    assert "no summary" in tput.validation_sentence(tmp_path / "missing.json")


def test_kv_less_check_shrinks_only_the_kv_pool():
    """A KV-bound row: Llama-3-70B FP16 on two H100s at 128/2048 (the heuristic's batch 64;
    the pool holds about 34 sequences of 2,176 tokens). With 2 GiB per GPU less KV memory
    the scenario's gpu_mem_util drops by exactly 2 GiB over CUDA's total, the pool holds
    fewer sequences and the run is slower; the shipped amount (0) is the check as shipped."""
    from disaggsim.catalog import get_gpu
    from disaggsim.units import GiB

    r = row(model="llama-3-70b", weight_dtype="fp16", kv_dtype="fp16", tp=2, osl=2048,
            num_requests=200)  # fmt: skip
    util = tput.scenario_for(r)["pool"]["gpu_mem_util"]
    less = tput.scenario_for(r, 2 * GiB)["pool"]["gpu_mem_util"]
    assert util - less == pytest.approx(2 * GiB / get_gpu("h100-sxm").usable_bytes, rel=1e-12)
    t = tput.kv_less_check([r], [2.0]).set_index("kv_less_gib")
    assert t.loc[0.0, "ratio"] == pytest.approx(tput.simulate_row(r).simulated_output_tokens_per_s)
    assert t.loc[2.0, "mean_batch"] < t.loc[0.0, "mean_batch"]
    assert t.loc[2.0, "ratio"] < t.loc[0.0, "ratio"]
    assert (t["note"] == "").all()
    # more than the row's KV memory (about 11.3 GiB a GPU here): not simulated, said so
    big = tput.kv_less_check([r], [100.0]).set_index("kv_less_gib").loc[100.0]
    assert big["note"].startswith("not simulated: the row's KV memory is 11.")
    assert big["ratio"] != big["ratio"]  # NaN


def test_cli_kv_less_gib(capsys):
    assert (
        tput.main(["--only", "h100-sxm-fp16/llama-3-70b/tp2/128-2048", "--kv-less-gib", "2"]) == 0
    )
    out = capsys.readouterr().out
    assert "GiB per GPU less KV memory" in out and "tp2/128-2048" in out
    assert tput.main(["--only", "a100", "--kv-less-gib", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--kv-less-gib" in err
    assert tput.main(["--kv-less-gib", "1", "--write-doc"]) == 2
