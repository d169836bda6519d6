"""Each layout rule is declared once (launcher/validate/rule.py): `validate` words its violations
from the declared object and `plan --search` prunes with the same object at the level where the
values it reads are fixed. A rule added to the registry is used by both, with no other change."""

from __future__ import annotations

from collections import Counter

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.layout import derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.search.layouts import fixed_keys, search, search_space
from launcher.validate.rule import (
    ERROR,
    LAYOUT_VALUES,
    RULES,
    LayoutRule,
    Violation,
    declare,
    join,
    layout_conditions,
    layout_values,
)
from launcher.validate.rules import check

pytestmark = pytest.mark.unit

NAME = "test-no-zero3-with-two-sequences"
# Reads a value fixed at the micro-batch level and one fixed at the last (ZeRO) level: the search
# can only prune it once both are fixed.
CONDITION = LayoutRule(
    NAME,
    ("micro_batch_size", "zero_stage"),
    ("train.micro_batch_size", "zero.stage"),
    lambda cfg, v: not (v["micro_batch_size"] == 2 and v["zero_stage"] == 3),
    lambda cfg, v, works: (
        f"zero.stage=3 with train.micro_batch_size={v['micro_batch_size']}: not in this test; "
        f"valid zero.stage: {join(works)}"
    ),
    lambda cfg, v: [0, 1, 2],
)
SMALL = (
    "recipe=llama3-1b",
    "cluster.num_nodes=1",
    "train.global_batch_size=16",
)
LIMITS = {"max_cp": 1, "max_pp": 2, "max_vpp": 2, "max_micro_batch_size": 2}


def compose(*overrides: str) -> LLMTrainConfig:
    return compose_config(list(overrides)).config


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    declared = declare(NAME, CONDITION)
    monkeypatch.setitem(RULES, NAME, declared)


@pytest.mark.usefixtures("registered")
def test_validate_words_a_registered_rule() -> None:
    cfg = compose(*SMALL, "train.micro_batch_size=2", "zero.stage=3")
    found = [v for v in check(cfg) if v.rule == NAME]
    assert found == [
        Violation(
            NAME,
            ERROR,
            ("train.micro_batch_size", "zero.stage"),
            "zero.stage=3 with train.micro_batch_size=2: not in this test; "
            "valid zero.stage: 0, 1, 2",
        )
    ]
    assert not [v for v in check(compose(*SMALL, "zero.stage=3")) if v.rule == NAME]


@pytest.mark.usefixtures("registered")
def test_the_search_prunes_with_a_registered_rule() -> None:
    cfg = compose(*SMALL)
    fixed = fixed_keys(SMALL[1:])
    space = search_space(cfg, fixed=fixed, **LIMITS)
    refused: Counter[str] = Counter()
    for choice in space.choices():
        errors = {v.rule for v in check(space.apply(choice)) if v.is_error}
        mine = space.violated_rule(choice)
        assert (mine is None) == (not errors), (choice, mine, errors)
        if mine is not None:
            assert mine in errors
            refused[mine] += 1
    assert refused[NAME] > 0, "the small space holds layouts only this rule refuses"
    result = search(cfg, top=50, fixed=fixed, exhaustive=True, **LIMITS)
    assert result.rejected[NAME] == refused[NAME]
    assert result.candidates
    assert not [
        c for c in result.candidates if c.choice.micro_batch_size == 2 and c.choice.zero_stage == 3
    ]


def test_without_it_those_layouts_are_searched() -> None:
    # The other side of the test above: the layouts it prunes are otherwise allowed.
    cfg = compose(*SMALL)
    space = search_space(cfg, fixed=fixed_keys(SMALL[1:]), **LIMITS)
    allowed = [
        c
        for c in space.choices()
        if c.micro_batch_size == 2 and c.zero_stage == 3 and space.violated_rule(c) is None
    ]
    assert allowed
    assert NAME not in RULES


@pytest.mark.parametrize(
    "overrides",
    [
        ("recipe=llama3-8b", "cluster.num_nodes=2"),
        ("recipe=mixtral-8x7b", "cluster.num_nodes=2", "backend=megatron", "parallel.etp=1"),
        ("recipe=deepseek-v3",),
        ("recipe=llama3-70b", "parallel.pp_layers=[20,20,20,20]", "parallel.pp=4"),
    ],
)
def test_each_condition_reads_only_what_it_declares(overrides: tuple[str, ...]) -> None:
    """Every declared condition runs on only the layout values it declares, and on the search's
    configuration (whose varied keys are None): what it reads beyond them would fail here."""
    cfg = compose(*overrides)
    values = layout_values(cfg, derive_layout(cfg))
    assert set(values) == set(LAYOUT_VALUES)
    template = search_space(cfg).template
    for condition in layout_conditions():
        only = {k: values[k] for k in condition.reads}
        for seen in (cfg, template):
            if not condition.holds(seen, only):
                violation = condition.violation(seen, only)
                assert violation is not None and violation.rule == condition.name


def test_a_condition_reads_only_layout_values_and_belongs_to_its_rule() -> None:
    with pytest.raises(ValueError, match="not layout values"):
        LayoutRule(NAME, ("optim.lr",), (), lambda cfg, v: True, lambda cfg, v, w: "")
    with pytest.raises(ValueError, match="declared under"):
        declare("another-rule", CONDITION)
