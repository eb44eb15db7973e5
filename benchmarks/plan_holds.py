"""Does a plan's recommendation hold when its recommended.yaml is run as written?

For seeded random one-command plan questions (dense and MoE models, five GPU types,
4-16 GPUs, prompt, reply and SLO mixes), runs ``disaggsim plan`` (``--quick`` unless
``--full``), then ``disaggsim run`` of the recommended.yaml it wrote (its own ``sim``
section, seed 0: the question's 300 s of arrivals, or a shorter window where that would
hold more than 100,000 requests, docs/planning.md §4 "How long the file runs") and, with
``--margins``, the same scenario at lower rates; with ``--question-window``, a file that
was shortened is also run over the question's own window (question.yaml's ``sim``). It
prints one line per run: met or missed, attainment, the steady-state test and TTFT p99.
A recommendation that misses as written says the goodput was put above what the
deployment serves in a long run.

    python benchmarks/plan_holds.py [--seed 7] [--questions 12] [--full]
        [--regimes | --more-regimes]
        [--margins 0.96,0.92] [--question-window] [--only 7] [--out results/plan_holds]

``--regimes`` draws each question from one of the regimes where the verdict should
flip (:data:`REGIMES`: a PCIe-only fabric, 2-3 GPUs, very short prompts, a low target
rate that sizes a small budget, long prompts under a tight ITL on a large NVLink or
InfiniBand fleet, MoE models, a prefix-sharing trace with a prefix cache) instead of the
plain mix; the plain mix (the default) draws as before, so earlier seeds ask the same
questions. ``--more-regimes`` draws from :data:`MORE_REGIMES` (a target rate of 2-20
req/s with ``--fabric auto``, a largest-gap ITL target, lognormal lengths with another
attainment and percentile, a preset workload, FP8 weights and KV, RoCE).

Not a test: nothing is asserted; each question takes from seconds to minutes.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import yaml

MODELS = (
    "llama-3.1-8b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "mistral-7b",
    "qwen3-30b-a3b",
    "llama-3-8b",
)
GPUS = ("h100-sxm", "a100-80gb", "h200-sxm", "l40s", "b200")


def question(rng: random.Random) -> list[str]:
    """One random question's flags."""
    return [
        "--model", rng.choice(MODELS),
        "--gpu", rng.choice(GPUS),
        "--gpus", str(rng.choice((4, 8, 8, 16))),
        "--isl", str(rng.choice((128, 512, 2000, 6000))),
        "--osl", str(rng.choice((64, 256, 1000))),
        "--ttft-ms", str(rng.choice((300, 1000, 3000))),
        "--itl-ms", str(rng.choice((25, 50, 100))),
    ]  # fmt: skip


REGIMES = ("pcie", "few_gpus", "short", "low_rate", "long_tight", "moe", "prefix")
DENSE_128K = ("llama-3.1-8b", "llama-3.1-70b")  # context for 8-16k-token prompts
MOE = ("qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b", "deepseek-v3")
TRACE = "../shared/data/traces/mooncake_conversation_trace.jsonl"


def regime_question(rng: random.Random) -> tuple[str, list[str]]:
    """One random question from a regime of :data:`REGIMES`: (regime, flags)."""
    regime = rng.choice(REGIMES)
    slo = ["--ttft-ms", str(rng.choice((1000, 2000, 5000))),
           "--itl-ms", str(rng.choice((30, 50, 100)))]  # fmt: skip
    small = ("llama-3.1-8b", "mistral-7b", "llama-3-8b")
    if regime == "pcie":
        flags = ["--model", rng.choice(("llama-3.1-8b", "llama-3.1-70b")),
                 "--gpu", rng.choice(("l40s", "a100-80gb", "h100-pcie")),
                 "--gpus", str(rng.choice((4, 8))), "--fabric", "pcie",
                 "--isl", str(rng.choice((2000, 6000))), "--osl", "200", *slo]  # fmt: skip
    elif regime == "few_gpus":
        flags = ["--model", rng.choice(small), "--gpu", rng.choice(GPUS),
                 "--gpus", str(rng.choice((2, 3))),
                 "--isl", str(rng.choice((512, 2000, 6000))),
                 "--osl", str(rng.choice((64, 256))), *slo]  # fmt: skip
    elif regime == "short":
        flags = ["--model", rng.choice(small), "--gpu", rng.choice(GPUS),
                 "--gpus", str(rng.choice((4, 8, 16))),
                 "--isl", str(rng.choice((16, 64, 128))),
                 "--osl", str(rng.choice((128, 512))), *slo]  # fmt: skip
    elif regime == "low_rate":
        flags = ["--model", rng.choice((*small, "llama-3.1-70b")),
                 "--gpu", rng.choice(("h100-sxm", "a100-80gb")),
                 "--target-rate", str(rng.choice((0.2, 0.5, 1.0))),
                 "--isl", str(rng.choice((2000, 8000))), "--osl", "256", *slo]  # fmt: skip
    elif regime == "long_tight":
        fabric = rng.choice(("auto", "infiniband", "nvlink"))  # nvlink: one node of 8
        flags = ["--model", rng.choice(DENSE_128K), "--gpu", rng.choice(("h100-sxm", "h200-sxm")),
                 "--gpus", "8" if fabric == "nvlink" else str(rng.choice((16, 32))),
                 "--fabric", fabric,
                 "--isl", rng.choice(("12000", "lognormal:8000:0.6:32000")),
                 "--osl", "300", "--ttft-ms", "5000",
                 "--itl-ms", str(rng.choice((20, 30, 40)))]  # fmt: skip
    elif regime == "moe":
        model = rng.choice(MOE)
        gpus = ["--gpu", "h200-sxm", "--gpus", "16", "--weight-dtype", "released"] if (
            model == "deepseek-v3"
        ) else ["--gpu", rng.choice(("h100-sxm", "a100-80gb", "h200-sxm")),
                "--gpus", str(rng.choice((4, 8)))]  # fmt: skip
        flags = ["--model", model, *gpus, "--isl", str(rng.choice((512, 2000, 8000))),
                 "--osl", str(rng.choice((128, 500))), *slo]  # fmt: skip
    else:  # prefix: a trace that repeats prefixes, each prefill worker caching them
        flags = ["--model", "llama-3.1-8b", "--gpu", rng.choice(("h100-sxm", "a100-80gb")),
                 "--gpus", str(rng.choice((4, 8))), "--trace", TRACE,
                 "--set", "cache.policy=radix",
                 # colocated pools cache prefixes only with these KV settings (else the
                 # plan says its colocated candidates ran without a cache)
                 *(["--set", "kv.admission=on_demand", "--set", "kv.preemption=recompute"]
                   if rng.random() < 0.5 else []),
                 "--ttft-ms", str(rng.choice((2000, 5000))), "--itl-ms", "50"]  # fmt: skip
    return regime, flags


MORE_REGIMES = ("rate_auto", "max_gap", "lognormal", "preset", "fp8", "roce")


def more_regime_question(rng: random.Random) -> tuple[str, list[str]]:
    """One random question from a regime of :data:`MORE_REGIMES` (``--more-regimes``):
    a target rate of 2-20 req/s with ``--fabric auto`` (the fleet, and so the fabric,
    sized by the plan), a largest-gap ITL target, lognormal lengths with another
    attainment and percentile, a preset workload, FP8 weights and KV, a RoCE fabric."""
    regime = rng.choice(MORE_REGIMES)
    slo = ["--ttft-ms", str(rng.choice((1000, 2000, 5000))),
           "--itl-ms", str(rng.choice((30, 50, 100)))]  # fmt: skip
    small = ("llama-3.1-8b", "mistral-7b", "llama-3-8b")
    if regime == "rate_auto":
        flags = ["--model", rng.choice((*small, "llama-3.1-70b")),
                 "--gpu", rng.choice(("h100-sxm", "h200-sxm", "a100-80gb")),
                 "--target-rate", str(rng.choice((2, 5, 10, 20))),
                 "--isl", str(rng.choice((512, 2000, 8000))),
                 "--osl", str(rng.choice((128, 256, 1000))), *slo]  # fmt: skip
    elif regime == "max_gap":
        flags = ["--model", rng.choice(small), "--gpu", rng.choice(("h100-sxm", "a100-80gb")),
                 "--gpus", str(rng.choice((4, 8, 16))),
                 "--isl", str(rng.choice((2000, 6000))), "--osl", "256",
                 "--ttft-ms", str(rng.choice((2000, 5000))),
                 "--itl-ms", str(rng.choice((100, 200, 400))),
                 "--itl-statistic", "max_gap"]  # fmt: skip
    elif regime == "lognormal":
        flags = ["--model", rng.choice(("llama-3.1-8b", "llama-3.1-70b")),
                 "--gpu", rng.choice(("h100-sxm", "h200-sxm", "b200")),
                 "--gpus", str(rng.choice((4, 8, 16))),
                 "--isl", rng.choice(("lognormal:1500:1.0:16000", "lognormal:4000:0.8:32000")),
                 "--osl", rng.choice(("lognormal:200:0.8:2000", "uniform:50:500")),
                 "--attainment", str(rng.choice((0.95, 0.99))),
                 "--percentile", str(rng.choice((90, 95))), *slo]  # fmt: skip
    elif regime == "preset":
        flags = ["--model", rng.choice(("llama-3.1-8b", "llama-3.1-70b")),
                 "--gpu", rng.choice(("h100-sxm", "a100-80gb", "h200-sxm")),
                 "--gpus", str(rng.choice((4, 8, 16))),
                 "--preset", rng.choice(("azure-conv-2023", "azure-code-2023")), *slo]  # fmt: skip
    elif regime == "fp8":
        flags = ["--model", rng.choice(("llama-3.1-8b", "llama-3.1-70b")),
                 "--gpu", rng.choice(("h100-sxm", "h200-sxm", "b200")),
                 "--gpus", str(rng.choice((4, 8))),
                 "--weight-dtype", "fp8", "--kv-dtype", "fp8",
                 "--isl", str(rng.choice((2000, 8000))),
                 "--osl", str(rng.choice((128, 500))), *slo]  # fmt: skip
    else:  # roce: a large fleet joined by RoCE
        flags = ["--model", rng.choice(("llama-3.1-8b", "llama-3.1-70b")),
                 "--gpu", rng.choice(("h100-sxm", "a100-80gb")),
                 "--gpus", str(rng.choice((16, 24))), "--fabric", "roce",
                 "--isl", str(rng.choice((2000, 8000))), "--osl", "256", *slo]  # fmt: skip
    return regime, flags


def run(
    cli: list[str], scenario: Path, out: Path, rate: float | None, sim: dict | None = None
) -> dict:
    """``disaggsim run`` of ``scenario`` (at ``rate`` if given, over ``sim``'s window if
    given); its summary."""
    args = [*cli, "run", str(scenario), "--out", str(out), "--quiet", "--no-plots"]
    if rate is not None:
        args += ["--set", f"workload.rate_per_s={rate:.6g}"]
    for key in ("duration_s", "warmup_s"):
        if sim is not None and key in sim:
            args += ["--set", f"sim.{key}={sim[key]}"]
    subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads((out / "summary.json").read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--questions", type=int, default=12)
    ap.add_argument("--full", action="store_true", help="plan without --quick")
    ap.add_argument("--regimes", action="store_true", help="draw from REGIMES (see above)")
    ap.add_argument(
        "--more-regimes", action="store_true", help="draw from MORE_REGIMES (see above)"
    )
    ap.add_argument("--margins", default="", help="also run at these shares of the rate")
    ap.add_argument(
        "--question-window",
        action="store_true",
        help="also run a shortened file over the question's own window",
    )
    ap.add_argument(
        "--only",
        default="",
        help="plan only these questions of the seed's draw (indices, e.g. 7 or 3,7)",
    )
    ap.add_argument("--out", type=Path, default=Path("results/plan_holds"))
    a = ap.parse_args(argv)
    only = {int(x) for x in a.only.split(",") if x}
    cli = [sys.executable, "-m", "disaggsim"]
    rng = random.Random(a.seed)
    margins = [float(x) for x in a.margins.split(",") if x]
    a.out.mkdir(parents=True, exist_ok=True)
    for i in range(a.questions):
        regime, flags = (
            more_regime_question(rng)
            if a.more_regimes
            else regime_question(rng)
            if a.regimes
            else ("mix", question(rng))
        )
        name = f"q{a.seed}-{i}" + (f"-{regime}" if a.regimes or a.more_regimes else "")
        if only and i not in only:  # drawn all the same: later questions stay the same
            continue
        plan_out = a.out / name
        mode = [] if a.full else ["--quick"]
        t0 = time.perf_counter()
        p = subprocess.run(
            [*cli, "plan", *flags, *mode, "--workers", "1", "--quiet", "--out", str(plan_out)],
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - t0
        verdict = next((ln for ln in p.stdout.splitlines() if ln.startswith("verdict")), "")
        print(f"{name} {' '.join(flags)} rc {p.returncode} {wall:.0f} s {verdict}", flush=True)
        if p.returncode != 0:
            print(f"  {(p.stderr.strip().splitlines() or [''])[-1]}", flush=True)
        elif (plan_out / "plan.json").exists():
            why = json.loads((plan_out / "plan.json").read_text()).get("reason", "")
            print(f"  reason: {why}", flush=True)
        rec = plan_out / "recommended.yaml"
        if p.returncode != 0 or not rec.exists():
            continue
        written = yaml.safe_load(rec.read_text())
        rate = float(written["workload"]["rate_per_s"])
        asked = yaml.safe_load((plan_out / "question.yaml").read_text())["sim"]
        runs = [(f"x{share:g}", share, None) for share in (1.0, *margins)]
        if a.question_window and written["sim"]["duration_s"] != asked["duration_s"]:
            print(f"  file {written['sim']['duration_s']:g} s, question {asked['duration_s']:g} s")
            runs.append((f"x1 over {asked['duration_s']:g} s", 1.0, asked))
        for tag, share, sim in runs:
            out = a.out / f"{name}-{tag.replace(' ', '-')}"
            s = run(cli, rec, out, None if share == 1.0 else share * rate, sim)
            print(
                f"  {tag} ({share * rate:.4g} req/s): "
                f"{'met' if s['meets_slo'] else 'MISSED'}, attainment {s['slo_attainment']:.3f}, "
                f"stable {s['stable']} (p {s['stability_p_value']:.2g}), "
                f"TTFT p99 {s['ttft_p99_s']:.3g} s, TPOT p50 {s['tpot_p50_s'] * 1e3:.1f} ms",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
