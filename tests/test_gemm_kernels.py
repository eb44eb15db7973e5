"""Named GEMM kernels with a dispatch table (``gemm_kernels``, SGLang's and vLLM's FP8
GEMMs): the tile form by hand (branches by m, n and k, swapped operands), the step model
against ``ops.py``, selection by the engine profile, and the profile and engine-file
errors."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from disaggsim.costmodel import ops
from disaggsim.costmodel.step import build_worker_cost
from disaggsim.hardware.engines import (
    ZERO_ENGINE,
    EngineProfileError,
    engines_from_dict,
    load_engines,
    shipped_engines_path,
)
from disaggsim.hardware.profile import ProfileError, load_profile, profile_from_dict
from tests.costmodel_fixtures import FIXED_H100

# round numbers for hand arithmetic; the dispatch table is SGLang's (fit_public)
KERNEL = {
    "dtype": "fp8",
    "num_sms": 132,
    "launch_s": 3e-6,
    "mem_eff": 0.75,
    "epilogue_s_per_elem": 1e-10,
    "branches": [
        {"max_m": 64, "tile_m": 64, "tile_n": 64, "cluster_m": 1, "cluster_n": 4, "max_eff": 0.9},
        {"max_m": 256, "tile_m": 64, "tile_n": 64, "cluster_m": 1, "cluster_n": 1, "max_eff": 0.4},
        {"max_m": 1024, "tile_m": 128, "tile_n": 128, "cluster_m": 1, "cluster_n": 1,
         "max_eff": 0.8},
        {"max_m": None, "tile_m": 128, "tile_n": 128, "cluster_m": 2, "cluster_n": 1,
         "max_eff": 0.75},
    ],
}  # fmt: skip
SGLANG_KERNELS = dataclasses.replace(ZERO_ENGINE, fp8_gemm_kernel="sglang-fp8")
# vLLM's dispatch (fit_public VLLM_FP8): conditions on n and k, operands swapped for m <= 64
VLLM_KERNEL = {
    **KERNEL,
    "branches": [
        {"max_m": 16, "max_n": 1280, "tile_m": 64, "tile_n": 16, "cluster_m": 1,
         "cluster_n": 2, "max_eff": 0.2, "swap_ab": True},
        {"max_m": 16, "tile_m": 64, "tile_n": 16, "cluster_m": 1, "cluster_n": 1,
         "max_eff": 0.2, "swap_ab": True},
        {"max_m": 64, "max_n": 1280, "tile_m": 64, "tile_n": 16, "cluster_m": 1,
         "cluster_n": 4, "max_eff": 0.2, "swap_ab": True},
        {"max_m": 64, "tile_m": 64, "tile_n": 64, "cluster_m": 1, "cluster_n": 1,
         "max_eff": 0.4, "swap_ab": True},
        {"max_m": 128, "tile_m": 64, "tile_n": 128, "cluster_m": 2, "cluster_n": 1,
         "max_eff": 0.85},
        {"max_m": None, "min_m": 8192, "min_k": 6144, "tile_m": 256, "tile_n": 128,
         "cluster_m": 2, "cluster_n": 1, "max_eff": 0.8},
        {"max_m": None, "tile_m": 128, "tile_n": 128, "cluster_m": 2, "cluster_n": 1,
         "max_eff": 0.7},
    ],
}  # fmt: skip


def _profile(kernel=KERNEL):
    raw = copy.deepcopy(FIXED_H100)
    raw["gemm_kernels"] = {"sglang-fp8": copy.deepcopy(kernel)}
    return profile_from_dict(raw, "fixed.json")


def test_tile_form_by_hand() -> None:
    p = _profile().gemm_kernels["sglang-fp8"]
    peaks = _profile().peaks
    per_sm = 1979e12 / 132
    # m = 100 (64 x 64 tiles, no clusters), n = k = 4096: 2 x 64 = 128 tiles, one wave
    tile = 1e-10 * 4096 + 2 * 4096 * 4096 / (per_sm * 0.4)
    mem = (100 * 4096 + 4096 * 4096 + 100 * 4096) / (3.35e12 * 0.75)
    want = 3e-6 + max(tile, mem)
    assert float(ops.tiled_gemm_time_s(peaks, p, 100, 4096, 4096)) == pytest.approx(want, rel=1e-12)
    # m = 1025 (128 x 128 tiles in 2 x 1 clusters): 9 row tiles round up to 10, x 32 = 320
    # tiles, three waves of 132
    tile = 1e-10 * 128 * 128 + 2 * 128 * 128 * 4096 / (per_sm * 0.75)
    got = float(ops.tiled_gemm_time_s(peaks, p, 1025, 4096, 4096))
    assert got == pytest.approx(3e-6 + 3 * tile, rel=1e-12)
    # m = 1 is the m <= 64 branch: 64 column tiles already a multiple of the 1 x 4 cluster
    mem1 = (4096 + 4096 * 4096 + 4096) / (3.35e12 * 0.75)
    tile1 = 1e-10 * 4096 + 2 * 4096 * 4096 / (per_sm * 0.9)
    got1 = float(ops.tiled_gemm_time_s(peaks, p, 1, 4096, 4096))
    assert got1 == pytest.approx(3e-6 + max(tile1, mem1), rel=1e-12)


def test_l2_operand_traffic_bound_by_hand() -> None:
    # an L2 rate low enough to bind: each CTA tile loads (tm / cn + tn / cm) x k operand
    # bytes from L2 (FP8: one byte each), TMA multicast sharing them over the cluster
    prof = _profile({**KERNEL, "l2_bytes_per_s": 2e12})
    p, peaks = prof.gemm_kernels["sglang-fp8"], prof.peaks
    assert p.l2_bytes_per_s == 2e12 and _profile().gemm_kernels["sglang-fp8"].l2_bytes_per_s == 0
    # m = 100, n = k = 4096: 64 x 64 tiles, no cluster: 2 x 64 = 128 tiles, 128 x 128 x 4096 bytes
    want = 3e-6 + 128 * (64 + 64) * 4096 / 2e12
    assert float(ops.tiled_gemm_time_s(peaks, p, 100, 4096, 4096)) == pytest.approx(want, rel=1e-12)
    # m = 1: 64 tiles in 1 x 4 clusters; the A tile (the tokens) shared by the 4 CTAs of a
    # cluster: 64 x (64 / 4 + 64 / 1) x 4096 bytes
    want1 = 3e-6 + 64 * (64 / 4 + 64) * 4096 / 2e12
    assert float(ops.tiled_gemm_time_s(peaks, p, 1, 4096, 4096)) == pytest.approx(want1, rel=1e-12)
    # m = 1025: 320 tiles in 2 x 1 clusters, the B tile shared by 2: 320 x (128 + 64) x 4096
    want2 = 3e-6 + 320 * (128 + 128 / 2) * 4096 / 2e12
    got2 = float(ops.tiled_gemm_time_s(peaks, p, 1025, 4096, 4096))
    assert got2 == pytest.approx(want2, rel=1e-12)
    # at a fast L2 the bound does not bind: the tile form as without it
    fast = _profile({**KERNEL, "l2_bytes_per_s": 1e15}).gemm_kernels["sglang-fp8"]
    plain = _profile().gemm_kernels["sglang-fp8"]
    for m in (1, 100, 1025):
        want = float(ops.tiled_gemm_time_s(peaks, plain, m, 4096, 4096))
        assert float(ops.tiled_gemm_time_s(peaks, fast, m, 4096, 4096)) == want
    # the step model's scalar copy agrees
    from disaggsim.costmodel.step import _tiled_gemm_s

    for m, n, k in ((1, 4096, 4096), (100, 4096, 4096), (1025, 4096, 4096), (300, 96, 64)):
        want = _tiled_gemm_s(1979e12, 3.35e12, p, m, n, k)
        assert float(ops.tiled_gemm_time_s(peaks, p, m, n, k)) == pytest.approx(want, rel=1e-12)


def test_branches_by_n_and_k_and_swapped_operands_by_hand() -> None:
    raw = copy.deepcopy(FIXED_H100)
    raw["gemm_kernels"] = {"vllm-fp8": copy.deepcopy(VLLM_KERNEL)}
    prof = profile_from_dict(raw, "fixed.json")
    p, peaks = prof.gemm_kernels["vllm-fp8"], prof.peaks
    per_sm = 1979e12 / 132

    def tile_s(tm, tn, k, eff):
        return 1e-10 * tm * tn + 2 * tm * tn * k / (per_sm * eff)

    def mem_s(m, n, k):
        return (m * k + k * n + m * n) / (3.35e12 * 0.75)

    def got(m, n, k):
        return float(ops.tiled_gemm_time_s(peaks, p, m, n, k))

    # m = 10, n = 1024 (n <= 1280): swapped, the kernel's m is n: 16 tiles of 64 weight rows
    # x 1 of 16 tokens, rounded to the 1 x 2 cluster: 32 tiles, one wave; memory-bound
    want = 3e-6 + max(tile_s(64, 16, 4096, 0.2), mem_s(10, 1024, 4096))
    assert got(10, 1024, 4096) == pytest.approx(want, rel=1e-12)
    assert p.branch(10, 1024, 4096) is p.branches[0]
    # m = 10, n = 16384: the second branch (no cluster): 256 tiles, two waves
    want = 3e-6 + max(2 * tile_s(64, 16, 4096, 0.2), mem_s(10, 16384, 4096))
    assert got(10, 16384, 4096) == pytest.approx(want, rel=1e-12)
    # m = 40, n = 16384: swapped 64 x 64 tiles: 256 x 1 tiles, two waves
    tile = tile_s(64, 64, 4096, 0.4)
    assert got(40, 16384, 4096) == pytest.approx(3e-6 + max(2 * tile, mem_s(40, 16384, 4096)))
    # m = 40, n = 1024: swapped 64 x 16 tiles in 1 x 4 clusters: 16 x ceil(3/4) x 4 = 64 tiles
    want = 3e-6 + max(tile_s(64, 16, 4096, 0.2), mem_s(40, 1024, 4096))
    assert got(40, 1024, 4096) == pytest.approx(want, rel=1e-12)
    # m = 8192: k = 8192 takes the 256 x 128 branch (32 x 64 = 2048 tiles, 16 waves), k = 4096
    # the default 128 x 128 one (64 x 64 = 4096 tiles, 32 waves)
    assert got(8192, 8192, 8192) == pytest.approx(3e-6 + 16 * tile_s(256, 128, 8192, 0.8))
    assert got(8192, 8192, 4096) == pytest.approx(3e-6 + 32 * tile_s(128, 128, 4096, 0.7))
    assert p.branch(4096, 8192, 8192) is p.branches[-1]  # min_m not met
    # the step model's scalar copy agrees on every branch
    from disaggsim.costmodel.step import _tiled_gemm_s

    for m, n, k in (
        (1, 1024, 4096),
        (16, 2048, 4096),
        (17, 1280, 512),
        (64, 1281, 8192),
        (100, 4096, 4096),
        (8192, 4096, 6144),
        (8192, 4096, 6143),
        (300, 96, 64),
    ):
        want = _tiled_gemm_s(1979e12, 3.35e12, p, m, n, k)
        assert got(m, n, k) == pytest.approx(want, rel=1e-12)  # fmt: skip


def test_the_tile_grid_counts_whole_clusters_in_the_kernel_coordinates() -> None:
    raw = copy.deepcopy(FIXED_H100)
    raw["gemm_kernels"] = {"vllm-fp8": copy.deepcopy(VLLM_KERNEL)}
    p = profile_from_dict(raw, "fixed.json").gemm_kernels["vllm-fp8"]
    tiles, tm, tn, cm, cn = ops.tiled_gemm_grid(p, [10, 40, 40, 100, 8192], 1024, 8192)
    # m = 10 and 40 swapped (64 weight rows x 16 tokens): 16 x 2 (the 1 x 2 cluster) and
    # 16 x 4 (1 x 4); m = 100: 64 x 128 tiles, 2 rows x 8 columns; m = 8192, k = 8192:
    # 256 x 128 tiles, 32 x 8
    assert tiles.tolist() == [32, 64, 64, 16, 256]
    assert (tm.tolist(), tn.tolist()) == ([64, 64, 64, 64, 256], [16, 16, 16, 128, 128])
    assert (cm.tolist(), cn.tolist()) == ([1, 1, 1, 2, 2], [2, 4, 4, 1, 1])


def test_step_model_runs_the_engine_kernel_term_for_term() -> None:
    prof = _profile()
    w = build_worker_cost(
        "llama-3-8b", "h100-sxm", 2, weight_dtype="fp8", engine=SGLANG_KERNELS, profile=prof
    )
    assert w.gemm_kernel == "sglang-fp8"
    p = prof.gemm_kernels["sglang-fp8"]
    # llama-3-8b TP2: QKV (32/2 + 2 x 8/2) x 128 = 3072 x 4096, O 4096 x 2048,
    # up 2 x 7168 x 4096, down 4096 x 7168
    shapes = ((3072, 4096), (4096, 2048), (14336, 4096), (4096, 7168))
    for m in (1, 64, 65, 200, 256, 257, 1000, 1025, 4096):
        want = 32 * sum(float(ops.tiled_gemm_time_s(prof.peaks, p, m, n, k)) for n, k in shapes)
        got = w.breakdown(decode_batch=m, decode_context_tokens=m * 100).gemm_s
        assert got == pytest.approx(want, rel=1e-12)
    # the LM head stays 16-bit in an FP8 checkpoint: the generic bf16 GEMM, not the
    # engine's FP8 kernel, over vocab 128256 / 2 columns and the emitting sequences
    lm = w.breakdown(decode_batch=8, decode_context_tokens=800).lm_head_s
    ew = prof.elementwise
    norm = ew.launch_s + 2.0 * 8 * 4096 * 2 / (3.35e12 * ew.bw_eff)
    head = float(ops.gemm_time_s(prof.peaks, prof.gemm_params("bf16"), 8, 128256 / 2, 4096))
    assert lm == pytest.approx(norm + head, rel=1e-12)


def test_the_engine_profile_chooses_the_kernel_where_the_profile_fits_it() -> None:
    prof = _profile()
    kw = dict(weight_dtype="fp8", profile=prof)
    assert (
        build_worker_cost("llama-3-8b", "h100-sxm", 1, engine=SGLANG_KERNELS, **kw).gemm_kernel
        == "sglang-fp8"
    )
    generic = build_worker_cost("llama-3-8b", "h100-sxm", 1, engine=ZERO_ENGINE, **kw)
    assert generic.gemm_kernel == "generic"
    # bf16 weights: the kernel is an FP8 one, so ops.gemm.bf16
    bf = build_worker_cost("llama-3-8b", "h100-sxm", 1, engine=SGLANG_KERNELS, profile=prof)
    assert bf.gemm_kernel == "generic"
    # an older profile without gemm_kernels: the engine's FP8 GEMMs are ops.gemm.fp8, the
    # behaviour before the field existed (same step times as an engine naming no kernel)
    old = profile_from_dict(copy.deepcopy(FIXED_H100), "old.json")
    assert old.gemm_kernels == {}
    w_old = build_worker_cost("llama-3-8b", "h100-sxm", 1, weight_dtype="fp8",
                              engine=SGLANG_KERNELS, profile=old)  # fmt: skip
    w_none = build_worker_cost("llama-3-8b", "h100-sxm", 1, weight_dtype="fp8",
                               engine=ZERO_ENGINE, profile=old)  # fmt: skip
    assert w_old.gemm_kernel == "generic"
    for b in (1, 100, 3000):
        assert w_old.decode_time_s(b, b * 512) == w_none.decode_time_s(b, b * 512)
    # shipped: SGLang and vLLM name their kernels, the others none; the H100 profile fits them
    eng = load_engines()
    assert eng["sglang"].fp8_gemm_kernel == "sglang-fp8"
    assert eng["vllm"].fp8_gemm_kernel == "vllm-fp8"
    assert {eng[n].fp8_gemm_kernel for n in ("trtllm", "vllm-eager-2023")} == {None}
    kernels = {
        e: build_worker_cost("llama-3-70b", "h100-sxm", 4, weight_dtype="fp8", engine=e).gemm_kernel
        for e in ("sglang", "vllm", "trtllm")
    }
    assert kernels == {"sglang": "sglang-fp8", "vllm": "vllm-fp8", "trtllm": "generic"}


def test_kernels_follow_the_sm_architecture_with_each_gpu_sm_count() -> None:
    for name, num_branches in (("sglang-fp8", 5), ("vllm-fp8", 7)):
        h100 = load_profile("h100-sxm").gemm_kernels[name]
        assert h100.num_sms == 132 and len(h100.branches) == num_branches
        assert h100.l2_bytes_per_s > 0
        for gpu, sms, fp8 in (
            ("h200-sxm", 132, 1979e12), ("h800-sxm", 132, 1979e12), ("h100-pcie", 114, 1513e12)
        ):  # fmt: skip
            k = load_profile(gpu).gemm_kernels[name]
            assert k.num_sms == sms
            # the L2 rate scales with the clock: FP8 peak per SM (H100 PCIe 0.885 of the SXM)
            clock = (fp8 / sms) / (1979e12 / 132)
            assert k.l2_bytes_per_s == pytest.approx(h100.l2_bytes_per_s * clock, rel=1e-4)
            # the memory efficiency is the architecture's (the H200's GEMMs timed in CUDA
            # graphs reach the H100's fraction of the peak: docs/calibration.md)
            assert k.mem_eff == h100.mem_eff
            same = dict(num_sms=132, l2_bytes_per_s=h100.l2_bytes_per_s)
            assert dataclasses.replace(k, **same) == h100
    for gpu in ("a100-80gb", "l40s", "b200"):  # no FP8 / another architecture's kernels
        assert load_profile(gpu).gemm_kernels == {}


def _bad(path_change):
    k = copy.deepcopy(KERNEL)
    path_change(k)
    return k


@pytest.mark.parametrize(
    "kernel, name, pattern",
    [
        (KERNEL, "cublas-fp8",
         r"gemm_kernels\.cublas-fp8: unknown GEMM kernel \(allowed: sglang-fp8, vllm-fp8\)"),
        (_bad(lambda k: k.update(dtype="bf16")), "sglang-fp8", r"sglang-fp8\.dtype: sglang-fp8 runs fp8"),
        (_bad(lambda k: k.pop("mem_eff")), "sglang-fp8", r"sglang-fp8\.mem_eff: missing"),
        (_bad(lambda k: k.update(mem_eff=1.5)), "sglang-fp8", r"mem_eff: must be in \(0, 1\]"),
        (_bad(lambda k: k.update(num_sms=0)), "sglang-fp8", r"num_sms: expected an integer >= 1"),
        (_bad(lambda k: k.update(branches=[])), "sglang-fp8", r"branches: expected a non-empty list"),
        (_bad(lambda k: k["branches"][3].update(max_m=4096)), "sglang-fp8",
         r"branches\[3\]: the last branch takes every GEMM the others do not"),
        (_bad(lambda k: k["branches"][3].update(min_k=6144)), "sglang-fp8",
         r"branches\[3\]: the last branch takes every GEMM the others do not"),
        (_bad(lambda k: k["branches"][1].update(max_m=32)), "sglang-fp8",
         r"branches\[1\]\.max_m: must not decrease"),
        (_bad(lambda k: k["branches"][1].update(max_m=None)), "sglang-fp8",
         r"branches\[1\]: a branch before the last needs a condition"),
        (_bad(lambda k: k["branches"][1].update(swap_ab=1)), "sglang-fp8",
         r"branches\[1\]\.swap_ab: expected true or false"),
        (_bad(lambda k: k["branches"][1].update(max_n=0)), "sglang-fp8",
         r"branches\[1\]\.max_n: must be > 0"),
        (_bad(lambda k: k["branches"][1].update(min_n=4)), "sglang-fp8",
         r"branches\[1\]\.min_n: unknown key"),
        (_bad(lambda k: k["branches"][0].update(max_eff=1.2)), "sglang-fp8",
         r"branches\[0\]\.max_eff: must be in \(0, 1\]"),
        (_bad(lambda k: k["branches"][2].update(tile_m=0)), "sglang-fp8",
         r"branches\[2\]\.tile_m: expected an integer >= 1"),
        (_bad(lambda k: k["branches"][2].update(cluster_n=1.5)), "sglang-fp8",
         r"branches\[2\]\.cluster_n: expected an integer >= 1"),
        (_bad(lambda k: k.update(tile=64)), "sglang-fp8", r"sglang-fp8\.tile: unknown key"),
        (_bad(lambda k: k.update(l2_bytes_per_s=-1.0)), "sglang-fp8",
         r"sglang-fp8\.l2_bytes_per_s: must be >= 0"),
    ],
)  # fmt: skip
def test_bad_gemm_kernels_are_one_line_naming_the_field(kernel, name, pattern) -> None:
    raw = copy.deepcopy(FIXED_H100)
    raw["gemm_kernels"] = {name: kernel}
    with pytest.raises(ProfileError, match=pattern):
        profile_from_dict(raw, "p.json")


def test_an_fp8_kernel_on_a_gpu_without_fp8_is_an_error() -> None:
    raw = copy.deepcopy(FIXED_H100)
    raw["peaks"]["fp8_flop_per_s"] = 0.0
    raw["ops"]["gemm"].pop("fp8")
    raw["gemm_kernels"] = {"sglang-fp8": copy.deepcopy(KERNEL)}
    with pytest.raises(ProfileError, match=r"gemm_kernels\.sglang-fp8: this GPU has no FP8"):
        profile_from_dict(raw, "p.json")


def test_engine_file_fp8_gemm_kernel_field() -> None:
    raw = json.loads(shipped_engines_path().read_text())
    raw["engines"]["sglang"]["fp8_gemm_kernel"] = "cutlass"
    with pytest.raises(
        EngineProfileError,
        match=r"engines\.sglang\.fp8_gemm_kernel: 'cutlass' \(allowed: null, sglang-fp8, vllm-fp8\)",
    ):
        engines_from_dict(raw, "x.json")
    # a file written before the field: every engine's FP8 GEMMs are ops.gemm.fp8
    for e in raw["engines"].values():
        e.pop("fp8_gemm_kernel", None)
    assert all(e.fp8_gemm_kernel is None for e in engines_from_dict(raw, "old.json").values())
