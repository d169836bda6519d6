"""The composition that reuses a composed tree per list of group choices
(launcher/config/composition/hydra_tree.py) equals Hydra composing everything each time: the
same values and choices, or the same error messages, for plain overrides, overrides of keys a
group option or a recipe sets, repeated keys, lists, mappings, nulls, quoted strings,
interpolations, and the forms that go through Hydra whole (+, ++, ~, sweeps)."""

from __future__ import annotations

from typing import Any

import pytest

from launcher.config.composition import hydra_tree
from launcher.config.composition.compose import compose_config
from launcher.errors import ConfigError

pytestmark = pytest.mark.unit

RECIPES = ["tiny-sft-lora", "tiny-dpo-lora", "llama3-8b", "llama3-70b-qlora", "mixtral-8x7b"]
VALUES, ERROR = "values", "error"
CASES = [
    (["train.steps=7", "model.num_layers=3"], VALUES),
    (["model.num_layers=3", "model.num_layers=5"], VALUES),  # the last one wins
    (["cluster=h100-80gb", "cluster.gpus_per_node=4", "parallel.tp=4"], VALUES),
    (["zero=stage3-offload", "zero.stage=2"], VALUES),  # a key given wins over its group's file
    (["finetune=lora", "finetune.rank=4", "optim.lr=1e-4"], VALUES),
    (["optim.betas=[0.8,0.9]", "data.path=null", "run.name='a b'"], VALUES),
    (["run.name=${model.name}-x", "train.micro_batch_size=2"], VALUES),
    (["cluster.env={A: '1', B: two}", "precision=bf16"], ERROR),  # +cluster.env.A adds one
    (["+cluster.env.A=1", "train.steps=2"], VALUES),  # goes through Hydra whole
    (["backend=deepspeed", "zero.stage=3", "train.global_batch_size=64"], VALUES),
    (["optim.in_backward=true", "optim.name=adamw8bit", "finetune=full"], VALUES),
    (["train.epochs=2"], VALUES),
    (["model.num_layers=-1", "train.steps=0"], VALUES),  # composed; the rules are validate's
    (["train.steps=abc"], ERROR),  # a type error from OmegaConf, wrapped by Hydra
    (["model.num_layers=1.5", "train.steps=3"], ERROR),
    (["parallel.tp=[1,2]"], ERROR),
    (["model={hidden_size: 4}"], ERROR),  # a mapping given to a group
    (["+model.extra=1"], ERROR),
    (["~train.steps"], ERROR),
    (["train.steps=1,2"], ERROR),  # a sweep
    (["train.steps=3", "~train.steps"], ERROR),
    (["cluster=nope"], ERROR),
]


def _outcome(overrides: list[str]) -> Any:
    try:
        composed = compose_config(overrides)
    except ConfigError as exc:
        return (ERROR, exc.problems)
    return (VALUES, composed.values, composed.choices)


class _Everything(set[Any]):
    """As hydra_tree._SEEN: every list of group choices composed before, so the tree is kept and
    reused from the first composition on."""

    def __contains__(self, item: object) -> bool:
        return True


def _both(overrides: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    monkeypatch.setenv("LLMTRAIN_NO_CACHE", "1")
    monkeypatch.setattr(hydra_tree, "_SEEN", _Everything())
    reused = _outcome(overrides)
    with monkeypatch.context() as mp:
        mp.setattr(hydra_tree, "_split", lambda parsed: None)  # Hydra composes everything
        whole = _outcome(overrides)
    return reused, whole


@pytest.mark.parametrize(("overrides", "kind"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_compositions_and_errors_are_hydra_s(
    overrides: list[str], kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    reused, whole = _both(overrides, monkeypatch)
    assert reused == whole and reused[0] == kind, reused


@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_composes_as_hydra_does(recipe: str, monkeypatch: pytest.MonkeyPatch) -> None:
    overrides = [f"recipe={recipe}", "cluster=a100-80gb", "train.steps=9", "zero.stage=1"]
    reused, whole = _both(overrides, monkeypatch)
    assert reused == whole and reused[0] == VALUES, reused


def test_the_environment_is_read_when_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    # The kept tree is unresolved: a variable changed between two compositions is read anew.
    overrides = ["run.name=${oc.env:LLMTRAIN_TEST_NAME}"]
    monkeypatch.setenv("LLMTRAIN_TEST_NAME", "first")
    first, _ = _both(overrides, monkeypatch)
    monkeypatch.setenv("LLMTRAIN_TEST_NAME", "second")
    second, whole = _both(overrides, monkeypatch)
    assert first[1]["run"]["name"] == "first"
    assert second == whole and second[1]["run"]["name"] == "second"


def test_a_kept_tree_is_never_changed_by_a_composition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMTRAIN_NO_CACHE", "1")
    hydra_tree._TREES.clear()
    hydra_tree._SEEN.clear()
    assert compose_config(["train.steps=4"]).config.train.steps == 4  # Hydra whole, the first
    assert hydra_tree._TREES == {}
    assert compose_config(["train.steps=5"]).config.train.steps == 5
    (kept,) = hydra_tree._TREES.values()  # one list of group choices: none
    assert kept.train.steps != 5
    assert compose_config(["model.num_layers=3"]).config.train.steps == kept.train.steps
    assert len(hydra_tree._TREES) == 1


def test_an_edited_config_file_is_composed_again(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    from launcher import resources

    root = tmp_path / "data"
    shutil.copytree(resources.conf_dir(), root / "conf")
    shutil.copytree(resources.recipes_dir(), root / "recipes")
    monkeypatch.setattr(resources, "data_root", lambda: root)
    monkeypatch.setenv("LLMTRAIN_NO_CACHE", "1")
    before = compose_config(["cluster=h100-80gb", "train.steps=3"]).config.cluster
    path = root / "conf" / "cluster" / "h100-80gb.yaml"
    text = path.read_text()
    assert f"gpus_per_node: {before.gpus_per_node}" in text
    path.write_text(text.replace(f"gpus_per_node: {before.gpus_per_node}", "gpus_per_node: 3"))
    after = compose_config(["cluster=h100-80gb", "train.steps=4"]).config.cluster
    assert after.gpus_per_node == 3
