"""Constants several floors read, each written once (issue #43, item 7): the adaptable
projections and NF4's block sizes (launcher/config/adapters.py, read by plan/, validate/ and
train/), chat data's choices (launcher/config/schema/data.py, read by composition, validate and
data/), and fine-tuning's value ranges (schema bounds, checked by validate's positive-values)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from launcher.config import adapters
from launcher.config.schema import key_info
from launcher.config.schema.data import OVERLONG, TRAIN_ON
from launcher.config.schema.model import ModelConfig
from launcher.data.packing import trained_roles
from launcher.errors import UserError
from launcher.plan.finetune import projections
from launcher.validate import finetune_rules
from tests.cli import invoke

ROOT = Path(__file__).resolve().parents[3] / "launcher"
SHARED = {
    "NF4_BLOCK",
    "NF4_SCALER_BLOCK",
    "TRAIN_ON",
    "OVERLONG",
    "TARGET_WORDS",
    "COLUMN_PARALLEL",
    "ALL_LINEAR",
    "ATTENTION_MODULES",
    "ATTENTION_TARGETS",
    "HF_NAMES",
    "HF_PROJECTIONS",
}


def assignments() -> dict[str, list[str]]:
    """Module-level assignments of the shared names: name -> the modules assigning it."""
    out: dict[str, list[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                for name in names:
                    if isinstance(name, ast.Name) and name.id in SHARED:
                        out.setdefault(name.id, []).append(str(path.relative_to(ROOT)))
    return out


def test_each_shared_constant_is_assigned_in_one_module() -> None:
    found = assignments()
    assert {k: v for k, v in found.items() if len(v) > 1} == {}
    assert found["NF4_BLOCK"] == ["config/adapters.py"]
    assert found["TRAIN_ON"] == found["OVERLONG"] == ["config/schema/data.py"]


def test_all_linear_is_spelled_in_one_module() -> None:
    spelled = set()
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == "all-linear":
                spelled.add(str(path.relative_to(ROOT)))
    assert spelled == {"config/schema/finetune.py"}  # the schema floor; adapters re-exports it


@pytest.mark.parametrize("activation", ["swiglu", "gelu"])
def test_plan_and_validate_adapt_the_tables_projections(activation: str) -> None:
    m = ModelConfig(activation=activation)
    assert set(projections(m)) == set(adapters.target_modules(activation))
    assert finetune_rules.TARGET_WORDS is adapters.TARGET_WORDS
    words = set(adapters.TARGET_WORDS) - {adapters.ALL_LINEAR}
    assert set(adapters.target_modules("swiglu")) == words


def test_chat_choices_are_the_schema_fields() -> None:
    assert key_info.choices()["data.train_on"] == TRAIN_ON
    assert key_info.choices()["data.overlong"] == OVERLONG
    import numpy as np

    with pytest.raises(UserError, match="assistant, completion, all"):
        trained_roles(np.zeros(3, dtype=np.int8), "everything")


@pytest.mark.parametrize(
    ("override", "works"),
    [
        ("finetune.rank=0", "e.g. 16"),
        ("finetune.alpha=inf", "e.g. 32"),  # was accepted: inf > 0
        ("finetune.dropout=1", "e.g. 0.05"),
    ],
)
def test_finetune_values_are_schema_bounds(override: str, works: str) -> None:
    key = override.split("=")[0]
    assert key in key_info.ranges()
    result = invoke("validate", "recipe=tiny", "finetune=lora", override)
    assert result.returncode == 2, result.stdout
    line = next(line for line in result.stdout.splitlines() if f"{override}" in line)
    assert works in line, result.stdout
