"""The run summary's keys, declared once.

:class:`Summary` is what :func:`disaggsim.metrics.summary.summarize` returns. Each field
is one ``summary.json`` key, or a *family* of keys (a ``dict`` field: one key per pool or
per reason, ``util_decode`` from ``util["decode"]``), and carries its row of the summary
table: unit, definition, when it is present, its ``disaggsim run`` label and format, and
whether ``disaggsim regress`` tracks it. Everything that lists summary keys is produced
from these rows (:data:`SUMMARY_KEYS`):

- ``summary.json`` and the sweep table's columns: :meth:`Summary.to_dict` (field order);
- the key table in ``docs/metrics.md``: :func:`markdown_table` (a test checks the doc);
- the ``disaggsim run`` table: :func:`cli_rows`;
- ``disaggsim regress``'s metric list: :func:`regress_metrics`.

To add a summary key, add a field here with its row (:func:`metric`), compute it in
``summarize``, and regenerate the doc (``python scripts/metrics_doc.py``).

A ``Summary`` is also a read-only mapping from the flat keys to their values, so
``summary["ttft_p99_s"]`` works as well as ``summary.ttft_p99_s``; a key that is not in
the table (or not present in this run) is a ``KeyError`` that says so.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Literal

Value = float | int | str | bool
Family = Literal["", "pool", "reason"]

_ROW = "summary_row"


@dataclass(frozen=True, slots=True)
class RowSpec:
    """What a field declares about its key(s); the name and value type come from the
    field itself (see :class:`SummaryKey`)."""

    unit: str  # "s", "requests", "share" (0..1), "bytes", "" (a label), ...
    definition: str  # markdown, for docs/metrics.md
    label: str = ""  # `disaggsim run` row label ("" = not shown); "{}" = family member
    fmt: str = ""  # its format; "ms" in it shows an `_s` value in milliseconds
    regress: int = 0  # position in `disaggsim regress`'s metric list (1 = first); 0 = not tracked
    present: str = ""  # optional keys: when the run has them ("" = always present)
    family: Family = ""  # dict fields: one key `<name>_<member>` per pool or reason
    deterministic: bool = True  # False: differs between identical runs (left out of sweeps)


def metric(
    unit: str,
    definition: str,
    *,
    label: str = "",
    fmt: str = "",
    regress: int = 0,
    present: str = "",
    family: Family = "",
    deterministic: bool = True,
) -> Any:
    """A :class:`Summary` field with its table row. ``present`` makes the key optional
    (default ``None`` = absent from ``summary.json``); ``family`` makes it a dict field."""
    row = RowSpec(unit, definition, label, fmt, regress, present, family, deterministic)
    meta = {_ROW: row}
    if family:
        return field(default_factory=dict, metadata=meta)
    if present or not deterministic:
        return field(default=None, metadata=meta)
    return field(metadata=meta)


_FAILURES = "with worker failures"
_RETRIED = "when a measured request completed after a retry"
_DISAGG = "disaggregated runs"
_CACHE = "with a `cache:` section (prefix caching)"
_CHUNKED = "colocated `chunked` runs"
_PCT = "over measured completed requests"
_STOPPED = "when the run stopped early: `simulate(..., stop_on_certain_miss=True)`"


@dataclass(frozen=True, slots=True, kw_only=True)
class Summary(Mapping[str, Value]):
    """One run's summary statistics (definitions: docs/metrics.md, generated from here)."""

    scenario: str = metric("", "the scenario's `name`")
    architecture: str = metric(
        "", "`disaggregated`, `colocated-vllm` or `colocated-chunked` (colocated: its scheduler)"
    )
    seed: int = metric("", "the seed that ran")
    num_gpus: int = metric("GPUs", "Σ over pools of `num_workers × tp`", label="GPUs", fmt="{:d}")
    num_requests: int = metric(
        "requests", "measured requests", label="requests (measured)", fmt="{:d}"
    )
    num_completed: int = metric(
        "requests", "measured requests by outcome", label="completed", fmt="{:d}", regress=8
    )
    num_rejected: int = metric(
        "requests", "measured requests by outcome", label="rejected", fmt="{:d}"
    )
    num_abandoned: int = metric(
        "requests", "measured requests by outcome", label="abandoned", fmt="{:d}"
    )
    num_unfinished: int = metric(
        "requests", "measured requests by outcome", label="unfinished at horizon", fmt="{:d}"
    )
    num_retried: int = metric(
        "requests", "requests retried at least once", label="retried (failures)", fmt="{:d}"
    )
    num_retries: int = metric("retries", "retries in all")
    num_preempted: int = metric(
        "requests", "requests preempted at least once", label="preempted", fmt="{:d}"
    )
    num_preemptions: int = metric("preemptions", "preemptions in all")
    num_reason: dict[str, int] = metric(
        "requests",
        "rejected and abandoned requests per reason (`exceeds_context`, "
        "`exceeds_kv_capacity`, `queue_full`, `client_timeout`; only reasons that occurred)",
        family="reason",
    )
    retried_ttft_p99_s: float | None = metric(
        "s", "the same statistics over retried requests only", present=_RETRIED
    )
    retried_max_itl_p50_s: float | None = metric(
        "s", "the same statistics over retried requests only", present=_RETRIED
    )
    retried_e2e_p50_s: float | None = metric(
        "s", "the same statistics over retried requests only", present=_RETRIED
    )
    ttft_p99_near_failures_s: float | None = metric(
        "s",
        "TTFT p99 of requests arriving from 5 s before to 30 s after a worker failure",
        present=_FAILURES,
    )
    router_queue_max: int = metric("requests", "most requests held at the router")
    orphaned_kv_bytes_max: int = metric(
        "bytes", "most prefilled KV bytes waiting for a decode worker (held on prefill GPUs)"
    )
    num_resent_transfers: int = metric("transfers", "KV transfers sent again after a link outage")
    num_worker_failures: int = metric("failures", "worker failures that happened")
    num_chunked_steps: int | None = metric(
        "iterations",
        "iterations of the chunked workers, over the whole run (warm-up included), that "
        "carried prompt chunks, or that ran decode tokens only because the decode batch "
        "alone filled `pool.max_batch_tokens` while a prompt waited",
        present=_CHUNKED,
    )
    num_chunk_budget_full_steps: int | None = metric(
        "iterations",
        "those of `num_chunked_steps` whose decode tokens and prompt chunks reached "
        "`pool.max_batch_tokens` with prompt tokens still left to prefill after them: the "
        "iterations a larger budget would have run otherwise. 0: every iteration was the "
        "same under any larger `max_batch_tokens` (which still sizes the activation "
        "reserve, so the KV capacity can differ)",
        present=_CHUNKED,
    )
    ttft_p50_s: float = metric("s", _PCT, label="TTFT p50", fmt="{:.3f} s", regress=1)
    ttft_p90_s: float = metric("s", _PCT, label="TTFT p90", fmt="{:.3f} s", regress=2)
    ttft_p99_s: float = metric("s", _PCT, label="TTFT p99", fmt="{:.3f} s", regress=3)
    ttft_mean_s: float = metric("s", _PCT)
    tpot_p50_s: float = metric("s", f"{_PCT} with ≥ 2 tokens", label="TPOT p50", fmt="{:.1f} ms")
    tpot_p90_s: float = metric("s", f"{_PCT} with ≥ 2 tokens")
    tpot_p99_s: float = metric("s", f"{_PCT} with ≥ 2 tokens", label="TPOT p99", fmt="{:.1f} ms")
    tpot_mean_s: float = metric("s", f"{_PCT} with ≥ 2 tokens")
    e2e_p50_s: float = metric("s", _PCT, label="end-to-end p50", fmt="{:.2f} s")
    e2e_p90_s: float = metric("s", _PCT)
    e2e_p99_s: float = metric("s", _PCT, label="end-to-end p99", fmt="{:.2f} s")
    e2e_mean_s: float = metric("s", _PCT)
    itl_p50_s: float = metric(
        "s", "the inter-token gap distribution above", label="ITL p50", fmt="{:.1f} ms", regress=4
    )
    itl_p90_s: float = metric(
        "s", "the inter-token gap distribution above", label="ITL p90", fmt="{:.1f} ms", regress=5
    )
    itl_p99_s: float = metric(
        "s", "the inter-token gap distribution above", label="ITL p99", fmt="{:.1f} ms", regress=6
    )
    itl_max_s: float = metric("s", "the inter-token gap distribution above")
    slo_ttft_s: float = metric("s", "the scenario's SLO: `slo.ttft_ms`, `slo.itl_ms`")
    slo_itl_s: float = metric("s", "the scenario's SLO: `slo.ttft_ms`, `slo.itl_ms`")
    slo_itl_statistic: str = metric("", "`slo.itl_statistic` (`tpot` or `max_gap`)")
    slo_percentile: float = metric("%", "`slo.percentile`")
    ttft_at_slo_percentile_s: float = metric("s", "fleet TTFT and ITL at `slo.percentile`")
    itl_at_slo_percentile_s: float = metric("s", "fleet TTFT and ITL at `slo.percentile`")
    slo_attainment: float = metric(
        "share",
        "share of measured requests that completed with `ttft_s ≤ slo.ttft_ms` **and** ITL "
        "statistic `≤ slo.itl_ms`; the statistic is `tpot_s` (`slo.itl_statistic: tpot`, "
        "default) or `max_itl_s` (`max_gap`). Rejected and unfinished requests count as misses. "
        "NaN when the run stopped early (`stopped_early_at_s`)",
        label="SLO attainment",
        fmt="{:.1%}",
        regress=7,
    )
    slo_attainment_target: float = metric("share", "`slo.attainment_target`")
    slo_attained: bool = metric("", "`slo_attainment ≥ slo.attainment_target`")
    stable: bool = metric(
        "",
        "the steady-state test (below): no significant, material upward trend over the "
        "measurement window in the number of requests waiting (for a first token or for a "
        "decode batch) or in TTFT",
    )
    stability_p_value: float = metric(
        "", "the test's Bonferroni-adjusted p-value (unstable when below 0.01)"
    )
    waiting_trend_per_s: float = metric(
        "requests/s",
        "fitted slope of the number waiting (for a first token or for a decode batch) over "
        "the window (NaN when the arrival rate varies by design)",
    )
    ttft_trend_s_per_s: float = metric(
        "s/s", "fitted slope of the mean TTFT over the window, per second of arrival time"
    )
    meets_slo: bool = metric(
        "",
        "`slo_attained` **and** `stable`: the one rule by which a run's rate meets the SLO "
        "(docs/metrics.md, steady-state goodput)",
    )
    stopped_early_at_s: float | None = metric(
        "s",
        "the simulated instant the run was ended because it certainly misses the SLO: "
        "enough measured requests had provably missed that `slo_attainment` is below "
        "`slo.attainment_target` whatever the others do (docs/metrics.md, stopping a run "
        "that certainly misses). Then `slo_attainment` is NaN, `slo_attained`, `stable` "
        "and `meets_slo` are false (not tested: the run misses), `stability_p_value` and "
        "the trends NaN, and every other key covers the run up to this instant",
        label="stopped early at",
        fmt="{:.1f} s",
        present=_STOPPED,
    )
    slo_attainment_upper_bound: float | None = metric(
        "share",
        "the most `slo_attainment` the full run could have reached: 1 − (measured "
        "requests that had provably missed by `stopped_early_at_s`) / `num_requests`; "
        "below `slo_attainment_target`",
        present=_STOPPED,
    )
    num_arrived: int | None = metric(
        "requests",
        "measured requests that arrived before `stopped_early_at_s`: those the stopped run "
        "simulated (`num_requests` counts every measured request, arrived or not)",
        present=_STOPPED,
    )
    output_tokens_per_s: float = metric(
        "tokens/s",
        "output tokens of the completed measured requests divided by the span from the "
        "first measured arrival to the last measured finish",
        label="output tokens",
        fmt="{:.0f} tok/s",
    )
    requests_per_s: float = metric(
        "requests/s",
        "completed measured requests divided by the same span",
        label="throughput",
        fmt="{:.2f} req/s",
    )
    offered_requests_per_s: float = metric("requests/s", "measured arrivals per second")
    kv_transfer_p50_s: float | None = metric(
        "s",
        "KV handoff durations (start to end; with layer-wise overlap the handoff starts "
        "with the prefill)",
        present=_DISAGG,
    )
    kv_transfer_p99_s: float | None = metric(
        "s",
        "KV handoff durations (start to end; with layer-wise overlap the handoff starts "
        "with the prefill)",
        label="KV handoff p99",
        fmt="{:.1f} ms",
        present=_DISAGG,
    )
    kv_exposed_p50_s: float | None = metric(
        "s",
        "the part of a handoff after the KV was complete: "
        "`transfer_end − max(prefill_end, transfer_start)`",
        present=_DISAGG,
    )
    kv_exposed_p99_s: float | None = metric(
        "s",
        "the part of a handoff after the KV was complete: "
        "`transfer_end − max(prefill_end, transfer_start)`",
        label="KV handoff exposed p99",
        fmt="{:.1f} ms",
        present=_DISAGG,
    )
    kv_transfer_bytes_mean: float | None = metric(
        "bytes", "mean bytes per handoff", present=_DISAGG
    )
    link_util_max: float | None = metric(
        "share",
        "topology fabric: the busiest link's mean utilisation over the run (null for `kind: link`)",
        present=_DISAGG,
    )
    prompt_tokens_total: int | None = metric(
        "tokens",
        "Σ prompt tokens of the measured requests (docs/prefix-caching.md)",
        label="prompt tokens",
        fmt="{:,d}",
        present=_CACHE,
    )
    prefix_hit_tokens: int | None = metric(
        "tokens",
        "Σ over the measured requests of the prompt tokens their last admission found "
        "cached (HBM + DRAM + remote; at most prompt − 1 each)",
        present=_CACHE,
    )
    prefix_hit_share: float | None = metric(
        "share",
        "`prefix_hit_tokens / prompt_tokens_total`",
        label="prefix hit share",
        fmt="{:.1%}",
        present=_CACHE,
    )
    prefix_hit_share_hbm: float | None = metric(
        "share", "hit tokens found in the worker's HBM / `prompt_tokens_total`", present=_CACHE
    )
    prefix_hit_share_dram: float | None = metric(
        "share",
        "hit tokens promoted from the node's host DRAM / `prompt_tokens_total`",
        present=_CACHE,
    )
    prefix_hit_share_remote: float | None = metric(
        "share",
        "hit tokens promoted from the remote store / `prompt_tokens_total` (the three tier "
        "shares add up to `prefix_hit_share`)",
        present=_CACHE,
    )
    gpu_hours: float = metric(
        "GPU-hours", "Σ over workers of GPUs × time holding them (docs/autoscaling.md)"
    )
    scale_events: int = metric("events", "autoscaler decisions that changed a pool's size")
    mean_workers: dict[str, float] = metric(
        "workers",
        "time-averaged workers holding GPUs (starting, serving, draining) per pool",
        family="pool",
    )
    busy_share: dict[str, float] = metric(
        "share",
        "share of the pool's GPU-holding worker-seconds spent inside a forward pass (or a "
        "KV swap copy): Σ busy s / Σ held s over its workers. Says how often a worker has "
        "work, not how full its batch is (see `mean_batch_<pool>`, `mean_kv_util_<pool>`)",
        label="{} pool busy share",
        fmt="{:.1%}",
        family="pool",
    )
    mean_batch: dict[str, float] = metric(
        "sequences",
        "sequences per forward pass, weighted by pass duration (busy time only): decode and "
        "colocated token steps count their running sequences (a chunked iteration: the "
        "decoding ones), prefill iterations their prompts",
        label="{} pool mean batch",
        fmt="{:.1f}",
        family="pool",
    )
    mean_kv_util: dict[str, float] = metric(
        "share",
        "KV blocks in use over KV capacity, time-averaged over the pool's GPU-holding "
        "worker-seconds: ∫ Σ_w kv_used_w dt / ∫ Σ_held w capacity_w dt, from the per-worker "
        "samples (`timeseries.parquet`, held constant between samples)",
        label="{} pool mean KV use",
        fmt="{:.1%}",
        family="pool",
    )
    util: dict[str, float] = metric(
        "share",
        "alias of `busy_share_<pool>` (the name before it; same value)",
        family="pool",
    )
    sim_end_s: float = metric("s", "simulated time at the end")
    wall_s: float | None = metric(
        "s",
        "wall-clock seconds of the `simulate` call that produced the result: loading the "
        "scenario, the workload, the simulation, the invariant checks, the frames and this "
        "summary (writing the result folder is not in it; left out of sweep tables: it "
        "differs between identical runs)",
        label="wall time",
        fmt="{:.2f} s",
        deterministic=False,
    )

    # ------------------------------------------------------------------ flat view

    def to_dict(self) -> dict[str, Value]:
        """The flat ``summary.json`` mapping, in table order (absent keys left out)."""
        out: dict[str, Value] = {}
        for name in _FIELD_NAMES:
            value = getattr(self, name)
            if isinstance(value, dict):
                for member, v in value.items():
                    out[f"{name}_{member}"] = v
            elif value is not None:
                out[name] = value
        return out

    @classmethod
    def from_dict(cls, flat: Mapping[str, Any]) -> Summary:
        """The inverse of :meth:`to_dict` (JSON ``null`` reads back as NaN). A key not in
        the table is a ``ValueError`` naming it."""
        kwargs: dict[str, Any] = {}
        for key, value in flat.items():
            name, member = _split_key(key)
            if name is None:
                raise ValueError(f"summary key {key!r} is not in the summary table")
            if value is None:
                value = math.nan
            if member is None:
                kwargs[name] = value
            else:
                kwargs.setdefault(name, {})[member] = value
        missing = [k.key for k in SUMMARY_KEYS if k.required and k.key not in kwargs]
        if missing:
            raise ValueError(f"summary is missing required keys: {', '.join(missing)}")
        return cls(**kwargs)

    def deterministic(self) -> Summary:
        """The same summary without the keys that differ between identical runs."""
        absent: dict[str, Any] = {k.key: None for k in SUMMARY_KEYS if not k.deterministic}
        return replace(self, **absent)

    def __getitem__(self, key: str) -> Value:
        name, member = _split_key(key)
        if name is None:
            raise KeyError(f"{key!r} is not a summary key (docs/metrics.md lists them)")
        value = getattr(self, name)
        if member is not None:
            value = value.get(member)
        if value is None:
            raise KeyError(f"{key!r} is not present in this run's summary")
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


_FIELD_NAMES = tuple(f.name for f in fields(Summary))


@dataclass(frozen=True, slots=True)
class SummaryKey:
    """One row of the summary table. ``key`` is the ``summary.json`` key, or for a family
    its pattern (``util_<pool>``)."""

    key: str
    kind: type  # float, int, str or bool (a family: the type of each member)
    spec: RowSpec

    @property
    def required(self) -> bool:
        return not (self.spec.present or self.spec.family or not self.spec.deterministic)

    @property
    def deterministic(self) -> bool:
        return self.spec.deterministic

    def keys(self, members: tuple[str, ...] = ()) -> tuple[str, ...]:
        """The concrete keys: the key itself, or one per family member."""
        if not self.spec.family:
            return (self.key,)
        return tuple(f"{self.name}_{m}" for m in members)

    @property
    def name(self) -> str:
        """The :class:`Summary` field."""
        return self.key.split("<", 1)[0].rstrip("_") if self.spec.family else self.key

    def format(self, value: Value | None, member: str = "") -> tuple[str, str]:
        """(label, formatted value) for the ``disaggsim run`` table; NaN and None as
        ``-``; a ``ms`` format shows seconds in milliseconds."""
        label = self.spec.label.format(member) if self.spec.family else self.spec.label
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return label, "-"
        if "ms" in self.spec.fmt and self.key.endswith("_s") and isinstance(value, float):
            value = value * 1e3
        try:
            return label, self.spec.fmt.format(value)
        except (ValueError, TypeError):
            return label, str(value)


def _scalar_kind(tp: Any) -> type:
    """float/int/str/bool from a field annotation (``X | None``, ``dict[str, X]``)."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is dict:
        return _scalar_kind(args[1])
    if args:  # X | None
        (inner,) = [a for a in args if a is not type(None)]
        return _scalar_kind(inner)
    assert tp in (float, int, str, bool), tp
    return typing.cast(type, tp)


def _build_table() -> tuple[SummaryKey, ...]:
    hints = typing.get_type_hints(Summary)
    rows = []
    for f in fields(Summary):
        spec: RowSpec = f.metadata[_ROW]
        key = f"{f.name}_<{spec.family}>" if spec.family else f.name
        rows.append(SummaryKey(key, _scalar_kind(hints[f.name]), spec))
        optional = f.default is None and f.default_factory is MISSING
        assert optional == bool(spec.present or not spec.deterministic), f.name
    return tuple(rows)


SUMMARY_KEYS: tuple[SummaryKey, ...] = _build_table()
_BY_NAME = {k.name: k for k in SUMMARY_KEYS}
_FAMILIES = tuple(k.name for k in SUMMARY_KEYS if k.spec.family)


def _split_key(key: str) -> tuple[str | None, str | None]:
    """(field name, family member or None) of a flat key; (None, None) if unknown."""
    if key in _BY_NAME and not _BY_NAME[key].spec.family:
        return key, None
    for name in _FAMILIES:
        if key.startswith(name + "_") and len(key) > len(name) + 1:
            return name, key[len(name) + 1 :]
    return None, None


def summary_key(key: str) -> SummaryKey:
    """The table row of a flat key (``util_decode`` → the ``util_<pool>`` row)."""
    name, _ = _split_key(key)
    if name is None:
        raise KeyError(f"{key!r} is not a summary key")
    return _BY_NAME[name]


def regress_metrics() -> tuple[str, ...]:
    """The keys ``disaggsim regress`` compares, in their reference-file order."""
    tracked = sorted((k.spec.regress, k.key) for k in SUMMARY_KEYS if k.spec.regress)
    return tuple(key for _, key in tracked)


def nondeterministic_keys() -> tuple[str, ...]:
    return tuple(k.key for k in SUMMARY_KEYS if not k.deterministic)


def cli_rows(summary: Summary) -> list[tuple[str, str]]:
    """(label, value) rows of the ``disaggsim run`` table for the keys this run has."""
    out = []
    for k in SUMMARY_KEYS:
        if not k.spec.label:
            continue
        value = getattr(summary, k.name)
        if k.spec.family:
            out += [k.format(v, member) for member, v in value.items()]
        elif value is not None:
            out.append(k.format(value))
    return out


def markdown_table() -> str:
    """The key table of ``docs/metrics.md``: consecutive keys with the same definition,
    unit and presence share a row."""
    groups: list[list[SummaryKey]] = []
    for k in SUMMARY_KEYS:
        last = groups[-1][-1] if groups else None
        if last is not None and (last.spec.definition, last.spec.unit, last.spec.present) == (
            k.spec.definition,
            k.spec.unit,
            k.spec.present,
        ):
            groups[-1].append(k)
        else:
            groups.append([k])
    lines = ["| key | unit | definition |", "|---|---|---|"]
    for g in groups:
        keys = ", ".join(f"`{k.key}`" for k in g)
        spec = g[0].spec
        text = spec.definition + (f" (only {spec.present})" if spec.present else "")
        tracked = [f"`{k.key}`" for k in g if k.spec.regress]
        if tracked:
            text += f"; `disaggsim regress` compares {', '.join(tracked)}"
        lines.append(f"| {keys} | {spec.unit or '–'} | {text} |")
    return "\n".join(lines) + "\n"
