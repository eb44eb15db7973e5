"""The planning question asked in one command: ``disaggsim plan --model M --gpu G --gpus N
--isl 8000 --osl 300 --ttft-ms 2000 --itl-ms 100`` builds the scenario this module
describes, without writing YAML by hand (docs/planning.md, "One command").

:func:`build_question` turns the flags (a :class:`Question`) into a scenario mapping; a
bad value is one :class:`UserError` line naming the flag and what is allowed, raised
before anything is simulated or written. :func:`question_yaml` renders it with comments
(the command, the SLO model in words, what the pool stands for), as the plan writes it.

The scenario's pool only states the budget: ``budget // (tp x dp)`` chunked workers of
the smallest worker that fits the model with room for KV
(:func:`disaggsim.plan.analytic.smallest_unit`); the planner replaces it with
each candidate. Fabric ``auto`` is NVLink when the budget fits one node (the catalog's
``gpus_per_node``), else InfiniBand (disaggsim/validity.py).
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from disaggsim.config.bounds import MAX_REQUESTS, MAX_WORKERS_PER_POOL
from disaggsim.config.loader import closest_hint
from disaggsim.errors import UserError

__all__ = [
    "FABRICS",
    "LENGTH_SPEC",
    "Question",
    "build_question",
    "parse_lengths",
    "question_yaml",
]

FABRICS = ("auto", "nvlink", "infiniband", "roce", "pcie")
ITL_STATISTICS = ("tpot", "max_gap")
DTYPES = ("bf16", "fp16", "fp8")  # KV cache
# weights: the scenario's weight_dtype values (released: the checkpoint's own precision)
WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "fp8-block", "mxfp4", "nvfp4", "released")
LENGTH_SPEC = "N, uniform:LO:HI or lognormal:MEDIAN:SIGMA[:MAX] (tokens >= 1, sigma >= 0)"
DEFAULT_RATE_PER_S = 1.0  # a starting point for `disaggsim run`; the planner searches the rate
QUESTION_WINDOW_S = 300.0  # the question's sim window (question.yaml; the plan samples from it)
QUESTION_WARMUP_S = 30.0
# the scenario fields the question's flags fill: a scenario bound broken there (a length
# over 1,048,576 tokens, an SLO over 1e15 ms: docs/safety.md) names the flag
FLAG_FIELDS = (
    ("workload.prompt_tokens", "--isl", "isl"),
    ("workload.output_tokens", "--osl", "osl"),
    ("workload.max_tokens", "--max-tokens", "max_tokens"),
    ("workload.rate_per_s", "--target-rate", "target_rate_per_s"),
    ("slo.ttft_ms", "--ttft-ms", "ttft_ms"),
    ("slo.itl_ms", "--itl-ms", "itl_ms"),
    ("slo.percentile", "--percentile", "percentile"),
    ("slo.attainment_target", "--attainment", "attainment"),
    ("seed", "--seed", "seed"),
)


@dataclass(frozen=True, slots=True)
class Question:
    """The flags of one-command ``plan`` (None: not given)."""

    model: str | None = None
    gpu: str | None = None
    gpus: int | None = None
    target_rate_per_s: float | None = None
    isl: str | None = None
    osl: str | None = None
    preset: str | None = None
    trace: str | None = None
    ttft_ms: float | None = None
    itl_ms: float | None = None
    itl_statistic: str = "tpot"
    attainment: float = 0.9
    percentile: float = 99.0
    fabric: str = "auto"
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    seed: int = 0
    max_tokens: int | None = None  # None: the longest --osl reply (if bounded)

    def command_line(self) -> list[str]:
        """The ``disaggsim plan`` arguments that ask this question (non-defaults only)."""
        out = ["plan"]
        defaults = Question()
        for name in self.__slots__:
            v = getattr(self, name)
            if v is None or v == getattr(defaults, name):
                continue
            flag = {"target_rate_per_s": "target-rate"}.get(name, name.replace("_", "-"))
            out += [f"--{flag}", f"{v:g}" if isinstance(v, float) else str(v)]
        return out

    def given(self) -> list[str]:
        """The question flags given (for 'not both' errors)."""
        names = ("model", "gpu", "isl", "osl", "preset", "trace", "ttft_ms", "itl_ms")
        return ["--" + n.replace("_", "-") for n in names if getattr(self, n) is not None]


def _int(flag: str, text: str, spec: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise UserError(f"{flag} {spec}: expected {LENGTH_SPEC}") from None
    if v < 1:
        raise UserError(f"{flag} {spec}: expected {LENGTH_SPEC}")
    return v


def parse_lengths(flag: str, spec: str) -> dict[str, Any]:
    """``8000`` → fixed; ``uniform:6000:10000``; ``lognormal:8000:0.5[:32768]`` (median,
    sigma, optional clip) → the workload's length-distribution mapping."""
    parts = spec.strip().split(":")
    kind = parts[0].lower()
    if len(parts) == 1:
        return {"dist": "fixed", "value": _int(flag, parts[0], spec)}
    if kind == "uniform" and len(parts) == 3:
        lo, hi = _int(flag, parts[1], spec), _int(flag, parts[2], spec)
        if lo > hi:
            raise UserError(f"{flag} {spec}: uniform needs LO <= HI")
        return {"dist": "uniform", "low": lo, "high": hi}
    if kind == "lognormal" and len(parts) in (3, 4):
        median = _int(flag, parts[1], spec)
        try:
            sigma = float(parts[2])
        except ValueError:
            raise UserError(f"{flag} {spec}: expected {LENGTH_SPEC}") from None
        if not 0.0 <= sigma < float("inf"):
            raise UserError(f"{flag} {spec}: expected {LENGTH_SPEC}")
        out: dict[str, Any] = {"dist": "lognormal", "median": median, "sigma": sigma}
        if len(parts) == 4:
            out["max"] = _int(flag, parts[3], spec)
        return out
    raise UserError(f"{flag} {spec}: expected {LENGTH_SPEC}")


def _positive(flag: str, v: float | None, unit: str = "") -> None:
    if v is not None and not (v > 0 and v < float("inf")):
        raise UserError(f"{flag} {v:g}: must be a number > 0{unit}")


def target_rate_range() -> tuple[float, float]:
    """The ``--target-rate`` a question may ask (req/s): its window
    (:data:`QUESTION_WINDOW_S`) holds at least one request, which the plan samples its
    lengths from, and at most MAX_REQUESTS, what one run may hold (docs/safety.md)."""
    return 1.0 / QUESTION_WINDOW_S, MAX_REQUESTS / QUESTION_WINDOW_S


def _rate_refused(rate: float, why: str) -> UserError:
    lo, hi = target_rate_range()
    return UserError(
        f"--target-rate {rate:g}: must be between {math.ceil(lo * 1e5) / 1e5:g} and "
        f"{math.floor(hi):,} req/s: the question's {QUESTION_WINDOW_S:g} s of arrivals, "
        f"which the plan samples its requests from, {why}"
    )


def _window_rate(rate: float | None) -> None:
    """``--target-rate`` within :func:`target_rate_range` (a rate of 1e-9 req/s left the
    plan no request to sample, in an error that named no flag)."""
    if rate is None:
        return
    lo, hi = target_rate_range()
    if rate < lo:
        raise _rate_refused(rate, "would hold no request")
    if rate > hi:
        raise _rate_refused(rate, f"would hold more than the {MAX_REQUESTS:,} one run may")


def _choice(flag: str, v: str, allowed: tuple[str, ...]) -> None:
    if v not in allowed:
        hint = closest_hint(v, list(allowed))
        raise UserError(f"{flag} {v}: allowed: {', '.join(allowed)}{hint}")


def _workload(q: Question, base_dir: Path, context_tokens: int | None = None) -> dict[str, Any]:
    sources = [f for f, v in (("--isl/--osl", q.isl or q.osl), ("--preset", q.preset)) if v]
    if q.trace is not None:
        sources.append("--trace")
    if len(sources) != 1:
        raise UserError(
            "plan: describe the traffic with one of --isl and --osl (lengths), --preset NAME or "
            f"--trace FILE (got {' and '.join(sources) if sources else 'none'})"
        )
    rate = q.target_rate_per_s
    if q.preset is not None:
        from disaggsim.workload.presets import PRESET_NAMES

        _choice("--preset", q.preset, PRESET_NAMES)
        from disaggsim.workload.presets import load_preset

        wl: dict[str, Any] = {"kind": "preset", "preset": q.preset}
        if rate is not None:
            wl["rate_per_s"] = rate
        preset = load_preset(q.preset)
        _cap_at_longest(
            wl,
            math.ceil(preset.output_tokens_quantiles[-1][1]),
            math.ceil(preset.prompt_tokens_quantiles[-1][1]),
            context_tokens,
        )
        return wl
    if q.trace is not None:
        path = Path(q.trace)
        path = path if path.is_absolute() else (base_dir / path)
        if not path.is_file():
            raise UserError(f"--trace {q.trace}: file not found")
        from disaggsim.workload.traces import read_trace, timestamp_bucket_s

        wl = {"kind": "trace", "path": str(path.resolve())}
        if rate is not None:
            wl["rate_per_s"] = rate
        trace = read_trace(path)
        if timestamp_bucket_s(trace.arrival_s) is not None:
            # bucketed timestamps would deliver each bucket's requests at one instant
            wl["bucketed_timestamps"] = "spread"
        _cap_at_longest(
            wl, int(trace.output_tokens.max()), int(trace.prompt_tokens.max()), context_tokens
        )
        return wl
    if q.isl is None or q.osl is None:
        missing = "--isl" if q.isl is None else "--osl"
        raise UserError(f"plan: {missing} is needed with the other ({LENGTH_SPEC})")
    prompt, out = parse_lengths("--isl", q.isl), parse_lengths("--osl", q.osl)
    wl = {
        "kind": "synthetic",
        "rate_per_s": rate if rate is not None else DEFAULT_RATE_PER_S,
        "arrival": "poisson",
        "prompt_tokens": prompt,
        "output_tokens": out,
    }
    _cap_at_longest(wl, _upper(out), _upper(prompt), context_tokens)
    return wl


def _cap_at_longest(
    wl: dict[str, Any],
    longest_reply: int | None,
    longest_prompt: int | None,
    context_tokens: int | None,
) -> None:
    """Clients cap replies at the longest one (docs/workloads.md), where every prompt
    still fits the context with it; else the default cap, the context less the prompt
    (with a long-context model that default makes routing and KV admission plan on
    replies of the whole context)."""
    if longest_reply is None or longest_prompt is None or context_tokens is None:
        return
    if longest_prompt + longest_reply <= context_tokens:
        wl["max_tokens"] = longest_reply


def _source(q: Question) -> str:
    """Where the question's lengths come from, in words."""
    if q.preset is not None:
        return f"preset {q.preset}"
    if q.trace is not None:
        return "trace"
    return "--isl/--osl lengths"


def _upper(dist: dict[str, Any]) -> int | None:
    """The largest length a parsed length spec can draw (None: unbounded)."""
    v = dist.get("value", dist.get("high", dist.get("max")))
    return None if v is None else int(v)


def _name(q: Question) -> str:
    size = f"{q.gpus}gpu" if q.gpus is not None else f"{q.target_rate_per_s:g}rps"
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"plan-{q.model}-{q.gpu}-{size}")


def build_question(q: Question, base_dir: Path | None = None) -> dict[str, Any]:
    """The scenario mapping of a one-command plan question (see the module docstring)."""
    from disaggsim.catalog import get_gpu, get_model

    base_dir = base_dir or Path.cwd()
    for flag, name in (("--model", q.model), ("--gpu", q.gpu)):
        if name is None:
            raise UserError(
                f"plan: {flag} is needed without a scenario file "
                "(or give SCENARIO.yaml instead of the question flags)"
            )
    for flag, target in (("--ttft-ms", q.ttft_ms), ("--itl-ms", q.itl_ms)):
        if target is None:
            raise UserError(f"plan: {flag} is needed without a scenario file (the SLO target)")
    try:
        model = get_model(q.model)  # type: ignore[arg-type]
    except UserError as e:
        raise UserError(f"--model {q.model}: {e}") from None
    try:
        gpu = get_gpu(q.gpu)  # type: ignore[arg-type]
    except UserError as e:
        raise UserError(f"--gpu {q.gpu}: {e}") from None
    if q.gpus is None and q.target_rate_per_s is None:
        raise UserError("plan: give the budget --gpus N, or --target-rate R to size one")
    if q.gpus is not None and q.gpus < 1:
        raise UserError(f"--gpus {q.gpus}: must be >= 1")
    _positive("--target-rate", q.target_rate_per_s, " req/s")
    _window_rate(q.target_rate_per_s)
    _positive("--ttft-ms", q.ttft_ms, " ms")
    _positive("--itl-ms", q.itl_ms, " ms")
    if not 0 < q.attainment <= 1:
        raise UserError(f"--attainment {q.attainment:g}: must be in (0, 1], e.g. 0.9")
    if not 0 < q.percentile <= 100:
        raise UserError(f"--percentile {q.percentile:g}: must be in (0, 100]")
    _choice("--itl-statistic", q.itl_statistic, ITL_STATISTICS)
    _choice("--fabric", q.fabric, FABRICS)
    _choice("--weight-dtype", q.weight_dtype, WEIGHT_DTYPES)
    _choice("--kv-dtype", q.kv_dtype, DTYPES)
    if q.seed < 0:
        raise UserError(f"--seed {q.seed}: must be >= 0")
    if q.max_tokens is not None and not (
        isinstance(q.max_tokens, int) and not isinstance(q.max_tokens, bool) and q.max_tokens >= 1
    ):
        raise UserError(f"--max-tokens {q.max_tokens}: must be a whole number of tokens >= 1")
    workload = _workload(q, base_dir, model.context_tokens)
    if q.max_tokens is not None:
        workload["max_tokens"] = q.max_tokens

    node = gpu.gpus_per_node
    if q.fabric == "nvlink" and gpu.nvlink_bytes_per_s <= 0:
        raise UserError(
            f"--fabric nvlink: {gpu.id} has no NVLink: allowed: auto, infiniband, roce, pcie"
        )
    if q.fabric == "nvlink" and q.gpus is not None and q.gpus > node:
        raise UserError(
            f"--fabric nvlink: {q.gpus} GPUs do not fit one node of {node} x {gpu.id}, and "
            "NVLink joins the pools only inside one node: allowed here: auto, infiniband, "
            "roce, pcie"
        )
    # a target rate's budget is sized below, once the smallest worker is known
    link = auto_link(gpu.id, q.gpus) if q.fabric == "auto" else q.fabric

    raw: dict[str, Any] = {
        "name": _name(q),
        "description": f"one-command plan question: {model.id} on {gpu.id}",
        "seed": q.seed,
        "model": model.id,
        "weight_dtype": q.weight_dtype,
        "kv_dtype": q.kv_dtype,
        "architecture": "colocated",
        # num_workers and tp are placeholders until the smallest worker is known
        "pool": {
            "gpu": gpu.id,
            "num_workers": 1,
            "tp": 1,
            "scheduler": "chunked",
            "max_batch_tokens": 512,
        },
        "fabric": {"kind": "link", "link": link},
        "slo": {
            "ttft_ms": q.ttft_ms,
            "itl_ms": q.itl_ms,
            "itl_statistic": q.itl_statistic,
            "percentile": q.percentile,
            "attainment_target": q.attainment,
        },
        "workload": workload,
        "sim": {"duration_s": QUESTION_WINDOW_S, "warmup_s": QUESTION_WARMUP_S},
    }
    tp, dp = _smallest_unit(raw, q)
    pool = raw["pool"]
    # at most the workers a pool may hold: a larger budget is the plan's --gpus (the
    # planner's candidates are built for it; question.yaml says so)
    pool["num_workers"] = min(max(1, (q.gpus or tp * dp) // (tp * dp)), MAX_WORKERS_PER_POOL)
    pool["tp"] = tp
    if dp > 1:
        pool["dp"] = dp
    if q.gpus is None and q.fabric in ("auto", "nvlink"):
        # the fabric of a target rate's budget: the rule of --gpus at the GPUs the plan
        # first sizes (plan.fit_target_rate applies it again to a smaller fleet)
        budget = sized_budget(raw, q)
        if q.fabric == "auto":
            raw["fabric"]["link"] = auto_link(gpu.id, budget)
        elif budget > node:
            raise UserError(
                f"--fabric nvlink: --target-rate {q.target_rate_per_s:g} sizes {budget} GPUs, "
                f"more than one node of {node} x {gpu.id}, and NVLink joins the pools only "
                "inside one node: allowed here: auto, infiniband, roce, pcie"
            )
    return raw


def auto_link(gpu_id: str, gpus: int | None) -> str:
    """``--fabric auto``: NVLink where a budget of ``gpus`` fits one node of ``gpu_id``
    and the GPU has NVLink, else InfiniBand (an unknown budget, None: InfiniBand)."""
    from disaggsim.catalog import get_gpu

    gpu = get_gpu(gpu_id)
    fits_node = gpus is not None and gpus <= gpu.gpus_per_node
    return "nvlink" if fits_node and gpu.nvlink_bytes_per_s > 0 else "infiniband"


def sized_budget(raw: dict[str, Any], q: Question) -> int:
    """The GPUs a target-rate question's plan first searches
    (:func:`~disaggsim.plan.search.rate_budget`)."""
    from disaggsim.config.loader import load_scenario
    from disaggsim.plan.search import rate_budget

    return rate_budget(load_scenario(raw), q.target_rate_per_s)  # type: ignore[arg-type]


def flag_error(e: UserError, q: Question | None) -> UserError:
    """The error of loading the question's scenario, in the words of the question: a
    field a flag of ``q`` filled is named after the flag (``--isl 2000000:
    workload.prompt_tokens.value: must be <= 1,048,576 ...``); otherwise (or with no
    ``q``: the flags' values loaded already, the error is a ``--set``'s) the scenario's
    placeholder label ``<scenario>`` reads "plan question"."""
    text = str(e)
    if not text.startswith("<scenario>: "):
        return e
    text = text.removeprefix("<scenario>: ")
    for field, flag, attr in FLAG_FIELDS if q is not None else ():
        if text.startswith((field + ".", field + ":")):
            v = getattr(q, attr)
            return UserError(
                f"{flag} {v:g}: {text}" if isinstance(v, float) else f"{flag} {v}: {text}"
            )
    return UserError(f"plan question: {text}")


def _smallest_unit(raw: dict[str, Any], q: Question) -> tuple[int, int]:
    """The smallest worker, ``(tp, dp)``, of the question's model and GPU with KV room
    (:func:`disaggsim.plan.analytic.smallest_unit`)."""
    from disaggsim.config.loader import load_scenario
    from disaggsim.plan.analytic import refusal_note, smallest_unit

    try:
        loaded = load_scenario(raw)  # the pool as given is only a placeholder here
    except UserError as e:  # the first load of the flags' values: name the flag
        raise flag_error(e, q) from None
    rate = q.target_rate_per_s
    if rate is not None and rate * QUESTION_WINDOW_S < 1000:
        from disaggsim.run import make_requests

        if len(make_requests(loaded)) == 0:  # a rate in range whose draw holds none
            raise UserError(
                f"--target-rate {rate:g}: the question's {QUESTION_WINDOW_S:g} s of arrivals, "
                f"which the plan samples its requests from, hold no request at --seed "
                f"{q.seed}: allowed: a rate whose window draws one (at least "
                f"{math.ceil(target_rate_range()[0] * 1e5) / 1e5:g} req/s), or another seed"
            )
    pool = raw["pool"]
    refusals: dict[str, str] = {}
    lay = smallest_unit(loaded, pool["gpu"], 16, refusals=refusals)
    if lay is None:
        raise UserError(
            f"--model {raw['model']}: does not fit on any worker of {pool['gpu']} "
            f"({raw['weight_dtype']} weights, tensor parallel, or for an MoE model also "
            f"data-parallel attention with experts over all GPUs){refusal_note(refusals)}"
        )
    return lay.tp, lay.dp


def _fabric_reason(q: Question, link: str, raw: dict[str, Any], planned: bool = False) -> str:
    """Why the question's link is what it is. ``planned``: the plan's outcome is written
    on lines of its own (:func:`_planned_lines`), so the rate's note on a smaller fleet is
    left to them."""
    from disaggsim.catalog import get_gpu

    if q.fabric != "auto" or q.gpu is None:
        return f"{link} between the pools (--fabric {q.fabric})."
    gpu = get_gpu(q.gpu)
    node = gpu.gpus_per_node
    if q.gpus is None:
        budget = sized_budget(raw, q)
        after = (
            ""
            if planned
            else "; the plan applies the same rule to a smaller fleet it sizes for the rate, "
            "whose recommended.yaml says which link it was planned on"
        )
        if link == "nvlink":
            return (
                f"nvlink (auto: the {budget} GPUs first sized for --target-rate "
                f"{q.target_rate_per_s:g} fit one node of {node} GPUs)."
            )
        if gpu.nvlink_bytes_per_s <= 0:
            return f"{link} (auto: {q.gpu} has no NVLink)."
        return (
            f"{link} (auto: the {budget} GPUs first sized for --target-rate "
            f"{q.target_rate_per_s:g} span nodes of {node}; NVLink joins only one node{after})."
        )
    if link == "nvlink":
        return f"nvlink (auto: the budget fits one node of {node} GPUs)."
    if q.gpus <= node:
        return f"{link} (auto: {q.gpu} has no NVLink)."
    return f"{link} (auto: {q.gpus} GPUs span nodes of {node}; NVLink joins only one node)."


def _planned_lines(raw: dict[str, Any], planned: Any) -> list[str]:
    """What a target-rate plan searched when it sized a smaller fleet than the budget
    first sized (``planned``: its ``SearchResult``), and, where ``--fabric auto`` put that
    fleet on another link than this file's, how to plan it again from this file."""
    first = getattr(planned, "first_budget", None)
    if first is None:
        return []
    link = raw["fabric"]["link"]
    fab = planned.loaded.scenario.fabric
    got = getattr(fab, "link", link)
    n = planned.gpu_budget
    lines = [
        f"# Planned: the {first} GPUs first sized on {link}, then again {n} "
        f"GPU{'s' if n > 1 else ''} for the rate on {got}"
        + (f" (--fabric auto's rule for {n} GPU{'s' if n > 1 else ''})" if got != link else "")
        + ": recommended.yaml is the deployment planned, on that link."
    ]
    if got != link:
        lines.append(
            f"# This file keeps {link} (the budget first sized) and plans every fleet on it; "
            f"the fleet planned: disaggsim plan question.yaml --gpus {n} --set "
            f"fabric.link={got}"
        )
    return lines


def question_yaml(raw: dict[str, Any], q: Question, planned: Any = None) -> str:
    """The question as a commented YAML file (what ``plan`` writes as question.yaml).
    ``planned``: the plan's ``SearchResult``, whose fleet and link a target-rate plan
    that sized a smaller fleet says (:func:`_planned_lines`)."""
    from disaggsim.config.loader import load_scenario
    from disaggsim.metrics.slo_model import slo_model_lines

    s = load_scenario(raw).scenario
    pool = raw["pool"]
    stated = pool["num_workers"] * pool["tp"] * pool.get("dp", 1)  # GPUs the pool states
    lines = [
        "# disaggsim plan question, built from the command line:",
        "#   disaggsim " + shlex.join(q.command_line()),
    ]
    # the same question: its budget, or its rate (the pool states one worker for a rate)
    budget = (
        f" --gpus {q.gpus}"
        if q.gpus is not None
        else f" --target-rate {q.target_rate_per_s:g}"
        if q.target_rate_per_s is not None
        else ""
    )
    lines += [
        f"# Plan it again: disaggsim plan question.yaml{budget}",
        "# Simulate the pool below as it is: disaggsim run question.yaml",
        "#",
        *slo_model_lines(s.slo, prefix="# "),
        "#",
        "# The pool only states the GPU budget (num_workers x tp); the planner replaces it",
        "# with each candidate deployment."
        + (
            f" It holds at most {MAX_WORKERS_PER_POOL:,} workers, {stated:,} GPUs: plan"
            f" with --gpus {q.gpus}."
            if q.gpus is not None and stated < q.gpus
            else ""
        ),
        "# Fabric: " + _fabric_reason(q, s.fabric.link, raw, planned is not None),  # type: ignore[union-attr]
        *_planned_lines(raw, planned),
        *(
            [
                "# Trace timestamps: bucketed; each arrival is placed uniformly at random "
                "within its bucket (bucketed_timestamps: spread; keep replays them as they "
                "are, each bucket's requests at one instant)"
            ]
            if raw["workload"].get("bucketed_timestamps") == "spread"
            else []
        ),
        "# max_tokens: "
        + (
            f"{q.max_tokens} (--max-tokens), the cap routing and KV admission plan on"
            if q.max_tokens is not None
            else f"the longest reply of the {_source(q)}, the cap routing and KV admission plan on"
            if "max_tokens" in raw["workload"]
            else f"not set: the context length minus the prompt (the longest prompt and reply "
            f"of the {_source(q)} exceed the context, or a reply length is unbounded; "
            "docs/workloads.md)"
        ),
    ]
    return "\n".join(lines) + "\n" + yaml.safe_dump(raw, sort_keys=False)
