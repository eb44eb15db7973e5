"""``disaggsim cost decode`` prints the lines its ``time_s`` is made of: the stream-bound
line, the item-bound line, for a multi-block wave decode kernel (TensorRT-LLM's XQA) its
other lines and for a kernel with an occupancy term (masked MHA) its stream line per
context interval, composed as ``step_form`` says; the printed numbers reproduce
``time_s``, and the knee is where the kernel-bound part passes the item-bound line."""

from __future__ import annotations

import json

import pytest

from disaggsim.cli import main

CASES = [  # model, tp, engine: dense GQA and MHA layouts, an MoE model, an eager engine
    ("llama-3-8b", 1, "trtllm"),
    ("llama-3-70b", 4, "trtllm"),
    ("llama-2-7b", 1, "trtllm"),  # masked MHA: no wave kernel
    ("llama-3-8b", 1, "vllm"),
    ("llama-3-70b", 4, "sglang"),
    ("llama-2-70b", 4, "vllm-eager-2023"),
    ("mixtral-8x7b", 2, "vllm"),
]


def _line(d: dict, c: float) -> float:
    return d["base_s"] + d["per_context_token_s"] * c


def _from_printed(out: dict, c: float) -> float:
    """``time_s`` from the printed lines, composed as ``step_form`` names them."""
    kernel = _line(out, c)
    form = out["step_form"]
    if "interval" in form:  # the stream line of the context interval holding c
        for span in out["interval_lines"]:
            if c >= span["from_context_tokens"]:
                kernel = _line(span, c)
    if "min_lines" in form:
        kernel = min([kernel, *(_line(m, c) for m in out["min_lines"])])
    if form.startswith("max(item_bound"):
        item = {"base_s": out["item_bound_base_s"],
                "per_context_token_s": out["item_bound_per_context_token_s"]}  # fmt: skip
        return max(_line(item, c), kernel)
    return kernel


def _decode(capsys, model: str, tp: int, engine: str, batch: int, ctx: int) -> dict:
    main(["cost", "decode", "--model", model, "--gpu", "h100-sxm", "--tp", str(tp),
          "--engine", engine, "--batch", str(batch), "--context-tokens", str(ctx)])  # fmt: skip
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(("model", "tp", "engine"), CASES)
def test_printed_lines_reproduce_time_s(capsys, model: str, tp: int, engine: str) -> None:
    for batch in (1, 8, 64):
        for ctx in (16, 300, 2048, 16384):
            out = _decode(capsys, model, tp, engine, batch, ctx)
            c = float(batch * ctx)
            assert _from_printed(out, c) == pytest.approx(out["time_s"], rel=1e-12), (batch, ctx)


def test_masked_mha_prints_its_interval_lines(capsys) -> None:
    """Llama-2-7B on TensorRT-LLM (masked MHA, one query head per KV head) at batch 64
    (2,048 items >= 4 x 132): its stream line steepens where one block resides per SM
    (19,284 cached tokens per sequence on the H100: 64 x 19,284 + 1); at 20,000 tokens per
    sequence time_s is that interval's line."""
    out = _decode(capsys, "llama-2-7b", 1, "trtllm", 64, 20000)
    spans = out["interval_lines"]
    assert "interval" in out["step_form"]
    assert spans[0]["from_context_tokens"] == 64 * 19284 + 1
    assert spans[0]["per_context_token_s"] > out["per_context_token_s"]
    c = 64 * 20000.0
    assert out["time_s"] == pytest.approx(_line(spans[0], c), rel=1e-12)
    # the same lines keyed by the longest sequence's cached tokens (the kernel sizes its
    # shared memory by it): one sequence of 19,284 among short ones takes that line
    longest = out["longest_lines"]
    assert [x["from_longest_history_tokens"] for x in longest] == [
        (x["from_context_tokens"] - 1) / 64 for x in spans
    ]
    assert longest[0]["per_context_token_s"] == spans[0]["per_context_token_s"]


def test_xqa_prints_several_lines(capsys) -> None:
    out = _decode(capsys, "llama-3-8b", 1, "trtllm", 8, 4096)
    assert out["step_form"] == "max(item_bound, min(stream, min_lines))"
    assert len(out["min_lines"]) >= 1
    c = 8.0 * 4096
    # the most-split line alone is too slow: another line is the kernel's time here (by
    # more than rounding; 3.4 % with the shipped H100 fit)
    assert _line(out, c) > out["time_s"] * (1.0 + 1e-9)
    # vLLM's FlashAttention (split-KV): one more line, its stream at the few items' share
    # (ops.decode_attention_share_line), the smaller one at short contexts only
    vllm = _decode(capsys, "llama-3-8b", 1, "vllm", 8, 4096)
    assert vllm["step_form"] == "max(item_bound, min(stream, min_lines))"
    assert len(vllm["min_lines"]) == 1
    assert _line(vllm, 8.0 * 4096) == pytest.approx(vllm["time_s"], rel=1e-12)


@pytest.mark.parametrize("batch", [1, 8, 64])
def test_knee_is_where_the_kernel_part_passes_the_item_line(capsys, batch: int) -> None:
    """Below the printed knee the step is the item-bound line (constant in C for XQA);
    above it, the smallest kernel line. Before, the knee was the most-split line's
    crossing alone."""
    out = _decode(capsys, "llama-3-8b", 1, "trtllm", batch, 64)
    knee = out["knee_context_tokens"]
    item = out["item_bound_base_s"]
    assert out["item_bound_per_context_token_s"] == 0.0

    def kernel(c: float) -> float:
        return min(_line(out, c), *(_line(m, c) for m in out["min_lines"]))

    if knee > 0.0:
        assert kernel(knee) == pytest.approx(item, rel=1e-9)
        assert kernel(0.99 * knee) < item < kernel(1.01 * knee)
    else:
        assert kernel(0.0) >= item
        assert kernel(1.0) > item


@pytest.mark.parametrize("batch", [1, 8, 64])
def test_knee_under_a_launch_floor_with_the_wave_kernel(batch: int) -> None:
    """TensorRT-LLM's XQA under an eager launch floor (0.4 ms a layer): the item-bound line
    is the floor, above every kernel line at short contexts; the step leaves it where the
    smallest kernel line passes it, not where the most-split line alone does (the knee
    before: 11-22% early)."""
    import dataclasses

    from disaggsim.costmodel.step import build_worker_cost
    from disaggsim.hardware.engines import load_engines

    eng = dataclasses.replace(load_engines()["trtllm"], launch_per_layer_s=4e-4, cuda_graphs=False)
    w = build_worker_cost("llama-3-8b", "h100-sxm", 1, engine=eng)
    floor = w.decode_item_coeffs(batch)
    assert floor[1] == 0.0
    knee = w.decode_knee_tokens(batch)
    assert knee > 0.0
    assert w.decode_time_s(batch, 0.99 * knee) == pytest.approx(floor[0], rel=1e-12)
    assert w.decode_time_s(batch, knee) == pytest.approx(floor[0], rel=1e-9)
    assert w.decode_time_s(batch, 1.01 * knee) > floor[0] * (1 + 1e-4)
