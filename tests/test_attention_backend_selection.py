"""``attention_backend: auto`` runs the serving engine's own attention kernels, one rule for
prefill and decode: a vLLM worker runs vLLM's kernels, an SGLang worker SGLang's, a
TensorRT-LLM worker TensorRT-LLM's, never another framework's kernel because its fit is
faster (step.pick_attention_backends, engines.ENGINE_FRAMEWORKS,
profile.ATTENTION_BACKEND_FRAMEWORKS)."""

from __future__ import annotations

import dataclasses

import pytest

from disaggsim.catalog import get_model
from disaggsim.costmodel.step import build_worker_cost, pick_attention_backends, valid_tps
from disaggsim.hardware.engines import ENGINE_FRAMEWORKS, ENGINE_NAMES, ZERO_ENGINE, load_engines
from disaggsim.hardware.profile import (
    ATTENTION_BACKEND_FRAMEWORKS,
    ATTENTION_BACKENDS,
    load_profile,
)

# the kernels each shipped engine runs, written out (not read from the maps under test)
OWN = {
    "vllm": "vllm-flash",
    "vllm-eager-2023": "vllm-flash",
    "sglang": "sglang-flash",
    "trtllm": "trtllm",
}
GPUS = ("a100-80gb", "h100-sxm", "h200-sxm", "b200", "l40s")
# dense models over the head layouts of the catalog: MHA, GQA 4 and 8 query heads per KV head
MODELS = ("llama-2-7b", "mistral-7b", "llama-3-8b", "llama-3-70b")


def test_every_engine_and_backend_has_a_framework() -> None:
    assert set(ENGINE_FRAMEWORKS) == set(ENGINE_NAMES)
    assert set(ATTENTION_BACKEND_FRAMEWORKS) == set(ATTENTION_BACKENDS)
    assert ZERO_ENGINE.framework is None
    assert {n: e.framework for n, e in load_engines().items()} == {
        "vllm": "vllm",
        "vllm-eager-2023": "vllm",
        "sglang": "sglang",
        "trtllm": "trtllm",
    }


def test_calibration_fits_each_backend_on_its_frameworks_rows() -> None:
    from calibration.fit_public import BACKEND_FRAMEWORKS

    for name, fw in BACKEND_FRAMEWORKS.items():
        assert ATTENTION_BACKEND_FRAMEWORKS[name] == fw, name


@pytest.mark.parametrize("gpu", GPUS)
def test_auto_runs_the_engines_own_kernels_in_both_phases(gpu: str) -> None:
    """Every shipped profile, engine, head layout and KV dtype: ``auto`` decodes and
    prefills on the engine's own kernel (TensorRT-LLM: masked MHA for the MHA layout XQA
    refuses). Before the rule, vLLM workers prefilled on SGLang's kernel wherever its fit
    was faster (every shipped profile) and decoded on it for Llama-3-70B TP4 on the H100."""
    prof = load_profile(gpu)
    for engine, own in OWN.items():
        assert own in prof.attention_backends, (gpu, own)
        for model in MODELS:
            tp = max(t for t in valid_tps(get_model(model)) if t <= 4)
            for kv in ("bf16", "fp8") if gpu != "a100-80gb" else ("bf16",):
                w = build_worker_cost(model, gpu, tp, kv_dtype=kv, engine=engine)
                want_dec = own
                if engine == "trtllm" and model == "llama-2-7b":  # MHA: no XQA
                    want_dec = "trtllm-mmha"
                assert (w.decode_backend, w.prefill_backend) == (want_dec, own), (
                    gpu,
                    engine,
                    model,
                    kv,
                )


def _with_fast(prof, name: str, factor: float):
    """``prof`` with backend ``name``'s decode and prefill fits ``factor`` times faster
    (its efficiencies scaled; floors divided) and trusted by ``auto``."""
    b = prof.attention_backends[name]
    dec = {
        dt: dataclasses.replace(p, bw_eff=p.bw_eff * factor, floor_s=p.floor_s / factor)
        for dt, p in b.decode.items()
    }
    pre = {
        dt: dataclasses.replace(p, max_eff=min(p.max_eff * factor, 1.0), floor_s=p.floor_s / factor)
        for dt, p in b.prefill.items()
    }
    backends = {**prof.attention_backends, name: dataclasses.replace(b, decode=dec, prefill=pre)}
    auto = {ph: tuple(dict.fromkeys((*ns, name))) for ph, ns in prof.attention_auto.items()}
    return dataclasses.replace(prof, attention_backends=backends, attention_auto=auto)


@pytest.mark.parametrize("other", ["trtllm", "sglang-flash"])
def test_a_faster_kernel_of_another_framework_is_never_picked(other: str) -> None:
    """TensorRT-LLM's context FMHA (or SGLang's kernel) made 3x faster than any other
    fit, and an ``auto`` candidate in both phases: a vLLM worker still runs vLLM's kernel
    in both phases; the kernel-only profile (no engine) takes the faster one."""
    prof = _with_fast(load_profile("h100-sxm"), other, 3.0)
    layout = (64 // 4, 8 // 4, 128)  # Llama-3-70B on 4 GPUs
    for kv in ("bf16", "fp8"):
        assert pick_attention_backends(prof, "auto", *layout, kv, "auto", "vllm") == (
            "vllm-flash",
            "vllm-flash",
        )
        # without an engine, auto takes the fastest trusted fit: the faster kernel is faster
        free = pick_attention_backends(prof, "auto", *layout, kv)
        assert free[1] == other
        if other == "sglang-flash":
            assert free[0] == other
    w = build_worker_cost("llama-3-70b", "h100-sxm", 4, engine="vllm", profile=prof)
    assert (w.decode_backend, w.prefill_backend) == ("vllm-flash", "vllm-flash")


def test_an_engine_whose_kernels_the_profile_lacks_runs_the_generic_fit() -> None:
    """A profile without vLLM's kernel: a vLLM worker runs the profile's generic attention
    (``ops``), not SGLang's or TensorRT-LLM's fitted kernels."""
    prof = load_profile("h100-sxm")
    bare = dataclasses.replace(
        prof,
        attention_backends={k: v for k, v in prof.attention_backends.items() if k != "vllm-flash"},
        attention_auto={
            ph: tuple(n for n in ns if n != "vllm-flash") for ph, ns in prof.attention_auto.items()
        },
    )
    w = build_worker_cost("llama-3-8b", "h100-sxm", 1, engine="vllm", profile=bare)
    assert (w.decode_backend, w.prefill_backend) == ("generic", "generic")
    s = build_worker_cost("llama-3-8b", "h100-sxm", 1, engine="sglang", profile=bare)
    assert (s.decode_backend, s.prefill_backend) == ("sglang-flash", "sglang-flash")


def test_the_fastest_of_a_frameworks_own_kernels() -> None:
    """A framework with two fitted kernels (the harness-timed PyTorch ones on the H200):
    ``auto`` for that framework takes the faster of the two, per phase."""
    prof = load_profile("h200-sxm")
    assert "sdpa-flash" in prof.attention_backends
    sdpa = prof.attention_backends["sdpa-flash"]
    prof = dataclasses.replace(
        prof, attention_backends={**prof.attention_backends, "sdpa-cudnn": sdpa}
    )
    layout = (32, 8, 128)
    assert pick_attention_backends(prof, "auto", *layout, "bf16", "auto", "pytorch") == (
        "sdpa-cudnn",  # equal fits: the name breaks the tie
        "sdpa-cudnn",
    )
    fast = _with_fast(prof, "sdpa-flash", 2.0)
    assert pick_attention_backends(fast, "auto", *layout, "bf16", "auto", "pytorch") == (
        "sdpa-flash",
        "sdpa-flash",
    )


def test_moe_expert_kernels_follow_the_engine_framework() -> None:
    from disaggsim.costmodel.moe_params import ENGINE_EXPERT_KERNELS

    assert ENGINE_EXPERT_KERNELS == {
        "vllm": "vllm",
        "vllm-eager-2023": "vllm",
        "sglang": "sglang",
        "trtllm": "trtllm",
    }


def _moe_prefill_attention_by_hand(p, layers: int, n: int, hq: int, hd: int, peak: float) -> float:
    """One prompt of ``n`` tokens, full causal: ``layers`` x the prefill formula of
    docs/costmodel.md on fit ``p`` (floor + 4 x pairs x heads x head dim FLOPs at the
    saturating efficiency)."""
    pairs = n * (n + 1) / 2
    eff = p.max_eff * n / (n + p.half_sat)
    return layers * (p.floor_s + 4.0 * pairs * hq * hd / (peak * eff))


@pytest.mark.parametrize(
    ("engine", "dec", "pre"),
    [
        ("vllm", "vllm-flash", "vllm-flash"),
        ("sglang", "sglang-flash", "sglang-flash"),
        # XQA's wave form is not in the MoE layer model: generic decode (docs/costmodel.md)
        ("trtllm", "generic", "trtllm"),
    ],
)
def test_moe_workers_run_their_engines_attention_kernels(engine: str, dec: str, pre: str) -> None:
    """Mixtral-8x7B on two H100s (16 query, 4 KV heads per GPU): the MoE layer model's
    attention runs the engine's own kernels too. Before, every engine's MoE worker ran the
    profile's generic kernel (vLLM's fit)."""
    from disaggsim.costmodel.moe import build_cost

    prof = load_profile("h100-sxm")
    w = build_cost("mixtral-8x7b", "h100-sxm", 2, engine=engine)
    assert (w.decode_backend, w.prefill_backend) == (dec, pre)
    n = 4096
    got = w.breakdown(prefill_seqs=1, prefill_tokens=n, prefill_attn_pairs=n * (n + 1) / 2)
    want = _moe_prefill_attention_by_hand(
        prof.prefill_attention_for(pre, "bf16"), 32, n, 16, 128, prof.peaks.bf16_flop_per_s
    )
    assert got.attention_s == pytest.approx(want, rel=1e-9)
