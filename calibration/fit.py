"""The fitter: least squares on log time of exactly the :mod:`disaggsim.costmodel.ops` forms.

Each ``fit_*`` function takes measured points of one op (numpy arrays, seconds) and the
GPU's datasheet peaks, and returns the op's parameter dataclass (the one the profile
holds) plus its fit error. Parameters are fitted in log space (all are positive), so a
1 µs floor and a 0.8 efficiency are equally well conditioned; the residual is
``log(predicted) - log(measured)``, i.e. relative error, which is what the accuracy
targets are stated in. Generalisation is reported as the error on points held out from
the fit: whole shape families held out in turn when the data has several (GEMM (n, k)
shapes, attention head layouts, GPU counts), else 5 random folds.

:func:`build_profile` turns a raw measurement folder (:mod:`calibration.rawio`) into a
profile dict, carrying the ops it did not measure from a named base profile.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar, cast

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from disaggsim.costmodel import ops
from disaggsim.hardware.profile import (
    DECODE_FIELDS_OMITTED_AT_ZERO,
    GEMM_FIELDS_OMITTED_AT_ZERO,
    CopyParams,
    DecodeAttentionParams,
    ElementwiseParams,
    GemmParams,
    GpuPeaks,
    PrefillAttentionParams,
)

NUM_FOLDS = 5


@dataclass(frozen=True, slots=True)
class FitError:
    """Absolute percentage errors (fractions: 0.05 = 5%) of a fitted op."""

    median_ape: float
    mean_ape: float
    p90_ape: float
    n: int
    held_out_median_ape: float | None = None
    held_out_mean_ape: float | None = None
    held_out: str = ""
    # the held-out 90th percentile: compared where a fit chooses between forms, written
    # there only (every other fit's record stays as it was)
    held_out_p90_ape: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            k: (round(v, 5) if isinstance(v, float) else v)
            for k, v in asdict(self).items()
            if k != "held_out_p90_ape"
        }


@dataclass(frozen=True, slots=True)
class Fitted:
    params: Any
    error: FitError
    extra: dict[str, Any] = field(default_factory=dict)


def shape_family(*cols: pd.Series) -> np.ndarray:
    """One label per row joining integer shape columns (e.g. ``32/8/128``): the groups
    held out together when the fit reports its held-out error. Joined column by column
    (a row-wise join took ~80% of loading the 270k MoE rows)."""
    labels = np.asarray(cols[0]).astype(int).astype(str).astype(object)
    for c in cols[1:]:
        labels = labels + "/" + np.asarray(c).astype(int).astype(str).astype(object)
    return labels


T = TypeVar("T")


class KeptResults:
    """Results of a pure computation kept for the process by a key of what they are
    computed from (at most ``limit``; the oldest goes first): a fit or a table that one
    process asks for more than once (the diagnostics, the validation doc, the tests) is
    made once. Each caller gets its own deep copy, so no caller's change reaches the kept
    result or another caller."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._kept: dict[Any, Any] = {}

    def get(self, key: Any, make: Callable[[], T]) -> T:
        """A copy of the result kept under ``key``, made by ``make`` if none is; ``key``
        None: made, not kept."""
        if key is None:
            return make()
        if key not in self._kept:
            if len(self._kept) >= self.limit:
                del self._kept[next(iter(self._kept))]
            self._kept[key] = make()
        return cast(T, copy.deepcopy(self._kept[key]))


def by_rows(read: Callable[[np.ndarray], T]) -> Callable[[np.ndarray], T]:
    """``read`` kept per set of row indices: a fitter's model is called at every parameter
    vector with the same few index arrays (all rows, each held-out fold's), and what it
    reads of those rows does not depend on the parameters."""
    kept: dict[tuple[str, tuple[int, ...], bytes], T] = {}

    def rows(idx: np.ndarray) -> T:
        i = np.asarray(idx)
        key = (i.dtype.str, i.shape, i.tobytes())
        if key not in kept:
            kept[key] = read(i)
        return kept[key]

    return rows


def ape(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    meas = np.asarray(meas, float)
    return np.abs(np.asarray(pred, float) - meas) / meas


def _stats(a: np.ndarray) -> tuple[float, float, float]:
    return float(np.median(a)), float(np.mean(a)), float(np.percentile(a, 90))


def prediction_error(pred, held_out_pred, meas, held_out: str) -> FitError:
    """APE statistics of in-sample predictions and of held-out ones (``held_out`` names
    what was held out) against the measured ``meas``."""
    a, ho = ape(pred, meas), ape(held_out_pred, meas)
    return FitError(*_stats(a), len(a), float(np.median(ho)), float(np.mean(ho)), held_out=held_out)


# the fitter's robust loss on log time: soft-l1, quadratic within ~5 % of a row's time
LOSS = "soft_l1"
LOSS_SCALE = 0.05
MAX_NFEV = 400

# A fit whose cost has several local minima ends in the one its starts lead to, so its
# parameters follow the starts, not the rows (measured: TensorRT-LLM's XQA wave fit on the
# H100 bf16 rows from its two hand starts ends at cost 62.17, from them scaled by 0.5 or
# 0.77 per parameter at 58.31, by 1.3 at 62.47; fitted on <= 8 query heads per KV head it
# predicts the >= 12 rows 11.6-21.0 % median as the starts move). A searched fit (``search`` > 0 starts) also
# starts from that many points drawn log-uniformly in the parameter box (SEARCH_SEED), runs
# every start SCREEN_NFEV evaluations on at most SCREEN_ROWS of the rows (every k-th, so
# the screen costs the same on the largest tables) and finishes the SEARCH_KEEP best on
# every row.
SEARCH_SEED = 20261203
SCREEN_NFEV = 25
SCREEN_ROWS = 1500
SEARCH_KEEP = 4


def search_starts(lower: Sequence[float], upper: Sequence[float], num: int) -> np.ndarray:
    """``num`` points drawn log-uniformly in the box ``[lower, upper]`` (seeded: the same
    points every time), one per row."""
    lo, hi = np.log(np.asarray(lower, float)), np.log(np.asarray(upper, float))
    u = np.random.default_rng(SEARCH_SEED).uniform(size=(num, lo.size))
    return np.exp(lo + u * (hi - lo))


def _log_residual(
    model: Callable[[np.ndarray, np.ndarray], np.ndarray], idx: np.ndarray, meas: np.ndarray
) -> Callable[[np.ndarray], np.ndarray]:
    logm = np.log(meas[idx])

    def resid(theta: np.ndarray) -> np.ndarray:
        pred = model(np.exp(theta), idx)
        return np.log(np.maximum(pred, 1e-15)) - logm

    return resid


def log_fit_cost(
    model: Callable[[np.ndarray, np.ndarray], np.ndarray],
    idx: np.ndarray,
    meas: np.ndarray,
    params: Sequence[float] | np.ndarray,
) -> float:
    """The cost the fitter minimises (``least_squares``' soft-l1 cost of the log-time
    residuals) at ``params``."""
    r = _log_residual(model, idx, np.asarray(meas, float))(np.log(np.asarray(params, float)))
    z = (r / LOSS_SCALE) ** 2
    return float(0.5 * LOSS_SCALE**2 * np.sum(2.0 * (np.sqrt(1.0 + z) - 1.0)))


def _least_squares_log(
    model: Callable[[np.ndarray, np.ndarray], np.ndarray],
    idx: np.ndarray,
    meas: np.ndarray,
    starts: Sequence[Sequence[float]],
    lower: Sequence[float],
    upper: Sequence[float],
    search: int = 0,
) -> np.ndarray:
    """Best of several starts of ``least_squares`` over log-parameters; returns parameters.
    ``search`` > 0 adds that many :func:`search_starts` and screens them all (see
    :data:`SEARCH_KEEP`)."""
    lo, hi = np.log(np.asarray(lower, float)), np.log(np.asarray(upper, float))
    resid = _log_residual(model, idx, meas)
    points = [np.log(np.asarray(x0, float)) for x0 in starts]
    if search > 0:
        points += list(np.log(search_starts(lower, upper, search)))
        screen = idx[:: max(1, -(-idx.size // SCREEN_ROWS))]
        screen_resid = _log_residual(model, screen, meas)
        screened = [
            least_squares(
                screen_resid, np.clip(t0, lo + 1e-9, hi - 1e-9), bounds=(lo, hi), loss=LOSS,
                f_scale=LOSS_SCALE, x_scale=1.0, max_nfev=SCREEN_NFEV,
            )
            for t0 in points
        ]  # fmt: skip
        # stable: ties keep the order of the starts
        points = [r.x for r in sorted(screened, key=lambda r: r.cost)[:SEARCH_KEEP]]
    best = None
    for t0 in points:
        r = least_squares(
            resid, np.clip(t0, lo + 1e-9, hi - 1e-9), bounds=(lo, hi), loss=LOSS,
            f_scale=LOSS_SCALE, x_scale=1.0, max_nfev=MAX_NFEV,
        )  # fmt: skip
        if best is None or r.cost < best.cost:
            best = r
    assert best is not None
    return np.exp(best.x)


def _folds(groups: np.ndarray | None, n: int) -> tuple[list[np.ndarray], str]:
    """Index sets to hold out: by shape family when there are >= 3 families, else random."""
    if groups is not None:
        uniq = pd.unique(pd.Series(groups))
        if len(uniq) >= 3:
            fold_of = {g: i % NUM_FOLDS for i, g in enumerate(uniq)}
            f = np.array([fold_of[g] for g in groups])
            return [
                np.flatnonzero(f == i) for i in range(min(NUM_FOLDS, len(uniq)))
            ], "shape families"
    if n < 2 * NUM_FOLDS:
        return [], ""
    perm = np.random.default_rng(12345).permutation(n)
    return [perm[i::NUM_FOLDS] for i in range(NUM_FOLDS)], f"{NUM_FOLDS}-fold random"


def fit_generic(
    model: Callable[[np.ndarray, np.ndarray], np.ndarray],
    meas: np.ndarray,
    starts: Sequence[Sequence[float]],
    lower: Sequence[float],
    upper: Sequence[float],
    groups: np.ndarray | None = None,
    held_out: bool = True,
) -> tuple[np.ndarray, FitError]:
    """Fit ``model(params, idx) -> seconds`` to ``meas``; error on all and held-out points."""
    meas = np.asarray(meas, float)
    n = len(meas)
    if n == 0:
        raise ValueError("no measured points to fit")
    every = np.arange(n)
    params = _least_squares_log(model, every, meas, starts, lower, upper)
    med, mean, p90 = _stats(ape(model(params, every), meas))
    ho_med = ho_mean = ho_p90 = None
    how = ""
    if held_out:
        errs, how = held_out_apes(model, meas, params, lower, upper, groups)
        if how:
            ho_med, ho_mean, ho_p90 = _stats(errs[~np.isnan(errs)])
    return params, FitError(med, mean, p90, n, ho_med, ho_mean, how, ho_p90)


def held_out_apes(
    model: Callable[[np.ndarray, np.ndarray], np.ndarray],
    meas: np.ndarray,
    params: Sequence[float] | np.ndarray,
    lower: Sequence[float],
    upper: Sequence[float],
    groups: np.ndarray | None = None,
) -> tuple[np.ndarray, str]:
    """Each row's APE predicted by a refit without its fold (whole shape families when
    ``groups`` has >= 3, else random folds; each refit starts from ``params``), and how the
    folds were made (``""`` and NaNs when there are too few rows)."""
    meas = np.asarray(meas, float)
    n = len(meas)
    every = np.arange(n)
    errs = np.full(n, np.nan)
    folds, how = _folds(groups, n)
    for test in folds:
        train = np.setdiff1d(every, test)
        p = _least_squares_log(model, train, meas, [list(params)], lower, upper)
        errs[test] = ape(model(p, test), meas[test])
    return errs, how


# Fits run their linear algebra (least_squares' SVDs and matrix products) on one BLAS
# thread: OpenBLAS splits a product over its threads, the split changes the rounding, and
# a fit's flat directions (a floor at its bound, a half-saturation point) then end
# elsewhere in the fifth digit, so the files a refit writes would depend on the core count
# (measured: H100 vllm-flash FP8 decode par_half_sat 14.876 on one thread, 14.877 on two).
BLAS_ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def restart_on_one_blas_thread(module: str) -> None:
    """Re-run ``python -m module`` with this process's arguments on one BLAS thread, unless
    it runs on one already. OpenBLAS reads its thread count when numpy loads, so a command
    that writes shipped files calls this first, from its ``__main__`` block."""
    if all(os.environ.get(k) == v for k, v in BLAS_ONE_THREAD.items()):
        return
    argv = [sys.executable, "-m", module, *sys.argv[1:]]
    os.execve(sys.executable, argv, {**os.environ, **BLAS_ONE_THREAD})


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the block with every BLAS and OpenMP thread pool loaded in this process on one
    thread (threadpoolctl), restoring them after: the in-process form of
    :func:`restart_on_one_blas_thread`, for commands that cannot restart themselves
    (``disaggsim calibrate ...`` has numpy loaded, and tests call it in-process). The
    limit reaches only libraries loaded when the block starts, so scipy's own OpenBLAS
    (``scipy.linalg``, which ``least_squares`` uses) is loaded first. A fit then writes
    the same bytes as the restarted module entries do."""
    import scipy.linalg  # noqa: F401  (loads scipy's OpenBLAS before the limit)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        yield


# ---- per-op fitters: each calls exactly the ops.py function the step model uses ----


def fit_gemm(
    peaks: GpuPeaks,
    m,
    n,
    k,
    t_s,
    dtype: str = "bf16",
    groups=None,
    held_out: bool = True,
    extra_s=None,
    launch_s: float | None = None,
) -> Fitted:
    """GEMM parameters from measured ``t_s``. ``extra_s`` (per row, seconds) is time the
    measurement holds beside the GEMM kernel, added to every prediction (an FP8 GEMM's
    activation-quantisation kernel, costed as an element-wise op); ``launch_s`` fixes the
    floor instead of fitting it."""
    m, n, k, t_s = (np.asarray(x, float) for x in (m, n, k, t_s))
    extra = np.zeros_like(t_s) if extra_s is None else np.asarray(extra_s, float)

    def prm_of(p) -> GemmParams:
        if launch_s is None:
            return GemmParams(launch_s=p[0], max_eff=p[1], half_sat=p[2], mem_eff=p[3])
        return GemmParams(launch_s=launch_s, max_eff=p[0], half_sat=p[1], mem_eff=p[2])

    def model(p, idx):
        return ops.gemm_time_s(peaks, prm_of(p), m[idx], n[idx], k[idx], dtype) + extra[idx]

    starts: list[tuple[float, ...]] = [
        (5e-6, 0.75, 64.0, 0.8),
        (2e-6, 0.9, 256.0, 0.6),
        (1e-5, 0.5, 16.0, 0.9),
    ]
    lo: tuple[float, ...] = (1e-8, 1e-4, 1e-2, 1e-4)
    hi: tuple[float, ...] = (1e-2, 1.0, 1e5, 1.0)
    if launch_s is not None:
        starts = [s[1:] for s in starts]
        lo, hi = lo[1:], hi[1:]
    p, err = fit_generic(model, t_s, starts, lo, hi, groups, held_out)
    return Fitted(prm_of(p), err)


def fit_decode_attention(
    peaks: GpuPeaks,
    batch,
    context_tokens,
    kv_heads,
    head_dim,
    t_s,
    kv_elem_bytes: float = 2.0,
    groups=None,
    held_out: bool = True,
    floor_s: float | None = None,
    overlap: float | None = 1.0,
    q_per_kv=None,
    split_kv: bool = False,
    group_q_per_kv=None,
    item_terms: bool = False,
    occupancy: tuple[float, float] | None = None,
) -> Fitted:
    """Decode-attention parameters; ``floor_s`` fixes the kernel floor (e.g. for rows timed
    without graphs, whose short calls carry launch time, not kernel time). ``overlap`` of
    per-item work and KV stream: 1 (default) is the roofline, the kernel takes the longer of
    the two, so extrapolation in batch, KV heads and context follows whichever bound binds
    (fitting it, ``None``, gains at most 1-3 points on the public tables and lets a fit
    add the two where the data is thin); a number fixes it. ``q_per_kv`` (query heads per
    KV head, per row) fits a per-query-head kernel (TensorRT-LLM's masked MHA): work items
    per query head and the L2 re-read rate ``reread_bytes_per_s`` of a KV head shared by
    several (``ops.decode_stream_seconds_per_byte``). ``split_kv`` fits a split-KV kernel
    (``split_fill_s``: few work items pay a fixed time and the KV stream runs at full
    bandwidth, as FlashAttention's split-KV and TensorRT-LLM's multi-block mode split a
    long sequence over several thread blocks) instead of the bandwidth share of few items.
    ``group_q_per_kv`` (query heads per KV head, per row) fits a grouped kernel's group rate
    ``group_bytes_per_s`` (its work per query head on each KV byte: TensorRT-LLM's XQA).
    ``item_terms`` also fits the per-item work's fixed part ``per_item_s`` and, for a
    grouped kernel, its query-head part ``per_q_elem_s`` (``ops.decode_item_seconds``; the
    query heads per KV head from ``group_q_per_kv``, else 1); a per-query-head kernel's
    items carry one query head each, so there ``per_seq_kv_elem_s`` is that part already
    (fitting both would leave a flat direction). ``occupancy`` = ``(SMs, shared memory per SM
    in KiB)`` (datasheet) fits a per-query-head kernel's resident-block rate
    ``block_bytes_per_s`` (TensorRT-LLM's masked MHA: ``ops.mmha_resident_blocks``), last."""
    b, c, kh, d, t_s = (
        np.asarray(x, float) for x in (batch, context_tokens, kv_heads, head_dim, t_s)
    )
    per_qh = q_per_kv is not None
    g = np.asarray(q_per_kv, float) if per_qh else np.ones_like(b)
    grouped = group_q_per_kv is not None
    gq = np.asarray(group_q_per_kv, float) if grouped else np.ones_like(b)
    # query heads per KV head: the group rate and the per-query-head-element work
    qk = gq if grouped else g
    i_item = 7 + per_qh + split_kv  # index of per_item_s when fitted (per_q_elem_s next)

    def params(p) -> DecodeAttentionParams:
        return DecodeAttentionParams(
            floor_s=p[0] if floor_s is None else floor_s,
            per_seq_s=p[1],
            bw_eff=p[2],
            per_seq_kv_elem_s=p[3],
            par_half_sat=p[4],
            multi_floor_s=p[5],
            overlap=p[6] if overlap is None else overlap,
            reread_bytes_per_s=p[7] if per_qh else 0.0,
            split_fill_s=p[7 + per_qh] if split_kv else 0.0,
            group_bytes_per_s=p[-1 - (occupancy is not None)] if grouped else 0.0,
            per_item_s=p[i_item] if item_terms else 0.0,
            per_q_elem_s=p[i_item + 1] if item_terms and not per_qh else 0.0,
            block_bytes_per_s=p[-1] if occupancy is not None else 0.0,
            occupancy_sms=occupancy[0] if occupancy is not None else 0.0,
            smem_per_sm_kib=occupancy[1] if occupancy is not None else 0.0,
        )

    def model(p, idx):
        return ops.decode_attention_time_s(
            peaks, params(p), b[idx], c[idx], kh[idx], d[idx], kv_elem_bytes, g[idx],
            q_per_kv=qk[idx],
        )  # fmt: skip

    # (floor_s, per_seq_s, bw_eff, per_seq_kv_elem_s, par_half_sat, multi_floor_s, overlap);
    # the log-space bounds keep every parameter > 0, the lower ones small enough to mean
    # "term off"
    starts: list[tuple[float, ...]] = [
        (8e-6, 1e-8, 0.7, 1e-10, 1.0, 1e-6, 0.9),
        (3e-6, 1e-9, 0.5, 1e-11, 0.1, 5e-6, 0.5),
        (2e-5, 1e-7, 0.9, 1e-9, 10.0, 1e-8, 0.99),
    ]
    lo = [1e-8, 1e-13, 1e-4, 1e-15, 1e-4, 1e-12, 1e-6]
    hi = [1e-2, 1e-3, 1.0, 1e-5, 1e4, 1e-3, 1.0]
    if per_qh:  # the re-read rate (bytes/s): from well under to well over HBM bandwidth
        hbm = peaks.hbm_bytes_per_s
        starts = [(*s0, 2.0 * hbm * kv_elem_bytes / 2.0) for s0 in starts]
        lo.append(0.1 * hbm)
        hi.append(100.0 * hbm)
    if split_kv:  # the few-item time (s)
        starts = [(*s0, f) for s0, f in zip(starts, (5e-6, 2e-5, 1e-6), strict=True)]
        lo.append(1e-12)
        hi.append(1e-2)
    if item_terms:  # per-item fixed time (s), and per query-head element (s) when grouped
        starts = [(*s0, i) for s0, i in zip(starts, (2e-8, 5e-9, 1e-7), strict=True)]
        lo.append(1e-15)
        hi.append(1e-4)
        if not per_qh:
            starts = [(*s0, q) for s0, q in zip(starts, (5e-12, 1e-12, 2e-11), strict=True)]
            lo.append(1e-18)
            hi.append(1e-8)
    if grouped:  # the group rate (bytes/s), last: from HBM bandwidth to well over it
        hbm = peaks.hbm_bytes_per_s
        starts = [(*s0, f * hbm) for s0, f in zip(starts, (10.0, 5.0, 30.0), strict=True)]
        lo.append(hbm)
        hi.append(1000.0 * hbm)
    if occupancy is not None:  # a resident block's stream rate (bytes/s), last
        if not per_qh:
            raise ValueError("occupancy: a per-query-head kernel's term (give q_per_kv)")
        # started inside the window where the bound binds at 1-2 resident blocks and not at
        # 4 (k x SMs x rate below the HBM stream, 4 x SMs x rate above it: 0.25-1 x hbm /
        # SMs): a rate that binds nowhere has no gradient to leave by, and one that binds at
        # 4 blocks too is pushed there. Measured: starts at 0.1, 0.2 and 0.5 left 6 of the
        # H100's 15 bf16 refits without one head-layout family at a rate binding nowhere
        # (the family's 1-2-block rows 17-25% off; python -m calibration.fit_public
        # --mmha-occupancy h100-sxm)
        sms = occupancy[0]
        hbm = peaks.hbm_bytes_per_s
        starts = [(*s0, f * hbm / sms) for s0, f in zip(starts, (0.7, 0.5, 0.35), strict=True)]
        lo.append(1e-3 * hbm / sms)
        hi.append(10.0 * hbm / sms)
    p, err = fit_generic(model, t_s, starts, lo, hi, groups, held_out)
    return Fitted(params(p), err)


# a wave kernel's fit searches this many starts beside its hand starts (SEARCH_KEEP):
# measured, 32 find the H100 XQA bf16 rows' lowest cost (58.31) from the hand starts as
# given and scaled by 0.5, 0.77 and 2 per parameter; 16 (screened for 30 evaluations,
# keeping 3) missed it from one of them
WAVE_SEARCH_STARTS = 32
# the group rate is fitted only where holding it at its roofline
# (group_rate_roofline) costs the fit more than this fraction of its cost; else it is held
# there. Measured (OPENBLAS_NUM_THREADS=1): on rows of <= 8 query heads per KV head, where
# the group rate binds no full wave, fits ending at 3.2e13-2.0e15 B/s differ in cost by
# <= 4e-5 of it (A100 bf16) and holding it gains nothing to 12 digits (H100 bf16), while on
# every row (to 32 per KV head) fitting it gains 1.2 % (H100 bf16), 8.6 % (H100 FP8 KV)
# and 2.3 % (A100 bf16)
GROUP_RATE_MIN_GAIN = 1e-3


def group_rate_roofline(peaks: GpuPeaks, kv_elem_bytes: float) -> float:
    """The fastest group rate (bytes/s) the tensor cores allow a grouped decode kernel: one
    multiply-add (2 FLOP) per query head on each KV element, at the dense peak of the KV
    dtype's math (FP8 where the GPU has it and the cache is FP8, else bf16), with
    ``kv_elem_bytes`` bytes per element."""
    fp8 = kv_elem_bytes == 1.0 and peaks.fp8_flop_per_s > 0.0
    return peaks.flop_per_s("fp8" if fp8 else "bf16") * kv_elem_bytes / 2.0


def fit_decode_wave(
    peaks: GpuPeaks,
    batch,
    context_tokens,
    kv_heads,
    head_dim,
    t_s,
    q_per_kv,
    num_sms: int,
    kv_elem_bytes: float = 2.0,
    groups=None,
    held_out: bool = True,
    per_query_head: bool = False,
) -> Fitted:
    """A multi-block wave decode kernel (``ops.decode_wave_lines``) on ``num_sms`` SMs: its
    floor, the fixed time per thread block, the KV bandwidth share (``bw_eff`` ≤ 1), a
    block's own streaming rate in a partial wave and the split's reduction (fixed and per
    partial element); for a grouped kernel (TensorRT-LLM's XQA) also the time per
    query-head element of a block and the group rate, for a per-query-head kernel
    (``per_query_head``: TensorRT-LLM's masked MHA) the L2 re-read rate instead.
    ``q_per_kv``: query heads per KV head, per row.

    The fit searches :data:`WAVE_SEARCH_STARTS` starts, so where its cost has several
    minima it ends in the lowest, not in the one its hand starts lead to. The group rate
    is at most its roofline (:func:`group_rate_roofline`) and held there unless the rows
    determine it (:data:`GROUP_RATE_MIN_GAIN`): rows whose full waves it does not bind
    leave it flat above the rate where it starts to bind them, and a solver would stop
    anywhere there (where its starts and the BLAS rounding lead), moving the prediction
    of larger groups."""
    b, c, kh, d, t_s, q = (
        np.asarray(x, float) for x in (batch, context_tokens, kv_heads, head_dim, t_s, q_per_kv)
    )
    hbm = peaks.hbm_bytes_per_s
    share = hbm / num_sms  # one SM's share of the HBM bandwidth

    names: tuple[str, ...]
    if per_query_head:
        names = ("floor_s", "bw_eff", "cta_s", "cta_bytes_per_s", "reread_bytes_per_s",
                 "split_s", "split_elem_s")  # fmt: skip
        starts: list[tuple[float, ...]] = [
            (5e-6, 0.8, 3e-6, 2.0 * share, 5.0 * hbm, 3e-6, 1e-11),
            (3e-6, 0.9, 1e-6, share, 2.0 * hbm, 1e-6, 1e-12),
        ]
        lo: tuple[float, ...] = (1e-8, 1e-3, 1e-10, 0.05 * share, 0.2 * hbm, 1e-10, 1e-16)
        hi: tuple[float, ...] = (1e-3, 1.0, 1e-3, hbm, 100.0 * hbm, 1e-3, 1e-6)
    else:
        roof = group_rate_roofline(peaks, kv_elem_bytes)
        names = ("floor_s", "bw_eff", "cta_s", "cta_q_elem_s", "cta_bytes_per_s",
                 "group_bytes_per_s", "split_s", "split_elem_s")  # fmt: skip
        starts = [
            (5e-6, 0.8, 3e-6, 1e-10, 2.0 * share, min(30.0 * hbm, roof), 3e-6, 1e-11),
            (3e-6, 0.9, 5e-6, 1e-11, share, min(10.0 * hbm, roof), 1e-6, 1e-12),
        ]
        lo = (1e-8, 1e-3, 1e-9, 1e-16, 0.1 * share, hbm, 1e-10, 1e-16)
        hi = (1e-3, 1.0, 1e-3, 1e-6, hbm, roof, 1e-3, 1e-6)

    # the split counts and waves do not depend on the parameters: computed once, not at
    # every parameter vector the solver tries (bit-identical to ops.decode_attention_time_s)
    geometry = ops.decode_wave_geometry(b, kh, d, q, float(num_sms), per_query_head)
    rows = by_rows(geometry.take)

    def builder(fit_names: tuple[str, ...], held: dict[str, float]):
        def params(p) -> DecodeAttentionParams:
            fitted = {name: float(v) for name, v in zip(fit_names, p, strict=True)}
            return DecodeAttentionParams(
                per_seq_s=0.0, overlap=1.0, wave_sms=float(num_sms), **fitted, **held
            )

        def model(p, idx):
            return ops.decode_wave_time_s(peaks, params(p), rows(idx), c[idx], kv_elem_bytes)

        return params, model

    params, model = builder(names, {})
    every = np.arange(t_s.size)
    found = _least_squares_log(model, every, t_s, starts, lo, hi, WAVE_SEARCH_STARTS)
    # rates the rows leave undetermined, held at their bound, in turn: the group rate at its
    # roofline, then the HBM share at 1 (a grouped kernel whose block rate binds every full
    # wave: the A100's K-only XQA table, fit_public.table_hbm_share)
    holds = [] if per_query_head else [("group_bytes_per_s", roof), ("bw_eff", 1.0)]
    held: dict[str, float] = {}
    for name, bound in holds:
        i = names.index(name)
        keep = [k for k in range(len(names)) if k != i]
        h_names = tuple(names[k] for k in keep)
        h_lo, h_hi = tuple(lo[k] for k in keep), tuple(hi[k] for k in keep)
        h_params, h_model = builder(h_names, {**held, name: bound})
        h_found = _least_squares_log(h_model, every, t_s, [found[keep].tolist()], h_lo, h_hi)
        free_cost = log_fit_cost(model, every, t_s, found)
        if log_fit_cost(h_model, every, t_s, h_found) <= free_cost * (1.0 + GROUP_RATE_MIN_GAIN):
            names, params, model, found, lo, hi = h_names, h_params, h_model, h_found, h_lo, h_hi
            held[name] = bound
    p, err = fit_generic(model, t_s, [found.tolist()], lo, hi, groups, held_out)
    return Fitted(params(p), err)


def fit_prefill_attention(
    peaks: GpuPeaks,
    num_seqs,
    new_tokens,
    pairs,
    heads,
    head_dim,
    t_s,
    dtype: str = "bf16",
    groups=None,
    held_out: bool = True,
    floor_s: float | None = None,
) -> Fitted:
    """Prefill-attention parameters; ``floor_s`` fixes the kernel floor (see
    :func:`fit_decode_attention`)."""
    s, nt, pr, h, d, t_s = (
        np.asarray(x, float) for x in (num_seqs, new_tokens, pairs, heads, head_dim, t_s)
    )

    def prm_of(p) -> PrefillAttentionParams:
        if floor_s is None:
            return PrefillAttentionParams(floor_s=p[0], max_eff=p[1], half_sat=p[2])
        return PrefillAttentionParams(floor_s=floor_s, max_eff=p[0], half_sat=p[1])

    def model(p, idx):
        return ops.prefill_attention_time_s(
            peaks, prm_of(p), s[idx], nt[idx], pr[idx], h[idx], d[idx], dtype
        )

    starts: list[tuple[float, ...]] = [(1e-5, 0.6, 512.0), (5e-6, 0.8, 128.0), (3e-5, 0.4, 2048.0)]
    lo: tuple[float, ...] = (1e-8, 1e-4, 1e-2)
    hi: tuple[float, ...] = (1e-2, 1.0, 1e6)
    if floor_s is not None:
        starts = [x[1:] for x in starts]
        lo, hi = lo[1:], hi[1:]
    p, err = fit_generic(model, t_s, starts, lo, hi, groups, held_out)
    return Fitted(prm_of(p), err)


def fit_elementwise(peaks: GpuPeaks, nbytes, t_s, groups=None, held_out: bool = True) -> Fitted:
    nb, t_s = np.asarray(nbytes, float), np.asarray(t_s, float)

    def model(p, idx):
        return ops.elementwise_time_s(peaks, ElementwiseParams(launch_s=p[0], bw_eff=p[1]), nb[idx])

    p, err = fit_generic(
        model, t_s, [(3e-6, 0.7), (1e-5, 0.4)], (1e-8, 1e-4), (1e-2, 1.0), groups, held_out
    )
    return Fitted(ElementwiseParams(launch_s=p[0], bw_eff=p[1]), err)


GATHER_ONE_BLOCK_SIZE_RULE = (
    "one block size in the rows: per_block_s held at 0 (the per-block cost is folded into "
    "bw_bytes_per_s; rows of two or more block sizes are needed to separate them)"
)


def blocks_separable(nbytes, num_blocks) -> bool:
    """Whether gather rows can separate a per-block cost from the bandwidth: they hold at
    least two sizes of block (bytes per block differing by more than rounding)."""
    nb, blocks = np.asarray(nbytes, float), np.asarray(num_blocks, float)
    per_block = nb[blocks > 0] / blocks[blocks > 0]
    return per_block.size >= 2 and float(np.ptp(per_block)) > 1e-9 * float(per_block.max())


def fit_copy(nbytes, t_s, num_blocks=None, held_out: bool = True) -> Fitted:
    nb, t_s = np.asarray(nbytes, float), np.asarray(t_s, float)
    blocks = None if num_blocks is None else np.asarray(num_blocks, float)
    if blocks is None or not np.any(blocks > 0):

        def model(p, idx):
            return ops.copy_time_s(CopyParams(latency_s=p[0], bw_bytes_per_s=p[1]), nb[idx])

        p, err = fit_generic(
            model,
            t_s,
            [(1e-5, 1e11), (2e-6, 1e12), (1e-4, 1e10)],
            (1e-9, 1e6),
            (1.0, 1e14),
            held_out=held_out,
        )
        return Fitted(CopyParams(latency_s=p[0], bw_bytes_per_s=p[1]), err)

    if not blocks_separable(nb, blocks):
        # one block size: a per-block cost and the bandwidth move time in proportion, so the
        # rows cannot split them (any split fits equally, and which one a solver lands on
        # depends on the BLAS's rounding); the per-block cost is folded into the bandwidth
        f = fit_copy(nb, t_s, None, held_out)
        return Fitted(CopyParams(latency_s=f.params.latency_s,
                                 bw_bytes_per_s=f.params.bw_bytes_per_s, per_block_s=0.0),
                      f.error, {"rule": GATHER_ONE_BLOCK_SIZE_RULE})  # fmt: skip

    def model_b(p, idx):
        prm = CopyParams(latency_s=p[0], bw_bytes_per_s=p[1], per_block_s=p[2])
        return ops.copy_time_s(prm, nb[idx], blocks[idx])

    p, err = fit_generic(
        model_b,
        t_s,
        [(1e-5, 1e11, 1e-9), (3e-6, 1e12, 1e-8)],
        (1e-9, 1e6, 1e-14),
        (1.0, 1e14, 1e-3),
        held_out=held_out,
    )
    return Fitted(CopyParams(latency_s=p[0], bw_bytes_per_s=p[1], per_block_s=p[2]), err)


def fit_allreduce(nbytes, t_s, num_gpus: int, held_out: bool = True) -> Fitted:
    """Latency and bus bandwidth for one GPU count (``nbytes`` is the per-GPU buffer).

    Two protocols, the faster of which runs: Simple ``(latency_s, bus_bw)`` and LL
    ``(ll_latency_s, ll_bus_bw)``; ``params`` is ``(latency_s, bus_bw, ll_latency_s,
    ll_bus_bw)``. With fewer than 8 sizes only Simple is fitted (``ll_bus_bw`` 0)."""
    from disaggsim.hardware.profile import AllReduceParams

    nb, t_s = np.asarray(nbytes, float), np.asarray(t_s, float)
    if len(np.unique(nb)) < 8:

        def model1(p, idx):
            prm = AllReduceParams(((num_gpus, p[0], p[1]),))
            return ops.allreduce_time_s(prm, nb[idx], num_gpus)

        p, err = fit_generic(
            model1,
            t_s,
            [(1e-5, 1e11), (3e-5, 3e11), (5e-6, 5e10)],
            (1e-8, 1e8),
            (1e-1, 1e13),
            held_out=held_out,
        )
        return Fitted((p[0], p[1], 0.0, 0.0), err)

    def model(p, idx):
        prm = AllReduceParams(((num_gpus, p[0], p[1], p[2], p[3]),))
        return ops.allreduce_time_s(prm, nb[idx], num_gpus)

    # starts: Simple slow to start and fast, LL quick to start and about half as fast
    p, err = fit_generic(
        model,
        t_s,
        [(3e-5, 2e11, 5e-6, 5e10), (5e-5, 3e11, 1e-5, 1e11), (2e-5, 1e11, 3e-6, 3e10)],
        (1e-8, 1e8, 1e-8, 1e8),
        (1e-1, 1e13, 1e-1, 1e13),
        held_out=held_out,
    )
    simple, ll = (p[0], p[1]), (p[2], p[3])
    if ll[1] > simple[1]:  # name the higher-bandwidth protocol Simple
        simple, ll = ll, simple
    return Fitted((*simple, *ll), err)


# ---- raw folder → profile ----


def _round(x: float) -> float:
    return float(f"{x:.5g}")


def _params_dict(prm: Any) -> dict[str, float]:
    # the optional fields a profile leaves out at 0 (written only where fitted)
    optional = DECODE_FIELDS_OMITTED_AT_ZERO + GEMM_FIELDS_OMITTED_AT_ZERO
    return {k: _round(v) for k, v in asdict(prm).items() if not (k in optional and v == 0.0)}


def allreduce_dict(params: tuple[float, float, float, float]) -> dict[str, float]:
    """Profile entry for one GPU count from :func:`fit_allreduce` parameters."""
    lat, bw, ll_lat, ll_bw = params
    out = {"latency_s": _round(lat), "bus_bw_bytes_per_s": _round(bw)}
    if ll_bw > 0:
        out.update(ll_latency_s=_round(ll_lat), ll_bus_bw_bytes_per_s=_round(ll_bw))
    return out


def _dtype_key(dtype: str) -> str:
    return "bf16" if dtype in ("bf16", "fp16") else dtype


# Rows timed without CUDA graphs (the harness before graph timing, ``timing`` absent or
# ``eager``) hold the launch time of their call: their floors are not kernel time. Only
# rows at least this long are fitted, with the floor held at the base profile's.
EAGER_MIN_S = 40e-6
# raw ``backend`` names of attention rows -> the profile's attention backends
RAW_ATTENTION_BACKENDS = {
    "sdpa-flash": "sdpa-flash",
    "sdpa-cudnn": "sdpa-cudnn",
    "sdpa-efficient": "sdpa-efficient",
    "flex": "flex",
}


def _is_graph(rows: pd.DataFrame) -> np.ndarray:
    """Rows whose time is kernel time: replayed CUDA graphs, or the CPU path (no launches
    to separate there)."""
    if "timing" not in rows.columns:
        return np.zeros(len(rows), bool)
    return rows["timing"].astype(str).isin(["graph", "cpu"]).to_numpy()


# a GEMM row whose kernel time under the base profile is within this factor of the kernel
# floor (tiny GEMMs, all far below the rows compared) measures the run's per-call time
# (launch path or graph replay, weights cold in L2, floor); at least this many such rows
# are needed; and this many memory-bound rows to fit a memory efficiency on
FLOOR_ROW_FACTOR = 1.2
MIN_FLOOR_ROWS = 5
EAGER_MIN_GEMM_ROWS = 8


def per_call_time_s(
    pred_s: np.ndarray, meas_s: np.ndarray, launch_s: float, compared: np.ndarray
) -> tuple[float, int] | None:
    """A run's per-call time over the kernel: the median of measured minus predicted over
    its floor rows (predicted within :data:`FLOOR_ROW_FACTOR` of the kernel floor
    ``launch_s``, none of the ``compared`` rows), with the number of floor rows; None
    with fewer than :data:`MIN_FLOOR_ROWS` of them."""
    floor = (pred_s <= FLOOR_ROW_FACTOR * launch_s) & ~compared
    if int(floor.sum()) < MIN_FLOOR_ROWS:
        return None
    return float(np.median(meas_s[floor] - pred_s[floor])), int(floor.sum())


def fit_gemm_mem_eff_alone(
    peaks: GpuPeaks,
    base_prm: GemmParams,
    rows: pd.DataFrame,
    dtype: str,
    min_s: float = EAGER_MIN_S,
) -> Fitted | str:
    """The memory efficiency a GPU's GEMMs reach, the other parameters held at
    ``base_prm`` (a profile of the same SM architecture: the compute efficiencies and the
    kernel floor are the architecture's), to compare a run with the Hopper rule (the
    memory efficiency the architecture's too: docs/calibration.md, "Hopper rule"). The
    run's per-call time (timed call by call, the launch path; in CUDA graphs, the replay
    and weights cold in L2) is the median of measured minus ``base_prm``'s kernel time over
    its floor rows (:func:`per_call_time_s`, all shorter than ``min_s``) and is added to every prediction; ``mem_eff`` is fitted on the rows of
    at least ``min_s`` (the memory bound decides the weight-streaming ones; the
    compute-bound ones do not move it), held out by (n, k) shape family. A reason (str)
    instead when the rows cannot tell it. No profile is fitted this way: timed call by
    call a run's GEMMs reach less bandwidth than in graphs (the H200's 0.755 against 0.837
    for the same GEMMs), and a graph-timed run is fitted whole (:func:`fit_raw`)."""
    m, n, k, t_s = (rows[c].to_numpy(float) for c in ("m", "n", "k", "median_s"))
    pred0 = ops.gemm_time_s(peaks, base_prm, m, n, k, dtype)
    long = t_s >= min_s
    call = per_call_time_s(pred0, t_s, base_prm.launch_s, long)
    if call is None:
        return f"fewer than {MIN_FLOOR_ROWS} floor rows to measure the per-call time"
    call_s, n_floor = call
    compute_s = ops.gemm_flop(m, n, k) / (
        peaks.flop_per_s(dtype) * ops.gemm_compute_eff(base_prm, m, n, k)
    )
    memory_s = ops.gemm_bytes(m, n, k, 1.0 if dtype == "fp8" else 2.0) / (
        peaks.hbm_bytes_per_s * base_prm.mem_eff
    )
    if int((long & (memory_s > compute_s)).sum()) < EAGER_MIN_GEMM_ROWS:
        return (
            f"fewer than {EAGER_MIN_GEMM_ROWS} memory-bound rows of at least {min_s * 1e6:.0f} us"
        )
    sel = np.flatnonzero(long)
    ms, ns, ks, ts = m[sel], n[sel], k[sel], t_s[sel]

    def model(p, idx):
        prm = replace(base_prm, mem_eff=float(p[0]))
        return ops.gemm_time_s(peaks, prm, ms[idx], ns[idx], ks[idx], dtype) + call_s

    fam = shape_family(pd.Series(ns), pd.Series(ks))
    p, err = fit_generic(model, ts, [(base_prm.mem_eff,), (0.5,)], (1e-3,), (1.0,), fam)
    return Fitted(
        replace(base_prm, mem_eff=float(p[0])),
        err,
        {
            "rule": (
                f"mem_eff alone fitted on the {len(sel)} rows >= {min_s * 1e6:.0f} us with "
                f"the run's per-call time ({call_s * 1e6:.2f} us, median over "
                f"{n_floor} floor rows) added; launch_s, max_eff, half_sat held at "
                f"the base profile's (same SM architecture); base mem_eff {base_prm.mem_eff:.5g}"
            ),
            "per_call_s": _round(call_s),
            "base_mem_eff": base_prm.mem_eff,
        },
    )


@dataclass
class RawFit:
    """What :func:`fit_raw` made of a raw folder."""

    ops: dict[str, Any] = field(default_factory=dict)
    backends: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, Any] = field(default_factory=dict)
    measured: list[str] = field(default_factory=list)
    not_fitted: dict[str, str] = field(default_factory=dict)


def fit_raw(df: pd.DataFrame, peaks: GpuPeaks, base: Any | None = None) -> RawFit:
    """Fit every op present in raw rows ``df`` that its timing allows (module notes):

    - graph-timed rows (``timing == graph``): every op;
    - rows timed call by call: element-wise and GEMM rows are not fitted (their floors
      are launch time, which their fitted efficiencies would absorb; and an eager loop
      lowers the bandwidth a weight-streaming GEMM reaches: the same H200 GEMMs fit
      ``mem_eff`` 0.755 timed call by call and 0.837 graph-timed,
      :func:`fit_gemm_mem_eff_alone` over each run); attention rows of at
      least :data:`EAGER_MIN_S` are fitted per backend with the floor held at ``base``'s
      (a :class:`HardwareProfile`; required for this rule); copies and all-reduces are
      fitted (a copy or collective is launched by the host in an engine too).

    Attention rows go to ``backends[<backend>]`` (:data:`RAW_ATTENTION_BACKENDS`), other ops
    to ``ops``."""
    out = RawFit()
    g = df[df["op"] == "gemm"]
    for dt, rows in g.groupby("dtype"):
        key = _dtype_key(str(dt))
        graph = _is_graph(rows)
        if not graph.any():
            out.not_fitted[f"gemm.{key}"] = (
                f"{len(rows)} rows timed call by call: their ~7-9 us floor is launch time "
                "(graph-replayed Hopper GEMMs of the same shapes take 2.5-3 us), and an "
                "eager loop lowers the bandwidth a weight-streaming GEMM reaches too (the "
                "H200's GEMMs timed call by call fit mem_eff 0.755, the same GEMMs "
                "graph-timed on an H200 0.837: docs/calibration.md), so the base "
                "profile's graph-timed parameters are kept"
            )
            continue
        rows = rows[graph]
        f = fit_gemm(
            peaks,
            rows["m"],
            rows["n"],
            rows["k"],
            rows["median_s"],
            key,
            groups=shape_family(rows["n"], rows["k"]),
        )
        out.ops.setdefault("gemm", {})[key] = _params_dict(f.params)
        out.errors[f"gemm.{key}"] = f.error.as_dict()
        out.measured.append(f"gemm.{key}")
    ew = df[df["op"] == "elementwise"]
    if len(ew):
        graph = _is_graph(ew)
        if graph.any():
            rows = ew[graph]
            f = fit_elementwise(
                peaks, rows["nbytes"], rows["median_s"], groups=rows["kind"].astype(str).to_numpy()
            )
            out.ops["elementwise"] = _params_dict(f.params)
            out.errors["elementwise"] = f.error.as_dict()
            out.measured.append("elementwise")
        else:
            out.not_fitted["elementwise"] = "timed call by call (launch-bound floors)"
    for op in ("decode_attention", "prefill_attention"):
        a = df[df["op"] == op]
        for gkey, rows in a.groupby(["backend", "dtype"]):
            be, dt = (str(x) for x in cast(tuple, gkey))
            backend = RAW_ATTENTION_BACKENDS.get(be)
            key = _dtype_key(dt)
            label = f"attention.{backend or be}.{op.split('_')[0]}.{key}"
            if backend is None:
                out.not_fitted[label] = f"backend {be!r} is not a profile attention backend"
                continue
            graph = _is_graph(rows)
            floor = None
            if not graph.all():
                if base is None:
                    out.not_fitted[label] = "timed call by call and no base profile for the floor"
                    continue
                rows = rows[rows["median_s"].to_numpy() >= EAGER_MIN_S]
                if len(rows) < 8:
                    out.not_fitted[label] = (
                        f"fewer than 8 rows of at least {EAGER_MIN_S * 1e6:.0f} us"
                    )
                    continue
                floor = (
                    base.decode_attention_params(key).floor_s
                    if op == "decode_attention"
                    else base.prefill_attention_params(key).floor_s
                )
            fam = shape_family(rows["heads"], rows["kv_heads"], rows["head_dim"])
            if op == "decode_attention":
                f = fit_decode_attention(
                    peaks,
                    rows["batch"],
                    rows["context_tokens"],
                    rows["kv_heads"],
                    rows["head_dim"],
                    rows["median_s"],
                    kv_elem_bytes=1.0 if key == "fp8" else 2.0,
                    groups=fam,
                    floor_s=floor,
                )
            else:
                b = rows["batch"].to_numpy(float)
                pt = rows["prompt_tokens"].to_numpy(float)
                f = fit_prefill_attention(
                    peaks,
                    b,
                    b * pt,
                    b * ops.causal_pairs(pt),
                    rows["heads"],
                    rows["head_dim"],
                    rows["median_s"],
                    key,
                    groups=fam,
                    floor_s=floor,
                )
            sec = out.backends.setdefault(backend, {})
            sec.setdefault(op, {})[key] = _params_dict(f.params)
            err = f.error.as_dict()
            if floor is not None:
                err["rule"] = (
                    f"timed call by call: rows >= {EAGER_MIN_S * 1e6:.0f} us only, floor_s held "
                    "at the base profile's graph-timed floor"
                )
            out.errors[label] = err
            out.measured.append(label)
    c = df[df["op"] == "copy"]
    for kind, rows in c.groupby("kind"):
        blocks = rows["num_blocks"].fillna(0).to_numpy(float)
        f = fit_copy(rows["nbytes"], rows["median_s"], blocks if kind == "gather" else None)
        out.ops.setdefault("copy", {})[str(kind)] = _params_dict(f.params)
        out.errors[f"copy.{kind}"] = {**f.error.as_dict(), **f.extra}
        out.measured.append(f"copy.{kind}")
    a = df[df["op"] == "allreduce"]
    for ng_key, rows in a.groupby("num_gpus"):
        ng = int(cast(float, ng_key))
        f = fit_allreduce(rows["nbytes"], rows["median_s"], ng)
        out.ops.setdefault("allreduce", {})[str(ng)] = allreduce_dict(f.params)
        out.errors[f"allreduce.{ng}"] = f.error.as_dict()
        out.measured.append(f"allreduce.{ng}")
    return out


def build_profile(
    gpu: str, df: pd.DataFrame, base: dict, raw_dir: str, base_path: str
) -> dict[str, Any]:
    """A measured profile: what :func:`fit_raw` fits from ``df`` over a copy of the
    ``base`` profile dict; everything else carried (listed in the provenance)."""
    from disaggsim.hardware.profile import profile_from_dict

    pk = base["peaks"]
    peaks = GpuPeaks(
        pk["bf16_flop_per_s"], pk["fp8_flop_per_s"], pk["hbm_bytes_per_s"], pk["hbm_bytes"]
    )
    fit = fit_raw(df, peaks, profile_from_dict(base, base_path))
    ops_out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base["ops"].items()}
    for op, table in fit.ops.items():
        if op == "elementwise":
            ops_out[op] = table
            continue
        merged = dict(ops_out.get(op, {}))
        merged.update(table)
        ops_out[op] = merged
    backends = json.loads(json.dumps(base.get("attention_backends", {})))
    for name, sec in fit.backends.items():
        b = backends.setdefault(name, {})
        for op, table in sec.items():
            b[op] = {**b.get(op, {}), **table}
    carried = []
    for op, table in base["ops"].items():
        if op == "elementwise":
            if "elementwise" not in fit.measured:
                carried.append(op)
            continue
        for key in table:
            if f"{op}.{key}" not in fit.measured:
                carried.append(f"{op}.{key}")
    for name, sec in (base.get("attention_backends") or {}).items():
        for op, table in sec.items():
            for key in table:
                label = f"attention.{name}.{op.split('_')[0]}.{key}"
                if label not in fit.measured:
                    carried.append(label)
    kernels = json.loads(json.dumps(base.get("gemm_kernels") or {}))
    carried += [f"gemm_kernels.{name}" for name in kernels]
    carried.append("graph_replay")
    first = df.iloc[0]
    base_errors = {k: v for k, v in (base.get("fit_error") or {}).items() if k not in fit.errors}
    return {
        "schema_version": 1,
        "gpu": gpu,
        "peaks": dict(pk),
        "ops": ops_out,
        "attention_backends": backends,
        "attention_auto": json.loads(json.dumps(base.get("attention_auto", {}))),
        "gemm_kernels": kernels,
        "graph_replay": dict(base.get("graph_replay") or {"per_layer_s": 0.0}),
        "fit_error": {**fit.errors, **{f"carried:{k}": v for k, v in base_errors.items()}},
        "provenance": {
            "kind": "measured",
            "source": f"disaggsim calibrate on {first['device_name']}; fitted by calibration.fit",
            "device_name": str(first["device_name"]),
            "driver": "" if pd.isna(first["driver"]) else str(first["driver"]),
            "torch_version": str(first["torch_version"]),
            "cuda_version": "" if pd.isna(first["cuda_version"]) else str(first["cuda_version"]),
            "measured_date": str(first["date"]),
            "raw_dir": str(raw_dir),
            "timing": sorted(set(df["timing"].astype(str)))
            if "timing" in df.columns
            else ["call by call (CUDA events around each call)"],
            "backends": sorted({f"{o}:{b}" for o, b in zip(df["op"], df["backend"], strict=True)}),
            "measured": fit.measured,
            "not_fitted": fit.not_fitted,
            "carried": carried,
            "base_profile": base_path,
            "base_kind": (base.get("provenance") or {}).get("kind", ""),
            "base_source": (base.get("provenance") or {}).get("source", ""),
            "peaks_from": f"base profile {base_path} (datasheet)",
        },
    }
