"""The schema's keys, read from its dataclasses: every dotted key, each key's type, which keys
are mappings, the config groups, and the messages for keys the schema does not have. Used by
composition (compose.py), `--config FILE` (config_file.py), run_config.py and the CLI's hints;
imports neither of them.
"""

from __future__ import annotations

import dataclasses
import typing
from functools import cache
from typing import Any

from launcher import resources
from launcher.config.schema import LLMTrainConfig
from launcher.errors import did_you_mean

# train.steps and train.tokens are two ways to say how long to train; exactly one is set. One given
# on the command line replaces the other coming from a recipe or group file (a recipe's 300B
# tokens and `train.steps=20` for a trial mean 20 steps), unless both are given there.
BUDGET_PARTNER = {"train.steps": "train.tokens", "train.tokens": "train.steps"}
# optim.in_backward=true given on the command line (or in --config) steps each parameter inside
# the backward, which cannot clip the global norm nor accumulate micro-batches
# (launcher/backends/memory_savers.py): the keys it sets unless given there too, to the values
# it runs with (torchtune's optimizer_in_bwd configs: clip_grad_norm null,
# gradient_accumulation_steps 1). A batch of null: micro_batch_size x dp, one micro-batch a step.
IN_BACKWARD_SETS: dict[str, float | None] = {
    "optim.grad_clip": 0.0,
    "train.global_batch_size": None,
    "train.grad_accum": None,
}


def groups() -> list[str]:
    """Config groups a `group=option` override can select."""
    return [*sorted(p.name for p in resources.conf_dir().iterdir() if p.is_dir()), "recipe"]


def is_mapping_field(dotted: str) -> bool:
    return typing.get_origin(field_type(dotted)) is dict


def field_type(dotted: str) -> Any:
    """The schema's type annotation of a dotted key, or None."""
    cls: type = LLMTrainConfig
    parts = dotted.split(".")
    for part in parts[:-1]:
        sub = dataclass_of(schema_fields(cls).get(part))
        if sub is None:
            return None
        cls = sub
    return schema_fields(cls).get(parts[-1])


@cache
def schema_fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def dataclass_of(tp: Any) -> type | None:
    """The dataclass behind a field type (also inside Optional[...]), or None."""
    if dataclasses.is_dataclass(tp):
        return typing.cast(type, tp)
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return typing.cast(type, arg)
    return None


@cache
def all_schema_keys() -> tuple[str, ...]:
    """Every leaf key of the schema, dotted (model.num_layers, ...)."""
    keys: list[str] = []

    def walk(cls: type, prefix: str) -> None:
        for name, tp in schema_fields(cls).items():
            sub = dataclass_of(tp)
            if sub is not None:
                walk(sub, f"{prefix}{name}.")
            else:
                keys.append(f"{prefix}{name}")

    walk(LLMTrainConfig, "")
    return tuple(keys)


def unknown_key_problems(values: dict[str, Any]) -> list[str]:
    """One message per key that the schema does not have, with a suggestion and the valid keys."""
    problems: list[str] = []

    def walk(node: dict[str, Any], cls: type, prefix: str) -> None:
        fields = schema_fields(cls)
        for key, value in node.items():
            full = f"{prefix}{key}"
            if key not in fields:
                suggestion = did_you_mean(key, fields)
                if not suggestion:
                    # A key under the wrong node (train.tp) -> the full key it probably meant.
                    same_leaf = [k for k in all_schema_keys() if k.rsplit(".", 1)[-1] == key]
                    suggestion = f" (did you mean {same_leaf[0]!r}?)" if same_leaf else ""
                node_name = prefix.rstrip(".") or "the top level"
                problems.append(
                    f"{full}: unknown key{suggestion}; valid keys of {node_name}: "
                    f"{', '.join(fields)}"
                )
                continue
            sub = dataclass_of(fields[key])
            if sub is not None and isinstance(value, dict):
                walk(value, sub, f"{full}.")

    walk(values, LLMTrainConfig, "")
    return problems
