"""Regressions found by the catalog scenario fuzzer (tests/test_scenario_properties_catalog.py):
each scenario here once raised a traceback, or a refusal that did not say where. The
expected messages are written by hand from the scenario (which field is wrong and why),
never taken from the code under test."""

from __future__ import annotations

import pytest

from disaggsim.errors import UserError
from disaggsim.run import simulate


def _scenario(**over) -> dict:
    s = {
        "name": "reg",
        "seed": 1,
        "model": "llama-3-8b",
        "architecture": "colocated",
        "pool": {"gpu": "h100-sxm", "num_workers": 1, "tp": 1, "scheduler": "chunked"},
        "slo": {"ttft_ms": 2000, "itl_ms": 100},
        "workload": {
            "kind": "synthetic",
            "rate_per_s": 5.0,
            "num_requests": 4,
            "prompt_tokens": {"dist": "fixed", "value": 100},
            "output_tokens": {"dist": "fixed", "value": 10},
        },
        "sim": {"duration_s": 2.0},
    }
    s.update(over)
    return s


def _refusal(s: dict) -> str:
    with pytest.raises(UserError) as e:
        simulate(s)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("dtype", ["mxfp4", "nvfp4"])
def test_fp4_experts_of_an_fp8_released_model_need_fp8_on_the_gpu(dtype):
    """DeepSeek-R1 is released in fp8 blocks: with FP4 experts its attention and dense
    layers stay fp8, which an A100 cannot run (was: ValueError 'this GPU has no FP8
    tensor cores' from inside the cost model)."""
    s = _scenario(
        model="deepseek-r1",
        weight_dtype=dtype,
        pool={
            "gpu": "a100-80gb",
            "num_workers": 1,
            "tp": 1,
            "dp": 16,
            "scheduler": "chunked",
            "max_batch_tokens": 8192,
        },
    )
    msg = _refusal(s)
    assert msg.startswith("<scenario>: pool: weight_dtype: a100-80gb has no FP8 tensor cores")
    assert "deepseek-r1" in msg and msg.endswith("(allowed there: bf16, fp16)"), msg


def test_fp4_experts_of_a_bf16_attention_model_run_on_a100():
    """gpt-oss is released with MXFP4 experts and bf16 attention: no FP8 needed, so the
    refusal above must not reach it."""
    s = _scenario(
        model="gpt-oss-20b",
        weight_dtype="released",
        pool={"gpu": "a100-80gb", "num_workers": 1, "tp": 1, "scheduler": "chunked"},
    )
    res = simulate(s)
    assert set(res.requests["status"]) == {"completed"}


@pytest.mark.parametrize("gpu", ["h100-pcie", "l40s"])
def test_nvlink_fabric_on_a_gpu_without_nvlink_names_the_field(gpu):
    """fabric.link nvlink between pools of a GPU without NVLink (was: 'h100-pcie has no
    NVLink (...)' with neither the file nor the field)."""
    pool = {"gpu": gpu, "num_workers": 1, "tp": 1}
    s = _scenario(
        architecture="disaggregated",
        pool=None,
        prefill_pool=pool,
        decode_pool=pool,
        fabric={"link": "nvlink"},
    )
    del s["pool"]
    msg = _refusal(s)
    assert msg.startswith(f"<scenario>: fabric.link: {gpu} has no NVLink"), msg


def test_fp8_weights_of_a_dense_model_on_a100_name_weight_dtype():
    """Dense fp8 weights on an A100 (no FP8 tensor cores): the refusal names the field,
    as the MoE one does (was '<scenario>: pool: a100-80gb has no FP8 tensor cores: weight
    dtype fp8 is not supported there (use bf16 or fp16)')."""
    s = _scenario(
        weight_dtype="fp8",
        pool={"gpu": "a100-80gb", "num_workers": 1, "tp": 1, "scheduler": "chunked"},
    )
    msg = _refusal(s)
    assert msg == (
        "<scenario>: pool: weight_dtype: a100-80gb has no FP8 tensor cores for fp8 weights "
        "(allowed there: bf16, fp16)"
    ), msg


def test_trace_hash_blocks_that_do_not_match_name_hash_block_tokens(tmp_path):
    """A Mooncake trace of 512-token hash blocks read with hash_block_tokens 64: the
    refusal names the trace line and the field to change (was the trace line alone)."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]}\n'
    )
    s = _scenario(
        workload={
            "kind": "trace",
            "path": str(trace),
            "format": "mooncake",
            "hash_block_tokens": 64,
        },
    )
    msg = _refusal(s)
    assert msg.startswith(f"<scenario>: {trace}:1: hash_ids has 2 ids"), msg
    assert "workload.hash_block_tokens" in msg, msg


def test_written_scenario_of_a_dense_pool_with_an_empty_moe_section_runs_again(tmp_path):
    """`moe: {}` on a dense model runs (no option set); the scenario.yaml its result folder
    holds spells every MoE option out at its default, and must run the same requests
    again (was: refused, 'moe: model llama-3-8b is dense: MoE options need an MoE model
    (... set: all_to_all, ...)')."""
    import pandas as pd

    from disaggsim.run import write_results

    s = _scenario(
        pool={"gpu": "h100-sxm", "num_workers": 1, "tp": 1, "scheduler": "chunked", "moe": {}}
    )
    res = simulate(s)
    folder = write_results(res, tmp_path / "out", plots=False)
    again = simulate(folder / "scenario.yaml")
    pd.testing.assert_frame_equal(res.requests, again.requests, check_exact=True)


def test_planner_reads_a_written_dense_scenario_with_moe_defaults(tmp_path):
    """The planner's worker costs of the same written scenario.yaml (every MoE option spelt
    out at its default on a dense pool): TP 1 of llama-3-8b fits on one H100 (was: the
    options refused inside the TP search, and `disaggsim plan` said no worker fits)."""
    from disaggsim.config.loader import load_scenario
    from disaggsim.plan.analytic import fitting_tps, moe_options
    from disaggsim.run import write_results

    s = _scenario(
        pool={"gpu": "h100-sxm", "num_workers": 1, "tp": 1, "scheduler": "chunked", "moe": {}}
    )
    folder = write_results(simulate(s), tmp_path / "out", plots=False)
    loaded = load_scenario(folder / "scenario.yaml")
    assert loaded.raw["pool"]["moe"]["routing"] == "balanced"  # the defaults are spelt out
    assert moe_options(loaded) == {}
    assert fitting_tps(loaded, "h100-sxm", 8, 4096) == [1, 2, 4, 8]


def test_moe_options_away_from_their_defaults_on_a_dense_model_are_refused():
    """The other side of the above: an option that would change an MoE run is still an
    error on a dense model, naming the section."""
    s = _scenario(
        pool={
            "gpu": "h100-sxm",
            "num_workers": 1,
            "tp": 1,
            "scheduler": "chunked",
            "moe": {"two_batch_overlap": True},
        }
    )
    msg = _refusal(s)
    assert msg.startswith("<scenario>: pool: moe: model llama-3-8b is dense"), msg
    assert "two_batch_overlap" in msg, msg


def test_a_request_abandoned_between_chunks_frees_its_kv_at_once():
    """Chunked prefill of long prompts in one-token chunks; every client gives up after
    0.5 s. A request abandoned between two chunks of its prompt stops there (vLLM aborts
    it at its next step) and its KV is freed: the worker is empty long before the
    horizon. It used to be prefilled to its end for nobody, one token per iteration,
    holding its blocks, past the 600 s drain (found by the catalog fuzzer on
    DeepSeek-R1: seed 1700, case 516)."""
    s = _scenario(
        pool={
            "gpu": "h100-sxm",
            "num_workers": 1,
            "tp": 1,
            "scheduler": "chunked",
            "max_batch_tokens": 1,
            "max_batch_seqs": 1,  # vLLM refuses fewer batch tokens than sequences
        },
        router={"client_timeout_s": 0.5},
        workload={
            "kind": "synthetic",
            "rate_per_s": 20.0,
            "num_requests": 10,
            "prompt_tokens": {"dist": "fixed", "value": 8000},
            "output_tokens": {"dist": "fixed", "value": 10},
            "max_tokens": 10,
        },
        sim={"duration_s": 1.0, "max_drain_s": 600.0},
    )
    res = simulate(s)
    assert set(res.requests["status"]) == {"abandoned"}
    assert [w.kv_used_end_tokens for w in res.raw.workers] == [0]
    # nothing left to do once the clients are gone: the run ends soon after the last
    # timeout (arrivals within 1 s, timeouts 0.5 s later), far inside the drain
    assert res.raw.end_at_s < 10.0, res.raw.end_at_s


@pytest.mark.parametrize("policy", ["radix", "lru"])
def test_a_request_abandoned_between_chunks_frees_its_kv_with_a_prefix_cache(policy):
    """As above on a worker with a prefix cache (multi-turn sessions carry the chains):
    the blocks of its finished chunks stay cached, unpinned; the rest are dropped, and
    the worker holds nothing at the end (it held 24,048 tokens at the horizon)."""
    s = _scenario(
        pool={
            "gpu": "h100-sxm",
            "num_workers": 1,
            "tp": 1,
            "scheduler": "chunked",
            "max_batch_tokens": 1,
            "max_batch_seqs": 1,  # vLLM refuses fewer batch tokens than sequences
        },
        router={"client_timeout_s": 0.5},
        cache={"policy": policy},
        workload={
            "kind": "sessions",
            "rate_per_s": 20.0,
            "num_requests": 10,
            "turns": {"dist": "fixed", "value": 1},
            "system_prompt_tokens": 6000,
            "user_tokens": {"dist": "fixed", "value": 2000},
            "output_tokens": {"dist": "fixed", "value": 10},
            "think_time_s": {"dist": "fixed", "value_s": 0.0},
            "max_tokens": 10,
        },
        sim={"duration_s": 1.0, "max_drain_s": 600.0},
    )
    res = simulate(s)
    assert set(res.requests["status"]) == {"abandoned"}
    assert [w.kv_used_end_tokens for w in res.raw.workers] == [0]
    assert res.raw.end_at_s < 10.0, res.raw.end_at_s


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("2001-02-30", "timestamp"),  # a date YAML recognises, a day the month lacks
        ("2001-12-14t21:59:43.10-25:00", "timestamp"),  # an offset beyond a day
        ("!!timestamp x", "timestamp"),
        ("!!int abc", "int"),
        ("!!float x", "float"),
        ("9" * 5000, "int"),  # beyond Python's 4,300-digit limit on int()
    ],
)
def test_a_yaml_value_pyyaml_cannot_build_is_one_line_naming_its_line(tmp_path, text, kind):
    """PyYAML's constructors raise ValueError/AttributeError, not YAMLError, on these:
    `disaggsim run` printed a traceback (found by the mutated-file fuzzer of
    tests/test_fuzz_cli.py). Now the file's malformed-YAML line, naming the line."""
    from disaggsim.config.loader import load_scenario

    path = tmp_path / "s.yaml"
    path.write_text(f"name: reg\nseed: {text}\nmodel: llama-3-8b\n")
    with pytest.raises(UserError) as e:
        load_scenario(path)
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 300, msg
    assert msg.startswith(f"{path}: line 2: malformed YAML (cannot read "), msg
    assert f"as a YAML {kind} (" in msg, msg
    # the same value given with --set is read as the text it is (then refused by the field)
    with pytest.raises(UserError) as e:
        load_scenario(_scenario(), [f"seed={text}"])
    assert str(e.value).startswith("<scenario>: seed: "), str(e.value)


@pytest.mark.parametrize(
    ("trace", "given"),
    [
        ("mooncake_conversation_trace.jsonl", "azure"),
        ("AzureLLMInferenceTrace_conv.csv", "mooncake"),
    ],
)
def test_a_trace_format_given_for_the_other_kind_of_file_names_workload_format(
    shared_data, trace, given
):
    """`format: azure` on a Mooncake JSONL trace said "...jsonl:7: malformed CSV: Expected
    18 fields in line 7, saw 49", `format: mooncake` on an Azure CSV "...csv:1: invalid
    JSON" (tests/test_fuzz_cli.py-style trace option fuzz, seed 8001): the file blamed,
    not the field. Now the refusal names workload.format and its allowed values."""
    s = _scenario(
        workload={"kind": "trace", "path": str(shared_data / "traces" / trace), "format": given}
    )
    msg = _refusal(s)
    assert msg.startswith(f"<scenario>: workload.format: {given}, but "), msg
    assert "(allowed: azure, mooncake, auto)" in msg, msg
