"""Layer-wise overlap of the KV transfer with the prefill forward pass.

With overlap on, layer ``L``'s KV may leave as soon as layer ``L`` is computed. The
fluid model of that: the transfer is started when the prefill starts, its first byte may
leave after one layer's compute (``prefill_s / num_layers``), and until the prefill ends
the whole transfer sends at most ``nbytes / prefill_s`` (the rate the layers produce KV;
by the prefill's end the last layer's share, ``nbytes / num_layers``, has just become
ready). After the prefill it is uncapped. With overlap off the transfer starts when the
prefill ends. In both cases the exposed time is ``end − prefill end``.

For one uncontended transfer whose link alone would take ``T = nbytes / bandwidth``
(``P = prefill_s``, ``n = num_layers``, ``λ`` the fixed latency)::

    overlap off:  exposed = T + λ
    overlap on:   exposed = max(T / n, T − P·(1 − 1/n)) + λ

(``T ≤ P``: the link keeps up, and only the last layer's share is left at the prefill's
end; ``T > P``: the link is the bottleneck from the first layer on, and the excess over
the prefill shows). :func:`exposed_time_s` is that formula;
:func:`send_plan` gives :meth:`FlowNetwork.start`'s arguments so the simulated flow
obeys the same model.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SendPlan", "exposed_time_s", "send_plan"]


def exposed_time_s(
    transfer_s: float,
    prefill_s: float,
    num_layers: int,
    overlap: bool,
    *,
    latency_s: float = 0.0,
) -> float:
    """Seconds of KV transfer left after the prefill ends (one uncontended transfer).

    Parameters
    ----------
    transfer_s
        The transfer's serialization time alone on its path, ``nbytes / bandwidth``.
    prefill_s
        The prefill forward pass producing the KV.
    num_layers
        Transformer layers (KV is produced one layer at a time).
    overlap
        Whether the transfer streams layer by layer during the prefill.
    latency_s
        Fixed latency (hops, setup, block gather), always exposed.
    """
    if transfer_s < 0 or prefill_s < 0 or latency_s < 0:
        raise ValueError("transfer_s, prefill_s and latency_s must be >= 0")
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if not overlap or prefill_s == 0:
        return transfer_s + latency_s
    n = num_layers
    return max(transfer_s / n, transfer_s - prefill_s * (1 - 1 / n)) + latency_s


@dataclass(frozen=True, slots=True)
class SendPlan:
    """Keyword arguments of :meth:`~disaggsim.fabric.flows.FlowNetwork.start`."""

    start_delay_s: float
    source_rate_cap_bytes_per_s: float | None
    cap_until_s: float | None
    ready_at_s: float


def send_plan(
    nbytes: float,
    now_s: float,
    prefill_end_at_s: float,
    prefill_s: float,
    num_layers: int,
    overlap: bool,
) -> SendPlan:
    """How to start a KV transfer at ``now_s``.

    Call at the prefill's start (``now_s == prefill_end_at_s − prefill_s``) with overlap,
    or at/after its end. A transfer started at the end, or with overlap off, is
    uncapped; started at the start with overlap, it is delayed one layer and capped at
    ``nbytes / prefill_s`` until the prefill ends.
    """
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1, got {num_layers}")
    if now_s >= prefill_end_at_s or not overlap or prefill_s <= 0 or nbytes <= 0:
        return SendPlan(0.0, None, None, now_s)
    start_at = prefill_end_at_s - prefill_s
    if abs(now_s - start_at) > 1e-9 * max(1.0, abs(start_at)):
        raise ValueError(
            f"an overlapped transfer starts with its prefill (at {start_at} s), not at {now_s} s"
        )
    return SendPlan(
        start_delay_s=prefill_s / num_layers,
        source_rate_cap_bytes_per_s=nbytes / prefill_s,
        cap_until_s=prefill_end_at_s,
        ready_at_s=prefill_end_at_s,
    )
