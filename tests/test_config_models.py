"""Every model of the scenario's schema follows the same rules, from one base class
(:class:`disaggsim.config.bounds.ConfigModel`): frozen, unknown keys refused, numbers
finite and within MAX_NUMBER. The cache section had its own base without the magnitude
check: ``capacity_gib_per_node: 1e300`` ended in an OverflowError traceback."""

from __future__ import annotations

import typing

import pydantic
import pytest

from disaggsim.config.bounds import ConfigModel
from disaggsim.config.loader import load_scenario
from disaggsim.config.scenario import Scenario
from disaggsim.errors import UserError
from tests.conftest import REPO


def _models(root: type[pydantic.BaseModel]) -> set[type[pydantic.BaseModel]]:
    """Every pydantic model a field of ``root`` can hold, recursively."""
    seen: set[type[pydantic.BaseModel]] = set()
    todo = [root]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        for f in m.model_fields.values():
            stack = [f.annotation]
            while stack:
                a = stack.pop()
                if isinstance(a, type) and issubclass(a, pydantic.BaseModel):
                    todo.append(a)
                stack.extend(typing.get_args(a))
    return seen


def test_every_scenario_model_derives_from_the_one_base():
    models = _models(Scenario)
    assert len(models) > 30  # pools, fabric (two kinds), workloads, autoscale, cache, MoE
    strays = sorted(m.__qualname__ for m in models if not issubclass(m, ConfigModel))
    assert strays == []


@pytest.mark.parametrize(
    "field, value, shown",
    [
        ("cache.tiers.dram.capacity_gib_per_node", "1e300", "1e+300"),
        ("cache.routing.overlap_weight", "1e16", "1e+16"),
        ("cache.tiers.remote.capacity_gib", "1e16", "1e+16"),
    ],
)
def test_cache_numbers_beyond_the_bound_are_one_line_errors(field, value, shown):
    path = REPO / "scenarios" / "prefix" / "chat-sessions.yaml"
    with pytest.raises(UserError) as e:
        load_scenario(path, [f"{field}={value}"])
    assert str(e.value) == (
        f"{path}: {field}: {shown} is beyond 1e+15, the largest number a scenario may hold "
        "(docs/safety.md)"
    )
