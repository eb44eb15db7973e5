"""Hashes of every raw record the engine writes, over many runs: the check that an engine
change keeps the order of SimPy events and every record bit for bit
(docs/performance.md, "How an engine change is checked").

    python benchmarks/hash_records.py --save base.json      # before the change
    python benchmarks/hash_records.py --compare base.json   # after it: exit 1 on a difference
    python benchmarks/hash_records.py --only ci/ --list     # a subset; the runs' names

Runs, each through :func:`disaggsim.engine.cluster.run_cluster` on the inputs
:func:`disaggsim.run.simulate` builds (no frames, no summary):

- every scenario under ``scenarios/`` as written (each capped at ``--max-requests``
  requests, default 3,000, so the whole set takes a few minutes);
- stress variants of some of them: swap preemption, ``reserve_full`` admission, lower
  ``gpu_mem_util``, the KV capacity cut to 1/60 at twice the rate (preemptions), random
  worker failures on each pool, the other colocated scheduler, other router policies,
  client timeouts and a bounded router queue, and for disaggregated scenarios no
  back-pressure with a cut KV (also under ``most_free_kv``, the old default) (decode batches outgrow it: disaggregated preemption,
  recompute and swap);
- ci/disaggregated and ci/chunked on TensorRT-LLM's masked MHA (Llama-2-7B, tp1, 4x the
  rate): decode runs keyed by the batch's longest sequence;
- 20,000-request slices of the fixed benchmark (``disaggsim bench``) and of the 200- and
  1,000-GPU fleets (``disaggsim.cli.bench.fleet_scenario``).

Each run's result (:class:`~disaggsim.engine.records.RawResult`) is hashed column by
column: the request log, segments, samples (cache columns included), router samples,
each worker's info and step log (runs and prefill-only iterations), counters, failures,
transfers, link use, allocations, pool sizes, scale events, the prefix log and the end
time. The JSON written by ``--save`` holds one SHA-256 per record group per run, so a
difference names the run and the record. The totals printed at the end (preemptions,
retries, worker failures, abandoned and rejected requests) show what the variants
exercised. Not a test: it takes minutes, and its baseline comes from the code before a
change, not from the repository.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import sys
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


# -- hashing ---------------------------------------------------------------------------


def _feed(h: Any, obj: Any) -> None:
    """Feed ``obj`` into hash ``h``: arrays by their bytes and type, containers and
    records field by field, floats by their bits."""
    if isinstance(obj, array):
        h.update(b"A" + obj.typecode.encode() + len(obj).to_bytes(8, "little"))
        h.update(obj.tobytes())
    elif isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        h.update(b"N" + str(a.dtype).encode() + str(a.shape).encode())
        if a.dtype == object:
            for x in a.ravel().tolist():
                _feed(h, x)
        else:
            h.update(a.tobytes())
    elif obj is None or isinstance(obj, bool | int | str):
        h.update(b"S" + repr(obj).encode())
    elif isinstance(obj, float | np.floating):
        h.update(b"F" + float(obj).hex().encode())
    elif isinstance(obj, np.integer):
        h.update(b"S" + repr(int(obj)).encode())
    elif isinstance(obj, dict):
        h.update(b"D" + str(len(obj)).encode())
        for k in sorted(obj, key=repr):
            _feed(h, k)
            _feed(h, obj[k])
    elif isinstance(obj, tuple | list):
        h.update(b"T" + str(len(obj)).encode())
        for x in obj:
            _feed(h, x)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        h.update(b"C" + type(obj).__name__.encode())
        for f in dataclasses.fields(obj):
            h.update(f.name.encode())
            _feed(h, getattr(obj, f.name))
    elif hasattr(obj, "__slots__") or hasattr(obj, "__dict__"):
        h.update(b"O" + type(obj).__name__.encode())
        names = [n for c in type(obj).__mro__ for n in getattr(c, "__slots__", ())]
        names += sorted(getattr(obj, "__dict__", {}))
        for n in names:
            if hasattr(obj, n):
                h.update(n.encode())
                _feed(h, getattr(obj, n))
    else:
        raise TypeError(f"cannot hash a {type(obj).__name__}")


def _digest(obj: Any) -> str:
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()[:24]


def hash_raw(raw: Any) -> dict[str, str]:
    """One hash per record group of a :class:`RawResult`."""
    out = {
        "log": _digest(raw.log),
        "segments": _digest(raw.segments),
        "samples": _digest(raw.samples),
        "router_samples": _digest(raw.router_samples),
        "end_at_s": _digest(raw.end_at_s),
        "counters": _digest(raw.counters),
        "failures": _digest(raw.failures),
        "transfers": _digest(raw.transfers),
        "link_util": _digest(raw.link_util),
        "allocations": _digest(raw.allocations),
        "pool_sizes": _digest(raw.pool_sizes),
        "scale_events": _digest(raw.scale_events),
        "prefix_log": _digest(raw.prefix_log),
        "kv_bytes_per_token": _digest(raw.kv_bytes_per_token),
    }
    for w in raw.workers:
        out[f"worker{w.index}"] = _digest(w)
    return out


# -- runs ------------------------------------------------------------------------------


class _CutKV:
    """A cost model with ``1/factor`` of its KV capacity, but room for ``floor`` tokens
    (everything else delegated)."""

    def __init__(self, cost: Any, factor: int, floor: int) -> None:
        self._cost = cost
        self.kv_capacity_tokens = max(cost.kv_capacity_tokens // factor, floor)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cost, name)


def run_engine(raw_scenario: dict, base_dir: Path, kv_cut: int = 1) -> Any:
    """The engine's records of a scenario mapping, built as :func:`simulate` builds them."""
    from disaggsim.config.loader import load_scenario
    from disaggsim.run import build_costs, build_topology, build_transfer, make_requests
    from disaggsim.run import run_engine as engine_records

    loaded = load_scenario(raw_scenario, base_dir=base_dir)
    s = loaded.scenario
    costs = build_costs(s)
    reqs = make_requests(loaded)
    if kv_cut > 1 and len(reqs):
        # room for the longest sequence and a tenth more: small enough that batches run
        # out of blocks and preempt, enough that no request is rejected for its size
        floor = int((reqs.prompt_tokens + reqs.max_tokens).max()) * 11 // 10 + 64
        costs = {role: _CutKV(c, kv_cut, floor) for role, c in costs.items()}  # type: ignore[misc]
    return engine_records(s, costs, reqs, build_transfer(s), build_topology(s), label="<hash>")


def _read(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def _cap(raw: dict, max_requests: int) -> dict:
    """At most ``max_requests`` requests (synthetic/preset/trace workloads)."""
    raw = copy.deepcopy(raw)
    wl = raw.get("workload", {})
    if wl.get("kind") in ("synthetic", "preset"):
        n = wl.get("num_requests")
        wl["num_requests"] = max_requests if n is None else min(n, max_requests)
    return raw


def _pools(raw: dict) -> list[str]:
    return [k for k in ("pool", "prefill_pool", "decode_pool") if k in raw]


def _set(raw: dict, path: str, value: Any) -> dict:
    raw = copy.deepcopy(raw)
    node = raw
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return raw


def _rate_times(raw: dict, factor: float) -> dict:
    raw = copy.deepcopy(raw)
    wl = raw["workload"]
    if "rate_per_s" in wl:
        wl["rate_per_s"] = wl["rate_per_s"] * factor
    return raw


def _random_failures(raw: dict, mtbf_s: float, mttr_s: float) -> dict:
    raw = copy.deepcopy(raw)
    roles = {"pool": "colocated", "prefill_pool": "prefill", "decode_pool": "decode"}
    raw.setdefault("failures", {})["random"] = [
        {"pool": roles[p], "mtbf_s": mtbf_s, "mttr_s": mttr_s} for p in _pools(raw)
    ]
    return raw


def _mem_util(raw: dict, util: float) -> dict:
    raw = copy.deepcopy(raw)
    for p in _pools(raw):
        raw[p]["gpu_mem_util"] = util
    return raw


def _variants(name: str, raw: dict) -> list[tuple[str, dict, int]]:
    """(name, scenario, KV cut) stress variants of one scenario."""
    out: list[tuple[str, dict, int]] = []
    colocated = raw.get("architecture") == "colocated"
    cached = "cache" in raw
    dur = raw.get("sim", {}).get("duration_s", 60.0)
    out.append((f"{name}+kvcut", _rate_times(raw, 2.0), 60))
    out.append((f"{name}+failures", _random_failures(raw, dur / 3, dur / 30), 1))
    if not cached:
        out.append((f"{name}+swap+kvcut", _set(_rate_times(raw, 2.0), "kv.preemption", "swap"), 60))
        out.append((f"{name}+reserve_full", _set(raw, "kv.admission", "reserve_full"), 1))
        out.append(
            (
                f"{name}+reserve_full+kvcut",
                _set(_rate_times(raw, 2.0), "kv.admission", "reserve_full"),
                40,
            )
        )
    out.append((f"{name}+memutil", _rate_times(_mem_util(raw, 0.6), 1.5), 1))
    if colocated and not cached:
        other = "chunked" if raw["pool"].get("scheduler") == "vllm" else "vllm"
        out.append(
            (f"{name}+{other}+kvcut", _set(_rate_times(raw, 2.0), "pool.scheduler", other), 40)
        )
    if not colocated and not cached:
        r = raw.get("router", {})
        out.append(
            (
                f"{name}+policies",
                _set(
                    _set(
                        raw,
                        "router.prefill_policy",
                        "shortest_queue"
                        if r.get("prefill_policy") != "shortest_queue"
                        else "least_tokens",
                    ),
                    "router.decode_policy",
                    "round_robin",
                ),
                1,
            )
        )
        # without back-pressure the decode pool admits on today's blocks, not at full
        # length, so a cut KV makes decode batches outgrow it: disaggregated preemption,
        # recomputed (through the prefill pool again) and swapped
        nobp = _set(_rate_times(raw, 2.0), "router.backpressure", "none")
        out.append((f"{name}+no_backpressure+kvcut", nobp, 60))
        # the decode policy that was the default before least_committed_kv, kept covered
        out.append(
            (f"{name}+most_free_kv+kvcut", _set(nobp, "router.decode_policy", "most_free_kv"), 60)
        )
        out.append((f"{name}+no_backpressure+swap+kvcut", _set(nobp, "kv.preemption", "swap"), 60))
        out.append(
            (
                f"{name}+kv_aware+kvcut",
                _set(_rate_times(raw, 2.0), "router.backpressure", "kv_aware"),
                40,
            )
        )
    out.append(
        (
            f"{name}+timeout+queue+kvcut",
            _set(
                _set(_rate_times(raw, 2.0), "router.client_timeout_s", 2.0), "router.max_queue", 20
            ),
            40,
        )
    )
    return out


# scenarios whose variants run (the set covers colocated vllm and chunked, disaggregated
# over a link and over a topology fabric, prefix caching, failures, autoscaling, MoE)
VARIANT_BASES = (
    "ci/colocated-vllm",
    "ci/chunked",
    "ci/disaggregated",
    "ci/fabric-contention",
    "ci/failure",
    "failures/backpressure-kv-aware",
    "prefix/chat-sessions",
    "prefix/mooncake-cache-aware",
    "autoscaling/burst",
    "moe/deepseek-v3-pd",
)


def all_runs(max_requests: int) -> list[tuple[str, Callable[[], Any]]]:
    from disaggsim.cli.bench import BENCH_SCENARIO, fleet_scenario

    runs: list[tuple[str, Callable[[], Any]]] = []
    scen_dir = ROOT / "scenarios"
    for path in sorted(scen_dir.rglob("*.yaml")):
        name = str(path.relative_to(scen_dir).with_suffix(""))
        raw = _cap(_read(path), max_requests)
        base = path.parent
        runs.append((name, lambda raw=raw, base=base: run_engine(raw, base)))
        if name in VARIANT_BASES:
            for vname, vraw, cut in _variants(name, raw):
                runs.append((vname, lambda r=vraw, b=base, c=cut: run_engine(r, b, c)))
    # TensorRT-LLM's masked MHA (vanilla-MHA Llama-2-7B, tp1): the decode runs keyed by the
    # batch's longest sequence (the engine's heap of histories), decode and chunked
    for name in ("ci/disaggregated", "ci/chunked"):
        raw = _cap(_read(scen_dir / f"{name}.yaml"), max_requests)
        base = scen_dir / name.split("/")[0]
        mha = _set(_set(_rate_times(raw, 4.0), "model", "llama-2-7b"), "engine", "trtllm")
        mha = _set(mha, "workload.prompt_tokens.max", 3800)  # + 256 within its 4,096
        for pool in _pools(mha):
            mha = _set(mha, f"{pool}.tp", 1)
        runs.append((f"{name}+trtllm-mmha", lambda r=mha, b=base: run_engine(r, b)))
    fixed = copy.deepcopy(BENCH_SCENARIO)
    fixed["workload"]["num_requests"] = 20_000
    fixed["sim"]["duration_s"] = 20_000 / 8.0 * 1.2
    runs.append(("bench/fixed-20k", lambda: run_engine(fixed, ROOT)))
    small = copy.deepcopy(BENCH_SCENARIO)  # long batches that outgrow a cut KV
    small["workload"]["num_requests"] = 3000
    small["sim"]["duration_s"] = 3000 / 8.0 * 1.2
    for vname, vraw, cut in _variants("bench/fixed-3k", small):
        if "kvcut" in vname:
            runs.append((vname, lambda r=vraw, c=cut: run_engine(r, ROOT, c)))
    fleet = fleet_scenario(40, 3000)  # disaggregated batches that outgrow a cut KV
    for vname, vraw, cut in _variants("bench/fleet-40-3k", fleet):
        if "kvcut" in vname:
            runs.append((vname, lambda r=vraw, c=cut: run_engine(r, ROOT, c)))
    for gpus in (200, 1000):
        sc = fleet_scenario(gpus, 20_000)
        runs.append((f"bench/fleet-{gpus}-20k", lambda sc=sc: run_engine(sc, ROOT)))
    return runs


def _exercised(raw: Any) -> dict[str, int]:
    log = raw.log
    from disaggsim.engine.records import STATUS_ABANDONED, STATUS_COMPLETED, STATUS_REJECTED

    return {
        "requests": int(log.n),
        "completed": int((log.status == STATUS_COMPLETED).sum()),
        "rejected": int((log.status == STATUS_REJECTED).sum()),
        "abandoned": int((log.status == STATUS_ABANDONED).sum()),
        "preemptions": int(log.num_preemptions.sum()),
        "retries": int(log.num_retries.sum()),
        "worker_failures": len(raw.failures),
        "transfers": len(raw.transfers),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--save", type=Path, help="write the hashes to this JSON file")
    p.add_argument("--compare", type=Path, help="compare with the hashes in this JSON file")
    p.add_argument("--only", default="", help="only runs whose name contains this")
    p.add_argument("--max-requests", type=int, default=3000)
    p.add_argument("--list", action="store_true", help="list the runs and stop")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)

    runs = [(n, f) for n, f in all_runs(args.max_requests) if args.only in n]
    if args.list:
        print("\n".join(n for n, _ in runs))
        return 0
    hashes: dict[str, dict[str, str]] = {}
    totals: dict[str, int] = {}
    errors: dict[str, str] = {}
    t_all = time.process_time()
    for name, fn in runs:
        t0 = time.process_time()
        try:
            raw = fn()
        except Exception as e:  # a variant the configuration refuses: recorded, not hashed
            errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
            hashes[name] = {"error": errors[name]}
            if not args.quiet:
                print(f"{name:55s} refused: {errors[name]}")
            continue
        hashes[name] = hash_raw(raw)
        ex = _exercised(raw)
        for k, v in ex.items():
            totals[k] = totals.get(k, 0) + v
        if not args.quiet:
            print(
                f"{name:55s} {time.process_time() - t0:6.1f}s  n={ex['requests']:6d} "
                f"pre={ex['preemptions']:5d} retry={ex['retries']:4d} "
                f"fail={ex['worker_failures']:3d} aband={ex['abandoned']:4d} rej={ex['rejected']:4d}"
            )
    print(
        f"{len(runs)} runs ({len(errors)} refused by the configuration) in "
        f"{time.process_time() - t_all:.0f} s CPU; exercised: "
        + ", ".join(f"{k} {v:,}" for k, v in totals.items())
    )
    if args.save is not None:
        args.save.write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
        print(f"saved {args.save}")
    if args.compare is not None:
        base = json.loads(args.compare.read_text())
        diff = []  # one line per run that differs: its name and the groups
        groups = 0
        for name, hs in hashes.items():
            if name not in base:
                diff.append(f"{name}: not in {args.compare}")
                groups += 1
                continue
            moved = [k for k in sorted(set(hs) | set(base[name])) if hs.get(k) != base[name].get(k)]
            if moved:
                diff.append(f"{name}: {' '.join(moved)} differ")
                groups += len(moved)
        if diff:
            print(
                f"DIFFERENT: {len(diff)} of {len(hashes)} runs, {groups} record groups; "
                f"identical: {len(hashes) - len(diff)} runs"
            )
            print("\n".join(diff))
            return 1
        print(
            f"identical: {len(hashes)} runs, {sum(len(h) for h in hashes.values()):,} record hashes"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
