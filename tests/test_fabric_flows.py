"""The flow network: max-min fair sharing, contention, caps, outages, cancel, overlap,
and hypothesis invariants over random flow sets. Expected times are hand arithmetic
(bytes / fair share)."""

from __future__ import annotations

import math
from types import MappingProxyType

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsim.fabric import (
    FlowNetwork,
    Link,
    Path,
    Route,
    Topology,
    exposed_time_s,
    fabric_summary,
    max_min_rates,
    send_plan,
)

GBPS = 1e9  # bytes/s per GB/s


def _topology(capacities: list[float], latency_s: float = 0.0) -> Topology:
    links = tuple(Link(f"l{i}", "nic", c, latency_s) for i, c in enumerate(capacities))
    return Topology(
        links=links, workers=(), num_nodes=0,
        link_index=MappingProxyType({link.id: i for i, link in enumerate(links)}),
    )  # fmt: skip


def _path(*routes: tuple[int, ...], latency_s: float = 0.0, cap: float = math.inf) -> Path:
    return Path("rdma", 0, 1, tuple(Route(r, cap) for r in routes), latency_s)


def _run(capacities, flows, until=None):
    """flows: (nbytes, path, start_at_s); returns (records by tag, net, env)."""
    env = simpy.Environment()
    net = FlowNetwork(env, _topology(capacities))
    for tag, (nbytes, path, at) in enumerate(flows):
        ev = env.timeout(at)
        ev.callbacks.append(lambda _e, n=nbytes, p=path, t=tag: net.start(n, p, tag=t))
    env.run(until=until)
    return {r.tag: r for r in net.records}, net, env


def test_max_min_rates_by_hand():
    # link 0 (10) shared by flows 0, 1, 2; link 1 (2) also carries flow 0 → flow 0 gets 2,
    # flows 1 and 2 split the remaining 8; flow 3 alone on link 2 (5) but capped at 1.
    rates = max_min_rates([[0, 1], [0], [0], [2]], [math.inf] * 3 + [1.0], [10.0, 2.0, 5.0])
    assert rates == pytest.approx([2.0, 4.0, 4.0, 1.0])
    assert max_min_rates([[0], [0]], [math.inf, math.inf], [0.0]) == [0.0, 0.0]  # link down
    with pytest.raises(ValueError, match="no link and has no cap"):
        max_min_rates([[]], [math.inf], [])


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_n_equal_flows_on_one_link_take_n_times_solo(n):
    # 1 GB over 10 GB/s alone: 0.1 s; n together share it: each ends at n × 0.1 s
    recs, _, _ = _run([10 * GBPS], [(1e9, _path((0,)), 0.0)] * n)
    assert [recs[i].end_at_s for i in range(n)] == pytest.approx([0.1 * n] * n, rel=1e-12)


def test_disjoint_flows_do_not_slow_each_other():
    recs, _, _ = _run([10 * GBPS, 10 * GBPS], [(1e9, _path((0,)), 0.0), (2e9, _path((1,)), 0.0)])
    assert recs[0].end_at_s == pytest.approx(0.1) and recs[1].end_at_s == pytest.approx(0.2)


def test_flow_bottlenecked_elsewhere_leaves_its_share():
    # flow 0 crosses link 0 (10 GB/s) and link 1 (2 GB/s): it gets 2, flow 1 gets 8 on
    # link 0. Flow 0: 2 GB / 2 = 1 s. Flow 1: 8 GB in that second, then 1 GB alone at 10:
    # 1.1 s.
    recs, _, _ = _run([10 * GBPS, 2 * GBPS], [(2e9, _path((0, 1)), 0.0), (9e9, _path((0,)), 0.0)])
    assert recs[0].end_at_s == pytest.approx(1.0)
    assert recs[1].end_at_s == pytest.approx(1.1)


def test_late_arrival_slows_the_first_flow():
    # 1 GB at 10 GB/s starts at 0; a second 1 GB joins at 0.05 s (0.5 GB left): both at 5:
    # the first ends at 0.15 s, the second has 0.5 GB left then and ends at 0.2 s.
    recs, _, _ = _run([10 * GBPS], [(1e9, _path((0,)), 0.0), (1e9, _path((0,)), 0.05)])
    assert recs[0].end_at_s == pytest.approx(0.15) and recs[1].end_at_s == pytest.approx(0.2)


def test_shards_of_one_transfer_split_bytes_and_latency_is_added_once():
    # 2 shards over two 10 GB/s links: 1 GB in 0.05 s, plus 20 µs of hop latency
    recs, _, _ = _run([10 * GBPS, 10 * GBPS], [(1e9, _path((0,), (1,), latency_s=20e-6), 0.0)])
    assert recs[0].end_at_s == pytest.approx(0.05 + 20e-6)
    assert recs[0].num_shards == 2 and recs[0].exposed_s == pytest.approx(0.05 + 20e-6)


def test_outage_stalls_and_restore_resumes():
    env = simpy.Environment()
    net = FlowNetwork(env, _topology([10 * GBPS]))
    net.start(1e9, _path((0,)))
    env.run(until=0.05)
    net.set_link_capacity("l0", 0.0)  # 0.5 GB sent; stalls for 0.1 s
    env.run(until=0.15)
    assert net.in_flight() == 1 and not net.records
    net.set_link_capacity(0, 0.5)  # back at half rate: 0.5 GB / 5 GB/s = 0.1 s
    env.run()
    assert net.records[0].end_at_s == pytest.approx(0.25)


def test_cancel_returns_bytes_delivered_and_frees_the_link():
    env = simpy.Environment()
    net = FlowNetwork(env, _topology([10 * GBPS]))
    a = net.start(1e9, _path((0,)), tag=0)
    net.start(1e9, _path((0,)), tag=1)
    env.run(until=0.1)  # each at 5 GB/s: 0.5 GB sent
    assert net.cancel(a) == pytest.approx(0.5e9)
    env.run()  # the other's 0.5 GB left at 10 GB/s: 0.05 s
    by_tag = {r.tag: r for r in net.records}
    assert by_tag[0].cancelled and not by_tag[1].cancelled
    assert by_tag[1].end_at_s == pytest.approx(0.15)
    with pytest.raises(ValueError, match="not in flight"):
        net.cancel(a)


def test_source_cap_lifts_at_cap_until():
    # capped at 1 GB/s until 0.5 s on a 10 GB/s link: 0.5 GB by then, 0.5 GB at 10: 0.55 s
    env = simpy.Environment()
    net = FlowNetwork(env, _topology([10 * GBPS]))
    net.start(1e9, _path((0,)), source_rate_cap_bytes_per_s=1e9, cap_until_s=0.5)
    env.run()
    assert net.records[0].end_at_s == pytest.approx(0.55)


def test_events_per_change_not_per_tick():
    # a 1 TB flow over a 1 GB/s link (1000 s) is a handful of events, not one per tick
    env = simpy.Environment()
    net = FlowNetwork(env, _topology([1 * GBPS]))
    net.start(1e12, _path((0,), latency_s=1e-5))
    steps = 0
    while env.peek() < math.inf:
        env.step()
        steps += 1
    assert steps <= 3 and net.records[0].end_at_s == pytest.approx(1000.0 + 1e-5)


@pytest.mark.parametrize(
    "transfer_s, prefill_s, num_layers",
    [(0.01, 1.0, 80), (0.5, 1.0, 80), (2.0, 1.0, 80), (1.0, 1.0, 32), (0.3, 0.2, 1)],
)
@pytest.mark.parametrize("overlap", [True, False])
def test_simulated_exposure_agrees_with_the_formula(transfer_s, prefill_s, num_layers, overlap):
    bw = 10 * GBPS
    nbytes = transfer_s * bw
    latency = 30e-6
    env = simpy.Environment()
    net = FlowNetwork(env, _topology([bw]))
    if not overlap:
        env.run(until=prefill_s)
    plan = send_plan(nbytes, env.now, prefill_s, prefill_s, num_layers, overlap)
    net.start(
        nbytes, _path((0,), latency_s=latency), start_delay_s=plan.start_delay_s,
        source_rate_cap_bytes_per_s=plan.source_rate_cap_bytes_per_s,
        cap_until_s=plan.cap_until_s, ready_at_s=plan.ready_at_s,
    )  # fmt: skip
    env.run()
    expected = exposed_time_s(transfer_s, prefill_s, num_layers, overlap, latency_s=latency)
    assert net.records[0].exposed_s == pytest.approx(expected, rel=1e-9)


def test_exposed_time_formula_by_hand():
    # 10 ms transfer under a 1 s prefill of 80 layers: only the last layer's 1/80 shows
    assert exposed_time_s(0.01, 1.0, 80, True) == pytest.approx(0.01 / 80)
    # 3 s transfer, 1 s prefill: link-bound from the first layer (1/80 s) on: ends at
    # 1/80 + 3 s, i.e. 2 + 1/80 s after the prefill
    assert exposed_time_s(3.0, 1.0, 80, True) == pytest.approx(2.0 + 1 / 80)
    assert exposed_time_s(3.0, 1.0, 80, False, latency_s=1e-3) == pytest.approx(3.001)
    assert exposed_time_s(3.0, 0.0, 80, True) == 3.0  # nothing to overlap with
    with pytest.raises(ValueError, match="num_layers"):
        exposed_time_s(1.0, 1.0, 0, True)
    with pytest.raises(ValueError, match="starts with its prefill"):
        send_plan(1e9, 0.5, 1.0, 1.0, 80, True)


def test_summary_keys_by_hand():
    recs, net, env = _run([10 * GBPS], [(1e9, _path((0,)), 0.0), (1e9, _path((0,)), 0.0)])
    s = fabric_summary(list(recs.values()), net.link_utilisation(), 0.4)
    assert s["kv_transfer_p50_s"] == pytest.approx(0.2)
    assert s["kv_exposed_p99_s"] == pytest.approx(0.2)
    # the link was busy 0.2 s of the 0.4 s measured
    assert s["link_util_max"] == pytest.approx(0.5)
    empty = fabric_summary([], net.link_utilisation(), 0.4)
    assert math.isnan(empty["kv_transfer_p99_s"])


@st.composite
def _flow_sets(draw):
    num_links = draw(st.integers(1, 5))
    caps = [draw(st.floats(0.5, 50.0)) * GBPS for _ in range(num_links)]
    flows = []
    for _ in range(draw(st.integers(1, 8))):
        routes = []
        for _ in range(draw(st.integers(1, 3))):
            links = draw(
                st.lists(st.integers(0, num_links - 1), min_size=1, max_size=3, unique=True)
            )
            routes.append(tuple(sorted(links)))
        nbytes = draw(st.floats(1e6, 5e9))
        at = draw(st.floats(0.0, 0.5))
        cap = draw(st.one_of(st.none(), st.floats(0.1, 20.0)))
        flows.append((nbytes, tuple(routes), at, cap))
    outage = draw(
        st.one_of(
            st.none(),
            st.tuples(st.integers(0, num_links - 1), st.floats(0.0, 0.5), st.floats(0.01, 0.5)),
        )
    )
    return caps, flows, outage


@settings(max_examples=60, deadline=None)
@given(_flow_sets())
def test_flows_conserve_bytes_finish_and_respect_capacity(case):
    caps, flows, outage = case
    env = simpy.Environment()
    net = FlowNetwork(env, _topology(caps))
    for tag, (nbytes, routes, at, cap) in enumerate(flows):

        def go(_e, n=nbytes, r=routes, t=tag, c=cap):
            kw = {}
            if c is not None:  # a source cap for 0.2 s
                kw = {"source_rate_cap_bytes_per_s": c * GBPS, "cap_until_s": env.now + 0.2}
            net.start(n, _path(*r), tag=t, **kw)

        env.timeout(at).callbacks.append(go)
    if outage is not None:
        link, t0, dur = outage
        env.timeout(t0).callbacks.append(lambda _e: net.set_link_capacity(link, 0.0))
        env.timeout(t0 + dur).callbacks.append(lambda _e: net.set_link_capacity(link, 1.0))
    env.run()
    recs = {r.tag: r for r in net.records}
    assert sorted(recs) == list(range(len(flows)))  # every flow finished
    assert not any(r.cancelled for r in recs.values())
    util = net.link_utilisation()
    assert (util.util <= 1.0 + 1e-9).all()  # no link over capacity at any time
    for i in range(len(caps)):
        # bytes carried by link i: each transfer's share on each of its routes through i
        carried = sum(n / len(r) * sum(i in route for route in r) for n, r, _, _ in flows)
        assert util.busy_bytes[i] == pytest.approx(carried, rel=1e-6, abs=1.0)
    for tag, (nbytes, routes, at, _) in enumerate(flows):
        r = recs[tag]
        slowest = min(caps[i] for route in routes for i in route)
        # the shard on the slowest link needs at least its bytes / that link alone
        assert r.end_at_s - at >= nbytes / len(routes) / slowest * (1 - 1e-9)
        assert r.delivered_bytes == nbytes
