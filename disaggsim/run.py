"""Run one scenario: build the cost models, workload and fabric, simulate, derive frames.

:func:`simulate` and :func:`write_results` are part of the package API (``from disaggsim
import load_scenario, simulate``; see ``disaggsim/__init__.py``)::

    res = simulate(load_scenario("scenarios/quickstart.yaml", ["workload.rate_per_s=4"]))
    res.summary.ttft_p99_s, res.requests.head()

:func:`write_results` writes a result folder (see docs/metrics.md for its files).
"""

from __future__ import annotations

import json
import os
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd
import yaml

from disaggsim.config.loader import LoadedScenario, load_scenario
from disaggsim.config.scenario import PoolConfig, Scenario
from disaggsim.costmodel.interface import WorkerCost
from disaggsim.engine.cluster import (
    EngineConfig,
    LinkWindow,
    PoolSpec,
    RawResult,
    StopCheck,
    WorkerFailureEvent,
    run_cluster,
)
from disaggsim.engine.config import Role
from disaggsim.engine.prefix import PrefixSetup
from disaggsim.engine.records import Samples
from disaggsim.errors import InvariantError, UserError, check_callable, check_switch
from disaggsim.metrics.early_stop import CHECK_EVERY_S, CertainMiss
from disaggsim.metrics.invariants import check_run
from disaggsim.metrics.reconstruct import GapDistribution, request_frame
from disaggsim.metrics.summary import summarize
from disaggsim.metrics.summary_table import Summary
from disaggsim.output import Written, write_folder
from disaggsim.units import GiB
from disaggsim.validity import check_prefill_budget
from disaggsim.workload import generate_requests
from disaggsim.workload.chains import PrefixChains
from disaggsim.workload.requests import Requests

ProgressFn = Callable[[float, int, int], None]


@dataclass(frozen=True)
class SimulationResult:
    scenario: Scenario
    raw_scenario: dict
    requests: pd.DataFrame  # one row per request (docs/metrics.md)
    timeseries: pd.DataFrame  # per-worker samples at state changes
    summary: Summary
    gaps: GapDistribution
    raw: RawResult
    wall_s: float  # the simulate call, frames and summary included (summary.wall_s)


def _pool_key(role: str) -> str:
    return "pool" if role == "colocated" else f"{role}_pool"


def build_costs(scenario: Scenario, label: str = "<scenario>") -> dict[str, WorkerCost]:
    """One cost model per pool role; a configuration that cannot run is a UserError."""
    from disaggsim.costmodel.moe import build_cost

    costs: dict[str, WorkerCost] = {}
    # a topology fabric's node size decides how many nodes an MoE unit's all-to-all spans,
    # as it decides where the fabric places the unit's ranks
    gpn = getattr(scenario.fabric, "gpus_per_node", None)
    for role, pool in scenario.pools.items():
        try:
            costs[role] = build_cost(  # dense roofline, or MoE/MLA with the pool's layout
                scenario.model,
                pool.gpu,
                pool.tp,
                dp=pool.dp,
                ep=pool.ep,
                # options at their defaults model nothing (and a written scenario.yaml, which
                # spells every default out, runs as the scenario it resolves)
                moe=pool.moe.model_dump(exclude_defaults=True) if pool.moe else None,
                weight_dtype=scenario.weight_dtype,
                kv_dtype=scenario.kv_dtype,
                engine=scenario.engine,
                attention_backend=scenario.attention_backend,
                gpu_mem_util=pool.gpu_mem_util,
                max_seqs=pool.max_batch_seqs,
                max_batch_tokens=pool.max_batch_tokens,
                activation_reserve_bytes=(
                    None
                    if pool.activation_reserve_gib is None
                    else pool.activation_reserve_gib * GiB
                ),
                gpus_per_node=gpn,
            )
        except UserError as e:
            raise UserError(f"{label}: {_pool_key(role)}: {e}") from None
        if costs[role].kv_capacity_tokens < 16:
            raise UserError(
                f"{label}: {_pool_key(role)}: no room for KV cache after the weights of "
                f"{scenario.model} on {pool.gpus_per_worker} x {pool.gpu} (raise tp or gpu_mem_util)"
            )
        if costs[role].kv_capacity_tokens < scenario.kv.block_tokens:
            raise UserError(
                f"{label}: kv.block_tokens: {scenario.kv.block_tokens} tokens per block, but "
                f"{_pool_key(role)} has room for {costs[role].kv_capacity_tokens} KV tokens: "
                "not one block (lower block_tokens, or raise tp or gpu_mem_util)"
            )
    return costs


def build_transfer(scenario: Scenario, label: str = "<scenario>"):
    """KV handoff time function ``(nbytes, src, dst) -> s`` for a ``kind: link`` fabric.

    Each GPU of the prefill worker sends its own shard over its own link, so the shards
    move in parallel: bandwidth scales with min(prefill tp, decode tp). Between different
    GPU types the slower end sets the link rate. (A ``kind: topology`` fabric is built by
    :func:`build_topology` instead.)"""
    from disaggsim.costmodel.kv import kv_transfer, link_bandwidth_bytes_per_s
    from disaggsim.fabric.config import FabricTopologyConfig

    if scenario.architecture != "disaggregated" or isinstance(
        scenario.fabric, FabricTopologyConfig
    ):
        return None
    from disaggsim.validity import check_link_fabric

    check_link_fabric(scenario, label)  # nvlink only inside one node of one GPU type
    fab = scenario.fabric
    p, d = scenario.prefill_pool, scenario.decode_pool
    assert p is not None and d is not None
    if fab.bandwidth_gb_per_s is not None:
        bw = fab.bandwidth_gb_per_s * 1e9
    else:
        try:
            bw = min(
                link_bandwidth_bytes_per_s(fab.link, p.gpu),
                link_bandwidth_bytes_per_s(fab.link, d.gpu),
            )
        except UserError as e:  # e.g. a GPU without NVLink: say where
            raise UserError(f"{label}: fabric.link: {e}") from None
        if bw <= 0:
            raise UserError(
                f"{label}: fabric.link: {fab.link} is not available between {p.gpu} and {d.gpu} "
                "(set fabric.bandwidth_gb_per_s or choose another link)"
            )
    shards = min(p.tp, d.tp)
    latency = None if fab.latency_us is None else fab.latency_us * 1e-6
    # kv_transfer's checks and defaults once; per handoff its time_s, the same arithmetic
    link = kv_transfer(0.0, fab.link, bandwidth_bytes_per_s=bw, latency_s=latency)
    bw_bytes_per_s, latency_s = link.bandwidth_bytes_per_s, link.latency_s

    def transfer_time(nbytes: int, src: int, dst: int) -> float:
        return latency_s + nbytes / shards / bw_bytes_per_s

    return transfer_time


def build_topology(scenario: Scenario, label: str = "<scenario>"):
    """The placed topology of a ``kind: topology`` fabric (None otherwise)."""
    from disaggsim.fabric import FabricTopologyConfig, pool_layouts
    from disaggsim.fabric import build_topology as _build

    if scenario.architecture != "disaggregated" or not isinstance(
        scenario.fabric, FabricTopologyConfig
    ):
        return None
    layouts = pool_layouts(
        [(r, p.gpu, p.num_workers, p.tp, max(p.dp, 1)) for r, p in scenario.pools.items()],
        _max_workers(scenario),
    )
    try:
        return _build(
            scenario.fabric,
            layouts,
            host_paths=scenario.kv.preemption == "swap",
            cache_paths=scenario.cache is not None,
        )
    except UserError as e:
        raise UserError(f"{label}: {e}") from None


def _max_workers(scenario: Scenario) -> dict[str, int]:
    """The most workers each autoscaled pool may grow to."""
    out: dict[str, int] = {}
    for role in scenario.pools:
        auto = scenario.autoscale.for_role(role)
        if auto is not None:
            out[role] = auto.max_workers
    return out


def worker_offsets(scenario: Scenario) -> dict[str, int]:
    """Global index of each pool's first worker, as the engine numbers them: pools in
    order, each with ``max(num_workers, autoscale max_workers)`` workers."""
    most = _max_workers(scenario)
    offset: dict[str, int] = {}
    n = 0
    for role, pool in scenario.pools.items():
        offset[role] = n
        n += max(pool.num_workers, most.get(role, 0))
    return offset


def link_windows(scenario: Scenario, topology=None, label: str = "<scenario>") -> tuple:
    """The scenario's link failure windows, each with the indices of the topology links it
    names (None: every link); a pattern that matches no link is a one-line error."""
    import fnmatch

    out = []
    for i, w in enumerate(scenario.failures.links):
        links: tuple[int, ...] | None = None
        if w.links is not None and topology is not None:
            ids = [link.id for link in topology.links]
            hits: list[int] = []
            for pat in w.links:
                hit = [j for j, lid in enumerate(ids) if fnmatch.fnmatchcase(lid, pat)]
                if not hit:
                    shown = ", ".join(ids[:8]) + (", ..." if len(ids) > 8 else "")
                    raise UserError(
                        f"{label}: failures.links.{i}.links: {pat!r} matches no link "
                        f"(links: {shown})"
                    )
                hits += [j for j in hit if j not in hits]
            links = tuple(hits)
        out.append(LinkWindow(w.start_s, w.duration_s, w.factor, links))
    return tuple(out)


def engine_config(
    scenario: Scenario,
    costs: dict[str, WorkerCost],
    replication: int = 0,
    topology=None,
    autoscalers: tuple = (),
    label: str = "<scenario>",
    prefix_chains: PrefixChains | None = None,
) -> EngineConfig:
    """The engine's configuration of a scenario; ``prefix_chains`` (the requests')
    turns on prefix caching where the scenario has a ``cache:`` section."""
    from disaggsim.catalog import get_model

    pools = []
    for role, pool in scenario.pools.items():
        auto = scenario.autoscale.for_role(role)
        pools.append(_pool_spec(role, pool, costs[role], auto.max_workers if auto else None))
    kv = scenario.kv
    return EngineConfig(
        pools=tuple(pools),
        prefill_policy=scenario.router.prefill_policy,
        decode_policy=scenario.router.decode_policy,
        first_token_from=scenario.first_token_from,
        block_tokens=kv.block_tokens,
        kv_admission=kv.admission,
        kv_watermark=kv.watermark,
        preemption=kv.preemption,
        backpressure=scenario.router.backpressure,
        reserved_decode_tokens=scenario.router.reserved_decode_tokens,
        max_queue=scenario.router.max_queue,
        client_timeout_s=scenario.router.client_timeout_s,
        worker_failures=failure_schedule(scenario, costs, replication),
        link_windows=link_windows(scenario, topology, label),
        swap_time=_swap_time_fn(scenario, costs),
        topology=topology,
        autoscalers=autoscalers,
        overlap=bool(getattr(scenario.fabric, "overlap", False)),
        num_layers=get_model(scenario.model).num_layers,
        context_tokens=get_model(scenario.model).context_tokens,
        horizon_s=scenario.sim.duration_s + scenario.sim.max_drain_s,
        prefix=prefix_setup(scenario, prefix_chains, label),
    )


def prefix_setup(
    scenario: Scenario, chains: PrefixChains | None, label: str = "<scenario>"
) -> PrefixSetup | None:
    """Prefix caching for the engine: the ``cache:`` section, the requests' chains, the
    promotion time of the prefilling pool's GPUs (host DRAM over PCIe, the remote store
    over the NIC, each GPU its own shard, the two in parallel) and its node size. None
    without a ``cache:`` section."""
    from disaggsim.catalog import get_gpu
    from disaggsim.costmodel.kv import kv_transfer, link_bandwidth_bytes_per_s

    if scenario.cache is None:
        return None
    if chains is None:
        raise UserError(
            f"{label}: cache: the workload has no prefix chains to cache (use a trace with "
            "hash_ids, e.g. format: mooncake, or kind: sessions)"
        )
    pool = scenario.prefill_pool if scenario.architecture == "disaggregated" else scenario.pool
    assert pool is not None
    pcie_bw = link_bandwidth_bytes_per_s("pcie", pool.gpu)
    nic_bw = link_bandwidth_bytes_per_s("infiniband", pool.gpu)

    def promote_time(cost: WorkerCost, pcie_bytes: int, nic_bytes: int) -> float:
        g = max(cost.num_gpus, 1)
        t = 0.0
        if pcie_bytes:
            t = kv_transfer(pcie_bytes / g, "pcie", bandwidth_bytes_per_s=pcie_bw).time_s
        if nic_bytes:
            nic = kv_transfer(nic_bytes / g, "infiniband", bandwidth_bytes_per_s=nic_bw).time_s
            t = max(t, nic)
        return t

    return PrefixSetup(
        cache=scenario.cache,
        chains=chains,
        promote_time=promote_time,
        gpus_per_node=get_gpu(pool.gpu).gpus_per_node,
    )


def restart_delay_s(scenario: Scenario, cost: WorkerCost) -> float:
    """Provisioning plus loading one GPU's share of the weights."""
    f = scenario.failures
    return f.provision_s + cost.weights_bytes / cost.num_gpus / (f.weights_load_gb_per_s * 1e9)


def failure_schedule(
    scenario: Scenario, costs: dict[str, WorkerCost], replication: int = 0
) -> tuple[WorkerFailureEvent, ...]:
    """Scheduled and random worker failures as engine events (global worker indices).

    Random failures: each worker of a pool fails after an exponential up-time of mean
    ``mtbf_s``, is repaired in an exponential time of mean ``mttr_s`` and then restarts
    (provisioning + weights load); drawn from stream 4 of the scenario's seed sequence
    (streams 0-3 belong to the workload). Workers an autoscaled pool may start beyond
    its initial ones draw theirs after every initial worker's (so the initial workers'
    failures are the same with and without autoscaling); a failure while a worker holds
    no GPUs (released) does not happen."""
    offset = worker_offsets(scenario)
    most = _max_workers(scenario)
    events = []
    for f in scenario.failures.workers:
        role, _, idx = f.worker.partition(":")
        down = f.repair_s + restart_delay_s(scenario, costs[role])
        events.append(WorkerFailureEvent(f.at_s, offset[role] + int(idx), down))
    if scenario.failures.random:
        rng = np.random.default_rng(
            np.random.SeedSequence([scenario.seed, replication]).spawn(5)[4]
        )
        horizon = scenario.sim.duration_s
        schedule = [
            (r, range(scenario.pools[r.pool].num_workers)) for r in scenario.failures.random
        ]
        schedule += [
            (r, range(scenario.pools[r.pool].num_workers, most.get(r.pool, 0)))
            for r in scenario.failures.random
        ]
        for r, workers in schedule:
            restart = restart_delay_s(scenario, costs[r.pool])
            for i in workers:
                t = 0.0
                while True:
                    t += rng.exponential(r.mtbf_s)
                    if t >= horizon:
                        break
                    down = rng.exponential(r.mttr_s) + restart
                    events.append(WorkerFailureEvent(t, offset[r.pool] + i, down))
                    t += down
    return tuple(sorted(events, key=lambda e: (e.at_s, e.worker)))


def _swap_time_fn(scenario: Scenario, costs: dict[str, WorkerCost]):
    """KV swap copies over each GPU's PCIe link, per the profile's pinned-copy fit (used
    where the fabric has no topology; a topology fabric moves them as flows over its
    PCIe links, :meth:`disaggsim.engine.cluster.Cluster.swap_copy`)."""
    from disaggsim.costmodel.ops import copy_time_s
    from disaggsim.hardware.profile import load_profile

    params = {}
    for role, pool in scenario.pools.items():
        prof = load_profile(pool.gpu)
        params[id(costs[role])] = (prof.copy.get("d2h_pinned"), prof.copy.get("h2d_pinned"))

    def swap_time(cost: WorkerCost, nbytes: float, direction: str) -> float:
        out_p, in_p = params[id(cost)]
        p = out_p if direction == "out" else in_p
        per_gpu = nbytes / cost.num_gpus  # each GPU copies its own shard over its own link
        if p is None:
            return 20e-6 + per_gpu / 25e9
        return float(copy_time_s(p, per_gpu))

    return swap_time


def _pool_spec(
    role: str, pool: PoolConfig, cost: WorkerCost, max_workers: int | None = None
) -> PoolSpec:
    return PoolSpec(
        role=cast(Role, role),
        num_workers=pool.num_workers,
        cost=cost,
        max_batch_seqs=pool.max_batch_seqs,
        max_batch_tokens=pool.max_batch_tokens,
        scheduler=pool.scheduler,
        max_workers=max_workers,
    )


def build_autoscalers(scenario: Scenario, costs: dict[str, WorkerCost], mean_prompt_tokens: int):
    """(role, controller, cold start s) for each autoscaled pool."""
    from disaggsim.autoscale import Autoscaler, cold_start_s, decode_step_fn, prefill_tokens_per_s

    out = []
    for role, pool in scenario.pools.items():
        cfg = scenario.autoscale.for_role(role)
        if cfg is None:
            continue
        cost = costs[role]
        scaler = Autoscaler(
            cfg,
            role,
            ttft_slo_s=scenario.slo.ttft_s,
            itl_slo_s=scenario.slo.itl_s,
            prefill_tokens_per_s_per_worker=prefill_tokens_per_s(
                cost,
                max_batch_tokens=pool.max_batch_tokens,
                prompt_tokens=max(mean_prompt_tokens, 1),
            ),
            decode_step_s=decode_step_fn(cost),
            max_batch_seqs=pool.max_batch_seqs,
            kv_capacity_tokens_per_worker=cost.kv_capacity_tokens,
        )
        out.append((role, scaler, cold_start_s(cost.weights_bytes / cost.num_gpus, cfg)))
    return tuple(out)


def make_requests(loaded: LoadedScenario, replication: int = 0) -> Requests:
    """The scenario's requests, each with its client's ``max_tokens`` (unset: the model's
    context length minus the prompt, docs/workloads.md)."""
    from disaggsim.catalog import get_model

    s = loaded.scenario
    return generate_requests(
        s.workload,
        duration_s=s.sim.duration_s,
        seed=s.seed,
        replication=replication,
        base_dir=loaded.base_dir,
    ).with_context(get_model(s.model).context_tokens)


def run_engine(
    s: Scenario,
    costs: dict[str, WorkerCost],
    reqs: Requests,
    transfer,
    topology=None,
    replication: int = 0,
    label: str = "<scenario>",
    progress: ProgressFn | None = None,
    stop_check: StopCheck | None = None,
    check_every_s: float = 0.0,
) -> RawResult:
    """The engine's records of ``reqs`` on the scenario's cluster: its configuration
    (autoscalers sized by the mean prompt) and the run, as :func:`simulate` does it
    (the benchmarks call this to time or hash the engine alone). ``stop_check``,
    ``check_every_s``: :meth:`disaggsim.engine.cluster.Cluster.run`."""
    mean_prompt = int(reqs.prompt_tokens.mean()) if len(reqs) else 1
    cfg = engine_config(
        s,
        costs,
        replication,
        topology,
        build_autoscalers(s, costs, mean_prompt),
        label,
        reqs.prefix_chains,
    )
    return run_cluster(
        reqs,
        cfg,
        transfer,
        progress=progress,
        progress_every_s=s.sim.duration_s / 100 if progress else 0.0,
        stop_check=stop_check,
        check_every_s=check_every_s,
    )


def certain_miss_check(
    s: Scenario, reqs: Requests, below: float | None = None, label: str = "<scenario>"
) -> CertainMiss:
    """The stop check of ``simulate(..., stop_on_certain_miss=True)``: the scenario's
    measured requests (arrival >= ``sim.warmup_s``) and SLO; the run stops once its
    attainment is certainly below ``below`` (default ``slo.attainment_target``; never
    above it, or a stopped run could still meet the SLO)."""
    target = s.slo.attainment_target
    if below is None:
        below = target
    elif not 0.0 <= below <= target:
        raise UserError(
            f"{label}: stop_below_attainment: {below} must be from 0 to "
            f"slo.attainment_target ({target}): above it a stopped run could still meet the SLO"
        )
    return CertainMiss(
        reqs.arrival_s, reqs.output_tokens, s.sim.warmup_s, s.slo.ttft_s, s.slo.itl_s, below
    )


def simulate(
    scenario: LoadedScenario | Scenario | str | Path | dict,
    overrides: list[str] | None = None,
    *,
    replication: int = 0,
    progress: ProgressFn | None = None,
    requests: Requests | None = None,
    stop_on_certain_miss: bool = False,
    stop_below_attainment: float | None = None,
) -> SimulationResult:
    """Simulate a scenario (a loaded one, a model, a YAML path or a mapping).

    The result's ``wall_s`` (and its summary's) is the wall-clock time of this call:
    loading the scenario, cost models, workload, the simulation, the invariant checks,
    and every frame and the summary; writing a result folder is not in it.

    ``stop_on_certain_miss``: end the run as soon as it certainly misses the SLO
    (:class:`~disaggsim.metrics.early_stop.CertainMiss`, checked every
    :data:`~disaggsim.metrics.early_stop.CHECK_EVERY_S` simulated seconds): so many
    measured requests have provably missed that the attainment is below
    ``slo.attainment_target`` whatever the rest do. A stopped run's summary says so
    (``stopped_early_at_s``; ``slo_attainment`` NaN, ``slo_attainment_upper_bound``,
    ``meets_slo`` false, docs/metrics.md); a run that does not stop is the same run as
    without the flag. ``stop_below_attainment`` (default ``slo.attainment_target``, at most
    that): stop only once the attainment is certainly below this; a search that averages
    the attainments of ``k`` seeds' runs passes
    :func:`~disaggsim.metrics.early_stop.seeds_stop_below` (``1 − k × (1 − target)``), below
    which one run puts the mean below the target whatever the other runs reach."""
    t0 = time.perf_counter()
    check_callable("progress", progress)
    stop_on_certain_miss = check_switch("stop_on_certain_miss", stop_on_certain_miss)
    loaded = _as_loaded(scenario, overrides)
    s = loaded.scenario
    label = str(loaded.path) if loaded.path else "<scenario>"
    costs = build_costs(s, label)
    transfer = build_transfer(s, label)
    topology = build_topology(s, label)
    try:
        if requests is not None:
            from disaggsim.catalog import get_model

            reqs = requests.with_context(get_model(s.model).context_tokens)
        else:
            reqs = make_requests(loaded, replication)
    except UserError as e:
        msg = str(e)
        raise UserError(msg if msg.startswith(label) else f"{label}: {msg}") from None
    check_prefill_budget(s, reqs, label)  # whole-prompt prefills need a budget >= the prompt
    stop_check = (
        certain_miss_check(s, reqs, stop_below_attainment, label) if stop_on_certain_miss else None
    )
    raw = run_engine(
        s,
        costs,
        reqs,
        transfer,
        topology,
        replication,
        label,
        progress,
        stop_check,
        CHECK_EVERY_S if stop_check is not None else 0.0,
    )
    # every worker's step end times, expanded once for the checks and the request frame
    step_ends = [w.steps.step_end_times() for w in raw.workers]
    try:
        check_run(raw, step_ends)  # before anything is derived from the records, or written
    except InvariantError as e:
        raise InvariantError(f"{label}: {e}") from None
    # the request frame takes each worker's out of the list as it goes (its memory freed
    # while the gap distribution fills)
    taken: list[np.ndarray | None] = list(step_ends)
    del step_ends
    frame, gaps = request_frame(raw, s.sim.warmup_s, taken)
    summary = summarize(frame, gaps, raw, s)
    timeseries = timeseries_frame(raw)
    wall = time.perf_counter() - t0  # after the last frame: what the summary reports
    return SimulationResult(
        scenario=s,
        raw_scenario=loaded.raw,
        requests=frame,
        timeseries=timeseries,
        summary=replace(summary, wall_s=wall),
        gaps=gaps,
        raw=raw,
        wall_s=wall,
    )


def _as_loaded(scenario, overrides) -> LoadedScenario:
    if isinstance(scenario, LoadedScenario):
        if overrides:
            return load_scenario(scenario.raw, overrides, base_dir=scenario.base_dir)
        return scenario
    if isinstance(scenario, Scenario):
        return load_scenario(scenario.model_dump(mode="json"), overrides)
    return load_scenario(scenario, overrides)


def timeseries_frame(raw: RawResult) -> pd.DataFrame:
    """Worker rows (queue, batch, KV use) and router rows (``worker`` = -1, role
    ``router``: requests held at the router, orphaned KV bytes), ordered by time, then
    worker (stable: equal keys keep worker rows before router rows, each in record order).

    Each column is built once, already in that order: a fleet-hour has millions of
    samples, and a frame concatenated then sorted would hold three copies of them at
    once. The engine records samples as time goes on, so the order is the worker rows as
    recorded (rows at one instant sorted by worker) with the router rows merged in
    (:func:`_merge_order`); otherwise one stable ``lexsort`` over the keys and one
    gather per column."""
    s = raw.samples
    r = raw.router_samples
    n_w, n_r = len(s.at_s), len(r.at_s)
    cap = np.array([w.kv_capacity_tokens for w in raw.workers] + [1], dtype=float)
    w_at = np.asarray(s.at_s, float)
    w_worker = np.asarray(s.worker, dtype=np.int64)
    r_at = np.asarray(r.at_s, float)
    merge = _merge_order(w_at, w_worker, r_at)
    if merge is not None:
        perm, is_router = merge
        is_worker = ~is_router

        def column(w_part: np.ndarray, r_part: np.ndarray) -> np.ndarray:
            out = np.empty(n_w + n_r, dtype=np.result_type(w_part, r_part))
            out[is_worker] = w_part if perm is None else w_part[perm]
            out[is_router] = r_part
            return out

    else:
        at_all = np.concatenate([w_at, r_at])
        worker_all = np.concatenate([w_worker, np.full(n_r, -1, dtype=np.int64)])
        order = np.lexsort((worker_all, at_all))  # by at_s, then worker; stable
        del at_all, worker_all

        def column(w_part: np.ndarray, r_part: np.ndarray) -> np.ndarray:
            return np.concatenate([w_part, r_part])[order]

    at_s = column(w_at, r_at)
    worker = column(w_worker, np.full(n_r, -1, dtype=np.int64))
    zeros_r = np.zeros(n_r, dtype=np.int64)
    kv = column(np.asarray(s.kv_used_tokens, dtype=np.int64), zeros_r)
    return pd.DataFrame(
        {
            "at_s": at_s,
            "worker": worker,
            "role": _role_column(raw, worker),
            "queue_len": column(
                np.asarray(s.queue_len, dtype=np.int64), np.asarray(r.queue_len, dtype=np.int64)
            ),
            "batch": column(np.asarray(s.batch, dtype=np.int64), zeros_r),
            "kv_used_tokens": kv,
            "kv_util": kv / cap[worker],  # -1 (router) picks the last entry
            "orphaned_kv_bytes": column(
                np.zeros(n_w, dtype=np.int64), np.asarray(r.orphaned_kv_bytes, dtype=np.int64)
            ),
            **{
                # prefix caching: the worker's HBM cache, its node's DRAM, the remote store
                name: column(np.asarray(values, dtype=np.int64), zeros_r)
                for name, values in _cache_columns(s).items()
            },
        },
        copy=False,
    )


def _merge_order(
    w_at: np.ndarray, w_worker: np.ndarray, r_at: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray] | None:
    """The (time, worker) order without a full sort, when the worker rows and the router
    rows are each recorded in time order, as the engine records them (None otherwise):
    the order of the worker rows (None: as recorded; else only rows at the same time
    reordered, stably by worker) and a mask of where the router rows go among all rows
    (at equal times router rows, worker -1, come first)."""
    if not (bool(np.all(r_at[1:] >= r_at[:-1])) and bool(np.all(w_at[1:] >= w_at[:-1]))):
        return None
    perm = None
    tie = w_at[1:] == w_at[:-1]
    swapped = np.flatnonzero(tie & (w_worker[1:] < w_worker[:-1]))
    if len(swapped):
        # sort only the rows of the instants where workers were recorded out of order
        instant = np.zeros(len(w_at), dtype=np.int64)
        instant[1:] = np.cumsum(~tie)
        unsorted = np.zeros(int(instant[-1]) + 1, dtype=bool)
        unsorted[instant[swapped]] = True
        rows = np.flatnonzero(unsorted[instant])
        perm = np.arange(len(w_at))
        perm[rows] = rows[np.lexsort((w_worker[rows], instant[rows]))]
    is_router = np.zeros(len(w_at) + len(r_at), dtype=bool)
    # router row i: after the i router rows before it and the worker rows at earlier times
    is_router[np.arange(len(r_at)) + np.searchsorted(w_at, r_at, side="left")] = True
    return perm, is_router


def _role_column(raw: RawResult, worker: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """Each row's pool role (``router`` for worker -1) as pandas' ``str`` column, taken
    from the few role names by index (no Python string per row)."""
    import pyarrow as pa

    names = [w.role for w in raw.workers] + ["router"]
    index = np.where(worker < 0, len(raw.workers), worker)
    taken = pa.array(names, type=pa.large_string()).take(pa.array(index))
    return pd.array(taken, dtype=pd.StringDtype("pyarrow", na_value=np.nan))


def _cache_columns(s: Samples) -> dict[str, array[int]]:
    """The sampled cache occupancy columns (none without prefix caching)."""
    if s.cache_hbm_tokens is None:
        return {}
    cols = {
        "cache_hbm_tokens": s.cache_hbm_tokens,
        "cache_hbm_pinned_tokens": s.cache_hbm_pinned_tokens,
        "cache_hbm_pending_tokens": s.cache_hbm_pending_tokens,
        "cache_dram_tokens": s.cache_dram_tokens,
        "cache_remote_tokens": s.cache_remote_tokens,
    }
    return {k: v for k, v in cols.items() if v is not None}


def pool_sizes_frame(raw: RawResult) -> pd.DataFrame:
    """Workers per pool over time: serving, starting (cold start), draining, and the
    autoscaler's desired size, from ``at_s`` on; control instants also carry the TTFT and
    ITL p99 the autoscaler saw over its last interval (NaN elsewhere)."""
    return pd.DataFrame(
        list(raw.pool_sizes),
        columns=[
            "at_s",
            "role",
            "num_in_service",
            "num_starting",
            "num_draining",
            "desired",
            "window_ttft_p99_s",
            "window_itl_p99_s",
        ],
    )


def links_frame(raw: RawResult) -> pd.DataFrame | None:
    """Per-link utilisation over time (topology fabric): from ``at_s`` on, ``link`` ran at
    ``util`` × its capacity."""
    u = raw.link_util
    if u is None:
        return None
    ids = np.asarray(u.link_ids, dtype=object)
    link = np.asarray(u.link, dtype=np.int64)
    return pd.DataFrame(
        {"at_s": u.at_s, "link": ids[link] if len(link) else link.astype(object), "util": u.util}
    )


def transfers_frame(raw: RawResult) -> pd.DataFrame:
    """One row per KV transfer on a topology fabric (cancelled ones included)."""
    cols = (
        "tag",
        "nbytes",
        "path_kind",
        "num_hops",
        "num_shards",
        "src_worker",
        "dst_worker",
        "start_at_s",
        "ready_at_s",
        "end_at_s",
        "exposed_s",
        "delivered_bytes",
        "cancelled",
    )
    frame = pd.DataFrame(
        [{c: getattr(r, c) for c in cols} for r in raw.transfers], columns=list(cols)
    )
    return frame.rename(columns={"tag": "request_id", "nbytes": "bytes"})


def write_results(result: SimulationResult, out_dir: str | Path, plots: bool = True) -> Path:
    """Write a result folder (:func:`write_results_folder`); returns its path."""
    if not isinstance(result, SimulationResult):
        raise UserError(
            f"write_results: give the SimulationResult simulate() returns, got "
            f"{type(result).__name__}"
        )
    if not isinstance(out_dir, (str, os.PathLike)):
        raise UserError(f"write_results: out_dir is a folder path, got {type(out_dir).__name__}")
    plots = check_switch("plots", plots)
    # the API's argument by its name: its errors said "--out", a flag the caller never typed
    return write_results_folder(result, out_dir, plots, flag="out_dir").path


# Every name a run's result folder may hold (besides the marker): the command refuses a
# --trace that would take one of them (tests/test_fuzz_cli.py checks the list against a
# folder with every optional file).
RESULT_FILE_NAMES = (
    "requests.parquet",
    "timeseries.parquet",
    "pools.parquet",
    "links.parquet",
    "transfers.parquet",
    "summary.json",
    "scenario.yaml",
    "latency_cdf.png",
    "timeline.png",
    "cache.png",
)


def write_results_folder(
    result: SimulationResult, out_dir: str | Path, plots: bool = True, flag: str = "--out"
) -> Written:
    """Write a result folder through :mod:`disaggsim.output` (built in a temporary
    sibling, then moved into place; only a new or empty folder or an earlier disaggsim
    result is written over): ``requests.parquet``, ``timeseries.parquet``,
    ``pools.parquet``, ``summary.json``, ``scenario.yaml`` (the resolved scenario), PNG
    plots, and on a topology fabric ``links.parquet`` and ``transfers.parquet``. The
    returned :class:`~disaggsim.output.Written` says what it replaced."""

    def render(tmp: Path) -> None:
        result.requests.to_parquet(tmp / "requests.parquet", index=False)
        result.timeseries.to_parquet(tmp / "timeseries.parquet", index=False)
        pool_sizes_frame(result.raw).to_parquet(tmp / "pools.parquet", index=False)
        links = links_frame(result.raw)
        if links is not None:
            links.to_parquet(tmp / "links.parquet", index=False)
            transfers_frame(result.raw).to_parquet(tmp / "transfers.parquet", index=False)
        (tmp / "summary.json").write_text(
            json.dumps(_jsonable(result.summary.to_dict()), indent=2) + "\n"
        )
        resolved = result.scenario.model_dump(mode="json")
        (tmp / "scenario.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
        if plots:
            from disaggsim.metrics.plots import write_plots

            write_plots(result, tmp)

    return write_folder(out_dir, render, command="run", flag=flag)


def _jsonable(d: dict) -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, (np.floating, float)):
            v = float(v)
            out[k] = None if not np.isfinite(v) else v
        elif isinstance(v, (np.integer,)):
            out[k] = int(v)
        elif isinstance(v, np.bool_):
            out[k] = bool(v)
        else:
            out[k] = v
    return out
