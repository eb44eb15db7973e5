"""``report.html``: one self-contained page per ``plan --out`` and ``compare --out``.

A page is plain HTML with its CSS inline and every figure embedded as a base64 PNG
(``<img src="data:image/png;base64,...">``), so it opens from a mail attachment or an
artifact store with nothing beside it. :class:`Page` builds one from headings, text,
tables, figures and labelled slots; :func:`plan_report` and :func:`compare_report` lay out
the two commands' results: the verdict and its reasons, the SLO model in words
(:mod:`disaggsim.metrics.slo_model`), goodput per GPU per candidate, the Pareto front,
the ranked table and the steady-state confirmation (rendered from whatever confirmation
data the results carry; a clearly labelled slot when they carry none).
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from disaggsim.metrics.slo_model import describe_slo

if TYPE_CHECKING:
    import pandas as pd

    from disaggsim.config.scenario import SloConfig
    from disaggsim.plan.advisor import Advice
    from disaggsim.plan.search import SearchResult
    from disaggsim.sweep.compare import CompareResult

__all__ = ["Page", "compare_report", "figure_png", "plan_report"]

REPORT_FILE = "report.html"
KIND_COLOURS = {
    "disaggregate": "#1f77b4",
    "colocate_chunked": "#2ca02c",
    "colocate_vllm": "#d62728",
}
CONFIRMATION_MISSING = (
    "No steady-state confirmation in these results: the goodput above comes from the "
    "bisection's runs alone. When the results carry a confirmation run (a longer run at the "
    "goodput found), its figures appear here."
)

_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 2em auto;
       max-width: 1100px; color: #1a1a1a; line-height: 1.45; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: 0.1em; }
h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 1.6em; }
.sub { color: #555; margin-top: 0; }
.verdict { background: #eef5ff; border-left: 6px solid #1f77b4; padding: 0.8em 1em; }
.verdict .what { font-size: 1.35em; font-weight: 600; }
.slot { background: #fff8e6; border: 1px dashed #d9a400; padding: 0.6em 1em; }
.wide { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }
th { background: #f3f3f3; }
td.l, th.l { text-align: left; }
ul.conditions { list-style: none; padding-left: 0.2em; }
.yes { color: #1a7f37; font-weight: 600; }
.no { color: #888; font-weight: 600; }
figure { margin: 1em 0; }
figcaption { color: #555; font-size: 0.9em; }
img { max-width: 100%; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
footer { color: #777; font-size: 0.85em; margin-top: 2em; }
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def figure_png(fig: Any) -> bytes:
    """A matplotlib figure as PNG bytes (the figure is closed)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


class Page:
    """An HTML page assembled from parts, every value escaped, every image inline."""

    def __init__(self, title: str, subtitle: str = "") -> None:
        self.title = title
        self.parts: list[str] = [f"<h1>{_e(title)}</h1>"]
        if subtitle:
            self.parts.append(f'<p class="sub">{_e(subtitle)}</p>')

    def heading(self, text: str) -> None:
        self.parts.append(f"<h2>{_e(text)}</h2>")

    def paragraph(self, text: str, cls: str | None = None) -> None:
        attr = f' class="{_e(cls)}"' if cls else ""
        self.parts.append(f"<p{attr}>{_e(text)}</p>")

    def verdict(self, what: str, reason: str, conditions: Iterable[tuple[str, bool, str]]) -> None:
        items = "".join(
            f'<li><span class="{"yes" if ok else "no"}">{"✓" if ok else "✗"}</span> '
            f"<b>{_e(name)}</b>: {_e(detail)}</li>"
            for name, ok, detail in conditions
        )
        self.parts.append(
            f'<div class="verdict"><div class="what">{_e(what)}</div><p>{_e(reason)}</p>'
            + (f'<ul class="conditions">{items}</ul>' if items else "")
            + "</div>"
        )

    def table(self, columns: Sequence[str], rows: Iterable[Sequence[Any]], left: int = 1) -> None:
        """A table; the first ``left`` columns are left-aligned (labels)."""
        head = "".join(
            f"<th{' class=l' if i < left else ''}>{_e(c)}</th>" for i, c in enumerate(columns)
        )
        body = "".join(
            "<tr>"
            + "".join(
                f"<td{' class=l' if i < left else ''}>{_e(v)}</td>" for i, v in enumerate(row)
            )
            + "</tr>"
            for row in rows
        )
        self.parts.append(
            f'<div class="wide"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>"
        )

    def figure(self, png: bytes, caption: str) -> None:
        data = base64.b64encode(png).decode("ascii")
        self.parts.append(
            f'<figure><img alt="{_e(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_e(caption)}</figcaption></figure>"
        )

    def slot(self, text: str) -> None:
        self.parts.append(f'<div class="slot">{_e(text)}</div>')

    def pre(self, text: str) -> None:
        self.parts.append(f"<pre>{_e(text)}</pre>")

    def render(self, footer: str = "") -> str:
        foot = f"<footer>{_e(footer)}</footer>" if footer else ""
        return (
            "<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(self.title)}</title><style>{_CSS}</style></head>"
            f"<body>{''.join(self.parts)}{foot}</body></html>\n"
        )


def _num(v: Any, fmt: str = "{:.3g}") -> str:
    if v is None:
        return "-"
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return "-" if not math.isfinite(f) else fmt.format(f)


def _footer() -> str:
    try:
        from importlib.metadata import version

        v = version("disaggsim")
    except Exception:  # not installed as a distribution
        v = "unknown"
    return f"Written by disaggsim {v}. Definitions: docs/metrics.md, docs/planning.md."


def _confirmation(page: Page, data: Any) -> None:
    """Render confirmation data of any shape (mapping, rows) or the labelled slot."""
    page.heading("Steady-state confirmation")
    if data is None or (hasattr(data, "__len__") and len(data) == 0):
        page.slot(CONFIRMATION_MISSING)
        return
    if isinstance(data, Mapping):
        # scalars in one table; each list of rows (a plan's re-measured candidates, the
        # caps it raised) in a table of its own under its key, empty lists as "none"
        lists = {k: v for k, v in data.items() if _rows(v)}
        page.table(
            ["", "value"],
            [(k, _cell(v)) for k, v in data.items() if k not in lists],
        )
        for k, v in lists.items():
            page.paragraph(k)
            _row_table(page, v)
        return
    if _rows(data):
        _row_table(page, data)
        return
    page.pre(str(data))


def _rows(v: Any) -> bool:
    """A non-empty list of mappings (rows of a table)."""
    return isinstance(v, (list, tuple)) and bool(v) and all(isinstance(r, Mapping) for r in v)


def _row_table(page: Page, rows: Sequence[Mapping[str, Any]]) -> None:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    page.table(cols, [[_cell(r.get(c)) for c in cols] for r in rows])


def _cell(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (list, tuple)):
        return ", ".join(_cell(x) for x in v) if v else "none"
    if isinstance(v, (int, float)):
        return _num(v)
    return "-" if v is None else str(v)


# ----------------------------------------------------------------------------- plan


def _goodput_bars(
    labels: list[str], values: list[float], colours: list[str], notes: list[str], title: str
) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(len(labels), 1)
    fig, ax = plt.subplots(figsize=(8, 0.45 * n + 1.4))
    y = list(range(len(labels)))[::-1]
    ax.barh(y, values, color=colours)
    ax.set_yticks(y, labels, fontsize=8)
    top = max([v for v in values if math.isfinite(v)] + [0.0])
    for yi, v, note in zip(y, values, notes, strict=True):
        ax.text(v + top * 0.01, yi, f"{v:.3g}{note}", va="center", fontsize=8)
    ax.set_xlim(0, top * 1.18 if top > 0 else 1)
    ax.set_xlabel("goodput per GPU (req/s)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return figure_png(fig)


def plan_report(res: SearchResult, advice: Advice, plan_dict: Mapping[str, Any]) -> str:
    """The plan's report page. ``plan_dict`` is :func:`disaggsim.plan.report.plan_json`'s
    object (its ``confirmation`` keys, when present, fill the confirmation section)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from disaggsim.plan.report import plot_pareto

    s = res.loaded.scenario
    page = Page(
        f"disaggsim plan: {s.name}",
        f"{s.model} on a budget of {res.gpu_budget} x {res.gpu}, fabric "
        f"{plan_dict.get('fabric_link', '-')}; {len(res.ranked)} candidates",
    )
    rec = advice.recommended
    gain = advice.disaggregation_gain
    what = f"Verdict: {advice.verdict}"
    if rec is not None:
        what += f" — {rec.candidate.label}"
        if rec.goodput_per_s > 0:
            what += f", {rec.goodput_per_gpu_per_s:.3g} req/s per GPU"
    page.verdict(
        what,
        advice.reason
        + (
            ""
            if gain is None
            else f" (disaggregation vs best colocated: {gain:+.0%} per GPU"
            # a quick plan's gain: how far to trust it (advisor.quick_margin)
            + (f"; {advice.margin.note()}" if advice.margin is not None else "")
            + ")"
        ),
        [(c.name, c.holds, c.detail) for c in advice.conditions],
    )
    page.heading("SLO model")
    page.paragraph(describe_slo(s.slo))

    page.heading("Goodput per GPU per candidate")
    labels, values, colours, notes = [], [], [], []
    for r in res.ranked:
        labels.append(r.candidate.label)
        values.append(r.goodput_per_gpu_per_s if r.goodput_per_s > 0 else 0.0)
        colours.append(KIND_COLOURS.get(r.candidate.kind, "#777777"))
        notes.append(
            {"above_range": "+ (above the range searched)", "below_range": " (below range)"}.get(
                r.status, ""
            )
        )
    page.figure(
        _goodput_bars(labels, values, colours, notes, "best first; colour: kind"),
        "Goodput per GPU of every candidate (blue: disaggregated, green: chunked, red: vLLM).",
    )
    fig, ax = plt.subplots(figsize=(7, 4.5))
    plot_pareto(res, ax)
    page.figure(
        figure_png(fig),
        "Goodput per GPU against ITL p99 at the goodput rate; dashed: the Pareto front.",
    )

    page.heading("Ranked candidates")
    rows = []
    for i, r in enumerate(res.ranked, 1):
        a = r.at_rate
        rows.append(
            [
                i,
                r.candidate.label,
                r.candidate.kind,
                r.candidate.num_gpus,
                _num(r.goodput_per_s),
                _num(r.goodput_per_gpu_per_s, "{:.4g}"),
                r.status,
                _num(None if a is None else a.ttft_p99_s * 1e3, "{:.0f}"),
                _num(None if a is None else a.itl_p99_s * 1e3, "{:.1f}"),
                _num(None if a is None else a.slo_attainment, "{:.3f}"),
                _num(r.usd_per_m_output_tokens, "{:.2f}"),
            ]
        )
    page.table(
        [
            "#",
            "candidate",
            "kind",
            "GPUs",
            "goodput req/s",
            "req/s per GPU",
            "status",
            "TTFT p99 ms",
            "ITL p99 ms",
            "attainment",
            "$/M out tok",
        ],
        rows,
        left=3,
    )
    _confirmation(page, _find_confirmation(plan_dict))

    page.heading("Recommended deployment")
    import yaml

    if advice.decided and rec is not None:
        page.pre(yaml.safe_dump(rec.candidate.deployment(), sort_keys=False))
        page.paragraph(_launch_files_text(res, advice))
    else:  # undecided (quick mode) or no deployment meets the SLOs
        page.paragraph(f"None: the verdict is {advice.verdict} ({advice.reason}).")
    page.heading("Analytic first guess")
    page.pre("\n".join(res.analytic.arithmetic()))
    return page.render(_footer())


def _launch_files_text(res: SearchResult, advice: Advice) -> str:
    """Which launch configurations ``plan --out`` writes beside the report, and why any
    of the three is left out (the same rule as :func:`disaggsim.plan.deploy.launch_configs`)."""
    from disaggsim.plan.deploy import (
        DEPLOY_FILES,
        deployment_of,
        launch_configs,
        uneven_nodes,
        unsupported,
    )

    assert advice.recommended is not None
    written = list(launch_configs(res, advice))
    reasons = [
        why
        for why in (
            unsupported(advice.recommended.candidate),
            uneven_nodes(deployment_of(res, advice)),
        )
        if why is not None
    ]
    if not written:
        return (
            "plan --out writes no launch configuration for this layout: " + "; ".join(reasons) + "."
        )
    text = "plan --out writes its launch configurations beside this report: " + ", ".join(written)
    if len(written) == len(DEPLOY_FILES):
        return text + " (flag names from each project's docs, versions in their header comments)."
    return text + "; " + "; ".join(reasons) + "."


def _find_confirmation(d: Mapping[str, Any]) -> Any:
    """Confirmation data in a plan or compare object: a top-level ``confirmation`` value,
    else the ranked rows' ``confirmation*`` fields and a plan's ``as_written`` check (the
    candidate run as its recommended.yaml runs; label kept)."""
    if d.get("confirmation"):
        return d["confirmation"]
    rows = []
    for r in d.get("ranked", []) or []:
        found = {
            k: v for k, v in r.items() if k.startswith("confirm") or k.startswith("as_written")
        }
        if found:
            row: dict[str, Any] = {"candidate": r.get("label")}
            for k, v in found.items():
                if isinstance(v, Mapping):
                    row.update({f"{k}.{kk}": vv for kk, vv in v.items()})
                else:
                    row[k] = v
            rows.append(row)
    return rows or None


# ----------------------------------------------------------------------------- compare


def _slo_of(frame: pd.DataFrame) -> SloConfig | None:
    from disaggsim.config.scenario import SloConfig

    need = (
        "slo_ttft_s",
        "slo_itl_s",
        "slo_itl_statistic",
        "slo_attainment_target",
        "slo_percentile",
    )
    if frame.empty or not all(c in frame for c in need):
        return None
    r = frame.iloc[0]
    return SloConfig(
        ttft_ms=float(r["slo_ttft_s"]) * 1e3,
        itl_ms=float(r["slo_itl_s"]) * 1e3,
        itl_statistic=str(r["slo_itl_statistic"]),  # type: ignore[arg-type]
        percentile=float(r["slo_percentile"]),
        attainment_target=float(r["slo_attainment_target"]),
    )


def _compare_pareto(table: pd.DataFrame, scenario_col: str) -> bytes | None:
    """Served requests per GPU against ITL p99 at every sweep point that met the SLO
    attainment target; the front over all scenarios dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    need = ("requests_per_s", "num_gpus", "itl_p99_s", "slo_attainment", "slo_attainment_target")
    if table.empty or not all(c in table for c in need):
        return None
    t = table.copy()
    t = t[t["slo_attainment"] >= t["slo_attainment_target"]]
    t = t[t["itl_p99_s"].notna() & t["requests_per_s"].notna()]
    if t.empty:
        return None
    t["per_gpu"] = t["requests_per_s"] / t["num_gpus"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, g in t.groupby(scenario_col, sort=False):
        ax.scatter(
            g["itl_p99_s"] * 1e3, g["per_gpu"], label=str(name).rsplit("/", 1)[-1], alpha=0.8
        )
    pts = sorted(zip(t["itl_p99_s"] * 1e3, t["per_gpu"], strict=True))
    front, best = [], -math.inf
    for x, y in pts:  # lowest ITL first: keep each point that serves more than all before
        if y > best:
            front.append((x, y))
            best = y
    ax.plot([p[0] for p in front], [p[1] for p in front], "k--", lw=1, label="Pareto front")
    ax.set_xlabel("ITL p99 (ms)")
    ax.set_ylabel("served req/s per GPU")
    ax.set_title("sweep points meeting the SLO attainment target", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return figure_png(fig)


def compare_report(res: CompareResult, plot_files: Sequence[tuple[str, bytes]] = ()) -> str:
    """The compare report page. ``plot_files``: (caption, PNG bytes) of the sweep plots
    to embed as well."""
    from disaggsim.sweep.compare import SCENARIO_FILE

    g = res.goodput
    names = [str(v).rsplit("/", 1)[-1] for v in g[SCENARIO_FILE]]
    page = Page(
        "disaggsim compare",
        f"{len(set(names))} scenarios: {', '.join(dict.fromkeys(names))}",
    )
    per_gpu = [float(v) for v in g["goodput_per_gpu_per_s"]]
    finite = [(v, i) for i, v in enumerate(per_gpu) if math.isfinite(v) and v > 0]
    top_ties = [i for v, i in finite if finite and v >= max(finite)[0] * (1 - 1e-9)]
    undecided = bool(finite) and (
        len(top_ties) > 1 or any(g.iloc[i]["status"] == "above_range" for i in top_ties)
    )
    if undecided:
        best_v = max(finite)[0]
        what = (
            f"Undecided at the top: {', '.join(names[i] for i in top_ties)} reach "
            f"{best_v:.3g} req/s per GPU"
        )
        reason = (
            "The best goodput is at the top of the searched range (or tied), so the ranking "
            "there is not measured: raise --rate-hi to separate them."
        )
    elif finite:
        best_v, best_i = max(finite)
        row = g.iloc[best_i]
        what = f"Best goodput per GPU: {names[best_i]} ({row['architecture']}), {best_v:.3g} req/s per GPU"
        others = [
            f"{names[i]}: {per_gpu[i]:.3g} ({_num(g.iloc[i]['ratio_to_best'], '{:.2f}')}x the best, "
            f"{g.iloc[i]['status']})"
            for i in range(len(g))
            if i != best_i
        ]
        reason = (
            "Goodput is the highest request rate that meets the SLO; per GPU so that "
            "deployments of different sizes compare. "
            + ("Others: " + "; ".join(others) + "." if others else "")
        )
    else:
        what = "No scenario met the SLO at any rate searched"
        reason = "Every goodput search ended below its range: widen --rate-lo/--rate-hi or relax the SLO."
    notes = [
        (f"{names[i]} status", g.iloc[i]["status"] == "found", _status_text(g.iloc[i]["status"]))
        for i in range(len(g))
    ]
    page.verdict(what, reason, notes)

    page.heading("SLO model")
    seen: set[str] = set()
    for name, sub in res.table.groupby(SCENARIO_FILE, sort=False):
        slo = _slo_of(sub)
        if slo is None:
            continue
        text = describe_slo(slo)
        if text in seen:
            continue
        seen.add(text)
        page.paragraph(("" if len(seen) == 1 else f"{name}: ") + text)
    if not seen:
        page.paragraph("The sweep table carries no SLO columns.")

    page.heading("Goodput per GPU")
    colours = [
        "#1f77b4"
        if str(a).startswith("disagg")
        else "#2ca02c"
        if "chunked" in str(a)
        else "#d62728"
        for a in g["architecture"]
    ]
    status_note = {"above_range": "+ (above range)", "below_range": " (below range)"}
    page.figure(
        _goodput_bars(
            [f"{n} ({a})" for n, a in zip(names, g["architecture"], strict=True)],
            [v if math.isfinite(v) else 0.0 for v in per_gpu],
            colours,
            [status_note.get(str(s), "") for s in g["status"]],
            "goodput per GPU by scenario",
        ),
        "Goodput per GPU of every scenario (blue: disaggregated, green: chunked, red: vLLM).",
    )
    pareto = _compare_pareto(res.table, SCENARIO_FILE)
    if pareto is not None:
        page.figure(
            pareto,
            "Served requests per GPU against ITL p99 at the sweep points that met "
            "the SLO attainment target; dashed: the Pareto front over all scenarios.",
        )
    else:
        page.slot("No sweep point met the SLO attainment target: no Pareto front to draw.")
    for caption, png in plot_files:
        page.figure(png, caption)

    page.heading("Ranked by goodput per GPU")
    order = sorted(range(len(g)), key=lambda i: -(per_gpu[i] if math.isfinite(per_gpu[i]) else -1))
    cols = [c for c in g.columns if c != SCENARIO_FILE]
    page.table(
        ["#", "scenario file", *cols],
        [
            [k + 1, str(g.iloc[i][SCENARIO_FILE]), *(_cell(g.iloc[i][c]) for c in cols)]
            for k, i in enumerate(order)
        ],
        left=2,
    )
    conf_cols = [c for c in g.columns if c.startswith("confirm")]
    conf = (
        [{"scenario": names[i], **{c: g.iloc[i][c] for c in conf_cols}} for i in range(len(g))]
        if conf_cols
        else None
    )
    _confirmation(page, conf)
    return page.render(_footer())


def _status_text(status: str) -> str:
    return {
        "found": "goodput found inside the searched range",
        "above_range": "meets the SLO even at the top of the range: goodput is at least that",
        "below_range": "misses the SLO even at the bottom of the range",
    }.get(status, status)
