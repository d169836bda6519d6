"""`llmtrain plan --json-schema`: the fields of the plan document (``views.plan.plan_to_json``) as
a JSON Schema (draft 2020-12), derived from the documents of a few configurations that cover its
shapes (one stage and many, dense and mixture-of-experts, a fit and a miss), so that it can never
drift from what `plan --json` writes. A field that is sometimes null says so in its type."""

from __future__ import annotations

from typing import Any

from launcher.config.composition.compose import compose_config
from launcher.plan.planner import make_plan
from launcher.views.plan import plan_to_json

# Configurations whose documents together show every field of the plan document.
SAMPLES = (
    ("recipe=tiny",),
    ("recipe=llama3-405b",),
    ("recipe=deepseek-v3",),
    ("recipe=gpt-7b", "cluster=a100-40gb", "zero.stage=0"),  # does not fit: fixes listed
    ("recipe=tiny-dpo-lora",),  # preference pairs: the reference named
    ("recipe=tiny-sft",),  # packed chat rows: the attention kernel named
)

_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"))


def _type(value: Any) -> str:
    if value is None:
        return "null"
    for py, name in _TYPES:
        if isinstance(value, py):
            return name
    return "array" if isinstance(value, list) else "object"


def _merge(schema: dict[str, Any] | None, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = dict(schema or {})
    types = set(
        out.get("type", []) if isinstance(out.get("type"), list) else [out["type"]] if out else []
    )
    kind = _type(value)
    types.add(kind)
    if "integer" in types and "number" in types:
        types.discard("integer")
    if kind == "object":
        props = dict(out.get("properties", {}))
        for key, item in value.items():
            props[key] = _merge(props.get(key), item)
        out["properties"] = props
        seen = set(value)
        out["required"] = sorted(seen & set(out.get("required", seen)))
    elif kind == "array":
        items = out.get("items")
        for item in value:
            items = _merge(items, item)
        if items is not None:
            out["items"] = items
    ordered = sorted(types)
    out["type"] = ordered[0] if len(ordered) == 1 else ordered
    return out


def plan_json_schema() -> dict[str, Any]:
    schema: dict[str, Any] | None = None
    for overrides in SAMPLES:
        schema = _merge(schema, plan_to_json(make_plan(compose_config(overrides).config)))
    assert schema is not None
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "llmtrain plan --json",
        **schema,
    }
