"""Session workloads: multi-turn conversations and agent tool loops with prefix reuse.

A session is one growing token stream: an optional shared system prompt, then for each
user turn the user's message and the model's answer, and inside a turn (agent loops)
tool calls and tool results. Every request's prompt is the stream so far, so consecutive
requests of a session share all but their newest tokens, and sessions using the same
system prompt share its blocks. Requests are generated up front (open loop, like a
trace replay): a session's next request arrives a think time (next user turn) or a tool
latency (next agent step) after the previous request's *arrival*.

Order of one turn with ``m`` tool calls (``m`` geometric with mean
``agent.tool_calls_mean``, 0 without ``agent``)::

    request 0:  prompt = stream + user message          -> output: a tool call
    request 1:  prompt = ... + tool call + tool result  -> output: a tool call
    ...
    request m:  prompt = ... + tool call + tool result  -> output: the answer

Prefix ids (``disaggsim/workload/chains.py``) come from the structure itself, no
hashing: full block ``k`` of a session's stream is the same block in every request of
the session that covers it; blocks wholly inside system prompt ``p`` are shared by all
sessions using ``p``; a request's partial last block is its own. All draws are
vectorised over sessions, turns and requests, each quantity from its own stream
(``generate.STREAMS``, appended after the existing ones).
"""

from __future__ import annotations

import math

import numpy as np

from disaggsim.workload.arrivals import Schedule, arrival_times
from disaggsim.workload.chains import PrefixChains
from disaggsim.workload.config import DurationDistribution, SessionWorkload
from disaggsim.workload.lengths import sample_lengths
from disaggsim.workload.requests import Requests


def sample_durations(dist: DurationDistribution, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` durations in seconds (float64, >= 0) from one stream."""
    match dist.dist:
        case "fixed":
            return np.full(n, dist.value_s, dtype=np.float64)
        case "exponential":
            return rng.exponential(dist.mean_s, n)
        case "uniform":
            return rng.uniform(dist.low_s, dist.high_s, n)
        case "lognormal":
            return dist.median_s * np.exp(dist.sigma * rng.standard_normal(n))
    raise TypeError(f"unknown duration distribution {dist!r}")


def generate_sessions(
    cfg: SessionWorkload,
    rngs: dict[str, np.random.Generator],
    *,
    schedule: Schedule,
    duration_s: float,
) -> Requests:
    """Requests of the sessions starting in ``[0, duration_s)``, those arriving in
    ``[0, duration_s)`` kept, sorted by arrival, at most ``num_requests`` (the first)."""
    cap = math.inf if cfg.num_requests is None else cfg.num_requests
    # Each session has at least one request, so `cap` sessions hold the first `cap`
    # arrivals: a later session starts after all of them.
    starts = arrival_times(
        rngs["session_starts"],
        schedule=schedule,
        process=cfg.arrival,
        cv=cfg.burstiness_cv if cfg.burstiness_cv is not None else 1.0,
        duration_s=duration_s,
        max_count=cap,
    )
    num_sessions = len(starts)
    turns = sample_lengths(cfg.turns, num_sessions, rngs["session_turns"])
    system = rngs["session_system_prompt"].integers(0, cfg.num_system_prompts, num_sessions)
    num_turns = int(turns.sum())
    turn_session = np.repeat(np.arange(num_sessions), turns)

    agent = cfg.agent
    if agent is not None and agent.tool_calls_mean > 0:
        # geometric on {0, 1, ...}: another tool call with probability q = m / (1 + m)
        q = agent.tool_calls_mean / (1.0 + agent.tool_calls_mean)
        tools = rngs["session_tool_calls"].geometric(1.0 - q, num_turns) - 1
        if agent.max_tool_calls is not None:
            tools = np.minimum(tools, agent.max_tool_calls)
    else:
        tools = np.zeros(num_turns, dtype=np.int64)
    per_turn = 1 + tools
    n = int(per_turn.sum())
    turn_of = np.repeat(np.arange(num_turns), per_turn)
    session_of = turn_session[turn_of]
    first_of_turn = np.zeros(n, dtype=bool)
    turn_start = np.cumsum(per_turn) - per_turn
    first_of_turn[turn_start] = True
    last_of_turn = np.zeros(n, dtype=bool)
    last_of_turn[turn_start + per_turn - 1] = True

    # what each request appends before its prompt is sent, and what it generates
    user = sample_lengths(cfg.user_tokens, num_turns, rngs["session_user_tokens"])
    answer = sample_lengths(cfg.output_tokens, num_turns, rngs["session_output_tokens"])
    num_tool_steps = n - num_turns
    segment = np.empty(n, dtype=np.int64)
    segment[first_of_turn] = user
    output = np.empty(n, dtype=np.int64)
    output[last_of_turn] = answer
    if num_tool_steps:
        assert agent is not None
        segment[~first_of_turn] = sample_lengths(
            agent.tool_result_tokens, num_tool_steps, rngs["session_tool_result_tokens"]
        )
        output[~last_of_turn] = sample_lengths(
            agent.tool_call_tokens, num_tool_steps, rngs["session_tool_call_tokens"]
        )

    # the clients' max_tokens: a reply stops at its cap, and the next turns' context
    # holds what was generated
    max_tokens = None
    if cfg.max_tokens is not None:
        max_tokens = sample_lengths(cfg.max_tokens, n, rngs["max_tokens"])
        output = np.minimum(output, max_tokens)

    # prompt = system + everything earlier in the session + this segment
    session_first = np.zeros(n, dtype=bool)
    session_first[np.searchsorted(session_of, np.arange(num_sessions))] = True
    grown = np.cumsum(segment + output) - output  # running total ending with this segment
    base = grown[session_first] - segment[session_first]  # running total before a session
    prompt = (
        cfg.system_prompt_tokens
        + grown
        - np.repeat(base, np.bincount(session_of, minlength=num_sessions))
    )

    # gaps: a think time before each user turn but a session's first, a tool latency
    # before each tool step
    think = sample_durations(cfg.think_time_s, num_turns, rngs["session_think_s"])
    gap = np.zeros(n, dtype=np.float64)
    user_gap = first_of_turn & ~session_first
    gap[user_gap] = think[turn_of[user_gap]]
    if num_tool_steps:
        assert agent is not None
        gap[~first_of_turn] = sample_durations(
            agent.tool_latency_s, num_tool_steps, rngs["session_tool_latency_s"]
        )
    since = np.cumsum(gap)
    since -= np.repeat(since[session_first], np.bincount(session_of, minlength=num_sessions))
    arrival_s = starts[session_of] + since

    keep = arrival_s < duration_s
    if cfg.max_context_tokens is not None:
        # prompts grow within a session, so this ends each session at its first
        # request that would not fit
        keep &= prompt <= cfg.max_context_tokens
    index = np.flatnonzero(keep)
    index = index[np.argsort(arrival_s[index], kind="stable")]
    if cfg.num_requests is not None:
        index = index[: cfg.num_requests]
    prompt_k = prompt[index]
    chains = session_chains(
        prompt_k,
        session_of[index],
        system[session_of[index]],
        num_sessions,
        cfg.system_prompt_tokens,
        cfg.num_system_prompts,
        cfg.block_tokens,
    )
    return Requests(
        arrival_s=arrival_s[index],
        prompt_tokens=prompt_k,
        output_tokens=output[index],
        prefix_chains=chains,
        max_tokens=None if max_tokens is None else max_tokens[index],
    )


def session_chains(
    prompt: np.ndarray,
    session: np.ndarray,
    system: np.ndarray,
    num_sessions: int,
    system_tokens: int,
    num_system: int,
    block_tokens: int,
) -> PrefixChains:
    """Canonical prefix ids of session requests (see the module docstring).

    Ids, before renumbering densely in the same order: system prompt ``p``'s full blocks
    ``p * nsys + k``; then each session's full blocks beyond the system prompt's, in
    session order; then one id per partial last block.
    """
    b = block_tokens
    nsys = system_tokens // b  # blocks wholly inside the system prompt
    full = prompt // b
    partial = (prompt % b) > 0
    count = full + partial
    offsets = np.zeros(len(prompt) + 1, dtype=np.int64)
    np.cumsum(count, out=offsets[1:])
    own = np.zeros(num_sessions, dtype=np.int64)  # full blocks past the system prompt
    np.maximum.at(own, session, full - nsys)
    session_base = num_system * nsys + np.cumsum(own) - own
    partial_base = num_system * nsys + int(own.sum())
    partial_id = partial_base + np.cumsum(partial) - 1
    row = np.repeat(np.arange(len(prompt)), count)
    k = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[:-1][row]
    ids = np.where(
        k < nsys,
        system[row] * nsys + k,
        np.where(k < full[row], session_base[session[row]] + k - nsys, partial_id[row]),
    )
    # dense ids: system prompts no kept request uses leave gaps
    used, dense = np.unique(ids, return_inverse=True)
    return PrefixChains(dense.astype(np.int64).reshape(-1), offsets, b, len(used))
