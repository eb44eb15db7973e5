"""Torch microbenchmarks: the only module of disaggsim that imports torch.

Runs the sweeps of ``disaggsim calibrate --device cuda|cpu`` and appends one raw CSV row
per measured point (:mod:`calibration.rawio`):

- GEMM in bf16, and fp8 through ``torch._scaled_mm`` with precomputed scales (sm_89+),
  over m = 1 … 16k tokens × the (n, k) of real TP shards of catalog models, plus squares;
- decode attention (one query token per sequence) over batch × context × head layouts and
  causal prefill attention over prompt length, through every attention kernel the device
  runs: torch SDPA with each backend forced in turn (flash, cuDNN, efficient) and
  FlexAttention (decode: a block mask over each sequence's 128-token KV pages; prefill:
  the causal block mask), one row per kernel;
- element-wise kernels: residual add, SiLU-and-multiply, and the FP8 activation
  quantisation an FP8 GEMM needs (bf16 in, fp8 out);
- KV copies: d2d, pinned h2d / d2h, p2p (2+ GPUs), and a paged-block gather (16-token
  blocks → one contiguous buffer via ``index_select``);
- all-reduce through ``torch.distributed`` over 2, 4, 8 ranks (as many as the GPUs
  visible allow: NCCL, one process per GPU; not measured with one GPU). On CPU two gloo
  ranks run the same code, so the multi-process path is tested without a GPU.

Time kernels, not launches (:func:`time_kernel`): on a GPU each measured op is captured in
a CUDA graph — as many calls per graph as keep one replay near
:data:`GRAPH_TARGET_S`, cycling through enough copies of the inputs that the calls do not
run out of L2 — and the replays are timed with CUDA events after an L2 flush; a row is
one call's share of a replay. Launch and Python time never enter a kernel row (they belong
to the engine profiles, ``disaggsim/hardware/engines.py``). On CPU the same calls run back
to back under ``time.perf_counter`` (no graphs), so the whole pipeline is testable without
a GPU; the ``timing`` column says which. Copies and all-reduces are timed one call at a
time (an engine launches those from the host too). Every op runs in its own try/except
under its own time budget, so one failure or a slow op does not lose the rest; rows are
written as they are measured.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from calibration.rawio import RawWriteError, RawWriter

# (name, hidden, heads, kv_heads, head_dim, ffn, gated, tp) used when the model catalog
# is not importable; the same numbers the catalog holds for these public models.
_FALLBACK_SHARDS = (
    ("llama-3-8b", 4096, 32, 8, 128, 14336, True, 1),
    ("llama-3-70b", 8192, 64, 8, 128, 28672, True, 8),
    ("llama-3-70b", 8192, 64, 8, 128, 28672, True, 4),
    ("opt-13b", 5120, 40, 40, 128, 20480, False, 1),
)
_CATALOG_SHARDS = (("llama-3-8b", 1), ("llama-3-70b", 8), ("llama-3-70b", 4), ("opt-13b", 1))


@dataclass(frozen=True, slots=True)
class Sweep:
    """Sizes of one run; ``cuda`` for a GPU, ``cpu_tiny`` for CI."""

    gemm_m: tuple[int, ...]
    gemm_squares: tuple[int, ...]
    decode_batch: tuple[int, ...]
    decode_context_per_seq: tuple[int, ...]
    decode_max_kv_bytes: float
    prefill_prompt: tuple[int, ...]
    prefill_max_tokens: int
    attn_layouts: tuple[tuple[int, int, int], ...]  # (heads, kv_heads, head_dim)
    copy_bytes: tuple[int, ...]
    allreduce_ranks: tuple[int, ...]  # world sizes to try (capped by the GPUs visible)
    allreduce_bytes: tuple[int, ...]  # message size per rank
    gather_blocks: tuple[int, ...]
    block_tokens: int
    elementwise_tokens: tuple[int, ...]  # rows of an element-wise op (× hidden columns)
    elementwise_hidden: tuple[int, ...]
    max_ops_per_replay: int
    repeats: int
    warmup: int
    flush_bytes: int
    budget_s: dict[str, float]
    use_model_shards: bool


def cuda_sweep(quick: bool = False) -> Sweep:
    pow2 = tuple(2**i for i in range(0, 15))  # 1 … 16384
    return Sweep(
        gemm_m=(1, 4, 16, 64, 256, 1024, 4096, 16384)
        if quick
        else (*pow2, 3, 24, 48, 96, 192, 384, 768, 1536, 3072, 6144, 12288),
        gemm_squares=(1024, 4096, 8192),
        decode_batch=(1, 4, 16, 64, 256) if quick else (1, 2, 4, 8, 16, 32, 64, 128, 256),
        decode_context_per_seq=(128, 1024, 8192)
        if quick
        else (64, 256, 1024, 2048, 4096, 8192, 16384, 32768),
        decode_max_kv_bytes=8e9,
        prefill_prompt=(128, 1024, 4096)
        if quick
        else (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384),
        prefill_max_tokens=32768,
        attn_layouts=((32, 8, 128), (8, 1, 128), (64, 8, 128), (40, 40, 128), (32, 32, 64)),
        copy_bytes=tuple(4**i * 4096 for i in range(0, 10)),  # 4 KB … 1 GiB
        allreduce_ranks=(2, 4, 8),
        allreduce_bytes=tuple(4**i * 1024 for i in range(0, 11)),  # 1 KiB … 1 GiB
        gather_blocks=(1, 4, 16, 64, 256, 1024, 4096, 16384),
        block_tokens=16,
        elementwise_tokens=(1, 16, 256, 2048, 16384),
        elementwise_hidden=(4096, 8192, 14336),
        max_ops_per_replay=32,
        repeats=20 if quick else 25,
        warmup=3,
        flush_bytes=512 * 2**20,
        budget_s={
            "gemm": 35 if quick else 75,
            "decode_attention": 25 if quick else 60,
            "prefill_attention": 20 if quick else 45,
            "elementwise": 5 if quick else 10,
            "copy": 10 if quick else 20,
            "allreduce": 30 if quick else 60,
        },
        use_model_shards=True,
    )


def cpu_sweep() -> Sweep:
    """Tiny sizes: the full pipeline in a few seconds on two cores."""
    return Sweep(
        gemm_m=(1, 8, 32, 128),
        gemm_squares=(64,),
        decode_batch=(1, 4),
        decode_context_per_seq=(32, 128),
        decode_max_kv_bytes=64e6,
        prefill_prompt=(16, 64, 128),
        prefill_max_tokens=256,
        attn_layouts=((4, 2, 32), (4, 4, 32)),
        copy_bytes=(4096, 65536, 1 << 20, 4 << 20),
        allreduce_ranks=(2,),
        allreduce_bytes=(4096, 65536, 1 << 20),
        gather_blocks=(1, 8, 64),
        block_tokens=16,
        elementwise_tokens=(1, 64),
        elementwise_hidden=(256,),
        max_ops_per_replay=4,
        repeats=20,
        warmup=2,
        flush_bytes=1 << 20,
        # The CPU sweep is tiny and exists to run every op through the pipeline (CI): its
        # budgets are backstops against a hang, far above its unloaded run time, so a busy
        # machine slows the sweep but never cuts an op from it.
        budget_s={
            "gemm": 120,
            "decode_attention": 120,
            "prefill_attention": 120,
            "elementwise": 60,
            "copy": 60,
            "allreduce": 120,
        },
        use_model_shards=False,
    )


def _log(msg: str) -> None:
    print(f"[calibrate {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def model_gemm_shapes(use_model_shards: bool) -> list[tuple[str, int, int]]:
    """(label, n, k) of the QKV, O, up(+gate) and down GEMMs of TP shards of catalog models."""
    if not use_model_shards:
        return [("tiny-qkv", 96, 64), ("tiny-down", 64, 128)]
    shards = []
    try:
        from disaggsim.catalog import get_model  # optional: catalog may be absent

        for name, tp in _CATALOG_SHARDS:
            m = get_model(name)
            shards.append(
                (name, m.hidden, m.num_heads, m.num_kv_heads, m.head_dim, m.ffn, m.gated_mlp, tp)
            )
    except Exception as e:  # the catalog is optional for the harness; fall back to known shapes
        _log(f"model catalog not usable ({type(e).__name__}: {e}); using built-in shard shapes")
        shards = list(_FALLBACK_SHARDS)
    out: dict[tuple[int, int], str] = {}
    for name, hidden, heads, kv_heads, head_dim, ffn, gated, tp in shards:
        qkv_n = (heads + 2 * kv_heads) * head_dim // tp
        up_n = (2 if gated else 1) * ffn // tp
        for label, n, k in (
            ("qkv", qkv_n, hidden),
            ("o", hidden, heads * head_dim // tp),
            ("up", up_n, hidden),
            ("down", hidden, ffn // tp),
        ):
            out.setdefault((n, k), f"{name}-tp{tp}-{label}")
    return [(label, n, k) for (n, k), label in out.items()]


def time_calls(
    torch,
    cuda: bool,
    fn: Callable[[], object],
    *,
    warmup: int,
    repeats: int,
    flush=None,
    before: Callable[[], object] | None = None,
) -> dict:
    """Median/p10/p90 seconds of ``repeats`` calls of ``fn`` after ``warmup`` calls: CUDA
    events on a GPU, wall clock on CPU. Before each timed call ``before`` runs (e.g. a
    barrier between ranks), then ``flush`` (a tensor, refilled to push the last call's
    data out of L2; it also keeps the GPU busy while ``fn`` is launched)."""
    for _ in range(warmup):
        fn()

    def prepare(i: int) -> None:
        if before is not None:
            before()
        if flush is not None:
            flush.fill_(float(i))

    if cuda:
        torch.cuda.synchronize()
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(repeats)
        ]
        for i, (a, b) in enumerate(events):
            prepare(i)
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        times = [a.elapsed_time(b) * 1e-3 for a, b in events]
    else:
        times = []
        for i in range(repeats):
            prepare(i)
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    t = np.asarray(times)
    return {
        "median_s": float(np.median(t)),
        "p10_s": float(np.percentile(t, 10)),
        "p90_s": float(np.percentile(t, 90)),
        "repeats": repeats,
    }


GRAPH_TARGET_S = 200e-6  # one replay: long enough that replay and event costs vanish
L2_ROTATE_BYTES = 256 * 2**20  # input copies cycled per graph: beyond any catalog GPU's L2


def time_kernel(
    torch,
    cuda: bool,
    make_call: Callable[[int], Callable[[], object]],
    *,
    working_bytes: float,
    warmup: int,
    repeats: int,
    flush=None,
    max_ops: int = 32,
) -> dict:
    """Per-call kernel time of ``make_call(i)()`` (``i``: which copy of the inputs).

    On a GPU the calls are captured in one CUDA graph and the replays timed (the module
    docstring): ``n`` calls per replay so a replay lasts about :data:`GRAPH_TARGET_S`,
    cycling through ``copies`` input sets so that together they exceed L2 (a serving
    engine streams each layer's weights and KV from HBM, not from L2). The result is one
    call's share (median/p10/p90 of the replays ÷ n), ``timing`` ``graph``. If capture
    fails, one call is timed between CUDA events instead and ``timing`` says ``eager``
    (launch time inside). On CPU the same ``n`` calls run back to back (``cpu``)."""
    first = make_call(0)
    first()
    est = time_calls(torch, cuda, first, warmup=1, repeats=3)["median_s"]
    n = int(min(max_ops, max(1, round(GRAPH_TARGET_S / max(est, 1e-7)))))
    copies = int(min(n, max(1, -(-L2_ROTATE_BYTES // max(int(working_bytes), 1)))))
    calls = [first] + [make_call(i) for i in range(1, copies)]
    seq = [calls[i % copies] for i in range(n)]

    def run_all() -> None:
        for c in seq:
            c()

    timing = "cpu"
    fn: Callable[[], object] = run_all
    if cuda:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(max(warmup, 1)):
                    run_all()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run_all()
            fn, timing = graph.replay, "graph"
        except Exception:  # a kernel that cannot be captured: time it launch by launch
            torch.cuda.synchronize()
            fn, timing, n = first, "eager", 1
    t = time_calls(torch, cuda, fn, warmup=warmup, repeats=repeats, flush=flush)
    return {
        "median_s": t["median_s"] / n,
        "p10_s": t["p10_s"] / n,
        "p90_s": t["p90_s"] / n,
        "repeats": t["repeats"],
        "timing": timing,
        "ops_per_replay": n,
    }


class Timer:
    """:func:`time_calls` with a sweep's warm-up, repeats and an L2 flush buffer."""

    def __init__(self, torch, device: str, sweep: Sweep) -> None:
        self.torch = torch
        self.cuda = device == "cuda"
        self.sweep = sweep
        self.flush_buf = torch.empty(sweep.flush_bytes // 4, dtype=torch.float32, device=device)

    def __call__(
        self,
        fn: Callable[[], object],
        repeats: int | None = None,
        before: Callable[[], object] | None = None,
    ) -> dict:
        """One call at a time (copies, collectives): ``timing`` ``eager`` on a GPU."""
        t = time_calls(
            self.torch,
            self.cuda,
            fn,
            warmup=self.sweep.warmup,
            repeats=repeats or self.sweep.repeats,
            flush=self.flush_buf,
            before=before,
        )
        return {**t, "timing": "eager" if self.cuda else "cpu", "ops_per_replay": 1}

    def kernel(
        self, make_call: Callable[[int], Callable[[], object]], working_bytes: float
    ) -> dict:
        """:func:`time_kernel` with the sweep's warm-up, repeats and flush buffer."""
        return time_kernel(
            self.torch,
            self.cuda,
            make_call,
            working_bytes=working_bytes,
            warmup=self.sweep.warmup,
            repeats=self.sweep.repeats,
            flush=self.flush_buf,
            max_ops=self.sweep.max_ops_per_replay,
        )


def environment(torch, device: str) -> dict[str, str]:
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        try:
            driver = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=20,
                    check=False,
                )
                .stdout.strip()
                .splitlines()[0]
            )
        except Exception:  # driver version is provenance only; never fatal
            driver = ""
    else:
        name = f"cpu {platform.machine()} {platform.processor()}".strip()
        driver = ""
    return {
        "device_name": name,
        "driver": driver,
        "torch_version": str(torch.__version__),
        "cuda_version": str(torch.version.cuda or ""),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _shuffled(items: list, seed: int) -> list:
    """A fixed permutation, so a run cut by its time budget still covers every size range."""
    order = np.random.default_rng(seed).permutation(len(items))
    return [items[i] for i in order]


class _Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def over(self) -> bool:
        return time.monotonic() > self.deadline


def bench_gemm(torch, dev: str, sweep: Sweep, timer: Timer, out: RawWriter) -> Iterator[str]:
    """bf16 ``linear`` and (sm_89+) fp8 ``_scaled_mm`` with scales computed once, before
    capture, as an engine with static scales runs it; the activation quantisation is timed
    on its own (:func:`bench_elementwise`)."""
    shapes = model_gemm_shapes(sweep.use_model_shards) + [
        (f"square{s}", s, s) for s in sweep.gemm_squares
    ]
    dtypes = ["bf16"]
    if (
        dev == "cuda"
        and torch.cuda.get_device_capability(0) >= (8, 9)
        and hasattr(torch, "_scaled_mm")
    ):
        dtypes.append("fp8")
    points = [
        (dt, m, label, n, k) for dt in dtypes for (label, n, k) in shapes for m in sweep.gemm_m
    ]
    budget = _Budget(sweep.budget_s["gemm"])
    done = 0
    for dt, m, label, n, k in _shuffled(points, 1):
        if budget.over():
            yield f"gemm: time budget reached after {done} points"
            return

        def make(i: int, dt=dt, m=m, n=n, k=k):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5
            if dt == "fp8":
                x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
                one = torch.ones((), device=dev, dtype=torch.float32)
                return partial(
                    torch._scaled_mm, x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16
                )
            return partial(torch.nn.functional.linear, x, w)

        elem = 1 if dt == "fp8" else 2
        backend = "torch._scaled_mm" if dt == "fp8" else "torch.nn.functional.linear"
        try:
            timing = timer.kernel(make, (m * k + n * k) * elem + m * n * 2)
        except RuntimeError as e:
            yield f"gemm {dt} m={m} n={n} k={k}: skipped ({str(e).splitlines()[0][:120]})"
            continue
        out.write("gemm", {"m": m, "n": n, "k": k, "kind": label}, dt, backend, timing)
        done += 1
    yield "gemm: done"


def bench_elementwise(torch, dev: str, sweep: Sweep, timer: Timer, out: RawWriter) -> Iterator[str]:
    """Memory-bound element-wise kernels of a layer: residual add (reads 2, writes 1
    element), SiLU-and-multiply on a gate/up pair (reads 2, writes 1) and, on FP8 GPUs, the
    activation quantisation in front of an FP8 GEMM (reads 2 bytes, writes 1 per element).
    ``nbytes`` is the bytes each call moves."""
    fp8 = dev == "cuda" and torch.cuda.get_device_capability(0) >= (8, 9)
    kinds = ["add", "silu_mul"] + (["quant_fp8"] if fp8 else [])
    points = [
        (kind, t, h)
        for kind in kinds
        for t in sweep.elementwise_tokens
        for h in sweep.elementwise_hidden
    ]
    budget = _Budget(sweep.budget_s["elementwise"])
    done = 0
    bf16 = torch.bfloat16
    for kind, t, h in _shuffled(points, 4):
        if budget.over():
            yield f"elementwise: time budget reached after {done} points"
            return

        def make(i: int, kind=kind, t=t, h=h):
            a = torch.randn(t, h, device=dev, dtype=bf16)
            b = torch.randn(t, h, device=dev, dtype=bf16)
            if kind == "add":
                o = torch.empty_like(a)
                return partial(torch.add, a, b, out=o)
            if kind == "silu_mul":
                return lambda: torch.nn.functional.silu(a).mul_(b)
            return partial(a.to, torch.float8_e4m3fn)

        nbytes = {"add": 3 * 2, "silu_mul": 3 * 2, "quant_fp8": 2 + 1}[kind] * t * h
        try:
            timing = timer.kernel(make, nbytes)
        except RuntimeError as e:
            yield f"elementwise {kind} {t}x{h}: skipped ({str(e).splitlines()[0][:120]})"
            continue
        backend = {"add": "torch.add", "silu_mul": "silu + mul_", "quant_fp8": "tensor.to(fp8)"}
        out.write("elementwise", {"kind": kind, "nbytes": nbytes}, "bf16", backend[kind], timing)
        done += 1
    yield "elementwise: done"


FLEX_PAGE = 128  # KV tokens per FlexAttention block (one page of the paged KV cache)


def _attention_candidates(torch, dev: str):
    """``(name, make)`` for every attention kernel to time: torch SDPA with each backend
    forced (flash, cuDNN, efficient) and FlexAttention. ``make(q, k, v, causal, lens)``
    returns a zero-argument call or raises when the kernel rejects the inputs."""
    import contextlib
    import warnings

    sdpa = torch.nn.functional.scaled_dot_product_attention
    import importlib

    try:
        sdpa_attention: object = importlib.import_module("torch.nn.attention")
    except ImportError:  # very old torch: whatever SDPA picks
        sdpa_attention = None
    sdpa_kernel = getattr(sdpa_attention, "sdpa_kernel", None)
    SDPBackend = getattr(sdpa_attention, "SDPBackend", None)

    def sdpa_maker(be):
        def make(q, k, v, causal, lens):
            gqa = k.shape[1] != q.shape[1]

            def call():
                with sdpa_kernel([be]) if be is not None else contextlib.nullcontext():
                    return sdpa(q, k, v, is_causal=causal, enable_gqa=gqa)

            call()  # raises here if this backend rejects the shape
            return call

        return make

    if sdpa_kernel is not None and SDPBackend is not None:
        for be, name in (
            (SDPBackend.FLASH_ATTENTION, "sdpa-flash"),
            (SDPBackend.CUDNN_ATTENTION, "sdpa-cudnn"),
            (SDPBackend.EFFICIENT_ATTENTION, "sdpa-efficient"),
        ):
            yield name, sdpa_maker(be)
    else:
        yield "sdpa", sdpa_maker(None)
    try:
        from torch.nn.attention.flex_attention import (
            create_block_mask,
            flex_attention,
        )
    except ImportError:
        return
    flex = torch.compile(flex_attention, dynamic=False) if dev == "cuda" else flex_attention

    def flex_make(q, k, v, causal, lens):
        b, _, lq, _ = q.shape
        lk = k.shape[2]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if causal:
                mask = create_block_mask(
                    lambda bi, h, qi, ki: qi >= ki, b, None, lq, lk, device=dev
                )
            else:  # decode: each sequence attends to its own pages of the padded cache
                lens_t = torch.as_tensor(lens, device=dev)
                mask = create_block_mask(
                    lambda bi, h, qi, ki: ki < lens_t[bi], b, None, lq, lk, device=dev,
                    BLOCK_SIZE=FLEX_PAGE,
                )  # fmt: skip

        def call():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return flex(q, k, v, block_mask=mask, enable_gqa=k.shape[1] != q.shape[1])

        call()
        return call

    yield "flex", flex_make


def _bench_attention(
    torch, dev, sweep, timer, out, op, points, shape_of, qkv_of, causal, seed
) -> Iterator[str]:
    """Time every accepting kernel (:func:`_attention_candidates`) at every point; one row
    per (point, kernel)."""
    budget = _Budget(sweep.budget_s[op])
    cands = list(_attention_candidates(torch, dev))
    # FlexAttention on CPU runs unfused and slowly: one point, after the budgeted sweep,
    # tests the path
    cpu_flex = [c for c in cands if c[0] == "flex" and dev != "cuda"]
    if cpu_flex:
        cands = [c for c in cands if c[0] != "flex"]
    done = 0
    order = _shuffled(points, seed)

    def one(pt, name, maker) -> Iterator[str]:
        nonlocal done
        shape, nbytes = shape_of(pt)

        def make(i: int):
            q, k, v, lens = qkv_of(pt)
            return maker(q, k, v, causal, lens)

        try:
            timing = timer.kernel(make, nbytes)
        except Exception as e:  # this kernel rejects the shape/dtype: the others still run
            msg = str(e).splitlines()[0][:80] if str(e) else type(e).__name__
            yield f"{op} {pt} {name}: skipped ({msg})"
            return
        out.write(op, shape, "bf16", name, timing)
        done += 1

    for pt in order:
        if budget.over():
            yield f"{op}: time budget reached after {done} rows"
            break
        for name, maker in cands:
            if budget.over():
                break
            yield from one(pt, name, maker)
    for name, maker in cpu_flex:
        yield from one(order[0], name, maker)
    yield f"{op}: done"


def bench_decode_attention(
    torch, dev: str, sweep: Sweep, timer: Timer, out: RawWriter
) -> Iterator[str]:
    dt = torch.bfloat16
    points = [
        (b, c, lay)
        for lay in sweep.attn_layouts
        for b in sweep.decode_batch
        for c in sweep.decode_context_per_seq
        if 2 * b * c * lay[1] * lay[2] * 2 <= sweep.decode_max_kv_bytes
    ]

    def shape_of(pt):
        b, c, (h, kh, d) = pt
        shape = {"batch": b, "context_tokens": b * c, "heads": h, "kv_heads": kh, "head_dim": d}
        return shape, 2 * b * c * kh * d * 2

    def qkv_of(pt):
        b, c, (h, kh, d) = pt
        q = torch.randn(b, h, 1, d, device=dev, dtype=dt)
        k = torch.randn(b, kh, c, d, device=dev, dtype=dt)
        v = torch.randn(b, kh, c, d, device=dev, dtype=dt)
        return q, k, v, [c] * b

    yield from _bench_attention(
        torch, dev, sweep, timer, out, "decode_attention", points, shape_of, qkv_of, False, 2
    )


def bench_prefill_attention(
    torch, dev: str, sweep: Sweep, timer: Timer, out: RawWriter
) -> Iterator[str]:
    dt = torch.bfloat16
    points = [
        (b, p, lay)
        for lay in sweep.attn_layouts
        for p in sweep.prefill_prompt
        for b in (1, 4)
        if b * p <= sweep.prefill_max_tokens
    ]

    def shape_of(pt):
        b, p, (h, kh, d) = pt
        shape = {"batch": b, "prompt_tokens": p, "heads": h, "kv_heads": kh, "head_dim": d}
        return shape, b * p * (h + 2 * kh) * d * 2

    def qkv_of(pt):
        b, p, (h, kh, d) = pt
        q = torch.randn(b, h, p, d, device=dev, dtype=dt)
        k = torch.randn(b, kh, p, d, device=dev, dtype=dt)
        v = torch.randn(b, kh, p, d, device=dev, dtype=dt)
        return q, k, v, [p] * b

    yield from _bench_attention(
        torch, dev, sweep, timer, out, "prefill_attention", points, shape_of, qkv_of, True, 3
    )


def bench_copy(torch, dev: str, sweep: Sweep, timer: Timer, out: RawWriter) -> Iterator[str]:
    budget = _Budget(sweep.budget_s["copy"])
    kinds = ["d2d"]
    if dev == "cuda":
        kinds += ["h2d_pinned", "d2h_pinned"]
        if torch.cuda.device_count() >= 2:
            kinds.append("p2p")
    for kind in kinds:
        for nbytes in sweep.copy_bytes:
            if budget.over():
                yield "copy: time budget reached"
                return
            n = nbytes // 2
            gpu_data = torch.randn(
                n, device=dev, dtype=torch.bfloat16
            )  # random: zeros can copy faster
            if kind == "d2d":
                src, dst = gpu_data, torch.empty_like(gpu_data)
            elif kind == "h2d_pinned":
                src = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
                src.copy_(gpu_data)
                dst = gpu_data
            elif kind == "d2h_pinned":
                src, dst = gpu_data, torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
            else:
                src, dst = gpu_data, torch.empty(n, device="cuda:1", dtype=torch.bfloat16)
            nb = src.numel() * src.element_size()
            try:
                timing = timer(partial(dst.copy_, src, non_blocking=True), repeats=sweep.repeats)
            except RuntimeError as e:
                yield f"copy {kind} {nb} B: skipped ({str(e).splitlines()[0][:120]})"
                continue
            out.write(
                "copy",
                {"kind": kind, "nbytes": nb, "num_blocks": 0},
                "bytes",
                f"tensor.copy_ {kind}",
                timing,
            )
            del src, dst, gpu_data
    # paged-block gather: blocks of block_tokens tokens × (K and V) × 8 kv heads × 128 dims,
    # and blocks four times as large up to the same bytes, so that the fit can tell a
    # per-block cost from the bandwidth (one block size moves both in proportion)
    row = 2 * 8 * 128 if dev == "cuda" else 2 * 2 * 32
    elem, tdt = 2, torch.bfloat16
    largest_bytes = max(sweep.gather_blocks) * sweep.block_tokens * row * elem
    for block_tokens in (sweep.block_tokens, 4 * sweep.block_tokens):
        for nblk in sweep.gather_blocks:
            nb = nblk * block_tokens * row * elem
            if nb > largest_bytes:
                continue
            if budget.over():
                yield "copy: time budget reached"
                return
            pool = torch.randn(2 * nblk, block_tokens * row, device=dev, dtype=tdt)
            idx = torch.randperm(2 * nblk, device=dev)[:nblk]
            dst = torch.empty(nblk, block_tokens * row, device=dev, dtype=tdt)
            try:
                timing = timer(partial(torch.index_select, pool, 0, idx, out=dst))
            except RuntimeError as e:
                yield f"copy gather {nblk} x {block_tokens}-token blocks: skipped ({str(e).splitlines()[0][:120]})"
                continue
            out.write(
                "copy",
                {"kind": "gather", "nbytes": nb, "num_blocks": nblk},
                "bytes",
                "index_select",
                timing,
            )
            del pool, idx, dst
    yield "copy: done"


def allreduce_ranks(torch, dev: str, sweep: Sweep) -> tuple[int, ...]:
    """World sizes to measure: the sweep's, capped by the GPUs visible (CPU: as given)."""
    if dev != "cuda":
        return sweep.allreduce_ranks
    return tuple(w for w in sweep.allreduce_ranks if w <= torch.cuda.device_count())


def _allreduce_rank(
    rank: int, world: int, dev: str, sweep: Sweep, deadline_s: float, rdzv: str, result: str
) -> None:
    """One rank of an all-reduce sweep (run in its own process by :func:`bench_allreduce`).

    Every repeat starts after a barrier; a rank's times are CUDA events (CPU: wall clock)
    around its ``all_reduce``; the row is the slowest rank's median/p10/p90. Rank 0 decides
    when the time budget is spent and every rank follows, so no rank waits on a collective
    the others skipped. Rank 0 writes the rows as JSON to ``result``.
    """
    import torch  # a spawned process
    import torch.distributed as dist

    cuda = dev == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(
        backend,
        init_method=f"file://{rdzv}",
        rank=rank,
        world_size=world,
        # binds the NCCL communicator (and its barriers) to this rank's GPU
        device_id=torch.device(f"cuda:{rank}") if cuda else None,
    )
    try:
        device = f"cuda:{rank}" if cuda else "cpu"
        dtype = torch.bfloat16 if cuda else torch.float32
        elem = 2 if cuda else 4
        timer = Timer(torch, dev, sweep)
        rows = []
        for nbytes in sweep.allreduce_bytes:
            over = torch.tensor([float(time.monotonic() > deadline_s)], device=device)
            dist.broadcast(over, src=0)
            if over.item():
                break
            buf = torch.randn(max(1, nbytes // elem), device=device, dtype=dtype)
            t = timer(partial(dist.all_reduce, buf), before=dist.barrier)
            stats = torch.tensor(
                [t["median_s"], t["p10_s"], t["p90_s"]], dtype=torch.float64, device=device
            )
            dist.all_reduce(stats, op=dist.ReduceOp.MAX)
            median_s, p10_s, p90_s = stats.tolist()
            rows.append(
                {
                    "nbytes": buf.numel() * elem,
                    "median_s": median_s,
                    "p10_s": p10_s,
                    "p90_s": p90_s,
                    "repeats": t["repeats"],
                }
            )
            del buf
        if rank == 0:
            Path(result).write_text(
                json.dumps({"backend": backend, "dtype": "bf16" if cuda else "fp32", "rows": rows})
            )
    finally:
        dist.destroy_process_group()


def bench_allreduce(torch, dev: str, sweep: Sweep, timer: Timer, out: RawWriter) -> Iterator[str]:
    """All-reduce over each world size: one process per rank (spawned), rows from rank 0."""
    worlds = allreduce_ranks(torch, dev, sweep)
    if not worlds:
        yield "allreduce: one GPU visible, not measured (fit carries it from the base profile)"
        return
    import torch.multiprocessing as tmp

    budget_s = sweep.budget_s["allreduce"]
    for world in worlds:
        with tempfile.TemporaryDirectory(prefix="disaggsim-allreduce-") as d:
            result = Path(d) / "result.json"
            # gloo binds to the host name's address; loopback is enough for one machine
            env_before = os.environ.get("GLOO_SOCKET_IFNAME")
            if dev != "cuda" and env_before is None:
                os.environ["GLOO_SOCKET_IFNAME"] = "lo"
            try:
                tmp.start_processes(
                    _allreduce_rank,
                    args=(
                        world,
                        dev,
                        sweep,
                        time.monotonic() + budget_s / len(worlds),
                        str(Path(d) / "rendezvous"),
                        str(result),
                    ),
                    nprocs=world,
                    join=True,
                    start_method="spawn",
                )
            finally:
                if dev != "cuda" and env_before is None:
                    os.environ.pop("GLOO_SOCKET_IFNAME", None)
            got = json.loads(result.read_text())
        for r in got["rows"]:
            timing = {k: r[k] for k in ("median_s", "p10_s", "p90_s", "repeats")}
            timing.update(timing="eager" if dev == "cuda" else "cpu", ops_per_replay=1)
            out.write(
                "allreduce",
                {"num_gpus": world, "nbytes": r["nbytes"]},
                got["dtype"],
                f"torch.distributed.all_reduce {got['backend']}",
                timing,
            )
        yield f"allreduce {world} ranks ({got['backend']}): {len(got['rows'])} sizes"
    yield "allreduce: done"


BENCHES = (
    ("gemm", bench_gemm),
    ("decode_attention", bench_decode_attention),
    ("prefill_attention", bench_prefill_attention),
    ("elementwise", bench_elementwise),
    ("copy", bench_copy),
    ("allreduce", bench_allreduce),
)


def run(
    device: str, out_dir: Path, quick: bool = False, ops: tuple[str, ...] | None = None
) -> Path:
    """Run every sweep on ``device`` ('cuda' or 'cpu'), appending rows under ``out_dir``."""
    try:
        import torch  # torch is only needed to calibrate
    except ImportError:
        from disaggsim.errors import UserError

        raise UserError(
            "calibrate: torch is not installed (pip install 'disaggsim[calibrate]')"
        ) from None
    if device == "cuda" and not torch.cuda.is_available():
        from disaggsim.errors import UserError

        raise UserError(
            "calibrate --device cuda: no CUDA device visible to torch (use --device cpu)"
        )
    out_dir = Path(out_dir)
    sweep = cuda_sweep(quick) if device == "cuda" else cpu_sweep()
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    env = environment(torch, device)
    _log(
        f"device {env['device_name']} torch {env['torch_version']} cuda {env['cuda_version']} -> {out_dir}"
    )
    writer = RawWriter(out_dir, env)
    timer = Timer(torch, device, sweep)
    if device == "cuda" and torch.cuda.device_count() < 2:
        _log("p2p: one GPU visible, not measured (carried from the base profile by fit)")
    for name, bench in BENCHES:
        if ops is not None and name not in ops:
            continue
        t0 = time.monotonic()
        _log(f"{name}: start")
        try:
            for msg in bench(torch, device, sweep, timer, writer):
                _log(msg)
        except RawWriteError:
            raise  # the disk refuses rows: every later sweep's would be refused too
        except Exception as e:  # one op's failure must not lose the others' data
            _log(
                f"{name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            )
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
        _log(f"{name}: {time.monotonic() - t0:.1f} s")
    sys.stdout.flush()
    return out_dir
