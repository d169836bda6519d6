"""What differs between runs' configurations (pure: flattened config values in, text out), for
`llmtrain diff`, the `runs` table and the candidates of a name that several runs begin with."""

from __future__ import annotations

from typing import Any

from launcher.config.composition.provenance import flatten

# Keys that name or place a run rather than say what it trains: every run differs in them.
_PLACE = ("run.name", "run.root_dir")


def _get(values: dict[str, Any], key: str) -> Any:
    node: Any = values
    for part in key.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def backend_name(values: dict[str, Any] | None) -> str | None:
    name = _get(values or {}, "backend.name")
    return name if isinstance(name, str) else None


def flat_values(values: dict[str, Any] | None) -> dict[str, Any]:
    return flatten(values) if values else {}


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(key, a's value, b's value) of every dotted key whose values differ between two flat
    configurations, sorted by key; a key one of them lacks shows as ``(absent)``."""
    rows = []
    for key in sorted(set(a) | set(b)):
        if a.get(key, _ABSENT) != b.get(key, _ABSENT):
            rows.append((key, _text(a, key), _text(b, key)))
    return rows


_ABSENT = object()


def _text(flat: dict[str, Any], key: str) -> str:
    return _shown(flat[key]) if key in flat else "(absent)"


def distinguishing(configs: dict[str, dict[str, Any]], limit: int = 6) -> dict[str, str]:
    """For each run (name -> flat configuration), ``key=value`` of the keys whose values are
    not the same in every run (a run's name and folder left out; when ``backend.name`` differs,
    the other ``backend.*`` keys are left out too: they follow from it), at most `limit` of
    them then ``+N more``; ``(same configuration)`` when nothing differs."""
    keys = sorted(
        {k for flat in configs.values() for k in flat} - set(_PLACE),
    )
    varying = [k for k in keys if len({repr(f.get(k, _ABSENT)) for f in configs.values()}) > 1]
    if "backend.name" in varying:
        varying = [k for k in varying if k == "backend.name" or not k.startswith("backend.")]
    # What is most telling first: backend, layout, then everything else in key order.
    first = ("backend.name", "cluster.num_nodes", "cluster.gpus_per_node", "parallel.", "zero.")
    varying.sort(key=lambda k: (next((i for i, p in enumerate(first) if k.startswith(p)), 9), k))
    out = {}
    for name, flat in configs.items():
        shown = [f"{'backend' if k == 'backend.name' else k}={_text(flat, k)}" for k in varying]
        more = len(shown) - limit
        text = " ".join(shown[:limit]) + (f" +{more} more" if more > 0 else "")
        out[name] = text or "(same configuration)"
    return out
