"""What validate and plan --search --json tell a user is true as printed (issue 33, item 10)."""

from __future__ import annotations

import json
import re

import pytest

from launcher.verdict import assess
from tests.cli import invoke, shown

pytestmark = pytest.mark.unit


def messages(*overrides: str) -> list[str]:
    verdict = assess(overrides)
    return [v.message for v in verdict.violations] + list(verdict.notes)


def test_no_list_called_valid_offers_a_tp_that_another_rule_refuses() -> None:
    found = messages("recipe=llama3-70b", "parallel.tp=6")
    agreed = [m for m in found if "valid tp with every rule" in m]
    assert agreed and agreed[0].endswith("valid tp with every rule: 1, 2, 4, 8, 16, 32, 64")
    for message in found:
        for listed in re.findall(r"valid tp[^:]*: ([\d, ]+)", message):
            values = {int(x) for x in listed.split(",") if x.strip()}
            assert 7 not in values, message  # 7 divides the MLP width, not the 64 heads
    # the MLP rule still says which tp divide its width, as what they are
    assert any("tp dividing it: 1, 2, 4, 7, 8" in m for m in found), found


def test_one_gpu_node_is_told_to_add_nodes_not_gpus_per_node() -> None:
    found = messages("recipe=llama3-70b", "cluster.num_nodes=1", "parallel.tp=8", "parallel.pp=4")
    world = next(m for m in found if "does not divide the world size" in m)
    assert "gpus_per_node=32" not in world
    assert "cluster.num_nodes=4 (32 GPUs)" in world
    # CPU processes on one machine: more of them is the answer there
    cpu = messages("recipe=tiny", "parallel.tp=3")
    assert any("cluster.gpus_per_node=3 (processes on this one machine)" in m for m in cpu), cpu


def test_no_value_passing_every_rule_is_said_in_words() -> None:
    found = messages("recipe=llama3-8b", "backend=torch", "parallel.pp=3", "parallel.vpp=2")
    note = next(m for m in found if m.startswith("parallel.pp=3:"))
    assert "none of 1, 2, 3" not in note
    assert "no value of pp from 1 to 256 passes every rule" in note


def test_layout_rules_run_on_what_did_compose() -> None:
    overrides = (
        "paralel.tp=2",
        "parallel.pp=eight",
        "cluster=h100",
        "model.activation=relu",
        "zero.stage=9",
        "parallel.cp=3",
    )
    verdict = assess(overrides)
    errors = [v for v in verdict.violations if v.is_error]
    named = {key for v in errors for key in v.keys}
    for key in ("paralel", "parallel.pp", "cluster", "model.activation", "zero.stage"):
        assert key in named, (key, [v.message for v in errors])
    assert any(v.rule == "context-parallel" and "parallel.cp" in v.keys for v in errors), [
        v.message for v in errors
    ]
    assert len(errors) == 6
    # nothing about the cluster that could not be chosen (its keys are the recipe's, not asked)
    assert not any(k.startswith("cluster.") for v in errors for k in v.keys)


def test_search_json_gives_each_candidate_as_an_argument_list_too() -> None:
    result = invoke("plan", "--search", "recipe=llama3-8b", "parallel.tp=2", "--top", "3", "--json")
    assert result.returncode == 0, shown(result)
    for candidate in json.loads(result.stdout)["candidates"]:
        words = candidate["override_list"]
        assert isinstance(words, list) and all(isinstance(w, str) for w in words)
        assert "parallel.tp=2" in words and words[0].startswith("backend=")
        assert " ".join(words) == candidate["overrides"].replace("'", "")
