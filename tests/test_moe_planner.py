"""search_moe_layouts: every layout it returns is valid and costed as the cost model
says, the ranking is by tokens per second per GPU, and the decode batch is the largest
within the ITL target."""

from __future__ import annotations

import pytest

from disaggsim.costmodel.moe import build_cost
from disaggsim.errors import UserError
from disaggsim.plan.moe_layouts import search_moe_layouts, unit_sizes


def test_unit_sizes_are_sub_node_powers_then_whole_nodes():
    assert unit_sizes(8, 3) == (1, 2, 4, 8, 16, 24)


def test_decode_layouts_meet_the_itl_target_at_the_largest_batch():
    r = search_moe_layouts(
        "qwen3-235b-a22b", "h100-sxm", "decode", max_nodes=2, weight_dtype="fp8-block",
        context_tokens=2000, itl_s=0.05,
    )  # fmt: skip
    assert r.estimates
    rates = [e.tokens_per_s_per_gpu for e in r.estimates]
    assert rates == sorted(rates, reverse=True)
    for e in r.estimates[:4]:
        c = build_cost(
            "qwen3-235b-a22b", "h100-sxm", e.tp, dp=e.dp, ep=e.ep, weight_dtype="fp8-block"
        )
        assert e.gpus == e.tp * e.dp == c.num_gpus
        assert c.decode_time_s(e.batch, e.batch * 2000) == pytest.approx(e.step_s)
        assert e.step_s <= 0.05
        over = e.batch + 1
        assert over * 2000 > c.kv_capacity_tokens or c.decode_time_s(over, over * 2000) > 0.05
        assert e.tokens_per_s_per_gpu == pytest.approx(e.batch / e.step_s / e.gpus)
    # layouts that do not fit are reported with their reason, not ranked
    assert all("does not fit" in why or "itl" in why for _, why in r.skipped)


def test_deepseek_decode_with_eplb_slots_reaches_the_published_unit():
    r = search_moe_layouts(
        "deepseek-v3", "h800-sxm", "decode", sizes=(144,), context_tokens=4000,
        itl_s=0.06, moe={"redundant_experts": 32},
    )  # fmt: skip
    assert [(e.tp, e.dp, e.ep) for e in r.estimates][:1] == [(1, 144, 144)]
    assert r.best.nodes == 18


def test_prefill_ranks_by_prompt_tokens_per_gpu():
    r = search_moe_layouts("mixtral-8x7b", "h100-sxm", "prefill", max_nodes=1, weight_dtype="bf16")
    best = r.best
    c = build_cost("mixtral-8x7b", "h100-sxm", best.tp, dp=best.dp, ep=best.ep)
    n = best.batch * 2048
    assert best.step_s == pytest.approx(
        c.prefill_time_s(best.batch, n, best.batch * 2048 * 2049 / 2)
    )
    assert best.tokens_per_s_per_gpu == pytest.approx(n / best.step_s / best.gpus)


def test_bad_role_is_a_one_line_error():
    with pytest.raises(UserError, match=r"^role: 'mixed' \(allowed: prefill, decode\)"):
        search_moe_layouts("mixtral-8x7b", "h100-sxm", "mixed")
