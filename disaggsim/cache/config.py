"""The scenario's ``cache:`` section: prefix caching, its policy and its KV tiers.

```yaml
cache:
  policy: radix                 # radix (SGLang RadixAttention) | lru (vLLM APC)
  tiers:                        # below HBM; each optional
    dram: {capacity_gib_per_node: 512}   # host DRAM per node (GiB = 2**30 bytes)
    remote: {capacity_gib: unbounded}    # shared store: a number of GiB or "unbounded"
  routing: {overlap_weight: 1.0}         # cache_aware router's weight (Dynamo's default)
```

HBM is always the first tier: a worker's KV capacity (``gpu_mem_util`` and the cost
model decide it), shared between running requests and cached blocks. Capacities are
converted to tokens once, with the bytes a stored block spends per token
(:func:`disaggsim.cache.worker.stored_bytes_per_token`: the model's KV bytes per token
unless windowed layers keep less; :meth:`CacheConfig.dram_tokens`,
:meth:`CacheConfig.remote_tokens`). Validation follows the project's style: frozen
models, unknown keys refused, and :func:`validate_cache_section` turns the first error
into one line naming the file and the field.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError

from disaggsim.config.bounds import ConfigModel
from disaggsim.errors import UserError
from disaggsim.units import GiB

NonNegativeGiB = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class DramTier(ConfigModel):
    """Host DRAM of each node, shared by the workers on it (LRU; blocks evicted from HBM
    are demoted here)."""

    capacity_gib_per_node: NonNegativeGiB


class RemoteTier(ConfigModel):
    """A store shared by every worker (Mooncake-Store-like; LRU when bounded; every
    newly computed block is written through to it)."""

    capacity_gib: NonNegativeGiB | Literal["unbounded"]


class CacheTiers(ConfigModel):
    dram: DramTier | None = None
    remote: RemoteTier | None = None


class CacheRouting(ConfigModel):
    overlap_weight: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.0
    """Weight of the prefill term in the cache_aware router's cost (Dynamo's
    ``--kv-overlap-score-weight``, default 1.0)."""


class CacheConfig(ConfigModel):
    policy: Literal["lru", "radix"] = "radix"
    tiers: CacheTiers = CacheTiers()
    routing: CacheRouting = CacheRouting()

    def dram_tokens(self, kv_bytes_per_token: float) -> int | None:
        """DRAM capacity per node in tokens, or None without a DRAM tier."""
        if self.tiers.dram is None:
            return None
        return _tokens(self.tiers.dram.capacity_gib_per_node, kv_bytes_per_token)

    def remote_tokens(self, kv_bytes_per_token: float) -> int | None:
        """Remote store capacity in tokens; None when unbounded or absent (see
        :attr:`has_remote`)."""
        remote = self.tiers.remote
        if remote is None or remote.capacity_gib == "unbounded":
            return None
        return _tokens(remote.capacity_gib, kv_bytes_per_token)

    @property
    def has_remote(self) -> bool:
        return self.tiers.remote is not None


def _tokens(gib: float, kv_bytes_per_token: float) -> int:
    if not kv_bytes_per_token > 0:
        raise ValueError(f"kv_bytes_per_token must be > 0, got {kv_bytes_per_token}")
    return math.floor(gib * GiB / kv_bytes_per_token)


_MODELS: dict[str, type[BaseModel]] = {
    "": CacheConfig,
    "tiers": CacheTiers,
    "tiers.dram": DramTier,
    "tiers.remote": RemoteTier,
    "routing": CacheRouting,
}


def validate_cache_section(raw: Any, source: str) -> CacheConfig:
    """Validate a ``cache:`` mapping read from ``source``; the first problem becomes one
    :class:`UserError` line ``source: cache.<field>: <problem>``."""
    try:
        return CacheConfig.model_validate(raw)
    except ValidationError as err:
        e = err.errors(include_url=False)[0]
        loc = [str(p) for p in e["loc"] if not str(p).startswith("function-")]
        # drop pydantic's union branch names (e.g. "float", "literal['unbounded']")
        loc = [p for p in loc if not (p.endswith("float") or p.startswith("literal["))]
        key = ".".join(["cache", *loc])
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            model = _MODELS.get(".".join(loc[:-1]))
            allowed = sorted(model.model_fields) if model is not None else []
            msg = "unknown key" + (f" (allowed: {', '.join(allowed)})" if allowed else "")
        elif e["type"] == "literal_error" and loc and loc[-1] == "policy":
            msg = f"unknown cache policy {e.get('input')!r} (allowed: lru, radix)"
        elif e["type"] == "missing":
            msg = "required key is missing"
        elif loc[-2:] == ["remote", "capacity_gib"] and e["type"] not in (
            "finite_number",
            "greater_than_equal",
        ):
            msg = f"{e.get('input')!r} is not a capacity: give GiB (a finite number >= 0) or unbounded"
        elif msg.startswith("Value error, "):  # a model's own check ("field: problem")
            field, _, rest = msg[len("Value error, ") :].partition(": ")
            key, msg = (f"{key}.{field}", rest) if rest else (key, field)
        raise UserError(f"{source}: {key}: {msg}") from None
