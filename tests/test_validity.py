"""Physical validity of deployments (issue 12, item 2): tensor parallelism beyond one
node priced hierarchically, NVLink only inside one node of one GPU type, whole-prompt
prefill budgets at least the longest prompt. Bad input: one line, exit 2, nothing
written."""

from __future__ import annotations

import json

import pytest
import yaml

from disaggsim.cli import main
from disaggsim.config.loader import load_scenario
from disaggsim.costmodel.step import build_worker_cost
from disaggsim.costmodel.tp_layout import TpLayout, allreduce_s, tp_layout, tp_options
from disaggsim.errors import UserError
from disaggsim.run import simulate
from disaggsim.validity import largest_prompt_tokens, link_fabric_problem
from tests.conftest import REPO

# The h100_sxm profile's 8-GPU all-reduce fit (Simple, then LL), copied from
# disaggsim/hardware/profiles/h100_sxm.json so the expected values are written out.
H100_AR8 = ((6.068e-05, 452.23e9), (1.6676e-05, 218.44e9))


def test_layout_inside_one_node_and_across_nodes():
    assert tp_layout("h100-sxm", 8) == TpLayout(8, 8, 8, 1, 50e9, 15e-6)
    assert not tp_layout("h100-sxm", 8).cross_node
    sixteen = tp_layout("h100-sxm", 16)
    assert (sixteen.gpus_in_node, sixteen.num_nodes, sixteen.cross_node) == (8, 2, True)
    # 12 GPUs on 8-GPU nodes: the largest divisor of 12 that fits a node is 6 -> 2 x 6
    assert (tp_layout("h100-sxm", 12).gpus_in_node, tp_layout("h100-sxm", 12).num_nodes) == (6, 2)
    assert tp_layout("a100-80gb", 32).nic_bytes_per_s == 25e9  # HDR 200 Gb/s per GPU
    assert [t.tp for t in tp_options(_model("llama-3-70b"), "h100-sxm", 64)] == [
        1,
        2,
        4,
        8,
        16,
        32,
        64,
    ]


def _model(mid):
    from disaggsim.catalog import get_model

    return get_model(mid)


def test_hierarchical_allreduce_by_hand():
    # 100 MB per GPU over 2 nodes x 8 GPUs, in-node fit 10 us + 400 GB/s, NIC 15 us + 50 GB/s:
    # in node 10e-6 + 2*7/8*1e8/4e11 = 447.5 us; across 2*1*15 us + 2*1/2*(1e8/8)/5e10 = 280 us
    lay = TpLayout(16, 8, 8, 2, 50e9, 15e-6)
    assert allreduce_s(lay, ((10e-6, 400e9),), 1e8) == pytest.approx(727.5e-6, rel=1e-12)
    # one GPU per node: no in-node phase, the whole buffer crosses: 4 nodes
    # 2*3*15 us + 2*3/4*1e8/5e10 = 90 us + 3 ms
    lay = TpLayout(4, 8, 1, 4, 50e9, 15e-6)
    assert allreduce_s(lay, (), 1e8) == pytest.approx(3.09e-3, rel=1e-12)
    # inside one node: exactly the fitted ring all-reduce
    lay = TpLayout(8, 8, 8, 1, 50e9, 15e-6)
    assert allreduce_s(lay, ((10e-6, 400e9),), 1e8) == pytest.approx(447.5e-6, rel=1e-12)


def test_tp16_step_prices_the_all_reduce_hierarchically():
    c = build_worker_cost("llama-3-70b", "h100-sxm", 16)
    m = 4096  # prefill tokens
    s = m * 8192 * 2  # bytes per GPU of one all-reduce (hidden 8192, 2-byte activations)
    in_node = min(lat + 2 * 7 / 8 * s / bw for lat, bw in H100_AR8)
    across = 2 * 15e-6 + 2 * (1 / 2) * (s / 8) / 50e9  # 400 Gb/s NIC per GPU
    bd = c.breakdown(prefill_seqs=1, prefill_tokens=m, prefill_attn_pairs=m * (m + 1) / 2)
    assert bd.allreduce_s == pytest.approx(80 * 2 * (in_node + across), rel=1e-12)


@pytest.mark.parametrize("tokens", [1, 8, 64, 512, 8192])
def test_spanning_nodes_never_makes_the_all_reduce_cheaper(tokens):
    """Same bytes per GPU at TP8 and TP16 (m x hidden): crossing nodes adds a phase."""
    t8 = build_worker_cost("llama-3-70b", "h100-sxm", 8).breakdown(decode_batch=tokens)
    t16 = build_worker_cost("llama-3-70b", "h100-sxm", 16).breakdown(decode_batch=tokens)
    assert t16.allreduce_s > t8.allreduce_s


def test_cost_cli_reports_the_layout(capsys):
    common = ["--model", "llama-3-70b", "--gpu", "h100-sxm", "--batch", "8"]
    main(["cost", "decode", *common, "--tp", "16", "--context-tokens", "100"])
    main(["cost", "decode", *common, "--tp", "8", "--context-tokens", "100"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0]["tp_layout"]["allreduce"] == "hierarchical"
    assert lines[0]["tp_layout"]["num_nodes"] == 2
    assert lines[1]["tp_layout"]["allreduce"] == "in-node"


def _disagg(**kw) -> dict:
    raw = {
        "name": "v",
        "model": "llama-3-8b",
        "architecture": "disaggregated",
        "prefill_pool": {"gpu": "h100-sxm", "num_workers": 2, "tp": 1},
        "decode_pool": {"gpu": "h100-sxm", "num_workers": 2, "tp": 1},
        "fabric": {"link": "nvlink"},
        "slo": {"ttft_ms": 1000, "itl_ms": 50},
        "workload": {
            "kind": "synthetic",
            "rate_per_s": 4,
            "prompt_tokens": {"dist": "fixed", "value": 1000},
            "output_tokens": {"dist": "fixed", "value": 20},
        },
        "sim": {"duration_s": 5},
    }
    for path, value in kw.items():
        node = raw
        *head, last = path.split("__")
        for part in head:
            node = node[part]
        node[last] = value
    return raw


def test_nvlink_inside_one_node_is_valid_and_runs():
    s = load_scenario(_disagg()).scenario
    assert link_fabric_problem(s) is None
    assert simulate(s).summary["num_completed"] > 0


@pytest.mark.parametrize(
    "change, expect",
    [
        (
            {
                "prefill_pool__num_workers": 3,
                "prefill_pool__tp": 2,
            },  # 3 x tp2 + 2 x tp1 = 8: one node
            None,
        ),
        (
            {"prefill_pool__num_workers": 4, "prefill_pool__tp": 2},  # 8 + 2 = 10 GPUs
            "prefill_pool (4 x tp2) + decode_pool (2 x tp1) = 10 GPUs",
        ),
        (
            {"decode_pool__gpu": "h200-sxm"},
            "prefill_pool.gpu h100-sxm and decode_pool.gpu h200-sxm",
        ),
    ],
)
def test_nvlink_checked_against_the_deployment(change, expect):
    s = load_scenario(_disagg(**change)).scenario
    problem = link_fabric_problem(s)
    if expect is None:
        assert problem is None
        return
    assert problem is not None and "\n" not in problem
    assert problem.startswith("fabric.link: nvlink")
    assert expect in problem
    assert "infiniband or roce" in problem and "kind topology" in problem
    with pytest.raises(UserError, match="fabric.link: nvlink"):
        simulate(s)


def test_nvlink_counts_an_autoscaled_pool_at_its_largest():
    raw = _disagg(
        autoscale={
            "decode": {
                "min_workers": 1,
                "max_workers": 7,
                "policy": "target",
                "target": {"signal": "batch_occupancy", "target_value": 0.6},
            }
        }
    )
    problem = link_fabric_problem(load_scenario(raw).scenario)
    assert (
        problem is not None and "decode_pool (7 x tp1 at autoscale.decode.max_workers)" in problem
    )
    assert "= 9 GPUs" in problem


def test_other_links_and_colocated_pools_are_not_limited_to_a_node():
    big = {"prefill_pool__num_workers": 8, "decode_pool__num_workers": 8}
    assert (
        link_fabric_problem(load_scenario(_disagg(fabric={"link": "infiniband"}, **big)).scenario)
        is None
    )
    colocated = _disagg()
    del colocated["prefill_pool"], colocated["decode_pool"]
    colocated["architecture"] = "colocated"
    colocated["pool"] = {"gpu": "h100-sxm", "num_workers": 16, "tp": 1, "scheduler": "vllm"}
    assert link_fabric_problem(load_scenario(colocated).scenario) is None


def _write(tmp_path, raw) -> str:
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(raw))
    return str(p)


def _assert_one_line_exit_2_nothing_written(argv, tmp_path, capsys, *needles):
    out = tmp_path / "out"
    rc = main([*argv, "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert "\n" not in err and "Traceback" not in err
    for n in needles:
        assert n in err
    assert not out.exists()
    return err


def test_run_refuses_nvlink_across_nodes(tmp_path, capsys):
    path = _write(tmp_path, _disagg(prefill_pool__num_workers=8))
    _assert_one_line_exit_2_nothing_written(
        ["run", path], tmp_path, capsys, path, "fabric.link: nvlink", "= 10 GPUs", "infiniband"
    )


def test_prompt_longer_than_a_whole_prompt_prefill_budget_is_refused(tmp_path, capsys):
    raw = _disagg(
        prefill_pool__max_batch_tokens=2048,
        workload__prompt_tokens={"dist": "uniform", "low": 1000, "high": 3000},
    )
    path = _write(tmp_path, raw)
    err = _assert_one_line_exit_2_nothing_written(
        ["run", path], tmp_path, capsys, path, "prefill_pool.max_batch_tokens: 2048"
    )
    # the largest prompt generated and the request holding it are named
    from disaggsim.run import make_requests

    reqs = make_requests(load_scenario(raw))
    i = int(reqs.prompt_tokens.argmax())
    assert f"largest prompt, {int(reqs.prompt_tokens[i])} tokens (request {i}," in err
    assert f"set it >= {int(reqs.prompt_tokens[i])}" in err


def test_prefill_budget_rule_by_scheduler(tmp_path):
    colocated = _disagg(workload__prompt_tokens={"dist": "fixed", "value": 3000})
    del colocated["prefill_pool"], colocated["decode_pool"]
    colocated["architecture"] = "colocated"
    colocated["pool"] = {
        "gpu": "h100-sxm",
        "num_workers": 1,
        "scheduler": "vllm",
        "max_batch_tokens": 2048,
    }
    with pytest.raises(UserError, match=r"pool\.max_batch_tokens: 2048 .*3000 tokens.*chunked"):
        simulate(colocated)
    colocated["pool"]["scheduler"] = "chunked"  # chunks: any prompt fits a 2048 budget
    assert simulate(colocated).summary["num_completed"] > 0
    # the decode pool's budget is not a prefill budget: far below the 1000-token prompts
    # (with no more sequences than tokens, which every vLLM instance requires)
    ok = _disagg(decode_pool__max_batch_tokens=16, decode_pool__max_batch_seqs=16)
    assert simulate(ok).summary["num_completed"] > 0


def test_prompts_refused_for_context_do_not_need_a_prefill_budget():
    """prompt + max_tokens beyond the context is refused at admission (exceeds_context):
    such prompts are never prefilled, so only admitted prompts count."""
    raw = _disagg(
        prefill_pool__max_batch_tokens=4096,
        workload__prompt_tokens={"dist": "fixed", "value": 9000},  # llama-3-8b: 8192 context
    )
    s = simulate(raw).summary
    assert s.num_rejected == s.num_requests > 0
    assert s.num_reason == {"exceeds_context": s.num_requests}
    # one admissible prompt above the budget is enough to refuse the scenario
    raw["workload"]["prompt_tokens"] = {"dist": "uniform", "low": 3000, "high": 9000}
    with pytest.raises(UserError, match=r"prefill_pool\.max_batch_tokens: 4096 .*largest prompt"):
        simulate(raw)


def test_largest_prompt_bound_of_each_workload_kind(tmp_path):
    def bound(workload):
        return largest_prompt_tokens(load_scenario(_disagg(workload=workload)))

    base = {"kind": "synthetic", "rate_per_s": 1, "output_tokens": {"dist": "fixed", "value": 9}}
    assert bound({**base, "prompt_tokens": {"dist": "uniform", "low": 5, "high": 700}}) == 700
    ln = {"dist": "lognormal", "median": 300, "sigma": 0.5}
    # unbounded: the longest prompt llama-3-8b admits (8192-token context, one reply token)
    assert bound({**base, "prompt_tokens": ln}) == 8191
    assert bound({**base, "prompt_tokens": {**ln, "max": 4000}}) == 4000
    shift = {"at_s": 1, "prompt_tokens": {"dist": "fixed", "value": 9000}}
    shift["prompt_tokens"]["value"] = 6000
    assert bound({**base, "prompt_tokens": {**ln, "max": 4000}, "mix_shift": shift}) == 6000
    preset = {"kind": "preset", "preset": "azure-conv-2023", "rate_per_s": 1}
    from disaggsim.workload.presets import load_preset

    top = load_preset("azure-conv-2023").prompt_tokens_quantiles[-1][1]
    assert round(top) > 8191 and bound(preset) == 8191  # the preset's tail is beyond the context
    assert bound({**preset, "max_prompt_tokens": 1000}) == 1000
    trace = tmp_path / "t.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:00.0,100,5\n2023-11-16 18:00:01.0,12345,5\n2023-11-16 18:00:02.0,7,5\n"
    )
    # the trace's longest prompt (12345) is beyond the context: the admitted bound is 8191
    assert bound({"kind": "trace", "path": str(trace), "format": "azure"}) == 8191
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:00:00.0,100,5\n2023-11-16 18:00:01.0,5432,5\n"
    )
    assert bound({"kind": "trace", "path": str(trace), "format": "azure"}) == 5432


def test_planner_candidates_get_a_budget_for_the_longest_prompt():
    from disaggsim.plan.search import Candidate, candidate_scenario

    raw = _disagg(workload__prompt_tokens={"dist": "uniform", "low": 9000, "high": 12000})
    raw["model"] = "llama-3.1-8b"  # 131072-token context: every prompt is admitted
    del raw["prefill_pool"], raw["decode_pool"]
    raw["architecture"] = "colocated"
    raw["pool"] = {
        "gpu": "h100-sxm",
        "num_workers": 4,
        "scheduler": "chunked",
        "max_batch_tokens": 512,
    }
    raw["fabric"] = {"link": "infiniband"}
    loaded = load_scenario(raw)
    for cand in (Candidate("disaggregate", 1, 1, 3, 1), Candidate("colocate_vllm", 4, 1)):
        s = load_scenario(candidate_scenario(loaded, cand)).scenario
        prefill = s.prefill_pool if s.prefill_pool is not None else s.pool
        assert prefill.max_batch_tokens == 12000


def test_shipped_scenarios_are_physically_valid():
    from disaggsim.run import make_requests
    from disaggsim.validity import prefill_budget_problem

    for path in sorted((REPO / "scenarios").rglob("*.yaml")):
        loaded = load_scenario(path)
        assert link_fabric_problem(loaded.scenario) is None, path
        if "mooncake" in path.name and not (REPO.parent / "shared" / "data").is_dir():
            continue
        assert prefill_budget_problem(loaded.scenario, make_requests(loaded)) is None, path
