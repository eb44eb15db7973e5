"""Whole-layer timing: real transformer-layer forward passes vs the step model.

Kernel tables check each operator; this checks their sum, and the launch gaps between
them. ``python -m calibration.steps --device cuda|cpu --out DIR`` builds one
Llama-3-8B-shaped layer (TP1) and one Llama-3-70B TP8-shard-shaped layer with random bf16
weights, and times forward passes with CUDA events (after warm-up, median of repeats):

- prefill: batch × prompt tokens, causal attention over the prompt;
- decode: one new token per sequence attending to a KV cache of ``context`` tokens per
  sequence (the new K/V written into the cache first, as a serving engine does);

each in ``eager`` mode (every kernel launched from Python) and ``cuda-graphs`` mode (the
same forward captured once with ``torch.cuda.CUDAGraph`` and replayed). One layer is
called ``LAYERS_PER_PASS`` times back to back per timed pass, so inter-layer launch gaps
are inside the measurement. No all-reduce (one GPU), no LM head. On CPU the same code runs
tiny token counts in eager mode only, one layer per pass, one repeat (for tests). Rows go to ``DIR/steps.csv``.

``disaggsim calibrate fit-steps DIR --gpu ID`` fits ``graph_replay.per_layer_s`` to
the graph passes (:func:`graph_layer_fit`) and writes the profile with it.

``disaggsim calibrate validate-steps DIR [--gpu ID | --profile JSON]`` compares each row
with the step model: per layer, ``(gemm_s + attention_s + elementwise_s) / num_layers``
of :func:`disaggsim.costmodel.step.build_worker_cost`'s breakdown, plus (graph passes)
the profile's ``graph_replay.per_layer_s``; it prints APE per (model, mode, kind) and the
kernels-only APE beside.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from calibration.harness import environment, time_calls

LAYERS_PER_PASS = 4
# (label, catalog model, tp, hidden, heads, kv_heads, head_dim, ffn) — per-GPU shard
SHAPES = (
    ("llama-3-8b-tp1", "llama-3-8b", 1, 4096, 32, 8, 128, 14336),
    ("llama-3-70b-tp8", "llama-3-70b", 8, 8192, 8, 1, 128, 3584),
)
CUDA_PREFILL = ((1, 128), (1, 512), (1, 2048), (1, 8192), (4, 1024))  # (batch, prompt)
CUDA_DECODE = tuple((b, c) for b in (1, 8, 64, 256) for c in (512, 4096))  # (batch, context)
CPU_PREFILL = ((1, 8), (2, 16))
CPU_DECODE = ((1, 16), (2, 32))
COLUMNS = (
    "shape", "model", "tp", "mode", "kind", "batch", "tokens", "layers_per_pass",
    "median_s", "p10_s", "p90_s", "repeats", "device_name", "driver", "torch_version",
    "cuda_version", "date",
)  # fmt: skip


class Layer:
    """One pre-norm gated-MLP decoder layer (Llama shape) with random bf16 weights."""

    def __init__(
        self, torch, dev: str, hidden: int, heads: int, kv_heads: int, hd: int, ffn: int,
        layers_per_pass: int = LAYERS_PER_PASS,
    ):  # fmt: skip
        self.t = torch
        self.layers_per_pass = layers_per_pass
        self.h, self.nh, self.nkv, self.hd, self.ffn = hidden, heads, kv_heads, hd, ffn
        g = torch.Generator(device=dev).manual_seed(0)

        def w(n: int, k: int):
            x = torch.randn(n, k, device=dev, generator=g, dtype=torch.bfloat16)
            return x.mul_(1.0 / math.sqrt(k))

        self.w_qkv = w((heads + 2 * kv_heads) * hd, hidden)
        self.w_o = w(hidden, heads * hd)
        self.w_up = w(2 * ffn, hidden)
        self.w_down = w(hidden, ffn)
        self.norm1 = torch.ones(hidden, device=dev, dtype=torch.bfloat16)
        self.norm2 = torch.ones(hidden, device=dev, dtype=torch.bfloat16)
        self.rope = torch.randn(hd, device=dev, generator=g).to(torch.bfloat16)

    def _norm(self, x, wt):
        t = self.t
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * t.rsqrt(var + 1e-5)).to(x.dtype) * wt

    def forward(self, x, k_cache=None, v_cache=None, pos: int = 0):
        """``x``: (batch, tokens, hidden). Prefill when no cache is given; decode writes the
        new token's K/V at ``pos`` of the (batch, kv_heads, context + 1, head_dim) cache."""
        F = self.t.nn.functional
        b, s, _ = x.shape
        hq, hkv, hd = self.nh, self.nkv, self.hd
        y = self._norm(x, self.norm1)
        qkv = F.linear(y, self.w_qkv)
        q, k, v = qkv.split([hq * hd, hkv * hd, hkv * hd], dim=-1)
        q = (q.view(b, s, hq, hd) * self.rope).transpose(1, 2)
        k = (k.view(b, s, hkv, hd) * self.rope).transpose(1, 2)
        v = v.view(b, s, hkv, hd).transpose(1, 2)
        if k_cache is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hq != hkv)
        else:
            k_cache[:, :, pos : pos + 1].copy_(k)
            v_cache[:, :, pos : pos + 1].copy_(v)
            a = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=hq != hkv)
        x = x + F.linear(a.transpose(1, 2).reshape(b, s, hq * hd), self.w_o)
        y = self._norm(x, self.norm2)
        gate, up = F.linear(y, self.w_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, self.w_down)

    def stack(self, x, k_cache=None, v_cache=None, pos: int = 0):
        for _ in range(self.layers_per_pass):
            x = self.forward(x, k_cache, v_cache, pos)
        return x


def run(device: str, out_dir: Path, budget_s: float = 150.0) -> Path:
    """Time every (shape, mode, point) within ``budget_s``; returns the CSV path."""
    import torch

    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("steps: --device cuda but torch sees no GPU")
    env = environment(torch, device)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "steps.csv"
    deadline = time.monotonic() + budget_s
    modes = ("eager", "cuda-graphs") if cuda else ("eager",)
    prefill, decode = (CUDA_PREFILL, CUDA_DECODE) if cuda else (CPU_PREFILL, CPU_DECODE)
    warmup, repeats, per_pass = (5, 20, LAYERS_PER_PASS) if cuda else (0, 1, 1)
    with path.open("w", newline="") as fh:
        wr = csv.DictWriter(fh, fieldnames=COLUMNS)
        wr.writeheader()
        for label, model, tp, hidden, heads, kvh, hd, ffn in SHAPES:
            layer = Layer(torch, device, hidden, heads, kvh, hd, ffn, per_pass)
            points = [("prefill", b, n) for b, n in prefill] + [("decode", b, c) for b, c in decode]
            for kind, b, n in points:
                for mode in modes:
                    if time.monotonic() > deadline:
                        print(
                            f"steps: time budget reached; skipped {label} {kind} b={b} n={n} {mode}"
                        )
                        continue
                    try:
                        with torch.inference_mode():
                            fn = _pass(torch, layer, device, kind, b, n, mode)
                            timing = time_calls(torch, cuda, fn, warmup=warmup, repeats=repeats)
                    except Exception as e:  # one shape failing must not lose the rest
                        print(
                            f"steps: {label} {kind} b={b} n={n} {mode}: skipped ({str(e).splitlines()[0][:120]})"
                        )
                        continue
                    wr.writerow(
                        {"shape": label, "model": model, "tp": tp, "mode": mode, "kind": kind,
                         "batch": b, "tokens": n, "layers_per_pass": per_pass, **timing, **env}
                    )  # fmt: skip
                    fh.flush()
                    print(
                        f"steps: {label} {mode:11s} {kind:7s} b={b:4d} n={n:5d} {timing['median_s'] * 1e3:9.3f} ms"
                    )
            del layer
            if cuda:
                torch.cuda.empty_cache()
    return path


def _pass(torch, layer: Layer, dev: str, kind: str, b: int, n: int, mode: str):
    """A zero-argument callable running one timed pass (LAYERS_PER_PASS layers)."""
    if kind == "prefill":
        x = torch.randn(b, n, layer.h, device=dev).to(torch.bfloat16)
        kc = vc = None
        pos = 0
    else:
        x = torch.randn(b, 1, layer.h, device=dev).to(torch.bfloat16)
        shape = (b, layer.nkv, n + 1, layer.hd)
        kc = torch.randn(shape, device=dev).to(torch.bfloat16)
        vc = torch.randn(shape, device=dev).to(torch.bfloat16)
        pos = n
    if mode == "eager":
        return lambda: layer.stack(x, kc, vc, pos)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            layer.stack(x, kc, vc, pos)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer.stack(x, kc, vc, pos)
    return graph.replay


def read_steps(raw_dir: str | Path) -> pd.DataFrame:
    from disaggsim.errors import UserError
    from disaggsim.inputs import regular_file

    path = Path(raw_dir) / "steps.csv"
    if not path.exists() and not path.is_symlink():
        raise UserError(
            f"{path}: no steps.csv (run `python -m calibration.steps --device cuda --out DIR`)"
        )
    regular_file(path, UserError, "steps CSV")  # a named pipe would block pandas for ever
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise UserError(f"{path}: missing column {missing[0]}")
    if df.empty:
        raise UserError(f"{path}: no rows")
    return df


def predict(df: pd.DataFrame, gpu: str, profile=None) -> pd.DataFrame:
    """Step-model seconds per layer of each row: kernels only and with the mode's overhead."""
    from disaggsim.costmodel.step import build_worker_cost
    from disaggsim.hardware.engines import ZERO_ENGINE

    kern, total = [], []
    workers: dict = {}
    for model, tp, mode, kind, b, n in zip(
        df["model"], df["tp"], df["mode"], df["kind"], df["batch"], df["tokens"], strict=True
    ):
        key = (model, int(tp), mode)
        if key not in workers:
            workers[key] = build_worker_cost(
                model, gpu, int(tp), engine=ZERO_ENGINE, profile=profile
            )
        w = workers[key]
        b, n = int(b), int(n)
        if kind == "prefill":
            bd = w.breakdown(
                prefill_seqs=b, prefill_tokens=b * n, prefill_attn_pairs=b * n * (n + 1) / 2
            )
        else:
            bd = w.breakdown(decode_batch=b, decode_context_tokens=b * (n + 1))
        k = (bd.gemm_s + bd.attention_s + bd.elementwise_s) / w.model.num_layers
        kern.append(k)
        total.append(k + (w.profile.graph_layer_s if mode == "cuda-graphs" else 0.0))
    return df.assign(
        measured_per_layer_s=df["median_s"] / df["layers_per_pass"],
        kernels_per_layer_s=kern,
        pred_per_layer_s=total,
    )


def validate_steps(raw_dir: str | Path, gpu: str, profile_path: str | None = None) -> str:
    from disaggsim.hardware.profile import load_profile

    prof = load_profile(gpu) if profile_path is None else load_profile(gpu, path=profile_path)
    p = predict(read_steps(raw_dir), gpu, prof)
    meas = p["measured_per_layer_s"]
    p = p.assign(
        ape=(p["pred_per_layer_s"] - meas).abs() / meas,
        kernels_ape=(p["kernels_per_layer_s"] - meas).abs() / meas,
    )
    lines = [
        f"step model ({prof.path}, {prof.provenance.get('kind')}) vs measured layer passes in {raw_dir}",
        f"device: {p['device_name'].iloc[0]}, torch {p['torch_version'].iloc[0]}",
        f"{'shape':18s} {'mode':11s} {'kind':7s} {'n':>3s} {'median APE':>10s} {'mean APE':>9s} {'kernels-only median':>20s}",
    ]
    for (shape, mode, kind), g in p.groupby(["shape", "mode", "kind"], sort=True):
        lines.append(
            f"{shape:18s} {mode:11s} {kind:7s} {len(g):3d} {100 * g['ape'].median():9.1f}% "
            f"{100 * g['ape'].mean():8.1f}% {100 * g['kernels_ape'].median():19.1f}%"
        )
    lines.append(
        f"{'all':18s} {'':11s} {'':7s} {len(p):3d} {100 * p['ape'].median():9.1f}% "
        f"{100 * p['ape'].mean():8.1f}% {100 * p['kernels_ape'].median():19.1f}%"
    )
    lines.append(
        "per row (ms per layer): shape mode kind batch tokens measured predicted kernels-only"
    )
    for r in p.to_dict("records"):
        lines.append(
            f"  {r['shape']} {r['mode']} {r['kind']} {r['batch']} {r['tokens']} "
            f"{1e3 * float(r['measured_per_layer_s']):.4f} {1e3 * float(r['pred_per_layer_s']):.4f} "
            f"{1e3 * float(r['kernels_per_layer_s']):.4f}"
        )
    return "\n".join(lines)


def graph_layer_fit(raw_dir: str | Path, gpu: str, profile=None) -> dict:
    """``graph_replay.per_layer_s`` fitted to the ``cuda-graphs`` layer passes.

    Each pass replays a graph of ``layers_per_pass`` layers, so a row's measured time per
    layer is the step model's kernels per layer plus the graph's per-layer cost: the
    non-negative ``x`` minimising the relative error of ``kernels + x`` (closed form).
    Held out by shape: ``x`` from the other shape predicts each shape's rows. The eager
    rows are reported beside (their residual is bare-torch launch cost, a lower bound of an
    eager serving engine's per-layer overhead, which is fitted to end-to-end data)."""
    from calibration.fit import ape, prediction_error
    from disaggsim.errors import UserError

    p = predict(read_steps(raw_dir), gpu, profile)
    g = p[p["mode"] == "cuda-graphs"]
    if g.empty:
        raise UserError(
            f"{Path(raw_dir) / 'steps.csv'}: no cuda-graphs rows (graph passes run on a GPU only)"
        )
    kern = g["kernels_per_layer_s"].to_numpy(float)
    meas = g["measured_per_layer_s"].to_numpy(float)
    x = _per_layer(kern, meas)
    shape = g["shape"].to_numpy()
    held = np.empty(len(g))
    for sh in sorted(set(shape)):
        test = shape == sh
        held[test] = kern[test] + (_per_layer(kern[~test], meas[~test]) if (~test).any() else x)
    err = prediction_error(kern + x, held, meas, "shapes").as_dict()
    err["kernels_only_median_ape"] = round(float(np.median(ape(kern, meas))), 5)
    err["source"] = f"{Path(raw_dir) / 'steps.csv'} (cuda-graphs layer passes)"
    e = p[p["mode"] == "eager"]
    eager_x = (
        _per_layer(
            e["kernels_per_layer_s"].to_numpy(float), e["measured_per_layer_s"].to_numpy(float)
        )
        if len(e)
        else None
    )
    first = g.iloc[0]
    return {
        "per_layer_s": x,
        "error": err,
        "eager_per_layer_s": eager_x,
        "device_name": str(first["device_name"]),
        "torch_version": str(first["torch_version"]),
        "date": str(first["date"]),
    }


def _per_layer(kern: np.ndarray, meas: np.ndarray) -> float:
    """argmin over x ≥ 0 of Σ ((kern + x − meas) / meas)²."""
    w = 1.0 / meas**2
    return max(float(np.sum(w * (meas - kern)) / np.sum(w)), 0.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m calibration.steps", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--device", choices=("cuda", "cpu"), required=True)
    ap.add_argument("--out", required=True, metavar="DIR")
    ap.add_argument(
        "--budget-s", type=float, default=150.0, help="stop starting new points after this"
    )
    args = ap.parse_args(argv)
    from disaggsim.errors import UserError
    from disaggsim.output import claim_folder, seal_folder

    out = Path(args.out)
    try:
        claim_folder(out, "calibration.steps", "--out")
    except UserError as e:
        print(f"calibration.steps: error: {e}", file=sys.stderr)
        return 2
    try:
        print(f"wrote {run(args.device, out, args.budget_s)}")
    finally:
        seal_folder(out, "calibration.steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
