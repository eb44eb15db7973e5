"""Turn a ``workload:`` config into the :class:`Requests` the engine replays.

Randomness: ``np.random.SeedSequence([seed, replication]).spawn(len(STREAMS))`` gives one
independent generator per entry of :data:`STREAMS`, in that order. New streams are
appended at the end, so existing results stay identical (``spawn(k)``'s i-th child does
not depend on ``k``). Trace replay draws nothing, unless it spreads bucketed
timestamps (``bucketed_timestamps: spread``: stream ``trace_spread``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from disaggsim.config.bounds import MAX_REQUESTS
from disaggsim.errors import UserError
from disaggsim.inputs import regular_file
from disaggsim.workload.arrivals import (
    CyclicSchedule,
    DiurnalSchedule,
    GapQuantiles,
    RateSchedule,
    Schedule,
    arrival_times,
)
from disaggsim.workload.chains import canonical_chains
from disaggsim.workload.config import (
    DiurnalRate,
    EmpiricalLengths,
    LengthDistribution,
    MixShift,
    PresetWorkload,
    SessionWorkload,
    StepRate,
    SyntheticWorkload,
    TraceWorkload,
)
from disaggsim.workload.lengths import sample_lengths
from disaggsim.workload.presets import Preset, load_preset
from disaggsim.workload.requests import Requests
from disaggsim.workload.sessions import generate_sessions
from disaggsim.workload.traces import read_trace, spread_in_buckets, timestamp_bucket_s

STREAMS: tuple[str, ...] = (
    "arrivals",
    "prompt_tokens",
    "output_tokens",
    "spare",
    "mix_prompt_tokens",
    "mix_output_tokens",
    "session_starts",
    "session_turns",
    "session_system_prompt",
    "session_user_tokens",
    "session_output_tokens",
    "session_think_s",
    "session_tool_calls",
    "session_tool_call_tokens",
    "session_tool_result_tokens",
    "session_tool_latency_s",
    "max_tokens",
    "trace_spread",
    "rate_phase",
)
"""Named random streams, in spawn order. ``spare`` is reserved (unused); the ``mix_``
streams draw the lengths of requests after a ``mix_shift``; the ``session_`` streams
draw session workloads (``sessions.py``); ``max_tokens`` draws the clients' ``max_tokens``
when given as a distribution; ``trace_spread`` places a trace's bucketed arrivals within
their buckets (``bucketed_timestamps: spread``); ``rate_phase`` draws where in its rate
profile a preset's ``arrival: modulated`` starts."""


def streams(seed: int, replication: int = 0) -> dict[str, np.random.Generator]:
    """One independent generator per name in :data:`STREAMS`."""
    children = np.random.SeedSequence([seed, replication]).spawn(len(STREAMS))
    return {
        name: np.random.default_rng(child) for name, child in zip(STREAMS, children, strict=True)
    }


def generate_requests(
    cfg: SyntheticWorkload | PresetWorkload | TraceWorkload | SessionWorkload,
    *,
    duration_s: float,
    seed: int,
    replication: int = 0,
    base_dir: Path | None = None,
) -> Requests:
    """Requests arriving in ``[0, duration_s)``, sorted by arrival.

    Parameters
    ----------
    cfg : the scenario's ``workload`` section.
    duration_s : length of the arrival window in seconds; may be ``inf`` for synthetic
        and preset workloads with ``num_requests``, and for traces (the whole trace).
    seed, replication : select the random streams (see :data:`STREAMS`).
    base_dir : folder that relative trace paths resolve against (the scenario's folder;
        default: the working directory).
    """
    if not duration_s > 0:
        raise UserError(f"duration_s must be > 0, got {duration_s}")
    requests = _generate(cfg, duration_s, seed, replication, base_dir)
    if len(requests) > MAX_REQUESTS:
        raise UserError(
            f"workload: {len(requests):,} requests, more than the {MAX_REQUESTS:,} allowed in "
            "one run (shorten the window, or set num_requests; docs/safety.md)"
        )
    # sessions draw their caps themselves (a cut answer feeds the next turns' context)
    max_tokens = None if isinstance(cfg, SessionWorkload) else cfg.max_tokens
    if max_tokens is not None:
        rng = streams(seed, replication)["max_tokens"]
        requests = requests.with_max_tokens(sample_lengths(max_tokens, len(requests), rng))
    return requests


def _generate(
    cfg: SyntheticWorkload | PresetWorkload | TraceWorkload | SessionWorkload,
    duration_s: float,
    seed: int,
    replication: int,
    base_dir: Path | None,
) -> Requests:
    match cfg:
        case SyntheticWorkload():
            return _synthetic(
                streams(seed, replication),
                schedule=synthetic_schedule(cfg),
                process=cfg.arrival,
                cv=cfg.burstiness_cv if cfg.burstiness_cv is not None else 1.0,
                prompt=cfg.prompt_tokens,
                output=cfg.output_tokens,
                duration_s=duration_s,
                num_requests=cfg.num_requests,
                mix_shift=cfg.mix_shift,
            )
        case PresetWorkload():
            preset = load_preset(cfg.preset)
            # Default: the trace's own gap distribution; a burstiness_cv alone asks gamma.
            arrival = cfg.arrival or ("gamma" if cfg.burstiness_cv is not None else "empirical")
            cv = cfg.burstiness_cv if cfg.burstiness_cv is not None else preset.interarrival_cv
            rngs = streams(seed, replication)
            schedule, process, gap_quantiles = preset_arrivals(
                preset, arrival, cfg.rate_per_s or preset.mean_rate_per_s, rngs["rate_phase"]
            )
            requests = _synthetic(
                rngs,
                schedule=schedule,
                process=process,
                cv=cv,
                prompt=EmpiricalLengths(dist="empirical", quantiles=preset.prompt_tokens_quantiles),
                output=EmpiricalLengths(dist="empirical", quantiles=preset.output_tokens_quantiles),
                duration_s=duration_s,
                num_requests=cfg.num_requests,
                gap_quantiles=gap_quantiles,
            )
            return _clip(requests, cfg.max_prompt_tokens, cfg.max_output_tokens)
        case TraceWorkload():
            return _replay(
                cfg,
                duration_s=duration_s,
                base_dir=base_dir,
                rng=streams(seed, replication)["trace_spread"],
            )
        case SessionWorkload():
            schedule = synthetic_schedule(cfg)
            if math.isinf(schedule.cumulative(duration_s)) and cfg.num_requests is None:
                raise UserError("workload: an endless duration needs workload.num_requests")
            return generate_sessions(
                cfg, streams(seed, replication), schedule=schedule, duration_s=duration_s
            )
    raise TypeError(f"unknown workload config {cfg!r}")


def preset_arrivals(
    preset: Preset, process: str, rate_per_s: float, phase_rng: np.random.Generator
) -> tuple[Schedule, str, GapQuantiles]:
    """The rate schedule, the renewal process and its gap table of a preset's ``arrival``.
    ``modulated``: the trace's per-minute rate profile from a point of it drawn from
    ``phase_rng`` (nothing is drawn otherwise), and the gaps measured under that profile
    (``measure_presets.py``), drawn as ``empirical`` draws the trace's own gaps."""
    if process != "modulated":
        return RateSchedule.constant(rate_per_s), process, preset.interarrival_gap_quantiles
    cycle_s = len(preset.rate_profile) * preset.rate_profile_piece_s
    schedule = CyclicSchedule(
        rate_per_s,
        preset.rate_profile,
        preset.rate_profile_piece_s,
        phase_s=float(phase_rng.uniform(0.0, cycle_s)),
    )
    return schedule, "empirical", preset.modulated_gap_quantiles


def synthetic_schedule(cfg: SyntheticWorkload | SessionWorkload) -> Schedule:
    """The arrival-rate schedule of a synthetic workload, or of a sessions workload's
    session starts (exactly one of ``rate_per_s``, ``rate_schedule``, ``rate_shape``
    is set)."""
    match cfg.rate_shape:
        case DiurnalRate() as d:
            return DiurnalSchedule(
                mean_per_s=d.mean_per_s,
                amplitude=d.amplitude,
                period_s=d.period_s,
                phase_s=d.phase_s,
            )
        case StepRate() as step:
            return RateSchedule.from_points(step.schedule_points())
    if cfg.rate_schedule is not None:
        return RateSchedule.from_points(cfg.rate_schedule)
    if cfg.rate_per_s is None:
        raise UserError("workload: give one of rate_per_s, rate_schedule or rate_shape")
    return RateSchedule.constant(cfg.rate_per_s)


def _synthetic(
    rngs: dict[str, np.random.Generator],
    *,
    schedule: Schedule,
    process: str,
    cv: float,
    prompt: LengthDistribution,
    output: LengthDistribution,
    duration_s: float,
    num_requests: int | None,
    mix_shift: MixShift | None = None,
    gap_quantiles: GapQuantiles | None = None,
) -> Requests:
    max_count = math.inf if num_requests is None else num_requests
    if math.isinf(schedule.cumulative(duration_s)) and math.isinf(max_count):
        raise UserError("workload: an endless duration needs workload.num_requests")
    arrival_s = arrival_times(
        rngs["arrivals"],
        schedule=schedule,
        process=process,
        cv=cv,
        duration_s=duration_s,
        max_count=max_count,
        gap_quantiles=gap_quantiles,
    )
    n = len(arrival_s)
    prompt_tokens = sample_lengths(prompt, n, rngs["prompt_tokens"])
    output_tokens = sample_lengths(output, n, rngs["output_tokens"])
    if mix_shift is not None:
        # Every request drew from the old mix above, so requests before at_s are the
        # same as without the shift; the later ones redraw from the new streams.
        first = int(np.searchsorted(arrival_s, mix_shift.at_s, side="left"))
        k = n - first
        if mix_shift.prompt_tokens is not None:
            prompt_tokens[first:] = sample_lengths(
                mix_shift.prompt_tokens, k, rngs["mix_prompt_tokens"]
            )
        if mix_shift.output_tokens is not None:
            output_tokens[first:] = sample_lengths(
                mix_shift.output_tokens, k, rngs["mix_output_tokens"]
            )
    return Requests(arrival_s=arrival_s, prompt_tokens=prompt_tokens, output_tokens=output_tokens)


def _clip(requests: Requests, max_prompt: int | None, max_output: int | None) -> Requests:
    prompt = requests.prompt_tokens
    chains = requests.prefix_chains
    if max_prompt is not None and int(prompt.max(initial=0)) > max_prompt:
        prompt = np.minimum(prompt, max_prompt)
        if chains is not None:
            # A prompt cut mid-block ends in a shorter block: re-key it (chains.py).
            chains = canonical_chains(chains, prompt, chains.block_tokens)
    return replace(
        requests,
        prompt_tokens=prompt,
        output_tokens=requests.output_tokens
        if max_output is None
        else np.minimum(requests.output_tokens, max_output),
        prefix_chains=chains,
    )


def _trace_path(cfg: TraceWorkload, base_dir: Path | None) -> Path:
    """The trace file ``workload.path`` names (relative to the scenario's folder); a path
    that is no file is refused naming the field."""
    path = Path(cfg.path).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    try:
        regular_file(path, _NotATrace, "trace file")
    except _NotATrace as e:
        what = str(e).removeprefix(f"{path}: ")
        if what.endswith(" not found"):
            what = "no such file"
        where = "" if Path(cfg.path).is_absolute() else " (relative to the scenario's folder)"
        raise UserError(f"workload.path: {str(path)!r}: {what}{where}") from None
    return path


class _NotATrace(Exception):
    """``workload.path`` names no regular file (reworded to name the field)."""


def kept_buckets_note(cfg: TraceWorkload, base_dir: Path | None = None) -> str | None:
    """One line for a user replaying a bucketed trace with ``bucketed_timestamps: keep``
    (each bucket's requests arrive at one instant, which sets the TTFT of a small prefill
    pool), else None: nothing to say for another trace or with ``spread``. Reads the
    trace; for the CLI to print beside a run's summary."""
    if cfg.bucketed_timestamps != "keep":
        return None
    path = _trace_path(cfg, base_dir)
    t = read_trace(path, cfg.format, cfg.hash_block_tokens).arrival_s
    bucket_s = timestamp_bucket_s(t)
    if bucket_s is None:
        return None
    per_stamp = len(t) / len(np.unique(t))
    return (
        f"note: {path.name} has {bucket_s:g} s timestamp buckets ({per_stamp:.1f} requests "
        "each) and bucketed_timestamps: keep delivers each bucket at one instant; "
        "workload.bucketed_timestamps=spread places each arrival within its bucket "
        "(docs/workloads.md)"
    )


def _replay(
    cfg: TraceWorkload,
    *,
    duration_s: float,
    base_dir: Path | None,
    rng: np.random.Generator | None = None,
) -> Requests:
    """The trace window ``[start_s, start_s + L)`` with
    ``L = min(window_s, duration_s * rate_scale)``, shifted to 0 and divided by
    ``rate_scale``. With ``rate_per_s``, ``rate_scale = rate_per_s / native rate``, the
    native rate being the number of trace arrivals in ``[start_s, start_s + window_s)``
    (to the last arrival when ``window_s`` is unset) over that window's length."""
    path = _trace_path(cfg, base_dir)
    trace = read_trace(path, cfg.format, cfg.hash_block_tokens)
    t = trace.arrival_s
    order = None  # trace rows in arrival order after spreading (None: as read)
    if cfg.bucketed_timestamps == "spread":
        bucket_s = timestamp_bucket_s(t)
        if bucket_s is not None:
            if rng is None:
                raise ValueError("spreading bucketed timestamps needs a generator")
            t, order = spread_in_buckets(t, bucket_s, rng)
    last_s = float(t[-1])
    if cfg.start_s > last_s:
        raise UserError(
            f"workload.start_s={cfg.start_s} is past the last arrival of {path} "
            f"({last_s:.3f} s after the first)"
        )
    window_s = cfg.window_s if cfg.window_s is not None else math.inf

    if cfg.rate_per_s is not None:
        if cfg.window_s is None:
            span_s = last_s - cfg.start_s
            n_native = int(np.count_nonzero(t >= cfg.start_s))
        else:
            span_s = cfg.window_s
            n_native = int(np.count_nonzero((t >= cfg.start_s) & (t < cfg.start_s + span_s)))
        if span_s <= 0 or n_native == 0:
            raise UserError(
                f"workload.rate_per_s: the window of {path} from start_s={cfg.start_s} "
                "has no measurable rate (fewer than two arrivals)"
            )
        rate_scale = cfg.rate_per_s / (n_native / span_s)
    else:
        rate_scale = cfg.rate_scale if cfg.rate_scale is not None else 1.0

    length_s = min(window_s, duration_s * rate_scale)
    keep = (t >= cfg.start_s) & (t < cfg.start_s + length_s)
    index = np.flatnonzero(keep)
    if cfg.num_requests is not None:
        index = index[: cfg.num_requests]
    arrival_s = (t[index] - cfg.start_s) / rate_scale
    if order is not None:
        index = order[index]  # the rows of the spread arrivals
    chains = trace.prefix_chains
    requests = Requests(
        arrival_s=arrival_s,
        prompt_tokens=trace.prompt_tokens[index],
        output_tokens=trace.output_tokens[index],
        prefix_chains=None if chains is None else chains.take(index),
        max_tokens=None if trace.max_tokens is None else trace.max_tokens[index],
    )
    return _clip(requests, cfg.max_prompt_tokens, cfg.max_output_tokens)
