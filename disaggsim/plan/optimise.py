"""The planner's search over deployments: branch and bound over families, hill climbing
inside each family (docs/planning.md, "Search").

A **family** is every deployment sharing the discrete choices that the analytic model
prices (kind, TP per pool, weight dtype): a disaggregated family's members differ in
their prefill and decode worker counts, a chunked family's in the chunk size. Each
family carries an optimistic **bound** on its goodput per GPU (the analytic capacity
of a perfectly packed fleet, :mod:`disaggsim.plan.analytic`) and **start** points.

The optimiser is pure: it is given an ``evaluate`` function (candidates → goodput per
GPU; the planner passes steady-state goodput by simulation, tests pass an oracle) and:

1. evaluates the start points of the family with the highest bound of each kind;
2. then, wave after wave, for every family not yet settled: **prunes** it when its
   bound × ``bound_slack`` is below the best goodput found (it cannot win), each member
   found counted at most at its own family's ceiling: its bound when that is a true
   one (``true_bound``), else its bound × ``bound_slack`` — the premise of pruning
   applied to the measurement that prunes; otherwise
   evaluates its start points, or the unevaluated **neighbours** of its best member
   (local moves, in tiers: the nearest tier with anything unevaluated); once every
   neighbour is evaluated, a family with a model (``predict``: goodput per GPU of its
   other members, predicted from what its evaluated members measured) evaluates the
   unevaluated members predicted to beat its best by more than ``min_gain``, the best
   predicted first, ``predict_width`` at a time; a family with nothing left to evaluate
   is settled. ``explore_floor`` > 0 also stops a family whose best member is below that
   share of the best found (quick mode); the best family of its kind with
   ``floor_at_nearest`` (a start that can be off its family's best: a chunk size, an
   analytic split) only once that member's nearest neighbours (its first non-empty
   tier) have been evaluated, and a family with ``floor_at_nearest_always`` (a start
   that is a setting, not a guess: the scenario's chunk) likewise whether or not it is
   the best of its kind (a nearest move that beats its best becomes the best, whose
   nearest moves are then tried: the family climbs while it gains). With ``screen``, those nearest neighbours of a family
   behind the floor are **screened**: the floor only asks whether one reaches the
   family's best, so ``evaluate`` is told that value (goodput per GPU) for each and may
   return 0 for one below it (the planner runs its goodput search from there and stops
   at a miss: one run instead of a search). A member below its family's best changes
   nothing the walk decides (its family's, its kind's and the overall best, pruning,
   the floor), so the walk is the one without screening;
3. stops when no family proposes anything, or after ``max_waves`` (then the search is
   reported as not converged).

A neighbour replaces its family's best member only when it is better by more than
``min_gain`` (a share: the evaluation's tolerance), so noise does not send the climb
wandering; the result is then a local optimum to within that share.

Every wave is one call of ``evaluate``: the planner's searches of a wave's candidates
run side by side on the executor, and the next wave starts when the last has ended.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["Family", "OptimiseResult", "optimise"]

C = TypeVar("C", bound=Hashable)


@dataclass(slots=True)
class Family(Generic[C]):
    """One family: its name, kind, bound (goodput per GPU, optimistic), start points, a
    neighbourhood function over its members (tiers of neighbours, nearest first) and,
    optionally, a model that predicts the goodput per GPU of members the local moves
    need not reach: ``predict(best, measured)`` with ``measured`` every evaluated member
    of the family and its goodput per GPU."""

    name: str
    kind: str
    bound_per_gpu: float
    starts: tuple[C, ...]
    neighbours: Callable[[C], Sequence[Sequence[C]]]  # tiers, nearest first
    state: str = "open"  # open | settled | pruned | stopped
    best: C | None = None
    evaluated: list[C] = field(default_factory=list)
    # the bound holds for the family's true goodput (MoE: plan/moe_bound.py), so a
    # member measured above it is a measurement artefact (a short run ending before its
    # queues grow): pruning counts it at the bound (else at the bound x the slack)
    true_bound: bool = False
    predict: Callable[[C, Mapping[C, float]], Mapping[C, float]] | None = None
    # the explore floor stops the family, while it is the best of its kind, only once
    # its best member's nearest neighbours are evaluated: for families whose start can
    # be off their best (a chunk size, an analytic split)
    floor_at_nearest: bool = False
    # the same whether or not it is the best of its kind: a start that is a setting,
    # not a guess (the scenario's chunk), can be far off the family's best, and a
    # family judged there is stopped on a value it does not have
    floor_at_nearest_always: bool = False
    # how many tiers of its best member's neighbours the floor waits for (a chunked
    # family: the ladder's rungs, then the rungs between them: search.chunk_neighbours)
    floor_tiers: int = 1
    # tiers past this many are tried only while its best member serves something (the
    # rungs between a chunked family's: none finer serves where no rung does)
    coarse_tiers: int | None = None


@dataclass(frozen=True, slots=True)
class OptimiseResult(Generic[C]):
    values: dict  # candidate -> goodput per GPU, every one evaluated
    family_of: dict  # candidate -> family name
    states: dict  # family name -> open | settled | pruned | stopped
    waves: int
    converged: bool  # every family settled, pruned or stopped before max_waves

    @property
    def best(self) -> C | None:
        return max(self.values, key=lambda c: self.values[c]) if self.values else None


def optimise(
    families: Sequence[Family[C]],
    evaluate: Callable[[list[C]], list[float]],
    *,
    bound_slack: float = 1.25,
    explore_floor: float = 0.0,
    max_waves: int = 40,
    min_gain: float = 0.0,
    predict_width: int = 2,
    screen: bool = False,
    floor_exempt: Collection[str] = (),
) -> OptimiseResult[C]:
    """The search (module docstring). ``evaluate(candidates)`` gives each one's goodput
    per GPU; with ``screen``, ``evaluate(candidates, screens)``, ``screens`` mapping the
    screened ones to the value each must reach (step 2), else it may give 0. The
    families named in ``floor_exempt`` are never stopped by ``explore_floor`` (they are
    still pruned, screened and settled): a quick plan walks on the families its floor
    stopped where they could change its verdict (plan/confirm.py)."""
    values: dict[C, float] = {}
    family_of: dict[C, str] = {}

    def best_value() -> float:
        return max(values.values(), default=0.0)

    def ceiling(fam: Family[C]) -> float:
        """The most a member of ``fam`` can truly reach: its bound when that is a true
        one, else its bound x the slack (what pruning assumes of every family)."""
        return fam.bound_per_gpu * (1.0 if fam.true_bound else bound_slack)

    def pruning_value() -> float:
        """The best found, each member counted at most at its family's ceiling: a value
        above it is a measurement artefact (a run too short for its queues to grow),
        and pruning on it would drop families that could win."""
        return max((min(v, ceiling(owner_of[c])) for c, v in values.items()), default=0.0)

    owner_of: dict[C, Family[C]] = {}

    def record(cands: list[C], owner: dict[C, Family[C]], screens: dict[C, float]) -> None:
        got = evaluate(cands, screens) if screen else evaluate(cands)  # type: ignore[call-arg]
        for c, v in zip(cands, got, strict=True):
            values[c] = float(v)
            fam = owner[c]
            owner_of[c] = fam
            family_of[c] = fam.name
            fam.evaluated.append(c)
            # a neighbour must beat the family's best by more than the evaluation's noise
            if fam.best is None or values[c] > values[fam.best] * (1 + min_gain):
                fam.best = c

    # wave 1: the most promising family of each kind, so later waves can prune
    first: dict[str, Family[C]] = {}
    for fam in families:
        if fam.kind not in first or fam.bound_per_gpu > first[fam.kind].bound_per_gpu:
            first[fam.kind] = fam
    waves = 0
    pending = list(first.values())
    while True:
        best = best_value()
        prune_below = pruning_value()
        kind_best: dict[str, float] = {}
        for c, v in values.items():
            k = owner_of[c].kind
            kind_best[k] = max(kind_best.get(k, v), v)
        proposals: list[C] = []
        owner: dict[C, Family[C]] = {}
        screens: dict[C, float] = {}
        for fam in pending if waves == 0 else families:
            if fam.state != "open":
                continue
            behind = False
            if prune_below > 0 and fam.bound_per_gpu * bound_slack < prune_below:
                fam.state = "pruned"
                continue
            if fam.best is None:
                todo = [c for c in fam.starts if c not in values]
            else:
                tiers = fam.neighbours(fam.best)
                if fam.coarse_tiers is not None and not values[fam.best] > 0:
                    tiers = tiers[: fam.coarse_tiers]
                # the best family of its kind, when its start can be off its best (a
                # chunked pool's start chunk, an analytic split), is judged at its best
                # member's nearest moves: the verdict compares the best of each kind
                at_nearest = fam.floor_at_nearest_always or (
                    fam.floor_at_nearest and values[fam.best] >= kind_best[fam.kind]
                )
                filled = [t for t in tiers if t][: fam.floor_tiers]
                nearest = [c for t in filled for c in t] if at_nearest else []
                behind = explore_floor > 0 and values[fam.best] < explore_floor * best
                if behind and fam.name not in floor_exempt and all(c in values for c in nearest):
                    fam.state = "stopped"
                    continue
                todo = []
                for tier in tiers:  # the first tier not yet tried
                    todo = [c for c in tier if c not in values]
                    if todo:
                        break
                if not todo and fam.predict is not None:
                    todo = _promising(fam, values, min_gain, predict_width)
            todo = [c for c in dict.fromkeys(todo) if c not in owner]
            if not todo:
                if fam.best is not None or not fam.starts:
                    fam.state = "settled"
                continue
            for c in todo:
                owner[c] = fam
                # its nearest tier: "better?" (not for a family whose best serves
                # nothing: any goodput beats it, and a screen at 0 req/s is no rate)
                if screen and behind and fam.best is not None and values[fam.best] > 0:
                    screens[c] = values[fam.best]
            proposals += todo
        if not proposals:
            if waves == 0:  # nothing to start with: go on to every family
                waves = 1
                continue
            break
        if waves >= max_waves:
            break
        record(proposals, owner, screens)
        waves += 1
    converged = all(f.state != "open" for f in families)
    return OptimiseResult(
        values=values,
        family_of=family_of,
        states={f.name: f.state for f in families},
        waves=waves,
        converged=converged,
    )


def _promising(fam: Family[C], values: Mapping[C, float], min_gain: float, width: int) -> list[C]:
    """The ``width`` unevaluated members the family's model predicts best, among those
    predicted to beat its best member by more than ``min_gain``."""
    assert fam.predict is not None and fam.best is not None
    measured = {c: values[c] for c in fam.evaluated}
    predicted = fam.predict(fam.best, measured)
    above = values[fam.best] * (1 + min_gain)
    todo = [c for c, v in predicted.items() if v > above and c not in values]
    todo.sort(key=lambda c: -predicted[c])  # stable: ties keep the model's order
    return todo[:width]
