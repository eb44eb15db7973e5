"""The fitter recovers known parameters, fitted times are monotone, bad profiles fail clearly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibration.fit import fit_copy, fit_decode_attention, fit_gemm, fit_prefill_attention
from disaggsim.costmodel import ops
from disaggsim.hardware.profile import (
    DecodeAttentionParams,
    GemmParams,
    GpuPeaks,
    PrefillAttentionParams,
    ProfileError,
    load_profile,
    profile_from_dict,
    shipped_profile_path,
)

PEAKS = GpuPeaks(
    bf16_flop_per_s=989e12, fp8_flop_per_s=1979e12, hbm_bytes_per_s=3.35e12, hbm_bytes=80e9
)
GPUS = ("a100-80gb", "h100-sxm", "h100-pcie", "h200-sxm", "b200", "l40s")


def _noisy(t: np.ndarray, seed: int, sigma: float = 0.02) -> np.ndarray:
    return t * np.exp(np.random.default_rng(seed).normal(0.0, sigma, size=t.shape))


def test_fitter_recovers_gemm_parameters_from_noisy_synthetic_data() -> None:
    true = GemmParams(launch_s=4e-6, max_eff=0.8, half_sat=120.0, mem_eff=0.75)
    m = np.repeat([1, 4, 16, 64, 256, 1024, 4096, 16384], 6).astype(float)
    n = np.tile([1024, 4096, 8192, 14336, 28672, 2048], 8).astype(float)
    k = np.tile([4096, 8192, 4096, 4096, 8192, 1024], 8).astype(float)
    t = _noisy(ops.gemm_time_s(PEAKS, true, m, n, k), 1)
    got = fit_gemm(PEAKS, m, n, k, t, held_out=False).params
    assert got.max_eff == pytest.approx(0.8, rel=0.05)
    assert got.mem_eff == pytest.approx(0.75, rel=0.05)
    assert got.launch_s == pytest.approx(4e-6, rel=0.25)
    assert got.half_sat == pytest.approx(120.0, rel=0.3)


def test_fitter_recovers_decode_attention_parameters() -> None:
    true = DecodeAttentionParams(
        floor_s=1e-5,
        per_seq_s=2e-8,
        bw_eff=0.8,
        per_seq_kv_elem_s=3e-11,
        par_half_sat=4.0,
        overlap=1.0,  # the roofline form the fitter uses by default
    )
    b = np.repeat([1, 4, 16, 64, 256, 1024], 6).astype(float)
    c = b * np.tile([16, 128, 1024, 4096, 16384, 65536], 6)
    # three head layouts so the per-sequence and per-(sequence × KV head × dim) terms and
    # the parallelism limit are each identifiable
    b, c = np.tile(b, 3), np.tile(c, 3)
    kh = np.repeat([1.0, 2.0, 8.0], 36)
    d = np.repeat([128.0, 64.0, 128.0], 36)
    t = _noisy(ops.decode_attention_time_s(PEAKS, true, b, c, kh, d), 2)
    got = fit_decode_attention(PEAKS, b, c, kh, d, t, held_out=False).params
    assert got.bw_eff == pytest.approx(0.8, rel=0.05)
    assert got.floor_s == pytest.approx(1e-5, rel=0.1)
    assert got.per_seq_s == pytest.approx(2e-8, rel=0.3)
    assert got.per_seq_kv_elem_s == pytest.approx(3e-11, rel=0.3)
    assert got.par_half_sat == pytest.approx(4.0, rel=0.3)


def test_decode_attention_new_terms_by_hand_and_old_profiles_load() -> None:
    # B 4, KH 2, D 128, C 4096 bf16: bytes = 2 × 4096 × 2 × 128 × 2 = 4,194,304;
    # P = 8 items → bandwidth share 8 / (8 + 8) = 0.5
    p = DecodeAttentionParams(
        floor_s=1e-5, per_seq_s=1e-7, bw_eff=0.8, per_seq_kv_elem_s=1e-10, par_half_sat=8.0
    )
    want = 1e-5 + 4 * 1e-7 + 1e-10 * 4 * 2 * 128 + 4_194_304 / (PEAKS.hbm_bytes_per_s * 0.8 * 0.5)
    got = float(ops.decode_attention_time_s(PEAKS, p, 4, 4096, 2, 128))
    assert got == pytest.approx(want, rel=1e-12)
    # the multi-sequence GQA floor applies only when B > 1 and KH > 1
    pm = DecodeAttentionParams(
        floor_s=1e-5,
        per_seq_s=1e-7,
        bw_eff=0.8,
        per_seq_kv_elem_s=1e-10,
        par_half_sat=8.0,
        multi_floor_s=6e-6,
    )
    assert float(ops.decode_attention_time_s(PEAKS, pm, 4, 4096, 2, 128)) == pytest.approx(
        want + 6e-6, rel=1e-12
    )
    for b, kh in ((1, 2), (4, 1)):
        assert float(ops.decode_attention_time_s(PEAKS, pm, b, 4096, kh, 128)) == pytest.approx(
            float(ops.decode_attention_time_s(PEAKS, p, b, 4096, kh, 128)), rel=1e-12
        )
    # a profile without the optional keys loads with those terms off
    raw = json.loads(shipped_profile_path("a100-80gb").read_text())
    for prm in raw["ops"]["decode_attention"].values():
        prm.pop("per_seq_kv_elem_s", None)
        prm.pop("par_half_sat", None)
        prm.pop("multi_floor_s", None)
    old = profile_from_dict(raw, "old.json").decode_attention_params("bf16")
    assert (old.per_seq_kv_elem_s, old.par_half_sat, old.multi_floor_s) == (0.0, 0.0, 0.0)
    want_old = old.floor_s + old.per_seq_s * 4 + 4_194_304 / (PEAKS.hbm_bytes_per_s * old.bw_eff)
    assert float(ops.decode_attention_time_s(PEAKS, old, 4, 4096, 2, 128)) == pytest.approx(
        want_old, rel=1e-12
    )


def test_fitter_recovers_prefill_attention_parameters() -> None:
    true = PrefillAttentionParams(floor_s=1e-5, max_eff=0.6, half_sat=800.0)
    p = np.tile([64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384], 2).astype(float)
    s = np.repeat([1.0, 4.0], 9)
    pairs = s * p * (p + 1) / 2
    h, d = np.full_like(p, 32.0), np.full_like(p, 128.0)
    t = _noisy(ops.prefill_attention_time_s(PEAKS, true, s, s * p, pairs, h, d), 3)
    got = fit_prefill_attention(PEAKS, s, s * p, pairs, h, d, t, held_out=False).params
    assert got.max_eff == pytest.approx(0.6, rel=0.08)
    assert got.half_sat == pytest.approx(800.0, rel=0.25)


def test_fitter_recovers_copy_latency_and_bandwidth() -> None:
    nbytes = 4096.0 * 4.0 ** np.arange(10)
    # independent expectation: 20 µs + bytes / 25 GB/s
    t = _noisy(20e-6 + nbytes / 25e9, 4, 0.01)
    got = fit_copy(nbytes, t, held_out=False).params
    assert got.bw_bytes_per_s == pytest.approx(25e9, rel=0.05)
    assert got.latency_s == pytest.approx(20e-6, rel=0.15)


def test_gather_fit_separates_a_per_block_cost_only_with_two_block_sizes() -> None:
    # independent expectation: 5 µs + bytes / 2 TB/s + 40 ns per block
    blocks = 4.0 ** np.arange(8)
    nbytes = np.concatenate([blocks * 65536.0, blocks * 16384.0])  # two block sizes
    nblk = np.concatenate([blocks, blocks])
    t = _noisy(5e-6 + nbytes / 2e12 + 40e-9 * nblk, 6, 0.01)
    two = fit_copy(nbytes, t, nblk, held_out=False)
    assert two.params.per_block_s == pytest.approx(40e-9, rel=0.2)
    assert two.params.bw_bytes_per_s == pytest.approx(2e12, rel=0.1)
    # one block size (the H200 run's 64 KiB): bandwidth and per-block cost move time in
    # proportion; the fit holds the per-block cost at 0 and says so, whatever the rounding
    one_rows = slice(0, 8)
    one = fit_copy(nbytes[one_rows], t[one_rows], nblk[one_rows], held_out=False)
    assert one.params.per_block_s == 0.0
    assert "one block size" in one.extra["rule"]
    # the bandwidth the per-block cost folds into: 1 / (1 / 2 TB/s + 40 ns / 64 KiB)
    assert one.params.bw_bytes_per_s == pytest.approx(1 / (1 / 2e12 + 40e-9 / 65536), rel=0.1)


def test_held_out_error_is_reported_by_shape_family() -> None:
    true = GemmParams(launch_s=4e-6, max_eff=0.8, half_sat=120.0, mem_eff=0.75)
    m = np.repeat([1, 16, 256, 4096], 5).astype(float)
    n = np.tile([1024, 2048, 4096, 8192, 16384], 4).astype(float)
    k = np.full_like(m, 4096.0)
    t = _noisy(ops.gemm_time_s(PEAKS, true, m, n, k), 5)
    err = fit_gemm(PEAKS, m, n, k, t, groups=n.astype(int)).error
    assert err.held_out == "shape families"
    assert err.held_out_median_ape is not None and err.held_out_median_ape < 0.1


@pytest.mark.parametrize("gpu", GPUS)
def test_shipped_profiles_say_where_they_come_from(gpu: str) -> None:
    prof = load_profile(gpu)
    kind = prof.provenance["kind"]
    if gpu in ("a100-80gb", "h100-sxm"):
        assert kind == "fitted-public"
        assert prof.provenance["source_commit"]["aiconfigurator"]
        assert prof.fit_error["gemm.bf16"]["held_out_median_ape"] is not None
    else:
        assert kind in ("prior", "measured")
        if kind == "prior":
            assert prof.provenance["transferred_from"] in ("h100-sxm", "a100-80gb")


@pytest.mark.parametrize("gpu", GPUS)
@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 32768),
    n=st.sampled_from([128, 1024, 4096, 14336]),
    k=st.sampled_from([128, 1024, 4096, 8192]),
    extra=st.integers(1, 4096),
)
def test_fitted_gemm_time_is_monotone_in_size(gpu: str, m: int, n: int, k: int, extra: int) -> None:
    prof = load_profile(gpu)
    p = prof.gemm_params("bf16")
    t0 = float(ops.gemm_time_s(prof.peaks, p, m, n, k))
    assert float(ops.gemm_time_s(prof.peaks, p, m + extra, n, k)) >= t0
    assert float(ops.gemm_time_s(prof.peaks, p, m, n + extra, k)) >= t0
    assert float(ops.gemm_time_s(prof.peaks, p, m, n, k + extra)) >= t0


@pytest.mark.parametrize("gpu", GPUS)
@settings(max_examples=30, deadline=None)
@given(
    b=st.integers(1, 512),
    c=st.integers(1, 10**6),
    p=st.integers(1, 32768),
    extra=st.integers(1, 10**5),
)
def test_fitted_attention_and_copy_times_are_monotone(
    gpu: str, b: int, c: int, p: int, extra: int
) -> None:
    prof = load_profile(gpu)
    dec = prof.decode_attention_params("bf16")
    # roofline: flat while per-item work outlasts the KV stream, rising above the knee
    assert ops.decode_attention_time_s(
        prof.peaks, dec, b, c + extra, 8, 128
    ) >= ops.decode_attention_time_s(prof.peaks, dec, b, c, 8, 128)
    far = b * 100_000  # every sequence far above the knee: the KV stream binds
    assert ops.decode_attention_time_s(
        prof.peaks, dec, b, far + extra, 8, 128
    ) > ops.decode_attention_time_s(prof.peaks, dec, b, far, 8, 128)
    pre = prof.prefill_attention_params("bf16")

    def pf(length: int) -> float:
        return float(
            ops.prefill_attention_time_s(
                prof.peaks, pre, 1, length, ops.causal_pairs(length), 32, 128
            )
        )

    assert pf(p + extra) > pf(p)
    for kind, cp in prof.copy.items():
        assert ops.copy_time_s(cp, c + extra) > ops.copy_time_s(cp, c), kind


def _write(tmp_path: Path, obj) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


def _good() -> dict:
    return json.loads(shipped_profile_path("h100-sxm").read_text())


def test_missing_profile_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"nope\.json: hardware profile not found") as e:
        load_profile(path=tmp_path / "nope.json")
    assert "shipped:" not in str(e.value)  # a file the user named: no list of GPU ids
    # an unknown GPU id lists the GPUs that have a shipped profile
    with pytest.raises(ProfileError, match=r"for GPU 'nope' \(shipped: a100-80gb, b200, .*l40s\)"):
        load_profile("nope")


def test_malformed_json_names_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"bad\.json: line 2: not valid JSON"):
        load_profile(path=_write(tmp_path, '{"schema_version": 1,\n "gpu": }'))


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(schema_version=2), "schema_version"),
        (lambda d: d["ops"]["gemm"]["bf16"].pop("max_eff"), r"ops\.gemm\.bf16\.max_eff: missing"),
        (lambda d: d["ops"]["gemm"]["bf16"].update(max_eff=1.5), r"ops\.gemm\.bf16\.max_eff"),
        (
            lambda d: d["ops"]["decode_attention"]["bf16"].update(bw_eff="fast"),
            r"decode_attention\.bf16\.bw_eff",
        ),
        (lambda d: d["peaks"].pop("hbm_bytes_per_s"), r"peaks\.hbm_bytes_per_s"),
        (lambda d: d["provenance"].update(kind="guess"), r"provenance\.kind"),
        (
            lambda d: d["ops"]["allreduce"].update(
                {"1": {"latency_s": 0, "bus_bw_bytes_per_s": 1}}
            ),
            r"ops\.allreduce\.1",
        ),
    ],
)
def test_wrong_schema_names_file_and_field(tmp_path: Path, mutate, field: str) -> None:
    d = _good()
    mutate(d)
    with pytest.raises(ProfileError, match=rf"bad\.json: .*{field}") as info:
        load_profile(path=_write(tmp_path, d))
    assert "\n" not in str(info.value)
