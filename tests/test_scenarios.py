"""Every scenario shipped in scenarios/ loads and runs a short slice."""

from __future__ import annotations

import pytest

from disaggsim.config.loader import load_scenario
from disaggsim.run import simulate
from tests.conftest import REPO, SHARED_DATA

SCENARIOS = sorted((REPO / "scenarios").rglob("*.yaml"))
NEEDS_SHARED = {
    "mooncake-replay.yaml",
    "mooncake-ideal.yaml",
    "mooncake-cache-aware.yaml",
    "mooncake-round-robin.yaml",
}


def test_there_are_scenarios():
    names = {p.relative_to(REPO / "scenarios").as_posix() for p in SCENARIOS}
    assert {
        "quickstart.yaml",
        "seed-70b-4k/disaggregated.yaml",
        "seed-70b-4k/colocated.yaml",
        "seed-70b-4k/chunked.yaml",
        "mooncake-replay.yaml",
    } <= names


@pytest.mark.parametrize(
    "path", SCENARIOS, ids=lambda p: p.relative_to(REPO / "scenarios").as_posix()
)
def test_scenario_runs_a_short_slice(path):
    if path.name in NEEDS_SHARED and not SHARED_DATA.is_dir():
        pytest.skip("needs ../shared/data")
    loaded = load_scenario(path)
    warm = min(loaded.scenario.sim.warmup_s, 5.0)
    res = simulate(loaded, ["sim.duration_s=20", f"sim.warmup_s={warm}"])
    s = res.summary
    assert s["num_requests"] > 0
    assert s["num_completed"] + s["num_rejected"] + s["num_unfinished"] == s["num_requests"]
    assert s["num_completed"] > 0
    assert s["ttft_p50_s"] > 0


def test_seed_example_colocated_decode_is_stalled_by_prefills():
    """The seed trio: same GPUs; the colocated (vllm) ITL tail is hostage to 4k prefills,
    chunked bounds it, disaggregated removes it."""
    res = {
        name: simulate(
            REPO / "scenarios" / "seed-70b-4k" / f"{name}.yaml", ["sim.duration_s=120"]
        ).summary
        for name in ("disaggregated", "colocated", "chunked")
    }
    assert (
        res["disaggregated"]["num_gpus"]
        == res["colocated"]["num_gpus"]
        == res["chunked"]["num_gpus"]
    )
    # colocated p99 gap is at least one whole 4k prefill; the others are far below it
    assert res["colocated"]["itl_p99_s"] > 5 * res["disaggregated"]["itl_p99_s"]
    assert res["colocated"]["itl_p99_s"] > 3 * res["chunked"]["itl_p99_s"]


def test_fabric_pair_shows_the_weak_fabric_ttft_penalty():
    """Same deployment and traffic: KV over NVLink, streamed during the prefill, vs across
    nodes through host memory and one shared NIC, after the prefill."""
    fab = REPO / "scenarios" / "fabric"
    nv = simulate(fab / "nvlink.yaml", ["sim.duration_s=120"]).summary
    pc = simulate(fab / "pcie.yaml", ["sim.duration_s=120"]).summary
    assert nv["num_gpus"] == pc["num_gpus"]
    # 8k prompts of a 70B model: ~2.5 GB per handoff; ~100 ms through a 25 GB/s NIC
    assert 0.05 < pc["kv_exposed_p50_s"] < 0.2
    assert nv["kv_exposed_p99_s"] < 0.005
    assert pc["ttft_p50_s"] > nv["ttft_p50_s"] + 0.05
    assert pc["ttft_p99_s"] > nv["ttft_p99_s"]
