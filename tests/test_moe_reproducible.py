"""The shipped MoE parameters are what the documented refit writes from the shared data.

``python -m calibration.fit_moe --data ../shared/data`` (``docs/calibration.md``,
"Reproducing the shipped files") writes ``disaggsim/hardware/moe/h100_sxm.json``. Here it
runs whole, into a temporary folder (76 s of wall time on a 2-core box, 2026-12-04,
docs/calibration.md), and the file it writes must equal the shipped one: the same keys,
strings and counts, and the same predictions of every fit's own rows within the
tolerances below (its fits have flat directions that another CPU resolves elsewhere). A
file of its own beside tests/test_calibration_reproducible.py, so that the two refits can
run on two test workers at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.conftest import REPO

HARDWARE = REPO / "disaggsim" / "hardware"

# The MoE fits' flat directions (several parameter sets predicting the fitted rows alike)
# landed elsewhere on another CPU until 2026-12-03 (TensorRT-LLM's mxfp4 expert_s 4.8e-7 vs
# 4.0e-8 s, predictions up to 1.52% apart). Since then calibration/fit_moe.py holds each
# such parameter by a stated rule and solves the rest to tight tolerances
# (fit_grouped_gemm): refitted from starts scaled 0.6-1.7x, the predictions of their fitted
# rows move at most 0.26% (TensorRT-LLM fp8, 0.033% median; the sets that had flat
# directions agree within 1e-4, tests/test_moe_fit_determined.py). The file is still
# compared by what it predicts (the MLA and DeepEP fits are not re-solved), at about four
# times that; the fit_error fractions within one point (the held-out refits start from the
# fit and stop at the solver's default tolerance), the held parameters exactly.
MOE_PRED_MEDIAN = 0.001  # relative change of the predictions of a fit's rows, median
MOE_PRED_MAX = 0.01  # and at most
MOE_FIT_ERROR_ABS = 0.01  # each fit_error fraction (0.01 = one percentage point)


def _moe_prediction_changes(written: dict, shipped: dict, tables: SimpleNamespace) -> list[str]:
    """Each MoE fit whose predictions of its own fitted rows (calibration.fit_moe; the rows
    in ``tables``, tests/conftest.moe_tables) move beyond the tolerances between two
    parameter files."""
    from calibration import fit_moe as fm
    from disaggsim.costmodel.moe_params import moe_params_from_dict

    a, b = moe_params_from_dict(written), moe_params_from_dict(shipped)
    preds = []  # (name, prediction with a, with b)
    moe = tables.moe
    for fw in (fm.REF_MOE, *fm.GEMM_FRAMEWORKS):
        for dt in ("bf16", "fp8", "fp8-block", "mxfp4"):
            d = fm.fitted_rows(moe, fw, dt)
            if not d.empty:
                pa, pb = fm._gg(a.gemm(dt, fw), d), fm._gg(b.gemm(dt, fw), d)
                preds.append((f"grouped_gemm {fw} {dt}", pa, pb))
    for fw in fm.TUNED_TILE_FRAMEWORKS:
        for dt in b.grouped_gemm_tuned.get(fw, {}):
            d = fm.fitted_rows(moe, fw, dt, tuned=True)
            pa, pb = fm._gg(a.gemm(dt, fw, True), d), fm._gg(b.gemm(dt, fw, True), d)
            preds.append((f"grouped_gemm {fw} {dt} tuned tiles", pa, pb))
    gen = tables.mla_generation
    for kv in ("bf16", "fp8"):
        d = gen[(gen.fw == "trtllm") & (gen.kv == kv)]
        preds.append(
            (f"mla_decode {kv}", fm._mla_dec(a.decode(kv), d), fm._mla_dec(b.decode(kv), d))
        )
    ctx = tables.mla_context
    for form, fw in (("absorbed", "sglang"), ("naive", "trtllm")):
        d = ctx[(ctx.fw == fw) & (ctx.kv == "bf16")]
        pa = fm._mla_pre(a.mla_prefill[form], d, form)
        preds.append((f"mla_prefill {form}", pa, fm._mla_pre(b.mla_prefill[form], d, form)))
    a2a = tables.deepep
    for mode in ("normal", "low_latency"):
        for phase in ("dispatch", "combine"):
            d = a2a[(a2a["mode"] == mode) & (a2a.phase == phase)]
            pa = fm._a2a(a.all_to_all[mode][phase], d)
            preds.append((f"all_to_all {mode} {phase}", pa, fm._a2a(b.all_to_all[mode][phase], d)))
    out = []
    for name, pa, pb in preds:
        rel = np.abs(np.asarray(pa) / np.asarray(pb) - 1.0)
        med, top = float(np.median(rel)), float(np.max(rel))
        if med > MOE_PRED_MEDIAN or top > MOE_PRED_MAX:
            out.append(f"{name}: predictions move {100 * med:.2f}% median, {100 * top:.2f}% max")
    return out


def _moe_fixed_differences(written: object, shipped: object, where: str = "") -> list[str]:
    """Where two MoE files differ in anything but a fitted number: keys, strings, counts;
    the fit_error fractions within MOE_FIT_ERROR_ABS."""
    if isinstance(written, dict) and isinstance(shipped, dict):
        if written.keys() != shipped.keys():
            return [f"{where}: keys {sorted(written.keys() ^ shipped.keys())}"]
        return [
            d
            for k in written
            for d in _moe_fixed_differences(written[k], shipped[k], f"{where}.{k}")
        ]
    if isinstance(written, float) and isinstance(shipped, (int, float)):
        fitted = not where.startswith(".fit_error")  # compared through their predictions
        ok = fitted or abs(written - shipped) <= MOE_FIT_ERROR_ABS
        return [] if ok else [f"{where}: {written!r} vs {shipped!r}"]
    return [] if written == shipped else [f"{where}: {written!r} vs {shipped!r}"]


@pytest.mark.slow
def test_moe_refit_writes_the_shipped_file(
    shared_data: Path, tmp_path: Path, moe_tables: SimpleNamespace
) -> None:
    out = tmp_path / "h100_sxm.json"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2"}
    done = subprocess.run(
        [sys.executable, "-m", "calibration.fit_moe", "--data", str(shared_data), "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = json.loads(out.read_text())
    shipped = json.loads((HARDWARE / "moe" / "h100_sxm.json").read_text())
    found = _moe_fixed_differences(written, shipped)
    found += _moe_prediction_changes(written, shipped, moe_tables)
    assert not found, (
        "disaggsim/hardware/moe/h100_sxm.json differs from what python -m calibration.fit_moe "
        f"--data ../shared/data writes: {'; '.join(found[:3])}"
    )


def test_moe_comparison_fails_a_stale_file(moe_tables: SimpleNamespace) -> None:
    """The comparison by predictions still catches a file that is not the refit's: the
    shipped file before 2026-12-03's fit without TensorRT-LLM's untuned cells (its bf16
    set predicts the fitted rows 1.3% apart in median, 8.7% at most) and a hand edit of one
    parameter."""
    shipped = json.loads((HARDWARE / "moe" / "h100_sxm.json").read_text())
    stale = json.loads(json.dumps(shipped))
    stale["grouped_gemm"]["bf16"] = {"launch_s": 2.8403e-05, "max_eff": 0.9089,
        "half_sat": 294.18, "mem_eff": 0.90693, "width_half_sat": 704.0,
        "token_eff": 0.78236, "expert_s": 1.4936e-07}  # fmt: skip
    found = _moe_prediction_changes(stale, shipped, moe_tables)
    assert [f.split(":")[0] for f in found] == ["grouped_gemm trtllm bf16"]
    edited = json.loads(json.dumps(shipped))
    edited["mla_decode"]["fp8"]["bw_eff"] *= 1.1
    assert [f.split(":")[0] for f in _moe_prediction_changes(edited, shipped, moe_tables)] == [
        "mla_decode fp8"
    ]
    edited = json.loads(json.dumps(shipped))
    edited["fit_error"]["grouped_gemm.bf16"]["n"] += 1
    assert _moe_fixed_differences(edited, shipped) == [
        ".fit_error.grouped_gemm.bf16.n: 14068 vs 14067"
    ]
