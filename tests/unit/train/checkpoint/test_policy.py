"""The checkpoint policy decides when to save: steps, minutes, or plan's Young/Daly interval."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from launcher.plan.figures import PlanFigures
from launcher.train.checkpoint.policy import CheckpointPolicy

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_every_steps_and_never_the_last_step() -> None:
    policy = CheckpointPolicy(total_steps=10, every_steps=4, clock=Clock())
    assert [s for s in range(1, 11) if policy.due(s)] == [4, 8]


def test_every_minutes_from_the_last_save() -> None:
    clock = Clock()
    policy = CheckpointPolicy(total_steps=100, every_minutes=2, clock=clock)
    clock.now = 119
    assert policy.due(1) is None
    clock.now = 120
    assert policy.due(2) == "every_minutes"
    policy.saved()
    clock.now = 200
    assert policy.due(3) is None


def test_young_daly_is_the_default_when_nothing_is_set() -> None:
    clock = Clock()
    plan = PlanFigures.from_json({"checkpoint": {"interval_s": 1800.0}})
    unset = SimpleNamespace(every_steps=None, every_minutes=None)
    policy = CheckpointPolicy.from_config(unset, plan, total_steps=1000)
    policy.clock = clock
    policy.saved()
    assert policy.young_daly_s == 1800.0 and "Young/Daly" in policy.describe()
    clock.now = 1799
    assert policy.due(5) is None
    clock.now = 1800
    assert policy.due(6) == "young_daly"
    # An explicit cadence replaces the default.
    explicit = SimpleNamespace(every_steps=50, every_minutes=None)
    assert CheckpointPolicy.from_config(explicit, plan, 1000).young_daly_s is None
    # A plan without a finite interval (no failures modelled) gives none.
    assert (
        CheckpointPolicy.from_config(
            unset, PlanFigures.from_json({"checkpoint": {"interval_s": None}}), 10
        ).interval_s
        is None
    )
