"""The work bound (docs/safety.md, bounds.MAX_PREFILL_ITERATIONS): a colocated chunked
pool prefills each prompt in chunks of ``max_batch_tokens``, one simulated iteration
each, so the requests bound alone let a valid scenario run for months: 1,000,000
prompts of 1,048,576 tokens in 16-token chunks passed every check (6.6e10 iterations;
10 prompts of 100,000 tokens in 64-token chunks took 0.61 s, about 25,000 iterations a
second). Refused when loaded now, naming the field; realistic runs are far below it."""

from __future__ import annotations

import pytest
import yaml

from disaggsim.config.bounds import MAX_PREFILL_ITERATIONS
from disaggsim.config.loader import load_scenario
from disaggsim.errors import UserError
from tests.conftest import REPO


def _scenario(rate: float, prompt: int, chunk: int, duration_s: float = 20.0) -> dict:
    s = yaml.safe_load((REPO / "scenarios" / "ci" / "colocated-vllm.yaml").read_text())
    # at most as many sequences as the chunk has tokens (vLLM refuses fewer tokens than seqs)
    seqs = min(chunk, s["pool"].get("max_batch_seqs", 256))
    s["pool"].update(scheduler="chunked", max_batch_tokens=chunk, max_batch_seqs=seqs)
    s["workload"].update(rate_per_s=rate, prompt_tokens={"dist": "fixed", "value": prompt})
    s["sim"] = {"duration_s": duration_s, "warmup_s": 1.0}
    return s


def test_months_of_chunked_prefill_are_refused_when_loaded():
    with pytest.raises(UserError) as e:
        load_scenario(_scenario(rate=50_000, prompt=1_048_576, chunk=16))
    msg = str(e.value)
    assert msg.startswith("<scenario>: pool.max_batch_tokens: 16 gives about 6.55e+10 "), msg
    assert "1e+09" in msg and "raise pool.max_batch_tokens" in msg, msg


@pytest.mark.parametrize(
    ("rate", "prompt", "chunk", "duration_s"),
    [
        (99_999, 131_072, 8_192, 20.0),  # 2,000,000 long-context prompts: 3.2e7 iterations
        (0.5, 32_768, 512, 2_592_000.0),  # 30 days of 32k prompts in 512-token chunks: 8.3e7
    ],
)
def test_realistic_runs_stay_below_the_bound(rate, prompt, chunk, duration_s):
    load_scenario(_scenario(rate, prompt, chunk, duration_s))  # no refusal
    assert rate * duration_s * prompt / chunk < MAX_PREFILL_ITERATIONS
