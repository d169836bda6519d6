"""A group option chosen on the command line wins over the recipe's keys in that group
(issue 33, item 5); an explicit key=value still wins over both, and `show --sources` says so."""

from __future__ import annotations

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.composition.provenance import value_sources
from tests.cli import invoke, shown

pytestmark = pytest.mark.unit


def test_command_line_group_option_beats_the_recipes_own_keys() -> None:
    # recipes/llama3-70b.yaml sets zero.stage: 2 in its body
    zero = compose_config(["recipe=llama3-70b", "zero=stage3-offload"]).config.zero
    assert (zero.stage, zero.offload_optimizer, zero.offload_params) == (3, "cpu", "cpu")
    # without the group option the recipe's value stands
    assert compose_config(["recipe=llama3-70b"]).config.zero.stage == 2


def test_an_explicit_key_beats_the_group_option_and_the_recipe() -> None:
    overrides = ["recipe=llama3-70b", "zero=stage3-offload", "zero.offload_params=none"]
    composed = compose_config(overrides)
    assert composed.config.zero.offload_params == "none"
    assert composed.config.zero.stage == 3
    # the key before the group option on the command line: still the key
    composed = compose_config(["recipe=llama3-70b", "zero.stage=1", "zero=stage3"])
    assert composed.config.zero.stage == 1


def test_show_sources_names_the_group_file_over_the_recipe() -> None:
    composed = compose_config(
        ["recipe=llama3-70b", "zero=stage3-offload", "zero.offload_params=none"]
    )
    sources = value_sources(composed)
    assert sources["zero.stage"] == (
        "zero/stage3-offload.yaml (chosen on the command line; wins over recipe llama3-70b's value)"
    )
    assert sources["zero.offload_optimizer"] == (
        "zero/stage3-offload.yaml (chosen on the command line)"
    )
    assert sources["zero.offload_params"] == "command line"
    # the recipe's own key, when the user chose no zero option
    assert value_sources(compose_config(["recipe=llama3-70b"]))["zero.stage"] == (
        "recipe llama3-70b"
    )


def test_plan_with_the_group_option_no_longer_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERMINAL_WIDTH", "200")
    result = invoke("plan", "recipe=llama3-70b", "zero=stage3-offload")
    assert result.returncode == 0, shown(result)
    assert "fits" in shown(result)


def test_a_cluster_option_keeps_the_recipes_number_of_nodes() -> None:
    # cluster=h100-80gb names the node type; the recipe's 256 nodes stay (the file says 1)
    composed = compose_config(["recipe=llama3-70b", "cluster=h100-80gb"])
    assert composed.config.cluster.num_nodes == 256
    assert value_sources(composed)["cluster.num_nodes"] == "recipe llama3-70b"
    # the node type's own keys do come from the file chosen
    other = compose_config(["recipe=llama3-70b", "cluster=a100-80gb"]).config.cluster
    assert (other.num_nodes, other.gpu) == (256, "a100-80gb")
    assert (
        compose_config(
            ["recipe=llama3-70b", "cluster=h100-80gb", "cluster.num_nodes=1"]
        ).config.cluster.num_nodes
        == 1
    )


def test_a_null_in_the_group_file_does_not_undo_the_recipes_choice() -> None:
    # recipes/mixtral-8x7b.yaml: backend.moe_dispatcher: alltoall; conf/backend/*.yaml: null
    composed = compose_config(["recipe=mixtral-8x7b", "backend=megatron"])
    assert composed.config.backend.moe_dispatcher == "alltoall"
    assert composed.config.backend.name == "megatron"
    sources = value_sources(composed)
    assert sources["backend.moe_dispatcher"] == "recipe mixtral-8x7b"
    assert sources["backend.name"] == "backend/megatron.yaml (chosen on the command line)"
