"""Physical validity of a scenario's deployment: checks that need the catalog or the
generated requests, beyond what the schema can say.

- :func:`link_fabric_problem`: a ``fabric: {kind: link, link: nvlink}`` joins the pools
  over NVLink only when both pools are of the same GPU type and together fit in one
  node's NVLink domain (``gpus_per_node`` of the catalog; an autoscaled pool counts at
  its ``max_workers``). Beyond that a handoff crosses a NIC: the error suggests
  ``infiniband``/``roce`` or the topology form (NVLink inside a node, the NIC between).
- :func:`prefill_budget_problem`: a prefill that runs whole prompts (a disaggregated
  prefill pool, a colocated ``vllm`` pool) needs ``max_batch_tokens`` at least the
  largest prompt it will be given, as vLLM needs ``max_num_batched_tokens`` at least
  ``max_model_len`` without chunked prefill. disaggsim refuses the scenario with one
  line naming the field, the largest prompt and its request rather than silently
  running that prompt alone over budget. Prompts the engine refuses at admission
  (prompt + ``max_tokens`` beyond the model's context, ``exceeds_context``) do not count. A ``chunked`` pool splits prompts into chunks
  and has no such limit.

Tensor parallelism beyond one node is not an error: it is priced hierarchically
(:mod:`disaggsim.costmodel.tp_layout`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from disaggsim.catalog import get_gpu, get_model
from disaggsim.errors import UserError

if TYPE_CHECKING:
    from disaggsim.autoscale.config import Role
    from disaggsim.config.loader import LoadedScenario
    from disaggsim.config.scenario import PoolConfig, Scenario
    from disaggsim.workload.requests import Requests

__all__ = [
    "check_link_fabric",
    "check_prefill_budget",
    "largest_prompt_tokens",
    "link_fabric_problem",
    "prefill_budget_problem",
]

NVLINK_ALTERNATIVES = (
    "use fabric.link infiniband or roce, or fabric kind topology "
    "(NVLink inside a node, the NIC between nodes)"
)


def _pool_key(role: str) -> str:
    return "pool" if role == "colocated" else f"{role}_pool"


def _max_workers(scenario: Scenario, role: Role, pool: PoolConfig) -> int:
    auto = scenario.autoscale.for_role(role)
    return max(pool.num_workers, auto.max_workers) if auto is not None else pool.num_workers


def link_fabric_problem(scenario: Scenario) -> str | None:
    """Why the scenario's ``kind: link`` NVLink fabric cannot exist, or None."""
    fab = scenario.fabric
    if (
        scenario.architecture != "disaggregated"
        or getattr(fab, "kind", "link") != "link"
        or getattr(fab, "link", None) != "nvlink"
    ):
        return None
    p, d = scenario.prefill_pool, scenario.decode_pool
    assert p is not None and d is not None
    if p.gpu != d.gpu:
        return (
            f"fabric.link: nvlink cannot join prefill_pool.gpu {p.gpu} and decode_pool.gpu "
            f"{d.gpu} (NVLink joins GPUs of one type in one node): {NVLINK_ALTERNATIVES}"
        )
    node = get_gpu(p.gpu).gpus_per_node
    n_p = _max_workers(scenario, "prefill", p)
    n_d = _max_workers(scenario, "decode", d)
    total = n_p * p.gpus_per_worker + n_d * d.gpus_per_worker  # tp x dp GPUs per worker
    if total > node:
        return (
            f"fabric.link: nvlink needs both pools in one node's NVLink domain ({node} x "
            f"{p.gpu}), but prefill_pool ({n_p} x tp{p.tp}{_dp(p)}{_scaled(scenario, 'prefill', p)}) "
            f"+ decode_pool ({n_d} x tp{d.tp}{_dp(d)}{_scaled(scenario, 'decode', d)}) "
            f"= {total} GPUs: {NVLINK_ALTERNATIVES}"
        )
    return None


def _scaled(scenario: Scenario, role: Role, pool: PoolConfig) -> str:
    """`` at autoscale.decode.max_workers`` where the autoscaler's bound, not the pool's
    ``num_workers``, sets the count."""
    auto = scenario.autoscale.for_role(role)
    if auto is None or auto.max_workers <= pool.num_workers:
        return ""
    return f" at autoscale.{role}.max_workers"


def _dp(pool: PoolConfig) -> str:
    return f" x dp{pool.dp}" if pool.dp > 1 else ""


def check_link_fabric(scenario: Scenario, label: str = "<scenario>") -> None:
    """Raise :class:`UserError` (``label: <problem>``) when :func:`link_fabric_problem`
    finds one."""
    problem = link_fabric_problem(scenario)
    if problem is not None:
        raise UserError(f"{label}: {problem}")


def prefill_budget_problem(scenario: Scenario, requests: Requests) -> str | None:
    """The first pool whose whole-prompt prefill budget is below a prompt, as one line
    naming the field, the largest prompt and its request; None when every prompt fits."""
    n = len(requests)
    if n == 0:
        return None
    prompts = np.asarray(requests.prompt_tokens)
    if requests.max_tokens is not None:
        # prompt + max_tokens beyond the model's context is refused at admission
        # (exceeds_context, the engine): such a prompt is never prefilled
        context = get_model(scenario.model).context_tokens
        admitted = prompts + np.asarray(requests.max_tokens) <= context
        prompts = np.where(admitted, prompts, 0)
    if not prompts.any():
        return None
    for role, pool in scenario.pools.items():
        if role == "decode" or pool.scheduler == "chunked":
            continue
        i = int(np.argmax(prompts))  # the first request holding the largest prompt
        largest = int(prompts[i])
        if largest > pool.max_batch_tokens:
            at_s = float(requests.arrival_s[i])
            return (
                f"{_pool_key(role)}.max_batch_tokens: {pool.max_batch_tokens} is below the "
                f"largest prompt, {largest} tokens (request {i}, arriving at {at_s:.3f} s, "
                f"of {n}); a prefill without "
                f"chunking runs whole prompts: set it >= {largest}"
                + (
                    ", or use pool.scheduler chunked"
                    if role == "colocated"
                    else ", or shorten the workload's prompts"
                )
            )
    return None


def check_prefill_budget(scenario: Scenario, requests: Requests, label: str = "<scenario>") -> None:
    """Raise :class:`UserError` (``label: <problem>``) when
    :func:`prefill_budget_problem` finds one."""
    problem = prefill_budget_problem(scenario, requests)
    if problem is not None:
        raise UserError(f"{label}: {problem}")


def largest_prompt_tokens(loaded: LoadedScenario) -> int:
    """The longest prompt the scenario's workload can produce at any rate and duration
    that the engine would admit (at most the model's context minus one token; the
    context bound alone when the prompt distribution is unbounded): what a whole-prompt
    prefill's ``max_batch_tokens`` must hold. Traces are read (the whole window)."""
    from disaggsim.workload import generate_requests
    from disaggsim.workload.config import PresetWorkload, SyntheticWorkload, TraceWorkload
    from disaggsim.workload.presets import load_preset

    w = loaded.scenario.workload
    bound: int | None
    match w:
        case SyntheticWorkload():
            dists = [w.prompt_tokens]
            if w.mix_shift is not None and w.mix_shift.prompt_tokens is not None:
                dists.append(w.mix_shift.prompt_tokens)
            ends = [d.largest for d in dists]
            bound = None if any(e is None for e in ends) else max(e for e in ends if e)
        case PresetWorkload():
            bound = max(int(np.rint(load_preset(w.preset).prompt_tokens_quantiles[-1][1])), 1)
            if w.max_prompt_tokens is not None:
                bound = min(bound, w.max_prompt_tokens)
        case TraceWorkload():
            reqs = generate_requests(
                w, duration_s=float("inf"), seed=loaded.scenario.seed, base_dir=loaded.base_dir
            )
            bound = int(np.max(reqs.prompt_tokens)) if len(reqs) else None
        case _:
            bound = None
    # a prompt that leaves no room for one token of reply is refused at admission
    context = get_model(loaded.scenario.model).context_tokens
    return context - 1 if bound is None else min(bound, context - 1)
