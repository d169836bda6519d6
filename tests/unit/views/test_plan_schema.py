"""`plan --json-schema` describes every shipped recipe's `plan --json` document."""

from __future__ import annotations

import json
from typing import Any

import pytest

from launcher import resources
from launcher.config.composition.compose import compose_config
from launcher.plan.planner import make_plan
from launcher.views.plan import plan_to_json
from tests.cli import invoke, shown

pytestmark = pytest.mark.unit
PY = {"boolean": bool, "integer": int, "number": (int, float), "string": str, "null": type(None)}
PY |= {"array": list, "object": dict}


def conforms(schema: dict[str, Any], value: Any, where: str = "$") -> list[str]:
    types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    ok = [t for t in types if isinstance(value, PY[t]) and not (t != "boolean" and value is True)]
    if not ok or (isinstance(value, bool) and "boolean" not in types):
        return [f"{where}: {type(value).__name__} is not {types}"]
    out: list[str] = []
    if isinstance(value, dict):
        out += [f"{where}.{k}: missing" for k in schema.get("required", []) if k not in value]
        for key, item in value.items():
            sub = schema.get("properties", {}).get(key)
            out += (
                [f"{where}.{key}: not in the schema"]
                if sub is None
                else conforms(sub, item, f"{where}.{key}")
            )
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += conforms(schema["items"], item, f"{where}[{i}]")
    return out


def test_schema_describes_every_recipe_plan() -> None:
    result = invoke("plan", "--json-schema")
    assert result.returncode == 0, shown(result)
    schema = json.loads(result.stdout)
    assert {"memory", "time", "layout"} <= set(schema["required"])
    for name in resources.recipe_names():
        doc = plan_to_json(make_plan(compose_config([f"recipe={name}"]).config))
        assert conforms(schema, doc) == [], name
    # The check can fail: a document with a field of the wrong type does not conform.
    doc["memory"]["fits"] = "yes"
    assert conforms(schema, doc)
