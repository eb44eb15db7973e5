"""How much one scenario's steady-state goodput moves with the scenario's seed and the
search's starting bracket: the run-to-run spread a goodput (and a ratio of two, a
planner's margin) carries.

    python benchmarks/goodput_spread.py SCENARIO [SCENARIO ...] [--seeds 5] \
        [--search-seeds 1] [--min-requests 1000] [--brackets 0.5,2 0.25,4] \
        [--set PATH=VALUE ...] [--json]

Each scenario's goodput is searched at full accuracy (``disaggsim.sweep.goodput``,
``--search-seeds`` seeds per search whose attainment is averaged, the default run-length
rule with ``--min-requests`` measured requests a run, as ``plan --min-requests``) for
``--seeds`` scenario seeds (1, 1001, 2001, ...: a search of K seeds runs seed, seed + 1,
..., seed + K - 1, so no two searches share a run) and every bracket; a bracket ``a,b``
is ``(a x G, b x G)`` where ``G`` is a first search's goodput at seed 1 from ``(0.5, 4)``
req/s (so the brackets are the same relative to every scenario's goodput). Per scenario
it prints each search's goodput and status, then the sd of their logarithms and the
spread (max - min) / median over all searches, over seeds at one bracket, and over
brackets at one seed. Searches run side by side on a local process pool
(``goodput_many``); results do not depend on the pool. Not a test: nothing is asserted.
docs/sweeps.md ("How much a goodput moves") quotes it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def spread(values: list[float]) -> float:
    """(max - min) / median of ``values``; NaN for fewer than two."""
    if len(values) < 2:
        return float("nan")
    return (max(values) - min(values)) / statistics.median(values)


def log_sd(values: list[float]) -> float:
    """Standard deviation of the logarithms (about the relative sd); NaN for fewer than two."""
    if len(values) < 2 or min(values) <= 0:
        return float("nan")
    return statistics.stdev(math.log(v) for v in values)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(REPO))
    from disaggsim.sweep import RunLengthRule, goodput, goodput_many
    from disaggsim.sweep.core import as_source

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="+")
    ap.add_argument("--seeds", type=int, default=5, help="scenario seeds 1, 1001, ... (N)")
    ap.add_argument("--search-seeds", type=int, default=1, help="seeds per search")
    ap.add_argument("--min-requests", type=int, default=1000, help="measured requests a run")
    ap.add_argument(
        "--brackets",
        nargs="+",
        default=["0.5,2", "0.25,4"],
        help="starting brackets as multiples of a first search's goodput: a,b ...",
    )
    ap.add_argument("--set", action="append", default=[], help="PATH=VALUE for every scenario")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    brackets = [tuple(float(x) for x in b.split(",")) for b in args.brackets]
    rule = RunLengthRule(min_measured_requests=args.min_requests)
    report: list[dict[str, Any]] = []
    for path in args.scenarios:
        start = time.monotonic()
        first = goodput(
            path, 0.5, 4.0, overrides=[*args.set, "seed=1"], seeds=args.search_seeds, rule=rule
        )
        g0 = first.rate_per_s
        sources, keys = [], []
        seeds = [1 + 1000 * i for i in range(args.seeds)]
        for seed in seeds:
            for lo, hi in brackets:
                sources.append(as_source(path, [*args.set, f"seed={seed}"]))
                keys.append((seed, lo, hi))
        results = goodput_many(
            sources,
            0,
            0,
            brackets=[(lo * g0, hi * g0) for _, lo, hi in keys],
            seeds=args.search_seeds,
            rule=rule,
        )
        rows: list[dict[str, Any]] = [
            {"seed": s, "bracket": [lo, hi], "goodput_per_s": r.rate_per_s, "status": r.status}
            for (s, lo, hi), r in zip(keys, results, strict=True)
        ]
        rates = [r["goodput_per_s"] for r in rows]
        by_seed = [
            spread([r["goodput_per_s"] for r in rows if r["bracket"] == list(b)]) for b in brackets
        ]
        by_bracket = [spread([r["goodput_per_s"] for r in rows if r["seed"] == s]) for s in seeds]
        entry: dict[str, Any] = {
            "scenario": path,
            "first_goodput_per_s": g0,
            "rows": rows,
            "median_per_s": statistics.median(rates),
            "spread_all": spread(rates),
            "log_sd": log_sd(rates),
            "spread_over_seeds_max": max(by_seed),
            "spread_over_brackets_max": max(by_bracket),
            "wall_s": time.monotonic() - start,
        }
        report.append(entry)
        if not args.json:
            print(f"{path}: first search {g0:.4g} req/s ({first.status})")
            for r in rows:
                print(
                    f"  seed {r['seed']} bracket {r['bracket'][0]:g}-{r['bracket'][1]:g} x G: "
                    f"{r['goodput_per_s']:.4g} req/s ({r['status']})"
                )
            parts = [f"all {entry['spread_all']:.1%}"]
            if len(seeds) > 1 and len(brackets) > 1:
                parts.append(f"over seeds at one bracket up to {max(by_seed):.1%}")
            if len(brackets) > 1:
                parts.append(f"over brackets at one seed up to {max(by_bracket):.1%}")
            print(
                f"  median {entry['median_per_s']:.4g} req/s, sd (log) {entry['log_sd']:.1%}; "
                f"spread (max - min) / median: {', '.join(parts)}; {entry['wall_s']:.0f} s",
                flush=True,
            )
    if args.json:
        print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
