"""Notes on the clients' ``max_tokens`` cap when a scenario leaves it unset.

Without ``workload.max_tokens`` (and no cap column in a trace) each request's cap is the
model's context less its prompt (docs/workloads.md, "max_tokens"), as vLLM's OpenAI server
does. Admission and two policies plan on that cap, not on the realised reply:

- every request whose prompt + cap cannot fit one worker's KV is refused at arrival
  (``exceeds_kv_capacity``): with a long-context model on a small worker, all of them;
- a disaggregated router's ``kv_aware`` back-pressure admits a request only when a decode
  worker can promise KV for prompt + min(cap, ``router.reserved_decode_tokens``) (512 by
  default, docs/engine.md; promising the whole cap left a decode worker a handful of
  requests);
- ``kv.admission: reserve_full`` books prompt + cap of blocks per request.

The results are then what such a deployment would do, but seldom what the scenario's
author meant, and they move a disaggregated-versus-colocated verdict: the runs, plans
and comparisons that met one of these say so in a ``note:`` line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from disaggsim.config.scenario import Scenario
    from disaggsim.metrics.summary import Summary
    from disaggsim.workload.requests import Requests

__all__ = [
    "cap_policies",
    "default_caps",
    "plan_cap_note",
    "rejections_note",
    "run_cap_note",
    "scenario_cap_note",
]

ADVICE = "set workload.max_tokens to the clients' cap (docs/workloads.md, 'max_tokens')"


def _cap_words(s: Scenario) -> str:
    from disaggsim.catalog import get_model

    context = get_model(s.model).context_tokens
    return (
        f"workload.max_tokens is not set, so each request's cap is {s.model}'s context "
        f"({context:,} tokens) less its prompt"
    )


def _promise_words(s: Scenario) -> str:
    """What kv_aware promises a request with the default cap (docs/engine.md)."""
    if s.kv.admission == "reserve_full":  # the handoff books prompt + cap anyway
        return "prompt + cap"
    return f"prompt + min(cap, {s.router.reserved_decode_tokens:,} reply tokens)"


def default_caps(s: Scenario, requests: Requests | pd.DataFrame) -> bool:
    """Whether every request's cap is the default, the model's context less its prompt
    (at least 1): none set, or ``max_tokens`` filled by ``Requests.with_context``.
    ``requests``: generated requests, or a run's per-request frame."""
    from disaggsim.catalog import get_model

    caps = requests["max_tokens"] if isinstance(requests, pd.DataFrame) else requests.max_tokens
    if caps is None:
        return True
    if not len(requests):
        return False
    context = get_model(s.model).context_tokens
    default = np.maximum(context - np.asarray(requests.prompt_tokens), 1)
    return bool(np.array_equal(np.asarray(caps), default))


def cap_policies(s: Scenario) -> list[str]:
    """The scenario's policies that plan on each request's cap, beyond the admission check."""
    out = []
    if s.architecture == "disaggregated" and s.router.backpressure == "kv_aware":
        out.append("router.backpressure kv_aware")
    if s.kv.admission == "reserve_full":
        out.append("kv.admission reserve_full")
    return out


def run_cap_note(s: Scenario, summary: Summary) -> str | None:
    """One line when a run's requests had no cap (the caller knows: ``Requests.max_tokens``
    is None) and the default cap acted: requests refused as ``exceeds_kv_capacity``,
    requests held at the router by ``kv_aware`` back-pressure, or ``reserve_full``
    reservations. None when it did not act."""
    effects = []
    refused = summary.num_reason.get("exceeds_kv_capacity", 0)
    if refused:
        effects.append(
            f"{refused:,} measured requests were refused as exceeds_kv_capacity "
            "(prompt + cap beyond one worker's KV)"
        )
    policies = cap_policies(s)
    if "router.backpressure kv_aware" in policies and summary.router_queue_max > 0:
        effects.append(
            "kv_aware back-pressure promised each request decode KV for "
            f"{_promise_words(s)} and held up to "
            f"{summary.router_queue_max:,} requests at the router"
        )
    if "kv.admission reserve_full" in policies:
        effects.append("reserve_full booked prompt + cap of KV blocks per request")
    if not effects:
        return None
    return f"note: {_cap_words(s)}: {'; '.join(effects)}; {ADVICE}"


def plan_cap_note(s: Scenario) -> str:
    """The line a plan or comparison prints for a scenario whose requests have no cap: its
    candidates' goodputs plan on the default (every layout's admission check; the
    disaggregated layouts' back-pressure)."""
    return (
        f"{_cap_words(s)}: requests whose prompt + cap exceed a worker's KV are refused, "
        "and disaggregated layouts with kv_aware back-pressure promise decode KV for "
        f"{_promise_words(s)}; {ADVICE}"
    )


def scenario_cap_note(s: Scenario) -> str:
    """The line a comparison prints for a scenario whose requests have no cap: what plans
    on the default in that scenario, before any run."""
    acts = ["admission refuses requests whose prompt + cap exceed a worker's KV"]
    policies = cap_policies(s)
    if "router.backpressure kv_aware" in policies:
        acts.append(f"kv_aware back-pressure promises decode KV for {_promise_words(s)}")
    if "kv.admission reserve_full" in policies:
        acts.append("reserve_full books prompt + cap of KV blocks per request")
    return f"{_cap_words(s)}: {'; '.join(acts)}; {ADVICE}"


def rejections_note(summary: Summary) -> str | None:
    """One line naming why measured requests were refused or abandoned, if any were."""
    reasons = {r: n for r, n in sorted(summary.num_reason.items()) if n}
    if not reasons:
        return None
    return (
        "note: refused or abandoned by reason: "
        + ", ".join(f"{r} {n:,}" for r, n in reasons.items())
        + " (docs/metrics.md)"
    )
