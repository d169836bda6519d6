"""`hardware_problems`: what a local run on this machine is told when it lacks the GPUs it names."""

from __future__ import annotations

import pytest

from launcher.config.composition.compose import compose_config
from launcher.launch.preflight import hardware_problems

pytestmark = pytest.mark.unit


def test_no_gpu_advice_has_no_template_placeholder(monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU visible: the advice names cluster=cpu and submit, never a gpus_per_node of 0, and
    # carries no unformatted "{visible}" (README's own example printed it).
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    (problem,) = hardware_problems(compose_config(["recipe=gpt-7b"]).config)
    assert "{" not in problem and "}" not in problem
    assert "found 0" in problem and "cluster=cpu" in problem and "llmtrain submit" in problem
    assert "gpus_per_node=0" not in problem


def test_fewer_gpus_than_named_suggests_the_count_found(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two of the recipe's eight GPUs visible: the advice offers cluster.gpus_per_node=2.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    (problem,) = hardware_problems(compose_config(["recipe=gpt-7b"]).config)
    assert "found 2" in problem and "cluster.gpus_per_node=2 " in problem
