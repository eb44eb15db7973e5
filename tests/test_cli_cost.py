"""``disaggsim cost``: JSON outputs of every subcommand, the ``--input`` CSV path, and
one-line errors for bad input."""

from __future__ import annotations

import argparse
import json
import re
import sys

import pytest

from disaggsim.cli import cost as cli_cost
from disaggsim.errors import UserError
from disaggsim.hardware.profile import ProfileError
from tests.costmodel_fixtures import write_fixed_h100


def _main(argv: list[str]) -> int:
    """``disaggsim.cli.main`` when the whole CLI imports, else the same dispatch over a
    parser holding only ``cost`` (other commands may not exist yet)."""
    try:
        from disaggsim.cli import main

        return main(argv)
    except ImportError:
        pass
    parser = argparse.ArgumentParser(prog="disaggsim")
    cli_cost.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (UserError, ProfileError) as e:
        print(f"disaggsim: error: {e}", file=sys.stderr)
        return 2


def _run(capsys, argv):
    rc = _main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    return [json.loads(line) for line in out.splitlines()]


def _fail(capsys, argv) -> str:
    rc = _main(argv)
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("disaggsim: error: ")
    return lines[0]


def test_prefill_json(capsys):
    (obj,) = _run(
        capsys,
        "cost prefill --model llama-3-70b --gpu h100-sxm --tp 4 --batch 2 --prompt-tokens 1024".split(),
    )
    assert obj["model"] == "llama-3-70b" and obj["tp"] == 4 and obj["prompt_tokens"] == 1024
    parts = obj["breakdown"]
    assert set(parts) == {
        "gemm_s", "attention_s", "elementwise_s", "allreduce_s", "lm_head_s", "overhead_s"
    }  # fmt: skip
    assert obj["time_s"] == pytest.approx(sum(parts.values()), rel=1e-12)
    assert parts["allreduce_s"] > 0  # tp 4
    # 2048 tokens × 2 × 70.55e9 FLOP over 4 × 989 TFLOP/s: GEMMs at least 73 ms at peak
    assert parts["gemm_s"] > 2 * 70.55e9 * 2048 / (4 * 989e12)
    assert obj["profile_kind"] == "fitted-public"  # h100-sxm ships fitted to public tables


def test_decode_json(capsys):
    (obj,) = _run(
        capsys,
        "cost decode --model llama-3-8b --gpu a100-80gb --tp 1 --batch 16 --context-tokens 1000".split(),
    )
    assert obj["breakdown"]["allreduce_s"] == 0.0
    assert obj["time_s"] == pytest.approx(obj["base_s"] + obj["per_context_token_s"] * 16_000)
    assert obj["kv_tokens_used"] == 16_000
    # 16 GB of weights over 2.039 TB/s: at least 7.9 ms
    assert obj["time_s"] > 2 * 8.03e9 / 2.039e12


def test_decode_names_the_gemm_kernel_the_engine_runs(capsys):
    """An SGLang FP8 worker on an H100 runs SGLang's own FP8 GEMM kernel (the profile's
    gemm_kernels.sglang-fp8), a vLLM one vLLM's (vllm-fp8); TensorRT-LLM there, and SGLang
    in bf16, run the generic GEMM fit; the kernels give different GEMM times for the same
    shapes."""
    base = "cost decode --model llama-3-70b --gpu h100-sxm --tp 4 --batch 32 --context-tokens 4096"
    got = {}
    for engine, dtype in (
        ("sglang", "fp8"),
        ("vllm", "fp8"),
        ("trtllm", "fp8"),
        ("sglang", "bf16"),
    ):
        argv = [*base.split(), "--engine", engine, "--weight-dtype", dtype]
        (obj,) = _run(capsys, argv)
        got[engine, dtype] = obj
    assert got["sglang", "fp8"]["gemm_kernel"] == "sglang-fp8"
    assert got["vllm", "fp8"]["gemm_kernel"] == "vllm-fp8"
    assert got["trtllm", "fp8"]["gemm_kernel"] == "generic"
    assert got["sglang", "bf16"]["gemm_kernel"] == "generic"
    gemm_s = {key: obj["breakdown"]["gemm_s"] for key, obj in got.items()}
    assert gemm_s["sglang", "fp8"] != pytest.approx(gemm_s["vllm", "fp8"], rel=1e-3)
    assert gemm_s["vllm", "fp8"] != pytest.approx(gemm_s["trtllm", "fp8"], rel=1e-3)


def test_kv_json_seed_facts(capsys):
    (obj,) = _run(capsys, "cost kv --model llama-3-70b --tokens 8192".split())
    assert obj["bytes_per_token"] == 327_680
    assert obj["bytes"] == 8192 * 327_680
    assert obj["gib"] == 2.5
    assert obj["link"] == "nvlink"
    assert obj["transfer_s"] == obj["time_s"]
    # 2.68 GB / 450 GB/s ≈ 6 ms
    assert obj["time_s"] == pytest.approx(8192 * 327_680 / 450e9, rel=0.01)
    (f8,) = _run(
        capsys,
        "cost kv --model llama-3-70b --tokens 8192 --kv-dtype fp8 --link infiniband --gpu a100-80gb".split(),
    )
    assert f8["bytes"] * 2 == obj["bytes"]
    assert f8["bandwidth_bytes_per_s"] == 25e9
    assert f8["time_s"] == pytest.approx(f8["latency_s"] + f8["bytes"] / 25e9)


def test_op_gemm_bounds(capsys, tmp_path):
    # h100 bf16: 2mnk vs (mk + kn + mn) × 2 bytes; m = 1 is memory-bound, m = 8192 compute.
    # The fixed test profile: gemm bf16 launch 5 µs, max_eff 0.75, half_sat 32, mem_eff 0.8.
    prof = ["--profile", str(write_fixed_h100(tmp_path))]
    small_argv = "cost op gemm --gpu h100-sxm --m 1 --n 8192 --k 8192".split()
    (small,) = _run(capsys, small_argv + prof)
    assert small["bound"] == "memory"
    assert small["efficiency"] == 0.8  # mem_eff
    assert small["bytes"] == (8192 + 8192 * 8192 + 8192) * 2
    assert small["time_s"] == pytest.approx(5e-6 + small["bytes"] / (3.35e12 * 0.8))
    (big,) = _run(capsys, "cost op gemm --gpu h100-sxm --m 8192 --n 8192 --k 8192".split() + prof)
    assert big["bound"] == "compute"
    assert big["flop"] == 2 * 8192**3
    assert big["efficiency"] == pytest.approx(0.75 * 8192 / (8192 + 32))
    assert big["time_s"] == pytest.approx(5e-6 + 2 * 8192**3 / (989e12 * big["efficiency"]))
    f8_argv = "cost op gemm --gpu h100-sxm --m 8192 --n 8192 --k 8192 --dtype fp8".split()
    (f8,) = _run(capsys, f8_argv + prof)
    assert f8["time_s"] < big["time_s"]
    # the shipped profile answers too, bounded by the datasheet roofline
    (shipped,) = _run(capsys, small_argv)
    assert shipped["bound"] == "memory" and shipped["time_s"] > small["bytes"] / 3.35e12


def test_op_attention(capsys):
    (dec,) = _run(
        capsys,
        "cost op decode-attention --gpu a100-80gb --batch 32 --context-tokens 1024 "
        "--heads 32 --kv-heads 8 --head-dim 128".split(),
    )
    assert dec["bound"] == "memory"
    assert dec["bytes"] == 2 * 32 * 1024 * 8 * 128 * 2
    assert dec["time_s"] > dec["bytes"] / 2.039e12
    (pre,) = _run(
        capsys,
        "cost op prefill-attention --gpu a100-80gb --batch 1 --prompt-tokens 2048 "
        "--heads 32 --kv-heads 8 --head-dim 128".split(),
    )
    assert pre["bound"] == "compute"
    assert pre["flop"] == 4 * (2048 * 2049 / 2) * 32 * 128
    assert pre["time_s"] > pre["flop"] / 312e12


def test_op_decode_attention_reports_every_term(capsys, tmp_path):
    # the fixed h100 profile with every decode-attention term switched on, by hand:
    # floor 8 µs + multi-sequence floor 6 µs, 0.1 µs per sequence, 1e-10 s per
    # (sequence × KV head × head-dim element), bw_eff 0.7 × share P / (P + 16)
    path = write_fixed_h100(tmp_path)
    prof = json.loads(path.read_text())
    prof["ops"]["decode_attention"]["bf16"].update(
        per_seq_kv_elem_s=1e-10, par_half_sat=16.0, multi_floor_s=6e-6
    )
    path.write_text(json.dumps(prof))
    argv = "cost op decode-attention --gpu h100-sxm --context-tokens 1024 --heads 32 --kv-heads 8 --head-dim 128 --profile".split()
    (one,) = _run(capsys, [*argv, str(path), "--batch", "1"])
    (many,) = _run(capsys, [*argv, str(path), "--batch", "32"])
    # one sequence: single-pass path (floor + 0.1 µs per sequence)
    assert one["fixed_s"] == pytest.approx(8e-6 + 1e-7)
    assert many["fixed_s"] == pytest.approx(14e-6 + 32 * 1e-7)
    assert many["items_s"] == pytest.approx(1e-10 * 32 * 8 * 128)
    assert many["parallel_share"] == pytest.approx(256 / (256 + 16))
    assert many["efficiency"] == pytest.approx(0.7 * 256 / 272)
    kv = 2 * 32 * 1024 * 8 * 128 * 2
    assert many["bytes"] == kv
    assert many["stream_s"] == pytest.approx(kv / (3.35e12 * 0.7 * 256 / 272))
    assert many["roofline_s"] == pytest.approx(kv / 3.35e12)
    for r in (one, many):  # no overlap, no split-KV fill: the terms add
        assert r["overlap"] == 0.0 and r["shortfall_s"] == 0.0
        assert r["time_s"] == pytest.approx(r["fixed_s"] + r["items_s"] + r["stream_s"])
    assert one["parallel_share"] == pytest.approx(8 / 24)


def test_op_decode_attention_takes_the_query_heads_per_kv_head_from_heads(capsys, tmp_path):
    """A grouped kernel's group rate and query-head work follow --heads / --kv-heads, as
    the step model runs them (the probe passed one query head per KV head whatever
    --heads said): group rate 1e12 B/s, 8 query heads a KV head, so every KV byte costs
    8e-12 s (above the 1 / (3.35e12 x 0.7) bandwidth), and 1e-12 s per query-head
    element adds 4 x 64 x 128 of them."""
    path = write_fixed_h100(tmp_path)
    prof = json.loads(path.read_text())
    prof["ops"]["decode_attention"]["bf16"].update(group_bytes_per_s=1e12, per_q_elem_s=1e-12)
    path.write_text(json.dumps(prof))
    argv = "cost op decode-attention --gpu h100-sxm --batch 4 --context-tokens 4096 --kv-heads 8 --head-dim 128 --profile".split()
    (mha,) = _run(capsys, [*argv, str(path), "--heads", "8"])
    (gqa,) = _run(capsys, [*argv, str(path), "--heads", "64"])
    kv = 2 * 4 * 4096 * 8 * 128 * 2
    assert (mha["q_per_kv"], gqa["q_per_kv"]) == (1.0, 8.0)
    assert gqa["stream_s"] == pytest.approx(kv * 8 / 1e12)
    assert mha["stream_s"] == pytest.approx(kv * 1 / 1e12)
    assert gqa["items_s"] == pytest.approx(1e-12 * 4 * 64 * 128)
    assert mha["items_s"] == pytest.approx(1e-12 * 4 * 8 * 128)
    for r in (mha, gqa):
        assert r["time_s"] == pytest.approx(r["fixed_s"] + r["items_s"] + r["stream_s"])


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm"])
def test_op_decode_attention_terms_rebuild_a_split_kv_kernels_time(capsys, gpu):
    """The shipped profiles' FlashAttention decode is split-KV (overlap 1): its few-item
    fill is a shortfall on the KV stream, min(stream × h / P, split_fill_s × h / (P + h)),
    not part of the floor (kernels lane, 2026-12-04). The printout's ``fixed_s`` +
    per_sequence_s + memory_s missed ``time_s`` by up to 30 % (a100, one sequence of
    1,024 tokens); the printed terms rebuild it by ``time_form`` now, at a short context
    (4 x 64 tokens: the stream's share loss binds), a long one (64 x 32,768: the fill
    binds) and one sequence of 1,024 (a100 the loss, h100 the fill)."""
    binds = []
    for batch, context in ((1, 1024), (4, 64), (64, 32768)):
        argv = f"cost op decode-attention --gpu {gpu} --batch {batch} --context-tokens {context} --heads 32 --kv-heads 8 --head-dim 128"
        (r,) = _run(capsys, argv.split())
        assert r["overlap"] == 1.0 and r["split_fill_s"] > 0.0
        items, h = batch * 8, r["par_half_sat"]
        loss, fill = r["stream_s"] * h / items, r["split_fill_s"] * h / (items + h)
        binds.append("fill" if fill < loss else "loss")
        shortfall = min(loss, fill)
        assert r["shortfall_s"] == pytest.approx(shortfall)
        assert r["fixed_s"] == pytest.approx(
            r["floor_s"] + r["multi_floor_s"] * (batch > 1) + r["per_seq_s"] * batch
        )
        stream = r["stream_s"] + r["shortfall_s"]
        assert r["time_s"] == pytest.approx(r["fixed_s"] + max(r["items_s"], stream))
    assert binds[1:] == ["loss", "fill"], binds  # both forms of the shortfall met


def test_input_csv_one_line_per_row_in_order(capsys, tmp_path):
    f = tmp_path / "q.csv"
    f.write_text(
        "model,gpu,tp,batch,prompt_tokens\n"
        "llama-3-8b,h100-sxm,1,1,512\n"
        "llama-3-70b,h100-sxm,8,2,4096\n"
        "llama-3-8b,a100-80gb,2,4,128\n"
    )
    rows = _run(capsys, ["cost", "prefill", "--input", str(f)])
    assert [(r["model"], r["gpu"], r["tp"], r["batch"], r["prompt_tokens"]) for r in rows] == [
        ("llama-3-8b", "h100-sxm", 1, 1, 512),
        ("llama-3-70b", "h100-sxm", 8, 2, 4096),
        ("llama-3-8b", "a100-80gb", 2, 4, 128),
    ]
    (single,) = _run(
        capsys,
        "cost prefill --model llama-3-70b --gpu h100-sxm --tp 8 --batch 2 --prompt-tokens 4096".split(),
    )
    assert rows[1] == single


def test_input_csv_flags_fill_missing_columns(capsys, tmp_path):
    f = tmp_path / "q.csv"
    f.write_text("gpu,m\nh100-sxm,1\na100-80gb,4096\n")
    rows = _run(capsys, ["cost", "op", "gemm", "--input", str(f), "--n", "4096", "--k", "4096"])
    assert [(r["gpu"], r["m"], r["n"]) for r in rows] == [
        ("h100-sxm", 1, 4096),
        ("a100-80gb", 4096, 4096),
    ]


def test_input_csv_kv_and_decode(capsys, tmp_path):
    f = tmp_path / "kv.csv"
    f.write_text(
        "model,tokens,kv_dtype,link,gpu\nllama-3-70b,8192,fp8,pcie,\nllama-2-7b,100,bf16,roce,h100-sxm\n"
    )
    a, b = _run(capsys, ["cost", "kv", "--input", str(f)])
    assert a["bytes"] == 8192 * 163_840 and a["gpu"] is None
    assert b["bytes"] == 100 * 524_288 and b["bandwidth_bytes_per_s"] == 50e9
    g = tmp_path / "dec.csv"
    g.write_text(
        "model,gpu,tp,batch,context_tokens\nmistral-7b,l40s,1,8,1000\nmistral-7b,l40s,1,8,5000\n"
    )
    lo, hi = _run(capsys, ["cost", "decode", "--input", str(g)])
    # both above the attention kernel's knee: the step is affine in the context there
    assert 8 * 1000 >= lo["knee_context_tokens"]
    assert hi["time_s"] - lo["time_s"] == pytest.approx(hi["per_context_token_s"] * 32_000)


@pytest.mark.parametrize(
    "csv_text, pattern",
    [
        ("model,gpu,tp,batch,prompt_tokens\nllama-3-8b,h100-sxm,1,1,512\nllama-9b,h100-sxm,1,1,5\n",
         r"q\.csv: line 3: column model: unknown value 'llama-9b' \(allowed: llama-2-7b"),
        ("model,gpu,tp,batch,prompt_tokens\nllama-3-8b,h100-sxm,one,1,512\n",
         r"q\.csv: line 2: column tp: expected an integer, got 'one'"),
        ("model,gpu,tp,batch\nllama-3-8b,h100-sxm,1,1\n",
         r"q\.csv: line 2: missing column prompt_tokens"),
        ("model,gpu,tp,batch,prompt_tokens,seq_len\nllama-3-8b,h100-sxm,1,1,512,3\n",
         r"q\.csv: line 1: unknown column 'seq_len'"),
        ("model,gpu,tp,batch,prompt_tokens\nllama-3-8b,h100-sxm,1,0,512\n",
         r"q\.csv: line 2: column batch: must be >= 1, got 0"),
        ("model,gpu,tp,batch,prompt_tokens\nllama-3-70b,h100-sxm,1,1,512\n",
         r"q\.csv: line 2: model llama-3-70b .* does not fit on 1 × h100-sxm.*use tp >= 2"),
        ("", r"q\.csv: empty file"),
    ],
)  # fmt: skip
def test_input_csv_errors_name_file_line_column(capsys, tmp_path, csv_text, pattern):
    f = tmp_path / "q.csv"
    f.write_text(csv_text)
    line = _fail(capsys, ["cost", "prefill", "--input", str(f)])
    assert re.search(pattern, line), line


def test_flag_errors(capsys, tmp_path):
    assert "missing --tp" in _fail(
        capsys, "cost prefill --model llama-3-8b --gpu h100-sxm --batch 1 --prompt-tokens 5".split()
    )
    assert "--gpu: unknown value 'v100'" in _fail(
        capsys, "cost op gemm --gpu v100 --m 1 --n 1 --k 1".split()
    )
    assert _fail(capsys, "cost op gemm --gpu H200 --m 1 --n 1 --k 1".split()).endswith(
        "--gpu: unknown value 'H200' (allowed: a100-80gb, h100-sxm, h100-pcie, h200-sxm, b200, "
        "l40s, h800-sxm) (did you mean h200-sxm?)"
    )
    assert "a100-80gb has no FP8" in _fail(
        capsys, "cost op gemm --gpu a100-80gb --m 1 --n 1 --k 1 --dtype fp8".split()
    )
    assert "l40s has no NVLink" in _fail(
        capsys, "cost kv --model llama-3-8b --tokens 10 --gpu l40s".split()
    )
    assert "cannot read" in _fail(capsys, ["cost", "decode", "--input", str(tmp_path / "nope.csv")])
    assert "must divide heads" in _fail(
        capsys,
        "cost op decode-attention --gpu h100-sxm --batch 1 --context-tokens 1 --heads 32 --kv-heads 5 --head-dim 128".split(),
    )


@pytest.mark.parametrize(
    "argv",
    [
        "cost prefill --model llama-3-8b --gpu h100-sxm --batch 1 --prompt-tokens 5",
        "cost decode --model llama-3-8b --gpu h100-sxm --batch 1 --context-tokens 5 --dp 2",
        "cost op decode-attention --gpu h100-sxm --batch 1 --context-tokens 1 --heads 32 --kv-heads 5 --head-dim 128",
        "cost op prefill-attention --gpu h100-sxm --batch 1 --prompt-tokens 1 --heads 8 --kv-heads 3 --head-dim 64",
        "cost kv --model llama-3-8b --tokens 10 --gpu h100-pcie",
        "cost op gemm --gpu a100-80gb --m 1 --n 1 --k 1 --dtype fp8",
        "cost prefill --model llama-3-70b --gpu h100-sxm --tp 1 --batch 1 --prompt-tokens 5",
        "cost prefill --model llama-3-8b --gpu h100-sxm --tp 1 --batch 1 --prompt-tokens 5 --attention-backend sdpa-cudnn",
        "cost prefill --model llama-3-8b --gpu h100-sxm --tp 1 --batch 1 --prompt-tokens 5 --profile {tmp}/nope.json",
        "cost decode --input {tmp}/nope.csv",
        "cost prefill --input {tmp}/q.csv",
    ],
)
def test_every_error_starts_with_cost_and_its_subcommand(capsys, tmp_path, argv):
    """Before: the cost model's own errors ('missing --tp (or --gpus)', 'kv_heads (5) must
    divide heads (32)', 'h100-pcie has no NVLink ...'), a profile's and the CSV's lacked
    the ``cost <subcommand>:`` that flag errors (and argparse's) start with."""
    (tmp_path / "q.csv").write_text(
        "model,gpu,tp,batch,prompt_tokens\nllama-3-70b,h100-sxm,1,1,5\n"
    )
    words = argv.replace("{tmp}", str(tmp_path)).split()
    sub = " ".join(words[1:3] if words[1] == "op" else words[1:2])
    line = _fail(capsys, words)
    assert line.startswith(f"disaggsim: error: cost {sub}: "), line
    assert line.count(f"cost {sub}: ") == 1, line


def test_an_unfitted_backend_is_named_as_given(capsys, tmp_path):
    """The cost model names the field (``attention_backend: 'flex' is not fitted ...``);
    given as a flag, the error names the flag; given in a CSV column, the line and column."""
    line = _fail(
        capsys,
        "cost decode --model llama-3-8b --gpu a100-80gb --tp 1 --batch 8 --context-tokens 1024 --attention-backend flex".split(),
    )
    assert line.startswith(
        "disaggsim: error: cost decode: --attention-backend: 'flex' is not fitted"
    ), line
    (tmp_path / "q.csv").write_text(
        "model,gpu,tp,batch,context_tokens,attention_backend\nllama-3-8b,a100-80gb,1,8,1024,flex\n"
    )
    line = _fail(capsys, ["cost", "decode", "--input", str(tmp_path / "q.csv")])
    assert ": line 2: attention_backend: 'flex' is not fitted" in line, line


@pytest.mark.parametrize("command", ["decode", "op decode-attention"])
def test_context_tokens_help_says_per_sequence_and_what_the_coefficients_count(command):
    """``--context-tokens`` is per sequence while the printed per_context_token_s and
    knee_context_tokens count the batch's total (batch x it): the help said only "cached
    tokens per sequence", and a reader multiplied the per-token line by the flag's value."""
    from disaggsim.cli.cost import COMMANDS

    (field,) = [f for f in COMMANDS[command][1] if f.name == "context_tokens"]
    assert "per sequence" in field.help and "batch x this" in field.help
    assert "per_context_token_s" in field.help


def test_op_decode_attention_of_a_wave_kernel_prints_its_lines(capsys, tmp_path):
    """A profile whose decode kernel is a multi-block wave kernel (XQA's form, 4 SMs):
    ``time_s`` is the smallest of its lines at C = batch x context_tokens, and the
    printout gives those lines instead of terms the form does not have."""
    path = write_fixed_h100(tmp_path)
    prof = json.loads(path.read_text())
    prof["ops"]["decode_attention"]["bf16"] = dict(
        floor_s=5e-6, per_seq_s=0.0, bw_eff=0.75, overlap=1.0, wave_sms=4.0, cta_s=1e-6,
        cta_q_elem_s=1e-10, cta_bytes_per_s=5e11, split_s=2e-6, split_elem_s=1e-11,
    )  # fmt: skip
    path.write_text(json.dumps(prof))
    argv = "cost op decode-attention --gpu h100-sxm --batch 4 --context-tokens 3000 --heads 32 --kv-heads 8 --head-dim 128 --profile"
    (r,) = _run(capsys, [*argv.split(), str(path)])
    assert r["time_form"] == "min(wave_lines)" and "stream_s" not in r
    at = [ln["base_s"] + ln["per_context_token_s"] * 4 * 3000 for ln in r["wave_lines"]]
    assert len(at) > 1 and r["time_s"] == pytest.approx(min(at))
