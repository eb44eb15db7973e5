"""Does one goodput search averaging the attainment over N seeds land on the mean of the
N seeds' own goodputs, or on the worst one?

    python benchmarks/seed_mean.py SCENARIO [SCENARIO ...] --bracket 2,3 [--seeds 4]

For each scenario: N goodput searches of one seed each (the scenario's seed + 0..N-1),
then one search averaging the attainment over the same N seeds (``seeds=N``: what
``plan --seeds`` runs; the planner's settling of a close call takes the mean of one-seed
searches instead), all at full accuracy (the default run-length
rule, 1 % bisection, confirmed at twice the horizon) from the same starting bracket
(req/s). Prints the per-seed goodputs, their mean and worst, and the averaged search's.
Runs on a local pool of 2 processes. Not a test: nothing is asserted; docs/sweeps.md
("How much a goodput moves") quotes it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    from disaggsim.config.loader import load_scenario
    from disaggsim.sweep.core import source_of
    from disaggsim.sweep.executors import ProcessExecutor
    from disaggsim.sweep.goodput import goodput_many

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="+")
    ap.add_argument("--bracket", required=True, help="LO,HI req/s")
    ap.add_argument("--seeds", type=int, default=4)
    a = ap.parse_args(argv)
    lo, hi = (float(x) for x in a.bracket.split(","))
    with ProcessExecutor(2) as ex:
        for path in a.scenarios:
            t0 = time.perf_counter()
            base = load_scenario(path).scenario.seed
            srcs = [
                source_of(load_scenario(path, [f"seed={base + k}"]), path) for k in range(a.seeds)
            ]
            each = [r.rate_per_s for r in goodput_many(srcs, lo, hi, executor=ex)]
            avg = goodput_many([srcs[0]], lo, hi, seeds=a.seeds, executor=ex)[0]
            print(
                f"{path}: per seed {', '.join(f'{g:.4g}' for g in each)} req/s, mean "
                f"{statistics.mean(each):.4g}, worst {min(each):.4g}; one search averaging "
                f"the {a.seeds} seeds {avg.rate_per_s:.4g} ({avg.status}); "
                f"{time.perf_counter() - t0:.0f} s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
