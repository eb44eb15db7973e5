"""A request whose client set no ``max_tokens`` (its cap is the model's context less the
prompt) is promised its prompt and a bounded reply reserve on a decode worker, not the
whole context: ``kv_aware`` back-pressure no longer starves a long-context model.

Counts here are derived by hand from the KV capacity; the engine is run with the
constant-cost double."""

from __future__ import annotations

import numpy as np

from disaggsim.config.scenario import RouterConfig
from disaggsim.costmodel.testing import ConstantCost
from disaggsim.engine.cluster import run_cluster
from disaggsim.engine.config import RESERVED_DECODE_TOKENS, EngineConfig, PoolSpec
from disaggsim.engine.records import STATUS_COMPLETED
from disaggsim.workload.requests import Requests
from tests.test_engine_failures import _check

CONTEXT = 131_072  # a long-context model (Llama 3.1)


def _cluster(
    decode_tokens: int, decode_base_s: float = 1.0, context: int = CONTEXT, **kw
) -> EngineConfig:
    """One prefill worker, one decode worker of ``decode_tokens`` tokens of KV (steps of
    ``decode_base_s``: by default one token a second, so nothing admitted at the start
    finishes for a while), kv_aware back-pressure, the model's context."""
    decode = ConstantCost(decode_base_s=decode_base_s, kv_capacity_tokens=decode_tokens)
    return EngineConfig(
        pools=(
            PoolSpec("prefill", 1, ConstantCost(prefill_base_s=0.001), 1000, 1_000_000),
            PoolSpec("decode", 1, decode, 1000, 1_000_000),
        ),
        **{
            "block_tokens": 16,
            "kv_admission": "on_demand",
            "backpressure": "kv_aware",
            "context_tokens": context,
            **kw,
        },
    )


def _admitted_before_first_finish(raw) -> int:
    """Requests whose prefill started before any request finished: those the router
    admitted at once (the rest waited for a promise to be released)."""
    first_end = float(np.min(raw.log.finish_at_s))
    return int(np.sum(np.asarray(raw.log.prefill_start_at_s) < first_end))


def _long_context_requests(n: int, prompt: int, reply: int) -> Requests:
    reqs = Requests(np.zeros(n), np.full(n, prompt), np.full(n, reply)).with_context(CONTEXT)
    assert reqs.max_tokens_default
    assert int(reqs.max_tokens[0]) == CONTEXT - prompt
    return reqs


def test_a_long_context_model_without_max_tokens_is_not_starved():
    """A decode worker of 262,144 tokens (16,384 blocks of 16), 400 requests of 1,000-token
    prompts at once, caps left to the server (131,072 - 1,000). Promised prompt + 512
    reply tokens: ceil(1,512 / 16) = 95 blocks each, and the worker can promise 16,384 - 1
    blocks (one kept for a joining sequence's next step): floor(16,383 / 95) = 172
    requests at once. Promised the whole cap (131,072 tokens, 8,192 blocks): 1."""
    reqs = _long_context_requests(400, 1000, 100)
    raw = run_cluster(reqs, _cluster(262_144))
    assert _admitted_before_first_finish(raw) == 172
    assert list(raw.log.status) == [STATUS_COMPLETED] * 400
    # 100-token replies never outgrow the 512-token reserve: nothing preempted
    assert int(np.asarray(raw.log.num_preemptions).sum()) == 0

    whole = run_cluster(reqs, _cluster(262_144, reserved_decode_tokens=CONTEXT))
    assert _admitted_before_first_finish(whole) == 1


def test_a_cap_the_client_set_is_promised_in_full():
    """The same requests with max_tokens set by their clients to the same value: the
    router plans on what the client allowed (1 at once), as before."""
    base = _long_context_requests(20, 1000, 100)
    reqs = Requests(base.arrival_s, base.prompt_tokens, base.output_tokens).with_max_tokens(
        base.max_tokens
    )
    assert not reqs.max_tokens_default
    raw = run_cluster(reqs, _cluster(262_144))
    assert _admitted_before_first_finish(raw) == 1


def test_replies_that_outgrow_the_reserve_are_preempted_and_complete():
    """A 1,000-token context on a decode worker of 1,024 tokens (64 blocks), a reserve of
    100 tokens: 16-token prompts are promised ceil(116 / 16) = 8 blocks, so floor(63 / 8)
    = 7 at once (promised their whole cap, 63 blocks: one); their 300-token replies grow
    to 316 tokens (20 blocks each, 140 for seven): the worker runs out and preempts
    (recompute), and every request still completes, the KV never over capacity (the
    invariants of tests/test_engine_failures.py)."""
    n = 12
    reqs = Requests(np.zeros(n), np.full(n, 16), np.full(n, 300)).with_context(1000)
    cfg = _cluster(1024, decode_base_s=0.01, context=1000, reserved_decode_tokens=100)
    raw = run_cluster(reqs, cfg)
    _check(reqs, cfg, raw)
    assert int(np.asarray(raw.log.num_preemptions).sum()) > 0
    assert list(raw.log.status) == [STATUS_COMPLETED] * n


def test_reserving_in_full_promises_the_whole_cap():
    """reserve_full books prompt + cap at the handoff, so the promise stays that."""
    reqs = _long_context_requests(20, 1000, 100)
    raw = run_cluster(reqs, _cluster(262_144, kv_admission="reserve_full"))
    assert _admitted_before_first_finish(raw) == 1


def test_the_scenario_default_is_the_engine_default():
    assert RouterConfig().reserved_decode_tokens == RESERVED_DECODE_TOKENS == 512
