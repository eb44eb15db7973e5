"""Preset arrivals drawn from the trace's own gap distribution (``arrival: empirical``,
the default): a unit mean, counts that spread like the trace's at short windows, and a
low-rate run whose arrivals still cover the run (a gamma renewal with the Azure code
trace's CV of 13 puts them in a few bursts)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pydantic import TypeAdapter, ValidationError

from disaggsim.workload import WorkloadConfig, generate_requests
from disaggsim.workload.arrivals import CyclicSchedule, unit_gap_table, unit_renewal_times
from disaggsim.workload.generate import kept_buckets_note
from disaggsim.workload.presets import load_preset
from disaggsim.workload.traces import spread_in_buckets, timestamp_bucket_s

ADAPTER = TypeAdapter(WorkloadConfig)


def _preset(**fields: object) -> WorkloadConfig:
    return ADAPTER.validate_python({"kind": "preset", "preset": "azure-code-2023", **fields})


def _dispersion(arrival_s: np.ndarray, span_s: float, window_s: float) -> float:
    counts, _ = np.histogram(arrival_s, bins=np.arange(0.0, span_s + 1e-9, window_s))
    return float(counts.var() / counts.mean())


def test_empirical_gaps_have_unit_mean_and_the_table_median() -> None:
    table = load_preset("azure-code-2023").interarrival_gap_quantiles
    u = unit_renewal_times(
        np.random.default_rng(5), process="empirical", cv=13.0, limit=400_000.0,
        max_count=np.inf, gap_quantiles=table,
    )  # fmt: skip
    gaps = np.diff(u)
    # 400k draws of a CV ~13 distribution: the mean is known to about 2%
    assert len(u) == pytest.approx(400_000, rel=0.05)
    qs, scaled = unit_gap_table(table)
    assert np.median(gaps) == pytest.approx(float(np.interp(0.5, qs, scaled)), rel=0.03)
    # the table's median gap is about a sixth of the mean (the trace: 0.164)
    assert 0.1 < np.median(gaps) < 0.25


@pytest.mark.parametrize(
    "table",
    [((0.1, 0.0), (1.0, 1.0)), ((0.0, 0.0), (0.5, 2.0), (1.0, 1.0)), ((0.0, 0.0), (1.0, 0.0))],
)
def test_gap_table_rejects_what_is_no_distribution(table: tuple) -> None:
    with pytest.raises(ValueError, match="gap quantiles"):
        unit_gap_table(table)


@pytest.mark.parametrize("name", ["azure-code-2023", "azure-conv-2023"])
def test_short_window_counts_spread_like_the_trace(name: str, shared_data) -> None:
    source = {"azure-code-2023": "code", "azure-conv-2023": "conv"}[name]
    df = pd.read_csv(shared_data / "traces" / f"AzureLLMInferenceTrace_{source}.csv")
    t = np.sort(pd.to_datetime(df["TIMESTAMP"]).astype("int64").to_numpy() / 1e9)
    t = t - t[0]
    span_s = float(t[-1])
    cfg = ADAPTER.validate_python({"kind": "preset", "preset": name})
    drawn = generate_requests(cfg, duration_s=span_s, seed=3).arrival_s
    for window_s in (0.1, 1.0):
        trace = _dispersion(t, span_s, window_s)
        model = _dispersion(drawn, span_s, window_s)
        assert trace / 1.5 < model < trace * 1.5, (window_s, trace, model)


def test_low_rate_arrivals_cover_the_run() -> None:
    def covered(cfg: WorkloadConfig) -> float:
        t = generate_requests(cfg, duration_s=300.0, seed=7).arrival_s
        return len(np.unique((t // 10.0).astype(int))) / 30

    assert covered(_preset(rate_per_s=0.5)) > 0.8
    # the gamma renewal at the trace's CV (the default before): a handful of bursts
    assert covered(_preset(rate_per_s=0.5, arrival="gamma")) < 0.3


def test_burstiness_cv_alone_asks_gamma_and_empirical_takes_none() -> None:
    alone = generate_requests(_preset(burstiness_cv=2.0), duration_s=200.0, seed=1)
    gamma = generate_requests(_preset(burstiness_cv=2.0, arrival="gamma"), duration_s=200.0, seed=1)
    assert np.array_equal(alone.arrival_s, gamma.arrival_s)
    with pytest.raises(ValidationError, match="burstiness_cv applies only to arrival: gamma"):
        _preset(arrival="empirical", burstiness_cv=2.0)
    with pytest.raises(ValidationError):
        ADAPTER.validate_python(
            {"kind": "synthetic", "rate_per_s": 1, "arrival": "empirical",
             "prompt_tokens": {"dist": "fixed", "value": 10},
             "output_tokens": {"dist": "fixed", "value": 10}}
        )  # fmt: skip


def test_bucketed_timestamps_are_found_and_spread() -> None:
    stamps = np.repeat(np.arange(0.0, 300.0, 3.0), 7)  # 7 arrivals stamped per 3 s bucket
    assert timestamp_bucket_s(stamps) == pytest.approx(3.0)
    fine = np.cumsum(np.random.default_rng(0).exponential(0.3, size=1000))
    assert timestamp_bucket_s(fine) is None
    spread, _ = spread_in_buckets(stamps, 3.0, np.random.default_rng(0))
    assert np.all(np.diff(spread) >= 0)
    assert np.all((spread >= stamps.min()) & (spread < stamps.max() + 3.0))
    # every bucket keeps its arrivals
    assert np.array_equal(np.bincount((spread // 3.0).astype(int)), np.full(100, 7))


def _mooncake(shared_data, **fields: object) -> WorkloadConfig:
    return ADAPTER.validate_python(
        {
            "kind": "trace",
            "path": str(shared_data / "traces" / "mooncake_conversation_trace.jsonl"),
            **fields,
        }
    )


def test_a_bucketed_trace_replays_spread_within_its_buckets(shared_data) -> None:
    kept = generate_requests(_mooncake(shared_data, window_s=600.0), duration_s=600.0, seed=4)
    spread = generate_requests(
        _mooncake(shared_data, window_s=600.0, bucketed_timestamps="spread"),
        duration_s=600.0,
        seed=4,
    )
    # kept: about ten arrivals per 3 s stamp, at one instant
    assert len(np.unique(kept.arrival_s)) < 0.2 * len(kept)
    # spread: the same requests, each within 3 s after its stamp, at distinct instants
    assert len(spread) == len(kept)
    assert len(np.unique(spread.arrival_s)) == len(spread)
    assert np.all(np.diff(spread.arrival_s) >= 0)
    assert sorted(spread.prompt_tokens.tolist()) == sorted(kept.prompt_tokens.tolist())
    # each request keeps its own lengths and prefix chain (the rows move together)
    key_kept = {
        (p, o, tuple(kept.prefix_chains.chain(i)))
        for i, (p, o) in enumerate(zip(kept.prompt_tokens, kept.output_tokens, strict=True))
    }
    key_spread = {
        (p, o, tuple(spread.prefix_chains.chain(i)))
        for i, (p, o) in enumerate(zip(spread.prompt_tokens, spread.output_tokens, strict=True))
    }
    assert key_kept == key_spread
    counts, _ = np.histogram(spread.arrival_s, bins=np.arange(0.0, 601.0, 3.0))
    counts_kept, _ = np.histogram(kept.arrival_s, bins=np.arange(0.0, 601.0, 3.0))
    assert abs(int(counts.sum()) - int(counts_kept.sum())) <= 1  # the last bucket may leave
    # same seed, same arrivals; another seed, others
    again = generate_requests(
        _mooncake(shared_data, window_s=600.0, bucketed_timestamps="spread"),
        duration_s=600.0,
        seed=4,
    )
    assert np.array_equal(again.arrival_s, spread.arrival_s)


def test_a_trace_without_buckets_replays_as_it_is_when_asked_to_spread(shared_data) -> None:
    cfg = {
        "kind": "trace",
        "path": str(shared_data / "traces" / "AzureLLMInferenceTrace_code.csv"),
        "window_s": 300.0,
    }
    kept = generate_requests(ADAPTER.validate_python(cfg), duration_s=300.0, seed=1)
    spread = generate_requests(
        ADAPTER.validate_python({**cfg, "bucketed_timestamps": "spread"}), duration_s=300.0, seed=1
    )
    assert np.array_equal(kept.arrival_s, spread.arrival_s)


def test_a_kept_bucketed_replay_gets_one_note(shared_data, tmp_path) -> None:
    """keep on a bucketed trace: one line naming the file, its bucket, requests per
    stamp and the field that spreads them; nothing with spread or for a trace without
    buckets. A relative path resolves against base_dir as the replay's does."""
    note = kept_buckets_note(_mooncake(shared_data))
    assert note is not None and "\n" not in note
    assert note.startswith("note: mooncake_conversation_trace.jsonl has 3 s timestamp buckets")
    assert "bucketed_timestamps: keep" in note
    assert "workload.bucketed_timestamps=spread" in note
    assert kept_buckets_note(_mooncake(shared_data, bucketed_timestamps="spread")) is None
    azure = ADAPTER.validate_python({"kind": "trace", "path": "AzureLLMInferenceTrace_code.csv"})
    assert kept_buckets_note(azure, base_dir=shared_data / "traces") is None


# -- arrival: modulated -------------------------------------------------------------------


def test_a_cyclic_schedule_inverts_its_integral_and_keeps_the_mean_rate() -> None:
    """Profile (1, 0, 3, 0) over 60 s pieces, mean 1: 2/s on average over a cycle, none
    in the zero pieces, the phase shifting where the profile starts."""
    s = CyclicSchedule(2.0, (1.0, 0.0, 3.0, 0.0), 60.0, phase_s=70.0)
    assert s.cumulative(240.0) == pytest.approx(480.0)  # one whole cycle
    assert s.cumulative(50.0) == 0.0  # 70 s in: the rest of the zero piece
    assert s.cumulative(110.0) == pytest.approx(360.0)  # then a whole piece at 3 x 2/s
    u = np.array([1.0, 100.0, 359.99, 480.0, 10_000.0])
    t = s.invert(u)
    assert [s.cumulative(float(x)) for x in t] == pytest.approx(u.tolist())
    # no arrival lands in a zero piece (profile position (t + 70) mod 240 in [60, 120) or
    # [180, 240))
    pos = (t + 70.0) % 240.0
    assert not np.any(((pos > 60.0) & (pos < 120.0)) | (pos > 180.0))


def test_modulated_arrivals_follow_the_trace_s_minute_scale_rate() -> None:
    """azure-conv-2023 over an hour: counts per minute spread like the trace's (index
    of dispersion 16.1, docs/workloads.md) with arrival: modulated, about Poisson with the
    default empirical gaps; the mean rate and the request lengths stay those of the
    preset (the phase has its own stream, appended after the others)."""

    def draw(arrival: str | None, seed: int):
        fields = {} if arrival is None else {"arrival": arrival}
        cfg = ADAPTER.validate_python({"kind": "preset", "preset": "azure-conv-2023", **fields})
        return generate_requests(cfg, duration_s=3600.0, seed=seed)

    plain, modulated = draw(None, 7), draw("modulated", 7)
    assert _dispersion(plain.arrival_s, 3600.0, 60.0) < 2.0
    assert _dispersion(modulated.arrival_s, 3600.0, 60.0) > 8.0
    assert len(modulated) / 3600.0 == pytest.approx(5.53, rel=0.1)
    n = min(len(plain), len(modulated))
    assert np.array_equal(plain.prompt_tokens[:n], modulated.prompt_tokens[:n])
    again, other = draw("modulated", 7), draw("modulated", 8)
    assert np.array_equal(again.arrival_s, modulated.arrival_s)
    assert not np.array_equal(other.arrival_s[:100], modulated.arrival_s[:100])


def test_modulated_refuses_a_burstiness_cv() -> None:
    with pytest.raises(ValidationError, match="burstiness_cv applies only to arrival: gamma"):
        _preset(arrival="modulated", burstiness_cv=2.0)


def test_every_preset_has_a_rate_profile_of_mean_one() -> None:
    for name in ("azure-conv-2023", "azure-code-2023", "mooncake-conversation"):
        preset = load_preset(name)
        assert preset.rate_profile_piece_s == 60.0
        assert len(preset.rate_profile) == int(preset.duration_s // 60.0)
        assert np.mean(preset.rate_profile) == pytest.approx(1.0, abs=1e-6)


def test_arrival_check_rows(shared_data) -> None:
    """--arrival-check: per preset the trace, its gaps shuffled and four processes; the
    Azure conversation preset's minute-scale spread comes back with modulated only."""
    from disaggsim.workload.measure_presets import arrival_check

    rows = arrival_check(shared_data / "traces", seeds=2)
    assert len(rows) == 2 + 4 * 6
    by_label = {tuple(c.strip() for c in r.split("|")[1:3]): r.split("|")[3:-1] for r in rows}
    minute = {k: float(v[3].split("±")[0]) for k, v in by_label.items() if "azure-conv" in k[0]}
    assert minute[("`azure-conv-2023`", "trace")] == pytest.approx(16.13, abs=0.01)
    assert minute[("`azure-conv-2023`", "modulated")] > 8.0
    assert minute[("`azure-conv-2023`", "empirical")] < 2.0
    assert minute[("`azure-conv-2023`", "trace, gaps shuffled")] < 2.0


@pytest.mark.parametrize(
    "arrival, stationary",
    [(None, True), ("empirical", True), ("gamma", True), ("poisson", True), ("modulated", False)],
)
def test_modulated_presets_are_not_stationary_for_the_trend_test(arrival, stationary):
    """``modulated`` follows the trace's per-minute rate, so the number waiting follows
    the offered load and only the TTFT trend may judge a run (docs/metrics.md); the
    renewal arrivals keep one rate and both signals."""
    from disaggsim.metrics.steady import stationary_arrivals

    raw = {"kind": "preset", "preset": "azure-conv-2023", "rate_per_s": 2.0}
    if arrival is not None:
        raw["arrival"] = arrival
    assert stationary_arrivals(TypeAdapter(WorkloadConfig).validate_python(raw)) is stationary
