"""Readers of the public measured kernel tables in ``../shared/data/kernels/``.

Each reader returns one tidy frame per table with the shape columns the
:mod:`disaggsim.costmodel.ops` functions take and the measured time in seconds
(``t_s``), plus the framework and kernel each row came from. Used by the public-table
fit (:mod:`calibration.fit_public`) and by validation (:mod:`calibration.validate`), so
both read the rows the same way. Conventions, from ``data/README.md``:

- AIConfigurator ``latency`` is in ms; nccl ``message_size`` is in elements (half: 2 B);
- generation (decode) attention: ``step`` = cached tokens per request, so a row reads
  ``batch × (step + 1)`` tokens of KV (the cached ones and the new token's);
- context (prefill) attention: full causal over ``isl`` new tokens per sequence; rows with
  a sliding window (``window_size`` > 0) are a different kernel shape and are skipped;
- Vidur ``mlp.csv``: per-op ``time_stats.<op>.median`` in ms, one row per
  (num_tokens, TP); shard GEMM shapes derived from the model columns;
- Vidur network ``all_reduce.csv``: ``size`` in bytes per GPU, median in ms.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from disaggsim.errors import UserError
from disaggsim.inputs import regular_file

AIC_GPU_DIR = {"a100-80gb": "a100_sxm", "h100-sxm": "h100_sxm"}
VIDUR_GPU_DIR = {"a100-80gb": "a100", "h100-sxm": "h100"}
VIDUR_NET_DIRS = {
    "a100-80gb": ("a100_dgx", "a100_pairwise_nvlink"),
    "h100-sxm": ("h100_dgx", "h100_pairwise_nvlink"),
}
FRAMEWORKS = ("vllm", "sglang", "trtllm")
MS = 1e-3


def kernels_dir(data_root: Path) -> Path:
    k = Path(data_root) / "kernels"
    if not k.is_dir():
        raise UserError(
            f"{k}: public kernel tables not found (give --data DIR holding kernels/, default ../shared/data)"
        )
    return k


def _aic(data_root: Path, gpu: str) -> Path:
    if gpu not in AIC_GPU_DIR:
        raise UserError(f"no public kernel tables for GPU {gpu!r} (have: {', '.join(AIC_GPU_DIR)})")
    return kernels_dir(data_root) / "aiconfigurator" / AIC_GPU_DIR[gpu]


def _one(paths: list[Path]) -> Path | None:
    """The newest version's table of several (version folders sort by version)."""
    return sorted(paths)[-1] if paths else None


def source_commit(data_root: Path, table: str) -> str:
    p = kernels_dir(data_root) / table / "SOURCE_COMMIT"
    return p.read_text().strip() if p.exists() else ""


def _dtype(s: pd.Series) -> pd.Series:
    return s.map({"bfloat16": "bf16", "float16": "bf16", "fp8": "fp8"}).fillna(s)


def _aic_tables(data_root: Path, gpu: str, op: str, table: str, columns: list[str] | None = None):
    """``(framework, path, rows)`` of the newest ``table`` of each framework that has one;
    sliding-window rows (``window_size`` > 0, another kernel shape) are left out."""
    for fw in FRAMEWORKS:
        path = _one(list((_aic(data_root, gpu) / op / fw).glob(f"*/{table}")))
        if path is None:
            continue
        df = pd.read_parquet(regular_file(path, UserError, "kernel table"), columns=columns)
        if "window_size" in df:
            df = df[df["window_size"] == 0]
        yield fw, path, df


def _aic_rows(data_root: Path, fw: str, path: Path, df: pd.DataFrame, **cols) -> pd.DataFrame:
    """One tidy frame: framework, kernel, the shape ``cols``, ``t_s`` (seconds), table."""
    return pd.DataFrame(
        {
            "framework": fw,
            "kernel": df["kernel_source"].astype(str),
            **cols,
            "t_s": df["latency"].astype(float) * MS,
            "table": str(path.relative_to(kernels_dir(data_root))),
        }
    )


def aic_gemm(data_root: Path, gpu: str) -> pd.DataFrame:
    """GEMM rows (bf16 and fp8; other quantised kinds are skipped) of every framework."""
    frames = []
    columns = ["gemm_dtype", "kernel_source", "m", "n", "k", "latency"]
    for fw, path, df in _aic_tables(data_root, gpu, "gemm", "gemm_perf.parquet", columns):
        df = df[df["gemm_dtype"].isin(["bfloat16", "fp8"])]
        frames.append(
            _aic_rows(
                data_root,
                fw,
                path,
                df,
                dtype=_dtype(df["gemm_dtype"]),
                m=df["m"].astype(float),
                n=df["n"].astype(float),
                k=df["k"].astype(float),
            )
        )
    return pd.concat(frames, ignore_index=True)


def aic_decode_attention(data_root: Path, gpu: str) -> pd.DataFrame:
    frames = []
    table = "generation_attention_perf.parquet"
    for fw, path, df in _aic_tables(data_root, gpu, "attention", table):
        b = df["batch_size"].astype(float)
        frames.append(
            _aic_rows(
                data_root,
                fw,
                path,
                df,
                dtype=_dtype(df["kv_cache_dtype"]),
                batch=b,
                context_tokens=b * (df["step"].astype(float) + 1.0),
                heads=df["num_heads"].astype(float),
                kv_heads=df["num_key_value_heads"].astype(float),
                head_dim=df["head_dim"].astype(float),
            )
        )
    return pd.concat(frames, ignore_index=True)


def aic_prefill_attention(data_root: Path, gpu: str) -> pd.DataFrame:
    """Full causal prefill rows with bf16 attention math (fp8-math rows are skipped)."""
    frames = []
    table = "context_attention_perf.parquet"
    for fw, path, df in _aic_tables(data_root, gpu, "attention", table):
        df = df[df["attn_dtype"] == "bfloat16"]
        b = df["batch_size"].astype(float)
        p = df["isl"].astype(float)
        frames.append(
            _aic_rows(
                data_root,
                fw,
                path,
                df,
                dtype="bf16",
                kv_dtype=_dtype(df["kv_cache_dtype"]),
                batch=b,
                prompt_tokens=p,
                num_seqs=b,
                new_tokens=b * p,
                pairs=b * p * (p + 1.0) / 2.0,
                heads=df["num_heads"].astype(float),
                kv_heads=df["num_key_value_heads"].astype(float),
                head_dim=df["head_dim"].astype(float),
            )
        )
    return pd.concat(frames, ignore_index=True)


def aic_allreduce(data_root: Path, gpu: str) -> pd.DataFrame:
    """nccl-tests all_reduce rows in half precision: nbytes per GPU = 2 × elements."""
    path = _one(list((_aic(data_root, gpu) / "comm" / "nccl").glob("*/nccl_perf.parquet")))
    if path is None:
        return pd.DataFrame(columns=["framework", "num_gpus", "nbytes", "t_s", "table"])
    df = pd.read_parquet(regular_file(path, UserError, "kernel table"))
    df = df[(df["op_name"] == "all_reduce") & (df["nccl_dtype"] == "half")]
    return pd.DataFrame(
        {
            "framework": "nccl-tests",
            "num_gpus": df["num_gpus"].astype(int),
            "nbytes": df["message_size"].astype(float) * 2.0,
            "t_s": df["latency"].astype(float) * MS,
            "table": str(path.relative_to(kernels_dir(data_root))),
        }
    )


def vidur_allreduce(data_root: Path, gpu: str) -> pd.DataFrame:
    """Vidur torch.distributed all_reduce rows inside one node (fp16 buffers, bytes per GPU)."""
    frames = []
    for node in VIDUR_NET_DIRS.get(gpu, ()):
        path = kernels_dir(data_root) / "vidur" / "network" / node / "all_reduce.csv"
        if not path.exists():
            continue
        df = pd.read_csv(regular_file(path, UserError, "kernel table"))
        df = df[df["num_workers"] <= df["devices_per_node"]]
        frames.append(
            pd.DataFrame(
                {
                    "framework": f"vidur {node}",
                    "num_gpus": df["num_workers"].astype(int),
                    "nbytes": df["size"].astype(float),
                    "t_s": df["time_stats.all_reduce.median"].astype(float) * MS,
                    "table": str(path.relative_to(kernels_dir(data_root))),
                }
            )
        )
    if not frames:
        return pd.DataFrame(columns=["framework", "num_gpus", "nbytes", "t_s", "table"])
    return pd.concat(frames, ignore_index=True)


VIDUR_GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
VIDUR_ELEMENTWISE_OPS = (
    "input_layernorm",
    "post_attention_layernorm",
    "attn_rope",
    "mlp_act",
    "add",
)


def vidur_mlp_files(data_root: Path, gpu: str) -> list[Path]:
    root = kernels_dir(data_root) / "vidur" / "compute" / VIDUR_GPU_DIR.get(gpu, "none")
    return sorted(root.glob("*/*/mlp.csv"))


def vidur_mlp(data_root: Path, gpu: str) -> pd.DataFrame:
    """Vidur per-op rows (long format): op, model, tp, m tokens, GEMM (n, k) or bytes moved.

    Element-wise bytes (bf16, read + write): RMS/LayerNorm ``2·m·h`` elements, RoPE on
    the Q and K shards ``2·m·(H + KH)/tp·d``, gated activation ``3·m·f/tp`` (plain
    ``2·m·f/tp``), residual add ``3·m·h``.
    """
    out = []
    for path in vidur_mlp_files(data_root, gpu):
        df = pd.read_csv(regular_file(path, UserError, "kernel table"))
        model = f"{path.parent.parent.name}/{path.parent.name}"
        h = df["n_embd"].astype(float)
        nh = df["n_head"].astype(float)
        nkv = df["n_kv_head"].astype(float)
        f = df["n_expanded_embd"].astype(float)
        tp = df["num_tensor_parallel_workers"].astype(float)
        m = df["num_tokens"].astype(float)
        d = h / nh
        gated = df["use_gated_mlp"].astype(str).str.lower().eq("true")
        shapes = {
            "attn_pre_proj": ((nh + 2 * nkv) * d / tp, h),
            "attn_post_proj": (h, nh * d / tp),
            "mlp_up_proj": (np.where(gated, 2.0, 1.0) * f / tp, h),
            "mlp_down_proj": (h, f / tp),
        }
        elems = {
            "input_layernorm": 2 * m * h,
            "post_attention_layernorm": 2 * m * h,
            "attn_rope": 2 * m * (nh + nkv) / tp * d,
            "mlp_act": np.where(gated, 3.0, 2.0) * m * f / tp,
            "add": 3 * m * h,
        }
        for op in (*VIDUR_GEMM_OPS, *VIDUR_ELEMENTWISE_OPS):
            col = f"time_stats.{op}.median"
            if col not in df:
                continue
            t = df[col].astype(float) * MS
            row: dict[str, object] = {
                "op": op,
                "model": model,
                "tp": tp.astype(int),
                "m": m,
                "t_s": t,
                "table": str(path.relative_to(kernels_dir(data_root))),
            }
            if op in shapes:
                row.update(n=shapes[op][0], k=shapes[op][1], nbytes=np.nan)
            else:
                row.update(n=np.nan, k=np.nan, nbytes=np.asarray(elems[op]) * 2.0)
            out.append(pd.DataFrame(row))
    frame = pd.concat(out, ignore_index=True)
    return frame[frame["t_s"] > 0].reset_index(drop=True)
