"""The scenario's ``workload:`` section: pydantic models validated at the config edge.

Four kinds, told apart by ``kind`` (``synthetic``, ``preset``, ``trace``, ``sessions``),
each of which accepts ``rate_per_s`` so ``--set workload.rate_per_s=4`` works whatever
the kind.
Length distributions are a second union told apart by ``dist`` (``fixed``, ``uniform``,
``lognormal``, ``empirical``); rate shapes of synthetic workloads a third, told apart by
``kind`` (``diurnal``, ``step``). The models only describe; ``generate.py`` draws.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, model_validator

from disaggsim.config.bounds import (
    LOGNORMAL_TAIL_SIGMAS,
    MAX_BURSTINESS_CV,
    MAX_REQUESTS,
    MAX_TOKENS,
    MAX_TOOL_CALLS,
    ConfigModel,
)

PresetName = Literal[
    "azure-conv-2023", "azure-code-2023", "mooncake-conversation", "mooncake-synthetic"
]
"""Shipped presets; ``presets.PRESET_NAMES`` is the same tuple (checked by a test)."""

ArrivalProcess = Literal["poisson", "gamma"]
PresetArrival = Literal["poisson", "gamma", "empirical", "modulated"]
"""A preset's arrivals: ``empirical`` draws gaps from the source trace's measured gap
distribution (the default), ``modulated`` the gaps left under the trace's per-minute rate
profile with the rate following that profile from a random minute, ``gamma`` gaps with
the measured (or given) CV, ``poisson``."""

PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
TokenCount = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
RequestCount = Annotated[int, Field(ge=1, le=MAX_REQUESTS)]
Burstiness = Annotated[float, Field(gt=0, le=MAX_BURSTINESS_CV, allow_inf_nan=False)]


# ---------------------------------------------------------------- length distributions


class FixedLengths(ConfigModel):
    """Every request has exactly ``value`` tokens."""

    dist: Literal["fixed"]
    value: TokenCount

    @property
    def smallest(self) -> int:
        """The smallest length a draw can take."""
        return self.value

    @property
    def largest(self) -> int | None:
        """The largest length a draw can take (None: unbounded)."""
        return self.value


class UniformLengths(ConfigModel):
    """Integers uniform on ``[low, high]``, both ends included."""

    dist: Literal["uniform"]
    low: TokenCount
    high: TokenCount

    @property
    def smallest(self) -> int:
        return self.low

    @property
    def largest(self) -> int | None:
        return self.high

    @model_validator(mode="after")
    def _low_le_high(self) -> UniformLengths:
        if self.low > self.high:
            raise ValueError(f"uniform needs low <= high, got low={self.low} > high={self.high}")
        return self


class LognormalLengths(ConfigModel):
    """``median * exp(sigma * Z)``, Z standard normal, rounded to the nearest integer and
    clipped to ``[min, max]`` (``max`` omitted: no upper clip)."""

    dist: Literal["lognormal"]
    median: PositiveFloat
    sigma: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    min: TokenCount = 1
    max: TokenCount | None = None

    @property
    def smallest(self) -> int:
        return self.min

    @property
    def largest(self) -> int | None:
        return self.max

    @model_validator(mode="after")
    def _min_le_max(self) -> LognormalLengths:
        if self.max is not None and self.min > self.max:
            raise ValueError(f"lognormal needs min <= max, got min={self.min} > max={self.max}")
        if self.max is None:
            # Without a clip, the tail must stay within MAX_TOKENS: median · exp(6 sigma)
            # (a draw beyond it has probability ~1e-9).
            log_tail = math.log(self.median) + LOGNORMAL_TAIL_SIGMAS * self.sigma
            if log_tail > math.log(MAX_TOKENS):
                raise ValueError(
                    f"lognormal with median {self.median:g} and sigma {self.sigma:g} draws "
                    f"lengths beyond {MAX_TOKENS:,} tokens; give max (at most {MAX_TOKENS:,})"
                )
        return self


class EmpiricalLengths(ConfigModel):
    """Piecewise-linear inverse CDF through ``[q, value]`` points: q strictly increasing
    from 0 to 1, values non-decreasing and >= 1. A draw is ``interp(U, q, value)``
    rounded to the nearest integer."""

    dist: Literal["empirical"]
    quantiles: tuple[tuple[float, float], ...] = Field(min_length=2, max_length=10_000)

    @property
    def smallest(self) -> int:
        return max(int(round(self.quantiles[0][1])), 1)

    @property
    def largest(self) -> int | None:
        return max(int(round(self.quantiles[-1][1])), 1)

    @model_validator(mode="after")
    def _check_quantiles(self) -> EmpiricalLengths:
        qs = [q for q, _ in self.quantiles]
        values = [v for _, v in self.quantiles]
        if qs[0] != 0.0 or qs[-1] != 1.0:
            raise ValueError(
                f"empirical quantiles must start at q=0 and end at q=1, got q={qs[0]}..{qs[-1]}"
            )
        for i in range(1, len(qs)):
            if not qs[i] > qs[i - 1]:
                raise ValueError(
                    f"empirical quantiles: q must be strictly increasing, "
                    f"got {qs[i - 1]} then {qs[i]} at index {i}"
                )
            if values[i] < values[i - 1]:
                raise ValueError(
                    f"empirical quantiles: values must be non-decreasing, "
                    f"got {values[i - 1]} then {values[i]} at index {i}"
                )
        if values[0] < 1:
            raise ValueError(f"empirical quantiles: values must be >= 1 token, got {values[0]}")
        if values[-1] > MAX_TOKENS:
            raise ValueError(
                f"empirical quantiles: values must be <= {MAX_TOKENS:,} tokens, got {values[-1]:g}"
            )
        return self


LengthDistribution = Annotated[
    FixedLengths | UniformLengths | LognormalLengths | EmpiricalLengths,
    Field(discriminator="dist"),
]


def _max_tokens_shorthand(v: Any) -> Any:
    """A whole number ``n`` is ``{dist: fixed, value: n}``; booleans and other scalars are
    errors (YAML ``true`` is not a token count)."""
    if isinstance(v, bool) or not isinstance(v, (int, dict, BaseModel)):
        raise ValueError(
            "expected a whole number of tokens >= 1 or a length distribution "
            f"({{dist: fixed | uniform | lognormal | empirical, ...}}), got {v!r}"
        )
    if isinstance(v, int):
        if v < 1:
            raise ValueError(f"must be a whole number of tokens >= 1, got {v}")
        return {"dist": "fixed", "value": v}
    return v


MaxTokens = Annotated[
    LengthDistribution,
    BeforeValidator(_max_tokens_shorthand),
    Field(
        description="the client's max_tokens: a constant, or a length distribution drawn "
        "per request (docs/workloads.md); default: the model's context length minus the prompt"
    ),
]
"""A request's ``max_tokens`` (the most tokens the client allows the reply): a constant or a
length distribution. The router and the KV admission plan on it; the realised reply is
``min(output_tokens, max_tokens)`` (generation stops at its end or at the cap)."""


# ---------------------------------------------------------------- rate shapes


class DiurnalRate(ConfigModel):
    """``rate(t) = mean_per_s * (1 + amplitude * cos(2 pi (t - phase_s) / period_s))``:
    a sinusoidal day whose peak, ``mean_per_s * (1 + amplitude)``, falls at ``phase_s``
    (and every ``period_s`` after it). Arrivals invert its integral exactly."""

    kind: Literal["diurnal"]
    mean_per_s: PositiveFloat
    amplitude: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
    period_s: PositiveFloat
    phase_s: Annotated[float, Field(allow_inf_nan=False)] = 0.0


class StepRate(ConfigModel):
    """``base_per_s``, then ``burst_per_s`` during ``[start_s, start_s + duration_s)``,
    then ``base_per_s`` again: the rate_schedule ``[[0, base], [start_s, burst],
    [start_s + duration_s, base]]``."""

    kind: Literal["step"]
    base_per_s: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    burst_per_s: PositiveFloat
    start_s: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    duration_s: PositiveFloat

    def schedule_points(self) -> tuple[tuple[float, float], ...]:
        """The equivalent ``rate_schedule`` (points with zero-length pieces dropped)."""
        end_s = self.start_s + self.duration_s
        if self.start_s == 0.0:
            return ((0.0, self.burst_per_s), (end_s, self.base_per_s))
        return ((0.0, self.base_per_s), (self.start_s, self.burst_per_s), (end_s, self.base_per_s))


RateShape = Annotated[DiurnalRate | StepRate, Field(discriminator="kind")]


# ---------------------------------------------------------------- durations (sessions)

NonNegativeSeconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class FixedDuration(ConfigModel):
    dist: Literal["fixed"]
    value_s: NonNegativeSeconds


class ExponentialDuration(ConfigModel):
    dist: Literal["exponential"]
    mean_s: PositiveFloat


class UniformDuration(ConfigModel):
    dist: Literal["uniform"]
    low_s: NonNegativeSeconds
    high_s: NonNegativeSeconds

    @model_validator(mode="after")
    def _low_le_high(self) -> UniformDuration:
        if self.low_s > self.high_s:
            raise ValueError(
                f"uniform needs low_s <= high_s, got low_s={self.low_s} > high_s={self.high_s}"
            )
        return self


class LognormalDuration(ConfigModel):
    """``median_s * exp(sigma * Z)``, Z standard normal."""

    dist: Literal["lognormal"]
    median_s: PositiveFloat
    sigma: Annotated[float, Field(ge=0, allow_inf_nan=False)]


DurationDistribution = Annotated[
    FixedDuration | ExponentialDuration | UniformDuration | LognormalDuration,
    Field(discriminator="dist"),
]


def min_length(dist: FixedLengths | UniformLengths | LognormalLengths | EmpiricalLengths) -> int:
    """The smallest length a distribution can draw (after rounding and clipping)."""
    match dist:
        case FixedLengths():
            return dist.value
        case UniformLengths():
            return dist.low
        case LognormalLengths():
            return dist.min
        case EmpiricalLengths():
            return max(1, round(dist.quantiles[0][1]))
    raise TypeError(f"unknown length distribution {dist!r}")


class MixShift(ConfigModel):
    """From ``at_s`` on, lengths come from new distributions: a request arriving at or
    after ``at_s`` draws its prompt (output) length from ``prompt_tokens``
    (``output_tokens``); an omitted one keeps the workload's distribution."""

    at_s: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    prompt_tokens: LengthDistribution | None = None
    output_tokens: LengthDistribution | None = None

    @model_validator(mode="after")
    def _check(self) -> MixShift:
        if self.prompt_tokens is None and self.output_tokens is None:
            raise ValueError("mix_shift needs prompt_tokens or output_tokens (or both)")
        return self


# ---------------------------------------------------------------- workload kinds


def _check_cv_needs_gamma(arrival: str | None, burstiness_cv: float | None) -> None:
    if arrival in ("poisson", "empirical", "modulated") and burstiness_cv is not None:
        raise ValueError(
            "burstiness_cv applies only to arrival: gamma (Poisson has CV 1; empirical "
            "and modulated draw the trace's own gaps); drop burstiness_cv or set "
            "arrival: gamma"
        )


class SyntheticWorkload(ConfigModel):
    """Arrivals from a Poisson or gamma renewal process at ``rate_per_s`` (or following
    the piecewise-constant ``rate_schedule``, or a ``rate_shape``), lengths from two
    distributions (which may change once, at ``mix_shift.at_s``)."""

    kind: Literal["synthetic"]
    rate_per_s: PositiveFloat | None = None
    rate_schedule: tuple[tuple[float, float], ...] | None = Field(
        default=None, min_length=1, max_length=100_000
    )
    """``[[t_s, rate_per_s], ...]``: the rate from t_s until the next point (the last
    one lasts forever); the first t_s must be 0; rates >= 0."""
    rate_shape: RateShape | None = None
    """A parametric rate over time: ``diurnal`` or ``step``."""
    arrival: ArrivalProcess = "poisson"
    burstiness_cv: Burstiness | None = None
    """Coefficient of variation of gamma inter-arrival times (default 1 = Poisson)."""
    prompt_tokens: LengthDistribution
    output_tokens: LengthDistribution
    """Every generated token, the first one included."""
    max_tokens: MaxTokens | None = None
    """The client's cap on the reply (default: context length − prompt, as vLLM)."""
    num_requests: RequestCount | None = None
    """Cap: at most this many requests (the first ones)."""
    mix_shift: MixShift | None = None
    """A traffic-mix shift: new length distributions from ``at_s`` on."""

    @model_validator(mode="after")
    def _check(self) -> SyntheticWorkload:
        _check_one_rate(self, "synthetic workload")
        _check_cv_needs_gamma(self.arrival, self.burstiness_cv)
        if self.rate_schedule is not None:
            _check_schedule(self.rate_schedule)
        return self


def _check_one_rate(model: BaseModel, label: str) -> None:
    given = [
        name
        for name in ("rate_per_s", "rate_schedule", "rate_shape")
        if getattr(model, name) is not None
    ]
    if len(given) != 1:
        raise ValueError(
            f"{label} needs exactly one of rate_per_s, rate_schedule or "
            f"rate_shape, got {' and '.join(given) if given else 'none'}"
        )


def _check_schedule(schedule: tuple[tuple[float, float], ...]) -> None:
    if schedule[0][0] != 0.0:
        raise ValueError(f"rate_schedule must start at t_s=0, got {schedule[0][0]}")
    for i, (t_s, rate) in enumerate(schedule):
        if not (rate >= 0 and rate < float("inf")):
            raise ValueError(f"rate_schedule[{i}]: rate_per_s must be finite and >= 0, got {rate}")
        if i and not t_s > schedule[i - 1][0]:
            raise ValueError(
                f"rate_schedule[{i}]: t_s must be strictly increasing, "
                f"got {schedule[i - 1][0]} then {t_s}"
            )
    if not any(rate > 0 for _, rate in schedule):
        raise ValueError("rate_schedule needs at least one rate_per_s > 0")


class PresetWorkload(ConfigModel):
    """A shipped preset: lengths drawn from quantiles measured on a real trace, arrivals
    a renewal process whose gaps are drawn from the trace's measured gap distribution,
    at the measured mean rate, unless overridden."""

    kind: Literal["preset"]
    preset: PresetName
    rate_per_s: PositiveFloat | None = None
    """Mean arrival rate; default: the rate measured on the source trace."""
    arrival: PresetArrival | None = None
    """Default ``empirical`` (the trace's gap distribution), or ``gamma`` when
    ``burstiness_cv`` is given; ``gamma`` alone takes the measured CV; ``modulated``
    adds the trace's per-minute rate profile (docs/workloads.md)."""
    burstiness_cv: Burstiness | None = None
    max_prompt_tokens: TokenCount | None = None
    max_output_tokens: TokenCount | None = None
    max_tokens: MaxTokens | None = None
    """The client's cap on the reply (default: context length − prompt, as vLLM)."""
    num_requests: RequestCount | None = None

    @model_validator(mode="after")
    def _check(self) -> PresetWorkload:
        _check_cv_needs_gamma(self.arrival, self.burstiness_cv)
        return self


class TraceWorkload(ConfigModel):
    """Replay of a trace file (Azure LLM inference CSV or Mooncake JSONL): the window
    ``[start_s, start_s + window_s)`` of trace time (offsets from the first arrival),
    shifted to start at 0 and compressed by ``rate_scale``."""

    kind: Literal["trace"]
    path: str = Field(min_length=1)
    """Relative paths resolve against the scenario file's folder."""
    format: Literal["azure", "mooncake", "auto"] = "auto"
    start_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    window_s: PositiveFloat | None = None
    rate_scale: PositiveFloat | None = None
    """Time compression: trace arrival times are divided by it (default 1)."""
    rate_per_s: PositiveFloat | None = None
    """Alternative to rate_scale: compress time so the window's mean rate is this."""
    max_prompt_tokens: TokenCount | None = None
    max_output_tokens: TokenCount | None = None
    max_tokens: MaxTokens | None = None
    """The client's cap on the reply; default: the trace's own max_tokens column where it
    has one (Azure ``MaxTokens``, Mooncake ``max_tokens``), else context length − prompt."""
    num_requests: RequestCount | None = None
    bucketed_timestamps: Literal["keep", "spread"] = "keep"
    """A trace whose timestamps are bucketed (most arrivals share one, the steps between
    them one bucket: the Mooncake conversation trace's 3 s): ``keep`` replays them as
    they are (each bucket's arrivals at one instant), ``spread`` places each arrival
    uniformly at random within its bucket (stream ``trace_spread``). A trace without
    buckets replays as it is either way."""
    hash_block_tokens: TokenCount = 512
    """Tokens per prefix-hash block (Mooncake ``hash_ids``: 512); a row must carry
    ``ceil(input_length / hash_block_tokens)`` hashes."""

    @model_validator(mode="after")
    def _check(self) -> TraceWorkload:
        if self.rate_scale is not None and self.rate_per_s is not None:
            raise ValueError("trace workload takes rate_scale or rate_per_s, not both")
        return self


class AgentLoop(ConfigModel):
    """Tool calls inside each user turn: after the user's message the model calls a tool
    (a short output), the tool's result is appended, and the model is asked again, until
    it answers. The number of tool calls per turn is geometric on {0, 1, ...} with mean
    ``tool_calls_mean`` (another call with probability ``m / (1 + m)``), at most
    ``max_tool_calls``."""

    tool_calls_mean: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    max_tool_calls: Annotated[int, Field(ge=0, le=MAX_TOOL_CALLS)] | None = None
    tool_call_tokens: LengthDistribution
    """Output tokens of a request that calls a tool."""
    tool_result_tokens: LengthDistribution
    """Tokens a tool's result appends to the context."""
    tool_latency_s: DurationDistribution
    """From a tool-calling request's arrival to the next request's."""

    @model_validator(mode="after")
    def _bounded_calls(self) -> AgentLoop:
        if self.max_tool_calls is None and self.tool_calls_mean > MAX_TOOL_CALLS:
            raise ValueError(
                f"tool_calls_mean: {self.tool_calls_mean:g} tool calls per turn on average "
                f"without max_tool_calls; give max_tool_calls (at most {MAX_TOOL_CALLS:,})"
            )
        return self


class SessionWorkload(ConfigModel):
    """Multi-turn sessions with growing context (``sessions.py``): sessions start at
    ``rate_per_s`` (or ``rate_schedule`` / ``rate_shape``); each has ``turns`` user
    turns; a turn appends a user message and, after any agent tool loop, an answer; the
    next turn arrives ``think_time_s`` after the previous request. Every prompt starts
    with one of ``num_system_prompts`` shared system prompts. Requests carry prefix
    chains of ``block_tokens``-token blocks."""

    kind: Literal["sessions"]
    rate_per_s: PositiveFloat | None = None
    """Session starts per second."""
    rate_schedule: tuple[tuple[float, float], ...] | None = Field(
        default=None, min_length=1, max_length=100_000
    )
    rate_shape: RateShape | None = None
    arrival: ArrivalProcess = "poisson"
    burstiness_cv: Burstiness | None = None
    turns: LengthDistribution
    """User turns per session (>= 1)."""
    system_prompt_tokens: Annotated[int, Field(ge=0, le=MAX_TOKENS)] = 0
    num_system_prompts: Annotated[int, Field(ge=1, le=MAX_REQUESTS)] = 1
    user_tokens: LengthDistribution
    output_tokens: LengthDistribution
    """Tokens of each answer (every generated token, the first included)."""
    think_time_s: DurationDistribution
    """From a turn's last request's arrival to the next user turn's arrival."""
    agent: AgentLoop | None = None
    max_context_tokens: TokenCount | None = None
    """A session ends before its first request whose prompt would be longer."""
    block_tokens: TokenCount = 512
    """Tokens per prefix-hash block of the generated chains."""
    num_requests: RequestCount | None = None
    """Cap: at most this many requests (the first arrivals)."""
    max_tokens: MaxTokens | None = None
    """The clients' cap on every request's reply (answers and tool calls); an answer cut
    at its cap enters the next turns' context at its cut length."""

    @model_validator(mode="after")
    def _check(self) -> SessionWorkload:
        _check_one_rate(self, "sessions workload")
        _check_cv_needs_gamma(self.arrival, self.burstiness_cv)
        if self.rate_schedule is not None:
            _check_schedule(self.rate_schedule)
        if self.max_context_tokens is not None:
            first = self.system_prompt_tokens + min_length(self.user_tokens)
            if first > self.max_context_tokens:
                raise ValueError(
                    f"max_context_tokens {self.max_context_tokens} leaves no room for a "
                    f"first request: system_prompt_tokens {self.system_prompt_tokens} + "
                    f"the shortest user_tokens {min_length(self.user_tokens)} = {first}"
                )
        return self


WorkloadConfig = Annotated[
    SyntheticWorkload | PresetWorkload | TraceWorkload | SessionWorkload,
    Field(discriminator="kind"),
]
"""The ``workload:`` field of a scenario."""
