"""What the schema says of each key, by dotted key: its allowed values (the ``Allowed`` in its
field's metadata, launcher/config/schema/allowed.py) and its help (the docstring below its field, as
torchtitan's job config documents its fields). Composition's choice check, validate's value
ranges, shell completion and the generated reference (docs/configuration.md) all read it here.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from functools import cache
from typing import Any

from launcher.config import schema
from launcher.config.schema.allowed import METADATA_KEY, Allowed
from launcher.config.schema.keys import all_schema_keys, dataclass_of, schema_fields


def schema_field(dotted: str) -> dataclasses.Field[Any] | None:
    """The dataclass field of a dotted key (a section's too), or None when the schema has no
    such key."""
    return _fields().get(dotted)


@cache
def _fields() -> dict[str, dataclasses.Field[Any]]:
    """Every field of the schema by dotted key, read once."""
    out: dict[str, dataclasses.Field[Any]] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = schema_fields(cls)
        for f in dataclasses.fields(cls):
            out[f"{prefix}{f.name}"] = f
            sub = dataclass_of(hints[f.name])
            if sub is not None:
                walk(sub, f"{prefix}{f.name}.")

    walk(schema.LLMTrainConfig, "")
    return out


def allowed(dotted: str) -> Allowed | None:
    """The key's allowed values, or None when any value of its type goes."""
    found = schema_field(dotted)
    value = found.metadata.get(METADATA_KEY) if found is not None else None
    return value if isinstance(value, Allowed) else None


@cache
def choices() -> dict[str, tuple[str, ...]]:
    """Every key whose value is one of a fixed set of words, in the schema's order."""
    out = {}
    for key in all_schema_keys():
        spec = allowed(key)
        if spec is not None and spec.choices:
            out[key] = spec.choices
    return out


@cache
def ranges() -> dict[str, Allowed]:
    """Every key with bounds on its value, in the schema's order."""
    out = {}
    for key in all_schema_keys():
        spec = allowed(key)
        if spec is not None and not spec.choices:
            out[key] = spec
    return out


@cache
def docstrings() -> dict[str, str]:
    """The docstring of every key (the string right below its field in schema.py), dotted key ->
    text with its lines joined; a section's own docstring under the section's name."""
    tree = ast.parse(inspect.getsource(schema))
    by_class: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        docs = by_class.setdefault(node.name, {})
        for stmt, after in zip(node.body, node.body[1:], strict=False):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[stmt.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    out: dict[str, str] = {}

    def walk(cls: type, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            sub = dataclass_of(typing.get_type_hints(cls)[f.name])
            if sub is not None:
                out[f"{prefix}{f.name}"] = " ".join(inspect.cleandoc(sub.__doc__ or "").split())
                walk(sub, f"{prefix}{f.name}.")
            elif f.name in by_class.get(cls.__name__, {}):
                out[f"{prefix}{f.name}"] = by_class[cls.__name__][f.name]

    walk(schema.LLMTrainConfig, "")
    return out
