"""A ``batch_occupancy`` target the pool's KV can never reach is said in a ``note:`` line
(disaggsim/autoscale/notes.py): each running sequence holds at least its prompt's KV
blocks, so a worker seats at most ``KV blocks // blocks of the shortest prompt``
sequences, and a target whose band (``target_value × (1 + tolerance) × max_batch_seqs``)
lies at or above that never adds a worker. The ceilings below are counted by hand."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import yaml

from disaggsim.autoscale.notes import occupancy_notes
from disaggsim.config.loader import load_scenario

SCENARIO = {
    "name": "occ",
    "seed": 3,
    "model": "llama-3.1-8b",
    "architecture": "disaggregated",
    "prefill_pool": {"gpu": "h100-sxm", "num_workers": 4, "tp": 1, "max_batch_tokens": 16384},
    "decode_pool": {"gpu": "h100-sxm", "num_workers": 1, "tp": 1, "max_batch_seqs": 64},
    "fabric": {"link": "infiniband"},
    "slo": {"ttft_ms": 2000, "itl_ms": 100},
    "kv": {"block_tokens": 16},
    "workload": {
        "kind": "synthetic",
        "rate_per_s": 20,
        "prompt_tokens": {"dist": "fixed", "value": 8000},
        "output_tokens": {"dist": "fixed", "value": 300},
        "max_tokens": 300,
    },
    "autoscale": {
        "decode": {
            "min_workers": 1,
            "max_workers": 4,
            "interval_s": 2,
            "policy": "target",
            "target": {"signal": "batch_occupancy", "target_value": 0.9},
            "provision_s": 1,
        }
    },
    "sim": {"duration_s": 30, "warmup_s": 2},
}


def notes(capacity: int, **sets: object) -> list[str]:
    overrides = [f"{k}={v}" for k, v in sets.items()]
    return occupancy_notes(load_scenario(SCENARIO, overrides), {"decode": capacity})


def test_a_target_above_the_seat_ceiling_is_noted_with_its_figures():
    # 320,000 KV tokens = 20,000 blocks of 16; an 8,000-token prompt holds 500 of them:
    # 40 seats. The band: 0.9 x 1.1 x 64 = 63.36 sequences. Occupancy <= 40 / 64 = 0.625.
    assert notes(320_000) == [
        "note: autoscale.decode: batch_occupancy target 0.9 × (1 + tolerance 0.1) × "
        "max_batch_seqs 64 = 63.36 running sequences per worker, but a worker's KV seats at "
        "most 40 (20,000 blocks of 16 tokens in its 320,000 KV tokens, 500 per sequence of "
        "the shortest prompt, 8,000 tokens): the signal stays at or below 0.625, so this "
        "target never adds a worker; use policy slo, or a queue signal (docs/autoscaling.md)"
    ]


def test_the_ceiling_counts_whole_blocks_and_the_band_its_tolerance():
    # 8,001 tokens take 501 blocks: 20,000 // 501 = 39 seats
    assert "seats at most 39 " in notes(320_000, **{"workload.prompt_tokens.value": 8001})[0]
    # 0.6 x 1.1 x 64 = 42.24 sequences: 40 seats cannot reach it; 43 seats (344,000
    # tokens = 21,500 blocks) can
    lower = {"autoscale.decode.target.target_value": 0.6}
    assert len(notes(320_000, **lower)) == 1
    assert notes(344_000, **lower) == []
    # tolerance 0: the band is 0.6 x 64 = 38.4, below 40 seats
    assert notes(320_000, **lower, **{"autoscale.decode.target.tolerance": 0}) == []
    # seats exactly at the band: the signal can reach it but never rise above it
    exact = {"autoscale.decode.target.target_value": 0.5, "autoscale.decode.target.tolerance": 0.25}
    assert "= 40 running sequences" in notes(320_000, **exact)[0]  # 0.5 x 1.25 x 64


def test_the_shortest_prompt_of_a_distribution_bounds_the_seats():
    # a lognormal clipped at min 100: 7 blocks each, 20,000 // 7 = 2,857 seats: no note
    sets = {"workload.prompt_tokens": "{dist: lognormal, median: 8000, sigma: 0.5, min: 100}"}
    assert notes(320_000, **sets) == []


def test_a_prefill_target_on_occupancy_is_noted():
    """A prefill worker holds no decode batch: the signal reads 0."""
    raw = {**SCENARIO, "autoscale": {"prefill": {**SCENARIO["autoscale"]["decode"],
                                                 "max_workers": 6}}}  # fmt: skip
    got = occupancy_notes(load_scenario(raw), {"prefill": 10**6, "decode": 10**6})
    assert got == [
        "note: autoscale.prefill: batch_occupancy target 0.9: the signal counts running decode "
        "sequences, which a prefill worker never holds: it reads 0, so this target only "
        "removes workers (down to min_workers 1); use policy slo, or a queue signal "
        "(docs/autoscaling.md)"
    ]


def test_a_run_says_it_and_its_decode_pool_indeed_never_grows(work):
    """The real run: its decode worker's KV (the cost model's, counted by hand from the
    run's own figure) seats 56 of the 8,000-token prompts, under the band of 63.36; the
    router queue grows to hundreds, the pool stays at one worker. At target 0.7 (band
    49.28) it grows and no note is printed."""
    (work / "s.yaml").write_text(yaml.safe_dump(SCENARIO, sort_keys=False))

    def run(out: str, *sets: str) -> tuple[str, pd.DataFrame]:
        p = subprocess.run(
            [sys.executable, "-m", "disaggsim", "run", "s.yaml", "--out", out, "--quiet",
             "--no-plots", *sets],
            cwd=work, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr[-2000:]
        pools = pd.read_parquet(work / out / "pools.parquet")
        return p.stdout, pools[pools.role == "decode"]

    out, decode = run("a")
    note = [line for line in out.splitlines() if line.startswith("note: autoscale.decode")]
    assert len(note) == 1, out
    capacity = int(note[0].split("in its ")[1].split(" KV tokens")[0].replace(",", ""))
    assert capacity // 16 // 500 == 56 and "seats at most 56 " in note[0]
    assert decode.num_in_service.max() == 1 and decode.desired.max() == 1
    summary = json.loads((work / "a" / "summary.json").read_text())
    assert summary["router_queue_max"] > 100, summary["router_queue_max"]
    out, decode = run("b", "--set", "autoscale.decode.target.target_value=0.7")
    assert "note: autoscale" not in out
    assert decode.num_in_service.max() > 1


def test_a_colocated_vllm_pool_is_bounded_and_a_chunked_one_is_not():
    """A colocated vllm sequence joins the batch with its whole prompt prefilled: the same
    ceiling. A chunked pool seats sequences partway through their prompts: no bound here."""
    auto = {**SCENARIO["autoscale"]["decode"]}
    raw = {k: v for k, v in SCENARIO.items() if k not in ("prefill_pool", "decode_pool", "fabric")}
    raw |= {
        "architecture": "colocated",
        "pool": {"gpu": "h100-sxm", "num_workers": 1, "tp": 1, "scheduler": "vllm",
                 "max_batch_seqs": 64, "max_batch_tokens": 16384},
        "autoscale": {"colocated": auto},
    }  # fmt: skip
    got = occupancy_notes(load_scenario(raw), {"colocated": 320_000})
    assert len(got) == 1 and "seats at most 40 " in got[0], got
    raw["pool"] = {**raw["pool"], "scheduler": "chunked"}
    assert occupancy_notes(load_scenario(raw), {"colocated": 320_000}) == []
