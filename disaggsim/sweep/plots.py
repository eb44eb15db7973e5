"""Sweep and comparison plots: latency percentiles and SLO attainment vs the first swept
parameter, one line per combination of the other parameters (and per scenario)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from disaggsim.sweep.core import SEED_INDEX

PANELS = (
    (
        "ttft.png",
        "Time to first token",
        (("ttft_p50_s", "p50", "-"), ("ttft_p99_s", "p99", "--")),
        "TTFT (s)",
    ),
    (
        "itl.png",
        "Inter-token latency",
        (("itl_p50_s", "p50", "-"), ("itl_p99_s", "p99", "--")),
        "ITL (ms)",
    ),
    (
        "slo_attainment.png",
        "SLO attainment",
        (("slo_attainment", "", "-"),),
        "share of requests meeting both SLOs",
    ),
)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def mean_over_seeds(df: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """Numeric columns averaged over ``seed_index`` for each combination of ``keys``."""
    value_cols = [c for c, *_ in (m for _, _, metrics, _ in PANELS for m in metrics) if c in df]
    value_cols += [c for c in ("slo_attainment_target",) if c in df and c not in value_cols]
    if SEED_INDEX not in df or not keys:
        return df[list(keys) + value_cols].copy()
    return df.groupby(list(keys), sort=False, dropna=False)[value_cols].mean().reset_index()


def short_labels(values: Sequence[str]) -> dict[str, str]:
    """File paths without their common folder (``a/x.yaml``, ``a/y.yaml`` → ``x.yaml``, ``y.yaml``)."""
    vals = [str(v) for v in values]
    if len(vals) < 2:
        return {v: Path(v).name for v in vals}
    try:
        common = os.path.commonpath([os.path.dirname(v) or "." for v in vals])
    except ValueError:
        return {v: v for v in vals}
    return {v: os.path.relpath(v, common) if common else v for v in vals}


def write_sweep_plots(
    df: pd.DataFrame, params: Sequence[str], out_dir: Path, series: Sequence[str] = ()
) -> list[Path]:
    """One PNG per panel in :data:`PANELS`. ``params[0]`` is the x axis; ``series`` (e.g.
    the scenario column of a comparison, labelled by file name) and the other params
    split the lines: one colour per line, solid p50 and dashed p99."""
    plt = _pyplot()
    if not params:
        return []
    x = params[0]
    split = list(series) + list(params[1:])
    m = mean_over_seeds(df, split + [x])
    groups = list(m.groupby(split, sort=False, dropna=False)) if split else [((), m)]
    names = {c: short_labels(list(m[c].unique())) for c in series}
    paths = []
    for fname, title, metrics, ylabel in PANELS:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for i, (key, g) in enumerate(groups):
            key = key if isinstance(key, tuple) else (key,)
            name = ", ".join(
                names[c][str(v)] if c in names else f"{c}={v}"
                for c, v in zip(split, key, strict=True)
            )
            for col, q, ls in metrics:
                if col not in g:
                    continue
                y = g[col] * (1e3 if ylabel.startswith("ITL") else 1.0)
                label = " ".join(s for s in (name, q) if s) or col
                ax.plot(g[x], y, ls=ls, color=f"C{i % 10}", marker="o", ms=3, label=label)
        if fname == "slo_attainment.png" and "slo_attainment_target" in m:
            for t in sorted(m["slo_attainment_target"].dropna().unique()):
                ax.axhline(t, color="r", ls=":", lw=1, label=f"target {t:g}")
            ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = out_dir / fname
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths
