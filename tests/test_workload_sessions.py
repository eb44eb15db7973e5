"""Session workloads: multi-turn conversations and agent tool loops with prefix chains
(disaggsim/workload/sessions.py)."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from disaggsim.cache import expected_hit_share
from disaggsim.cli import main
from disaggsim.workload import WorkloadConfig, generate_requests
from disaggsim.workload.generate import STREAMS
from disaggsim.workload.sessions import session_chains
from tests.conftest import REPO
from tests.test_workload_chains import prefix_property_holds

ADAPTER = TypeAdapter(WorkloadConfig)


def fixed(v: int) -> dict[str, Any]:
    return {"dist": "fixed", "value": v}


def sessions(**fields: Any) -> Any:
    data = {
        "kind": "sessions",
        # one session per ~10^6 s: the first requests all belong to the first session
        "rate_per_s": 1e-6,
        "turns": fixed(3),
        "system_prompt_tokens": 600,
        "user_tokens": fixed(300),
        "output_tokens": fixed(50),
        "think_time_s": {"dist": "fixed", "value_s": 10},
        **fields,
    }
    return ADAPTER.validate_python(data)


def test_one_conversation_by_hand() -> None:
    r = generate_requests(sessions(num_requests=3), duration_s=math.inf, seed=5)
    # prompts: 600 + 300; + 50 + 300; + 50 + 300
    assert r.prompt_tokens.tolist() == [900, 1250, 1600]
    assert r.output_tokens.tolist() == [50, 50, 50]
    assert np.allclose(np.diff(r.arrival_s), [10, 10])
    # 512-token blocks: the system prompt holds one whole block (id 0, shared by all
    # sessions); full blocks past it belong to the session; partial tails are private
    c = r.prefix_chains
    assert c is not None and c.block_tokens == 512
    chains = [c.chain(i) for i in range(3)]
    assert chains[0][0] == chains[1][0] == chains[2][0] == 0
    assert chains[1][1] == chains[2][1] and len(chains[2]) == 4
    assert len({chains[0][1], chains[1][2], chains[2][2], chains[2][3]}) == 4
    # the second request hits block 0 (512); the third blocks 0 and 1 (1024)
    assert expected_hit_share(r) == (512 + 1024) / (900 + 1250 + 1600)


def test_max_tokens_caps_replies_and_the_context_they_feed() -> None:
    # the clients cap every reply at 30 tokens: the 50-token answers stop at 30, and the
    # next turns' prompts hold the cut answers (600 + 300; + 30 + 300; + 30 + 300)
    r = generate_requests(sessions(num_requests=3, max_tokens=30), duration_s=math.inf, seed=5)
    assert r.prompt_tokens.tolist() == [900, 1230, 1560]
    assert r.output_tokens.tolist() == [30, 30, 30]
    assert r.max_tokens is not None and r.max_tokens.tolist() == [30, 30, 30]
    # a cap above every answer changes nothing but the planning bound
    loose = generate_requests(sessions(num_requests=3, max_tokens=64), duration_s=math.inf, seed=5)
    assert loose.prompt_tokens.tolist() == [900, 1250, 1600]
    assert loose.output_tokens.tolist() == [50, 50, 50]
    assert loose.max_tokens is not None and loose.max_tokens.tolist() == [64, 64, 64]
    # without max_tokens a session's requests carry none (the engine's default applies)
    assert (
        generate_requests(sessions(num_requests=3), duration_s=math.inf, seed=5).max_tokens is None
    )


def test_agent_loop_by_hand() -> None:
    agent = {
        "tool_calls_mean": 1e9,  # with max 2: two tool calls per turn (P(fewer) ~ 2e-9)
        "max_tool_calls": 2,
        "tool_call_tokens": fixed(20),
        "tool_result_tokens": fixed(400),
        "tool_latency_s": {"dist": "fixed", "value_s": 1},
    }
    r = generate_requests(sessions(agent=agent, num_requests=4), duration_s=math.inf, seed=2)
    # user 300 -> tool call 20 + result 400 -> tool call 20 + result 400 -> answer 50,
    # then the next turn's user message 300
    assert r.prompt_tokens.tolist() == [900, 1320, 1740, 2090]
    assert r.output_tokens.tolist() == [20, 20, 50, 20]
    assert np.allclose(np.diff(r.arrival_s), [1, 1, 10])


def test_max_context_ends_sessions_and_impossible_shapes_are_refused() -> None:
    r = generate_requests(sessions(max_context_tokens=1300, rate_per_s=0.2), duration_s=600, seed=1)
    assert len(r) > 0 and r.prompt_tokens.max() <= 1300
    assert set(r.prompt_tokens.tolist()) == {900, 1250}
    with pytest.raises(ValueError, match="max_context_tokens 800 leaves no room"):
        sessions(max_context_tokens=800)


def test_determinism_cap_and_window() -> None:
    cfg = sessions(
        turns={"dist": "uniform", "low": 1, "high": 6},
        num_system_prompts=3,
        user_tokens={"dist": "lognormal", "median": 200, "sigma": 1, "max": 3000},
        think_time_s={"dist": "exponential", "mean_s": 20},
        rate_per_s=1,
    )
    a = generate_requests(cfg, duration_s=300, seed=7, replication=1)
    b = generate_requests(cfg, duration_s=300, seed=7, replication=1)
    c = generate_requests(cfg, duration_s=300, seed=8, replication=1)
    assert np.array_equal(a.arrival_s, b.arrival_s) and np.array_equal(
        a.prefix_chains.ids, b.prefix_chains.ids
    )
    assert not np.array_equal(a.prompt_tokens[:20], c.prompt_tokens[:20])
    assert np.all(np.diff(a.arrival_s) >= 0) and a.arrival_s[-1] < 300
    assert prefix_property_holds(a.prefix_chains, a.prompt_tokens)
    # a cap keeps the first arrivals of the uncapped workload
    capped = generate_requests(
        cfg.model_copy(update={"num_requests": 50}), duration_s=300, seed=7, replication=1
    )
    assert np.array_equal(capped.arrival_s, a.arrival_s[:50])
    assert np.array_equal(capped.prompt_tokens, a.prompt_tokens[:50])
    with pytest.raises(Exception, match="num_requests"):
        generate_requests(cfg, duration_s=math.inf, seed=0)


def test_existing_streams_are_untouched_and_sessions_are_pinned() -> None:
    assert STREAMS[:6] == (
        "arrivals", "prompt_tokens", "output_tokens", "spare", "mix_prompt_tokens", "mix_output_tokens",
    )  # fmt: skip
    # tests/test_workload_shapes.py pins what the older kinds draw. This pins the
    # sessions draws (printed by this code when it was written): a change means
    # sessions scenarios would draw different requests.
    cfg = sessions(
        turns={"dist": "uniform", "low": 1, "high": 6},
        agent={
            "tool_calls_mean": 1,
            "tool_call_tokens": {"dist": "uniform", "low": 10, "high": 40},
            "tool_result_tokens": {"dist": "lognormal", "median": 300, "sigma": 1},
            "tool_latency_s": {"dist": "lognormal", "median_s": 1, "sigma": 0.5},
        },
        think_time_s={"dist": "exponential", "mean_s": 20},
        rate_per_s=0.2,
    )
    r = generate_requests(cfg, duration_s=120, seed=11, replication=2)
    blob = r.arrival_s.tobytes() + r.prompt_tokens.tobytes() + r.output_tokens.tobytes()
    blob += r.prefix_chains.ids.tobytes()
    assert (len(r), hashlib.sha256(blob).hexdigest()[:16]) == SESSIONS_PIN


SESSIONS_PIN = (100, "024f393523b67ed2")


# ---------------------------------------------------------------- chains, independently


def stream_prefix_chains(
    prompts: list[int], session: list[int], system: list[int], sys_tokens: int, block: int
) -> list[list[tuple]]:
    """Brute force: label every token of every session's stream (system prompt p's
    tokens ("sys", p, i), then the session's own ("s", s, i)) and name each block by the
    tuple of all tokens from the start to the block's end."""
    out = []
    for L, s, p in zip(prompts, session, system, strict=True):
        tokens = [("sys", p, i) if i < sys_tokens else ("s", s, i) for i in range(L)]
        out.append([tuple(tokens[: min(L, (k + 1) * block)]) for k in range(-(-L // block))])
    return out


@settings(max_examples=150, deadline=None)
@given(
    data=st.lists(st.lists(st.integers(1, 30), min_size=1, max_size=4), min_size=1, max_size=4),
    sys_tokens=st.integers(0, 20),
    num_system=st.integers(1, 2),
    block=st.sampled_from([1, 4, 8]),
    picks=st.lists(st.integers(0, 1), min_size=4, max_size=4),
)
def test_session_chains_match_token_streams(data, sys_tokens, num_system, block, picks) -> None:
    """Ids are equal exactly when the brute-force token prefixes are equal."""
    prompts, session, system = [], [], []
    for s, growth in enumerate(data):
        L = sys_tokens
        for g in growth:  # strictly growing prompts within a session
            L += g
            prompts.append(L)
            session.append(s)
            system.append(picks[s] % num_system)
    chains = session_chains(
        np.array(prompts),
        np.array(session),
        np.array(system),
        len(data),
        sys_tokens,
        num_system,
        block,
    )
    names = stream_prefix_chains(prompts, session, system, sys_tokens, block)
    pairs = {
        (cid, name)
        for i in range(len(prompts))
        for cid, name in zip(chains.chain(i), names[i], strict=True)
    }
    assert len({c for c, _ in pairs}) == len({n for _, n in pairs}) == len(pairs)
    assert chains.num_ids == len(pairs) and int(chains.ids.max(initial=-1)) < chains.num_ids


# ---------------------------------------------------------------- bad input at the CLI


def _write(tmp_path: Path, workload: dict[str, Any]) -> Path:
    raw = yaml.safe_load((REPO / "scenarios" / "quickstart.yaml").read_text())
    raw["workload"] = workload
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


GOOD = {
    "kind": "sessions",
    "rate_per_s": 0.5,
    "turns": fixed(3),
    "system_prompt_tokens": 600,
    "user_tokens": fixed(300),
    "output_tokens": fixed(50),
    "think_time_s": {"dist": "exponential", "mean_s": 10},
}
BAD = {
    "shape": ({"max_context_tokens": 700}, "workload: max_context_tokens 700 leaves no room for a first request: system_prompt_tokens 600 + the shortest user_tokens 300 = 900"),
    "think time": ({"think_time_s": {"dist": "exponential", "mean_s": -1}}, "workload.think_time_s.mean_s: Input should be greater than 0"),
    "unknown dist": ({"think_time_s": {"dist": "pareto"}}, "workload.think_time_s.dist: unknown value 'pareto' (allowed: fixed, exponential"),
    "nan": ({"think_time_s": {"dist": "fixed", "value_s": float("nan")}}, "workload.think_time_s.value_s: Input should be a finite number"),
    "unknown key": ({"turnz": 3}, "workload.turnz: unknown key"),
    "system prompts": ({"num_system_prompts": 0}, "workload.num_system_prompts: Input should be greater than or equal to 1"),
    "agent": ({"agent": {"tool_calls_mean": -1, "tool_call_tokens": fixed(1), "tool_result_tokens": fixed(1), "tool_latency_s": {"dist": "fixed", "value_s": 0}}}, "workload.agent.tool_calls_mean: Input should be greater than or equal to 0"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_sessions_one_line_exit_2_nothing_written(case, tmp_path, capsys) -> None:
    change, expected = BAD[case]
    path = _write(tmp_path, GOOD | change)
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err == f"disaggsim: error: {path}: {expected}" or (
        err.startswith(f"disaggsim: error: {path}: ") and expected in err
    ), err
    assert not out.exists()


def test_good_sessions_scenario_runs(tmp_path) -> None:
    """A sessions workload runs through the engine as it is (the cache is not wired yet:
    every prompt token is prefilled)."""
    path = _write(tmp_path, GOOD)
    out = tmp_path / "out"
    assert (
        main(
            [
                "run",
                str(path),
                "--out",
                str(out),
                "--quiet",
                "--set",
                "sim.duration_s=60",
                "--set",
                "sim.warmup_s=0",
            ]
        )
        == 0
    )
    assert (out / "summary.json").is_file()
