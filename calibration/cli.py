"""``disaggsim calibrate``: run microbenchmarks, fit profiles, show and validate them.

- ``disaggsim calibrate --device cuda|cpu --out DIR [--quick]``: torch sweeps → raw CSVs;
- ``disaggsim calibrate fit RAW_DIR --gpu ID [--out PROFILE.json] [--base PROFILE.json]``;
- ``disaggsim calibrate show GPU_ID``: which profile file, its provenance and fit errors;
- ``disaggsim calibrate validate [--gpu ...] [--data DIR] [--write-doc]``: the shipped
  cost model against every row of the public kernel tables;
- ``disaggsim calibrate validate-steps RAW [--gpu ID] [--profile JSON]``: the step model
  against whole-layer passes timed by ``python -m calibration.steps``;
- ``disaggsim calibrate fit-steps RAW --gpu ID [--profile JSON] [--out PROFILE.json]``:
  ``graph_replay.per_layer_s`` fitted to those passes, written into the profile.

``python -m calibration ...`` takes the same arguments. Only the sweep imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from disaggsim.cli.common import printing_after
from disaggsim.errors import UserError
from disaggsim.inputs import read_json
from disaggsim.output import (
    PROFILE_OWNED,
    Written,
    check_file,
    hold_file,
    out_flag,
    prefix_owned,
    write_file,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data"


def on_one_blas_thread(cmd: Callable[[argparse.Namespace], int]) -> Callable:
    """``cmd`` run on one BLAS thread (:func:`calibration.fit.one_blas_thread`): every
    subcommand that fits (``fit``, ``validate``'s held-out refits, ``fit-steps``), so its
    output does not depend on the core count. In-process, since ``disaggsim calibrate``
    cannot restart itself as the ``python -m calibration.fit_public`` entry does; the
    import waits for the call (numpy and scipy stay out of every CLI start)."""

    @functools.wraps(cmd)
    def pinned(args: argparse.Namespace) -> int:
        from calibration.fit import one_blas_thread

        with one_blas_thread():
            return cmd(args)

    return pinned


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "calibrate",
        help="GPU microbenchmarks → fitted hardware profiles; show / validate profiles",
        description=__doc__.split("\n\n")[0],
    )
    _configure(p)
    return p


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device", choices=("cuda", "cpu"), help="run the microbenchmark sweeps on this device"
    )
    p.add_argument("--out", dest="raw_out", metavar="DIR", help="folder for the raw CSVs")
    p.add_argument("--quick", action="store_true", help="smaller sweeps (GPU: about a minute)")
    p.add_argument(
        "--ops",
        metavar="OP,OP",
        help="comma-separated sweeps to run (default all: gemm, decode_attention, "
        "prefill_attention, elementwise, copy, allreduce)",
    )
    p.set_defaults(func=_cmd_run)
    sub = p.add_subparsers(
        dest="calibrate_command", metavar="{fit,show,validate,validate-steps,fit-steps}"
    )

    f = sub.add_parser("fit", help="fit a profile from a raw measurement folder")
    f.add_argument("raw_dir", metavar="RAW_DIR")
    f.add_argument(
        "--gpu", required=True, type=gpu_id, metavar="ID", help="catalog GPU id, e.g. h200-sxm"
    )
    f.add_argument(
        "--out", dest="profile_out", metavar="PROFILE.json", help="default: RAW_DIR/<gpu>.json"
    )
    f.add_argument(
        "--base",
        metavar="PROFILE.json",
        help="profile to carry unmeasured ops from (default: calibration/priors/<gpu>.json "
        "if present, else the shipped profile unless it is measured)",
    )
    f.set_defaults(func=_cmd_fit)

    s = sub.add_parser("show", help="which profile a GPU uses and where its numbers came from")
    s.add_argument("gpu", type=gpu_id, metavar="GPU_ID")
    s.add_argument(
        "--profile", metavar="PROFILE.json", help="show this file instead of the shipped one"
    )
    s.set_defaults(func=_cmd_show)

    v = sub.add_parser("validate", help="cost model vs every row of the public kernel tables")
    v.add_argument("--gpu", nargs="+", type=gpu_id, default=["a100-80gb", "h100-sxm"], metavar="ID")
    v.add_argument(
        "--data",
        metavar="DIR",
        help="public data root (default: ../shared/data from the repo root)",
    )
    v.add_argument(
        "--write-doc",
        metavar="MD",
        nargs="?",
        const=str(REPO_ROOT / "docs" / "validation.md"),
        help="also write the tables as Markdown (default docs/validation.md)",
    )
    v.set_defaults(func=_cmd_validate)

    vs = sub.add_parser(
        "validate-steps",
        help="step model vs measured whole-layer passes (python -m calibration.steps)",
    )
    vs.add_argument("raw_dir", metavar="RAW", help="folder holding steps.csv")
    vs.add_argument("--gpu", default="h200-sxm", type=gpu_id, metavar="ID", help="profile's GPU id")
    vs.add_argument("--profile", metavar="PROFILE.json", help="default: the shipped profile")
    vs.set_defaults(func=_cmd_validate_steps)

    fs = sub.add_parser(
        "fit-steps",
        help="fit graph_replay.per_layer_s to measured CUDA-graph layer passes",
    )
    fs.add_argument("raw_dir", metavar="RAW", help="folder holding steps.csv")
    fs.add_argument("--gpu", required=True, type=gpu_id, metavar="ID", help="GPU the passes ran on")
    fs.add_argument(
        "--profile", metavar="PROFILE.json", help="profile to start from (default: the shipped one)"
    )
    fs.add_argument(
        "--out", dest="profile_out", metavar="PROFILE.json", help="default: RAW/<gpu>.json"
    )
    fs.set_defaults(func=_cmd_fit_steps)


def gpu_id(text: str) -> str:
    """A ``--gpu`` value: a catalog GPU id (``--gpu ''`` was reported as a missing
    ``profiles/.json``, naming no flag); an unknown one names the id meant as a
    scenario's ``gpu`` does (``H100``: h100-sxm or h100-pcie; ``NVIDIA H100 80GB HBM3``:
    h100-sxm; it named none for either)."""
    from disaggsim.catalog import id_hint, load_gpus

    ids = sorted(load_gpus())
    if text in ids:
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r}: not a catalog GPU id{id_hint('gpu', text)} (allowed: {', '.join(ids)})"
    )


def _cmd_run(args) -> int:
    if args.device is None or args.raw_out is None:
        raise UserError(
            "calibrate: give --device cuda|cpu and --out DIR, or a subcommand: fit, show, validate"
        )
    from calibration import harness
    from disaggsim.output import claim_folder, seal_folder

    names = tuple(n for n, _ in harness.BENCHES)
    ops = None
    if args.ops:
        ops = tuple(o.strip() for o in args.ops.split(",") if o.strip())
        bad = [o for o in ops if o not in names]
        if bad:
            raise UserError(f"--ops: unknown sweep {bad[0]!r} (allowed: {', '.join(names)})")
    out = Path(args.raw_out)
    previous = claim_folder(out, "calibrate", "--out")
    if previous is not None:
        print(f"{out}: replacing the earlier disaggsim {previous.command} result there")
    try:
        harness.run(args.device, out, quick=args.quick, ops=ops)
    except BaseException:
        # the first error (a full disk, a stop, bad input) is the one to say: a seal that
        # fails as well (the disk refuses even the marker written in place) must not
        # replace it (docs/safety.md, "calibrate --out")
        with contextlib.suppress(OSError):
            seal_folder(out, "calibrate")
        raise
    seal_folder(out, "calibrate")
    return 0


@on_one_blas_thread
def _cmd_fit(args) -> int:
    from calibration.fit import build_profile
    from calibration.rawio import read_raw
    from disaggsim.hardware.profile import profile_from_dict, shipped_gpu_ids

    base_path = Path(args.base) if args.base else default_base(args.gpu)
    if not base_path.is_file():
        raise UserError(
            f"{base_path}: base profile for GPU {args.gpu!r} not found (give --base "
            f"PROFILE.json; shipped: {', '.join(shipped_gpu_ids())})"
        )
    base = read_json(base_path, UserError)
    profile_from_dict(base, str(base_path))  # validates the base before we build on it
    _check_profile_target(args)
    df = read_raw(args.raw_dir)
    check_raw_device(df, args.gpu, args.raw_dir)
    prof = build_profile(args.gpu, df, base, str(args.raw_dir), _repo_rel(base_path))
    written = _write_profile(prof, args)
    with printing_after(written.note()):  # `> /dev/full`: the line says it was written
        print(f"profile {written.note()}")
        for op, err in prof["fit_error"].items():
            if op.startswith("carried:"):
                continue
            ho = err.get("held_out_median_ape")
            print(
                f"  {op:28s} n={err['n']:5d}  median APE {100 * err['median_ape']:6.2f}%  mean {100 * err['mean_ape']:6.2f}%"
                + (f"  held-out median {100 * ho:6.2f}%" if ho is not None else "")
            )
        print(
            f"  carried from {prof['provenance']['base_profile']}: {', '.join(prof['provenance']['carried'])}"
        )
    return 0


def _write_profile(prof: dict, args) -> Written:
    """Validate ``prof`` and write it to ``--out`` (default ``RAW_DIR/<gpu>.json``); the
    returned note says when it replaced an earlier profile (the default replaces the one
    a raw run's folder holds: never silently). ``--out`` is passed as given, so a
    trailing '/' (a folder) is refused, not dropped."""
    from disaggsim.hardware.profile import profile_from_dict

    out, flag = _profile_target(args)
    profile_from_dict(prof, str(out))
    return write_file(
        out,
        lambda tmp: tmp.write_text(json.dumps(prof, indent=2) + "\n"),
        flag,
        PROFILE_OWNED,
        "profile",
    )


def _profile_target(args) -> tuple[str, str]:
    """(the profile path as given or defaulted, the flag its errors name)."""
    from disaggsim.hardware.profile import profile_filename

    given = bool(args.profile_out)
    out = args.profile_out if given else str(Path(args.raw_dir) / profile_filename(args.gpu))
    return out, out_flag(given)


def _check_profile_target(args) -> None:
    """The profile path, checked before the fit (as every single-file output)."""
    out, flag = _profile_target(args)
    check_file(out, flag, PROFILE_OWNED, "profile")


def check_raw_device(df, gpu: str, raw_dir: str | Path) -> None:
    """Refuse to fit a raw run measured on another GPU than ``gpu`` (an H200 run fitted as
    ``--gpu h100-sxm`` gave an h100-sxm profile of H200 timings, silently). The raw rows'
    ``device_name`` (CUDA's name, ``NVIDIA H200``) must hold the model of ``gpu``'s catalog
    name (H200, H100, A100, L40S, ...) and say PCIe exactly when the catalog's does. A CPU
    run (``device_name`` ``cpu...``: CI and tests time the code path, not a GPU) fits as
    any GPU."""
    import re

    from disaggsim.catalog import load_gpus

    names = sorted({str(n) for n in df["device_name"].dropna().unique()})
    measured = [n for n in names if not n.lower().startswith("cpu")]
    if not measured:
        return
    catalog = load_gpus()[gpu].name
    model = re.search(r"\b[A-Z]+\d+[A-Z]*\b", catalog)
    pcie = "pcie" in catalog.lower()

    def same(device: str) -> bool:
        words = re.split(r"[^a-z0-9]+", device.lower())
        return (model is None or model.group(0).lower() in words) and (("pcie" in words) == pcie)

    if len(measured) > 1 or not same(measured[0]):
        raise UserError(
            f"{raw_dir}: measured on {', '.join(measured)}, not --gpu {gpu} ({catalog}); "
            "give the --gpu the run measured"
        )


def _check_steps_device(raw_dir: str | Path, gpu: str) -> None:
    """Passes in ``RAW/steps.csv`` timed on another GPU than ``gpu`` are refused, as
    :func:`check_raw_device` refuses a raw run of ``calibrate fit`` (they were fitted and
    validated as ``gpu``'s, silently). Without the file, the step functions say so."""
    from calibration import steps

    path = Path(raw_dir) / "steps.csv"
    if os.path.lexists(path):
        check_raw_device(steps.read_steps(raw_dir), gpu, raw_dir)


def default_base(gpu: str) -> Path:
    """The profile ``calibrate fit`` carries unmeasured ops from when no ``--base`` is
    given: the prior ``calibration/priors/<gpu>.json`` when there is one (written by
    ``python -m calibration.fit_public`` for GPUs whose shipped profile is measured),
    else the shipped profile — unless that one is itself measured, which would carry a
    previous fit's values: then ``--base`` is required."""
    from calibration.fit_public import PRIORS_DIR, is_measured
    from disaggsim.hardware.profile import profile_filename, shipped_profile_path

    prior = PRIORS_DIR / profile_filename(gpu)
    if prior.is_file():
        return prior
    ship = shipped_profile_path(gpu)
    if is_measured(ship):
        raise UserError(
            f"{ship}: the shipped {gpu} profile is itself measured; give --base PROFILE.json "
            f"(e.g. the prior written by `python -m calibration.fit_public` to {prior})"
        )
    return ship


def _repo_rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _cmd_show(args) -> int:
    from disaggsim.hardware.profile import load_profile

    prof = load_profile(args.gpu, path=args.profile)
    path = Path(prof.path)
    prov = prof.provenance
    kind = prov.get("kind", "")
    print(f"GPU {prof.gpu}: profile {_repo_rel(path)}")
    note = {
        "measured": "measured on this GPU by disaggsim calibrate",
        "fitted-public": "fitted to public measured kernel tables",
        "prior": "PRIOR: datasheet peaks with efficiencies transferred from another GPU, not measured on this one",
        "provisional": "PROVISIONAL: typed-in efficiency guesses, not fitted to any measurement",
    }[kind]
    print(f"provenance: {kind} ({note})")
    for key in (
        "source",
        "transferred_from",
        "tables",
        "source_commit",
        "device_name",
        "driver",
        "torch_version",
        "measured_date",
        "date",
        "raw_dir",
        "base_profile",
    ):
        if prov.get(key):
            print(f"  {key}: {prov[key]}")
    for key in ("measured", "carried"):
        if prov.get(key):
            print(f"  {key}: {', '.join(map(str, prov[key]))}")
    pk = prof.peaks
    print(
        f"peaks: bf16 {pk.bf16_flop_per_s / 1e12:.0f} TFLOP/s, fp8 {pk.fp8_flop_per_s / 1e12:.0f} TFLOP/s, "
        f"HBM {pk.hbm_bytes_per_s / 1e9:.0f} GB/s (GB = 1e9 bytes)"
    )
    if not prof.fit_error:
        print("fit error: none recorded (nothing was fitted for this profile)")
        return 0
    print("fit error (APE = |predicted - measured| / measured):")
    for op, e in prof.fit_error.items():
        if not isinstance(e, dict) or "median_ape" not in e:
            continue
        ho = e.get("held_out_median_ape")
        src = f"  [{e['source']}]" if e.get("source") else ""
        print(
            f"  {op:30s} n={e.get('n', 0):6d}  median {100 * e['median_ape']:6.2f}%  mean {100 * e['mean_ape']:6.2f}%"
            + (
                f"  held-out median {100 * ho:6.2f}% ({e.get('held_out', '')})"
                if ho is not None
                else ""
            )
            + src
        )
    return 0


# The first line of docs/validation.md (calibration.validate's Report.markdown()): a file
# that starts with it is a validation doc disaggsim wrote.
VALIDATION_DOC_TITLE = "# Validation: cost model vs measurements"


@on_one_blas_thread
def _cmd_validate(args) -> int:
    from calibration import validate

    data = Path(args.data) if args.data else DEFAULT_DATA
    with contextlib.ExitStack() as held:
        if args.write_doc:  # before the work (about 40 s), as every single-file output;
            # held until written: another command writing the doc meanwhile is refused
            held.enter_context(
                hold_file(
                    args.write_doc,
                    "--write-doc",
                    prefix_owned(VALIDATION_DOC_TITLE),
                    "validation doc",
                )  # fmt: skip
            )
        report = validate.run(args.gpu, data, moe_section=bool(args.write_doc))
        # the doc first: a standard output that refuses the report (`> /dev/full`) failed
        # the command before the doc, the work of the last 40 s, was written
        if args.write_doc:
            write_file(
                args.write_doc,
                lambda tmp: tmp.write_text(report.markdown()),
                "--write-doc",
                prefix_owned(report.markdown().split("\n", 1)[0]),
                "validation doc",
            )
    with printing_after(f"written to {args.write_doc}" if args.write_doc else None):
        print(report.text())
        if args.write_doc:
            print(f"wrote {args.write_doc}")
    return 0 if report.all_targets_met() else 1


def _cmd_validate_steps(args) -> int:
    from calibration import steps

    _check_steps_device(args.raw_dir, args.gpu)
    print(steps.validate_steps(args.raw_dir, args.gpu, args.profile))
    return 0


@on_one_blas_thread
def _cmd_fit_steps(args) -> int:
    from calibration import steps
    from disaggsim.hardware.profile import (
        load_profile,
    )

    _check_profile_target(args)
    _check_steps_device(args.raw_dir, args.gpu)
    prof = load_profile(args.gpu, path=args.profile)
    f = steps.graph_layer_fit(args.raw_dir, args.gpu, prof)
    out_dict = json.loads(Path(prof.path).read_text())
    out_dict["graph_replay"] = {"per_layer_s": float(f"{f['per_layer_s']:.5g}")}
    out_dict.setdefault("fit_error", {})["graph_replay"] = f["error"]
    prov = out_dict.setdefault("provenance", {})
    prov["carried"] = [c for c in prov.get("carried", []) if c != "graph_replay"]
    prov["graphs_from"] = (
        f"graph_replay.per_layer_s fitted to CUDA-graph layer passes on {f['device_name']} "
        f"(torch {f['torch_version']}, {f['date']}; {_repo_rel(Path(args.raw_dir))}/steps.csv, "
        "calibration/steps.py graph_layer_fit)"
    )
    written = _write_profile(out_dict, args)
    with printing_after(written.note()):
        e = f["error"]
        print(
            f"graph_replay.per_layer_s = {1e6 * f['per_layer_s']:.2f} us: median APE "
            f"{100 * e['median_ape']:.1f}% (held out by shape {100 * e['held_out_median_ape']:.1f}%, "
            f"kernels only {100 * e['kernels_only_median_ape']:.1f}%), n={e['n']}"
        )
        if f["eager_per_layer_s"] is not None:
            print(
                f"eager passes beside (not written): {1e6 * f['eager_per_layer_s']:.2f} us per layer "
                "of bare-torch launch cost"
            )
        print(f"profile {written.note()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m calibration``: the same arguments as ``disaggsim calibrate``."""
    from disaggsim.hardware.profile import ProfileError

    p = argparse.ArgumentParser(prog="python -m calibration", description=__doc__.split("\n\n")[0])
    _configure(p)
    args = p.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (UserError, ProfileError) as e:
        print(f"calibrate: error: {e}", file=sys.stderr)
        return 2
