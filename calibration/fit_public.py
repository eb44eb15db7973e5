"""Fit the shipped A100-80GB and H100-SXM profiles to public measured kernel tables, and
derive the priors of the other catalog GPUs from them.

Run (from the repo root)::

    python -m calibration.fit_public --data ../shared/data

What is fitted to what (all through the :mod:`disaggsim.costmodel.ops` forms):

- ``gemm.bf16``: AIConfigurator vLLM bf16 rows (``torch.nn.functional.linear``, cuBLAS);
  ``gemm.fp8`` (H100): AIConfigurator TensorRT-LLM fp8 rows (vLLM's fp8 rows include its
  per-token activation quantisation, which the GEMM form does not model);
- ``decode_attention.<kv dtype>``: AIConfigurator vLLM generation-attention rows;
- ``prefill_attention.bf16``: AIConfigurator vLLM context-attention rows (bf16 KV, full
  causal);
- ``elementwise``: Vidur ``mlp.csv`` norm / RoPE / activation / residual-add rows;
- ``allreduce.<n>``: AIConfigurator nccl-tests all_reduce (half) rows per GPU count;
- ``copy.d2d`` / ``gather`` bandwidth from the fitted element-wise bandwidth (a copy reads
  and writes each byte); host and peer copies and the gather's per-block cost are carried
  from the provisional profile (no public table measures them as a single copy);
- ``engines``: carried from the shipped profile unless ``--engines`` fits them to
  DistServe (:mod:`calibration.engines`).

Priors: h100-pcie, h200-sxm, b200 take the H100-SXM efficiencies and l40s the
A100-80GB ones, with their own datasheet peaks from :func:`disaggsim.catalog.get_gpu`;
link-bound parameters are scaled by the ratio of the relevant link bandwidths.

A shipped profile whose provenance kind is ``measured`` is never overwritten: the prior
for that GPU is written to ``calibration/priors/<gpu>.json`` instead, and the measured
profile is refitted from its raw run on top of it with ``disaggsim calibrate fit RAW_DIR
--gpu GPU --base calibration/priors/<gpu>.json`` (the default base when that file exists).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path
from typing import Any, cast

from calibration import public
from calibration.fit import (
    FitError,
    _params_dict,
    _round,
    allreduce_dict,
    fit_allreduce,
    fit_decode_attention,
    fit_elementwise,
    fit_gemm,
    fit_prefill_attention,
    shape_family,
)
from disaggsim.catalog import get_gpu
from disaggsim.errors import UserError
from disaggsim.hardware.profile import GpuPeaks, profile_from_dict, shipped_profile_path

FITTED_GPUS = ("a100-80gb", "h100-sxm")
PRIORS_DIR = Path(__file__).resolve().parent / "priors"
PRIORS = {
    "h100-pcie": "h100-sxm",
    "h200-sxm": "h100-sxm",
    "b200": "h100-sxm",
    "l40s": "a100-80gb",
    "h800-sxm": "h100-sxm",  # the same chip with NVLink cut to 200 GB/s per direction
}
GEMM_FRAMEWORK = {"bf16": "vllm", "fp8": "trtllm"}
ATTENTION_FRAMEWORK = "vllm"


def peaks_of(gpu: str) -> GpuPeaks:
    g = get_gpu(gpu)
    return GpuPeaks(g.bf16_flop_per_s, g.fp8_flop_per_s, g.hbm_bytes_per_s, g.hbm_bytes)


def _err(e: FitError, source: str) -> dict[str, Any]:
    return {**e.as_dict(), "source": source}


def fit_gpu(gpu: str, data_root: Path, base: dict) -> dict[str, Any]:
    """A fitted-public profile dict for ``gpu`` (``base``: the shipped profile, for carried parts)."""
    peaks = peaks_of(gpu)
    ops_out: dict[str, Any] = {}
    errors: dict[str, Any] = {}
    tables: set[str] = set()

    gemm = public.aic_gemm(data_root, gpu)
    ops_out["gemm"] = {}
    for dtype, fw in GEMM_FRAMEWORK.items():
        if dtype == "fp8" and peaks.fp8_flop_per_s <= 0:
            continue
        rows = gemm[(gemm["dtype"] == dtype) & (gemm["framework"] == fw)]
        if rows.empty:
            continue
        f = fit_gemm(
            peaks,
            rows["m"],
            rows["n"],
            rows["k"],
            rows["t_s"],
            dtype,
            groups=shape_family(rows["n"], rows["k"]),
        )
        ops_out["gemm"][dtype] = _params_dict(f.params)
        errors[f"gemm.{dtype}"] = _err(f.error, f"{rows['table'].iloc[0]} ({fw} {dtype})")
        tables.add(rows["table"].iloc[0])

    dec = public.aic_decode_attention(data_root, gpu)
    dec = dec[dec["framework"] == ATTENTION_FRAMEWORK]
    ops_out["decode_attention"] = {}
    for dtype_key, rows in dec.groupby("dtype"):
        dtype = str(dtype_key)
        f = fit_decode_attention(
            peaks,
            rows["batch"],
            rows["context_tokens"],
            rows["kv_heads"],
            rows["head_dim"],
            rows["t_s"],
            kv_elem_bytes=1.0 if dtype == "fp8" else 2.0,
            groups=shape_family(rows["heads"], rows["kv_heads"], rows["head_dim"]),
        )
        ops_out["decode_attention"][str(dtype)] = _params_dict(f.params)
        errors[f"decode_attention.{dtype}"] = _err(
            f.error, f"{rows['table'].iloc[0]} (vllm, kv {dtype})"
        )
        tables.add(rows["table"].iloc[0])

    pre = public.aic_prefill_attention(data_root, gpu)
    pre = pre[(pre["framework"] == ATTENTION_FRAMEWORK) & (pre["kv_dtype"] == "bf16")]
    f = fit_prefill_attention(
        peaks,
        pre["num_seqs"],
        pre["new_tokens"],
        pre["pairs"],
        pre["heads"],
        pre["head_dim"],
        pre["t_s"],
        "bf16",
        groups=shape_family(pre["heads"], pre["kv_heads"], pre["head_dim"]),
    )
    ops_out["prefill_attention"] = {"bf16": _params_dict(f.params)}
    errors["prefill_attention.bf16"] = _err(
        f.error, f"{pre['table'].iloc[0]} (vllm, bf16 KV, full causal)"
    )
    tables.add(pre["table"].iloc[0])

    mlp = public.vidur_mlp(data_root, gpu)
    ew = mlp[mlp["op"].isin(public.VIDUR_ELEMENTWISE_OPS)]
    f = fit_elementwise(peaks, ew["nbytes"], ew["t_s"], groups=ew["model"].to_numpy())
    ops_out["elementwise"] = _params_dict(f.params)
    errors["elementwise"] = _err(
        f.error, f"vidur/compute/{public.VIDUR_GPU_DIR[gpu]}/*/mlp.csv (norm, rope, act, add)"
    )
    tables.add(f"vidur/compute/{public.VIDUR_GPU_DIR[gpu]}/*/mlp.csv")
    ew_bw = peaks.hbm_bytes_per_s * f.params.bw_eff

    ar = public.aic_allreduce(data_root, gpu)
    ops_out["allreduce"] = {}
    for n_key, rows in ar.groupby("num_gpus"):
        n = int(cast(float, n_key))
        fa = fit_allreduce(rows["nbytes"], rows["t_s"], n)
        ops_out["allreduce"][str(n)] = allreduce_dict(fa.params)
        errors[f"allreduce.{n}"] = _err(fa.error, f"{rows['table'].iloc[0]} (all_reduce, half)")
        tables.add(rows["table"].iloc[0])

    copies = {k: dict(v) for k, v in base["ops"]["copy"].items()}
    copies["d2d"] = {
        "latency_s": copies["d2d"]["latency_s"],
        "bw_bytes_per_s": _round(ew_bw / 2.0),
        "per_block_s": 0.0,
    }
    copies["gather"] = {**copies["gather"], "bw_bytes_per_s": _round(ew_bw / 2.0)}
    ops_out["copy"] = copies

    prof = {
        "schema_version": 1,
        "gpu": gpu,
        "peaks": {
            "bf16_flop_per_s": peaks.bf16_flop_per_s,
            "fp8_flop_per_s": peaks.fp8_flop_per_s,
            "hbm_bytes_per_s": peaks.hbm_bytes_per_s,
            "hbm_bytes": peaks.hbm_bytes,
        },
        "ops": ops_out,
        "engines": base["engines"],
        "fit_error": errors,
        "provenance": {
            "kind": "fitted-public",
            "source": "calibration/fit_public.py fitted the disaggsim.costmodel.ops forms to public measured "
            "kernel tables (log-space least squares); peaks are datasheet values from the GPU catalog",
            "tables": sorted(tables),
            "source_commit": {
                "aiconfigurator": public.source_commit(data_root, "aiconfigurator"),
                "vidur": public.source_commit(data_root, "vidur"),
            },
            "frameworks": {
                "gemm.bf16": GEMM_FRAMEWORK["bf16"],
                "gemm.fp8": GEMM_FRAMEWORK["fp8"],
                "attention": ATTENTION_FRAMEWORK,
            },
            "carried": [
                "copy.h2d_pinned",
                "copy.d2h_pinned",
                "copy.p2p",
                "copy.d2d.latency_s",
                "copy.gather.latency_s",
                "copy.gather.per_block_s",
                "engines",
            ],
            "carried_from": "the provisional profile shipped before this fit (no public table measures these)",
            "derived": "copy.d2d and copy.gather bandwidth = fitted element-wise bandwidth / 2 (read + write)",
            "command": "python -m calibration.fit_public --data ../shared/data",
            "date": _dt.date.today().isoformat(),
        },
    }
    return prof


def _scale(value: float, num: float, den: float) -> float:
    return _round(value * num / den) if den > 0 else value


def prior_from(gpu: str, source_gpu: str, source: dict) -> dict[str, Any]:
    """Datasheet peaks of ``gpu`` with efficiencies transferred from ``source`` (a profile dict)."""
    tgt, src = get_gpu(gpu), get_gpu(source_gpu)
    ops_in = source["ops"]
    ops_out: dict[str, Any] = json.loads(json.dumps(ops_in))
    if tgt.fp8_flop_per_s <= 0:
        ops_out["gemm"].pop("fp8", None)

    def link(g) -> float:
        return g.nvlink_bytes_per_s if g.nvlink_bytes_per_s > 0 else g.pcie_bytes_per_s

    for n, prm in ops_out["allreduce"].items():
        for key in ("bus_bw_bytes_per_s", "ll_bus_bw_bytes_per_s"):
            if key in prm:
                prm[key] = _scale(ops_in["allreduce"][n][key], link(tgt), link(src))
    hbm_ratio = (tgt.hbm_bytes_per_s, src.hbm_bytes_per_s)
    for kind in ("d2d", "gather"):
        ops_out["copy"][kind]["bw_bytes_per_s"] = _scale(
            ops_in["copy"][kind]["bw_bytes_per_s"], *hbm_ratio
        )
    for kind in ("h2d_pinned", "d2h_pinned"):
        ops_out["copy"][kind]["bw_bytes_per_s"] = _scale(
            ops_in["copy"][kind]["bw_bytes_per_s"], tgt.pcie_bytes_per_s, src.pcie_bytes_per_s
        )
    ops_out["copy"]["p2p"]["bw_bytes_per_s"] = _scale(
        ops_in["copy"]["p2p"]["bw_bytes_per_s"], link(tgt), link(src)
    )
    return {
        "schema_version": 1,
        "gpu": gpu,
        "peaks": {
            "bf16_flop_per_s": tgt.bf16_flop_per_s,
            "fp8_flop_per_s": tgt.fp8_flop_per_s,
            "hbm_bytes_per_s": tgt.hbm_bytes_per_s,
            "hbm_bytes": tgt.hbm_bytes,
        },
        "ops": ops_out,
        "engines": source["engines"],
        "fit_error": {},
        "provenance": {
            "kind": "prior",
            "source": f"PRIOR, not measured on {gpu}: datasheet peaks from the GPU catalog with the efficiency "
            f"parameters (GEMM, attention, element-wise, launch floors, engine overheads) of the "
            f"{source_gpu} profile ({source['provenance']['kind']}); all-reduce and p2p bandwidth scaled by "
            f"the {'NVLink' if tgt.nvlink_bytes_per_s > 0 else 'PCIe'} / "
            f"{'NVLink' if src.nvlink_bytes_per_s > 0 else 'PCIe'} bandwidth ratio, d2d/gather by the HBM "
            f"ratio, host copies by the PCIe ratio",
            "transferred_from": source_gpu,
            "command": "python -m calibration.fit_public --data ../shared/data",
            "date": _dt.date.today().isoformat(),
        },
    }


def write_profile(prof: dict, path: Path) -> None:
    from disaggsim.output import PROFILE_OWNED, write_file

    profile_from_dict(prof, str(path))
    text = json.dumps(prof, indent=2) + "\n"
    write_file(path, lambda tmp: tmp.write_text(text), "--out", PROFILE_OWNED, "profile")


def is_measured(path: Path) -> bool:
    """Whether the profile file at ``path`` was measured on its GPU (never overwritten here)."""
    if not path.is_file():
        return False
    try:
        return (json.loads(path.read_text()).get("provenance") or {}).get("kind") == "measured"
    except json.JSONDecodeError:
        return False


def destination(gpu: str, out_dir: str | None) -> Path:
    """Where this script writes ``gpu``'s fitted or prior profile: the shipped file (or
    ``out_dir``), except when that file is a measured profile — then the profile goes to
    ``calibration/priors/`` (or ``out_dir/priors/``), the base ``calibrate fit`` carries
    unmeasured parts from."""
    ship = shipped_profile_path(gpu)
    target = (Path(out_dir) / ship.name) if out_dir else ship
    if is_measured(target) or is_measured(ship):
        return ((Path(out_dir) / "priors") if out_dir else PRIORS_DIR) / ship.name
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m calibration.fit_public", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--data",
        default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data"),
        help="public data root holding kernels/ (default ../shared/data from the repo root)",
    )
    p.add_argument("--out-dir", help="write profiles here instead of disaggsim/hardware/profiles/")
    p.add_argument(
        "--engines", action="store_true", help="also fit engine overheads to DistServe (A100)"
    )
    args = p.parse_args(argv)
    try:
        data = Path(args.data)
        public.kernels_dir(data)
        fitted = {}
        for gpu in FITTED_GPUS:
            out = destination(gpu, args.out_dir)
            base_path = out if out.is_file() else shipped_profile_path(gpu)
            base = json.loads(base_path.read_text())
            prof = fit_gpu(gpu, data, base)
            if args.engines:
                from calibration import engines

                if gpu == "a100-80gb":
                    prof = engines.fit_into(prof, data)
                prof = engines.graphs_into(prof, data, gpu)
            write_profile(prof, out)
            fitted[gpu] = prof
            print(f"wrote {out}")
            for op, e in prof["fit_error"].items():
                ho = e.get("held_out_median_ape")
                print(
                    f"  {op:24s} n={e['n']:6d} median {100 * e['median_ape']:5.1f}% mean {100 * e['mean_ape']:5.1f}%"
                    + (
                        f" held-out median {100 * ho:5.1f}% ({e['held_out']})"
                        if ho is not None
                        else ""
                    )
                )
        if args.engines:  # no H100 whole-step table: it takes the A100 eager overheads
            h100, a100 = fitted["h100-sxm"], fitted["a100-80gb"]
            own_graph_layer_s = h100["engines"]["cuda-graphs"]["per_layer_s"]
            h100["engines"] = json.loads(json.dumps(a100["engines"]))
            h100["engines"]["cuda-graphs"]["per_layer_s"] = own_graph_layer_s
            h100["provenance"]["carried"] = [
                c for c in h100["provenance"]["carried"] if c != "engines"
            ]
            h100["provenance"]["engines_from"] = (
                "engines.eager and engines.cuda-graphs.per_iteration_s from the a100-80gb "
                "DistServe fit (no H100 whole-step table)"
            )
            write_profile(fitted["h100-sxm"], destination("h100-sxm", args.out_dir))
        for gpu, src in PRIORS.items():
            out = destination(gpu, args.out_dir)
            write_profile(prior_from(gpu, src, fitted[src]), out)
            note = ""
            if out.parent.name == "priors":
                note = (
                    f"; the shipped {gpu} profile is measured and stays: refit it with "
                    f"`disaggsim calibrate fit RAW_DIR --gpu {gpu} --base {out}`"
                )
            print(f"wrote {out} (prior from {src}{note})")
    except UserError as e:
        print(f"fit_public: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
