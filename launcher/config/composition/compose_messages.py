"""One line for each problem of a composition: a Hydra, OmegaConf or YAML exception explained as
the key, what was wrong and what is expected (and the file, for an error inside one), and the
words for a key's expected type. Used by launcher/config/composition/compose.py."""

from __future__ import annotations

import re
import typing
from typing import Any

from launcher import resources
from launcher.config.composition.group_options import group_options
from launcher.config.schema.keys import all_schema_keys, field_type, groups, unknown_key_problems
from launcher.errors import did_you_mean

# A list element's index at the end of a key (data.blend[0]).
INDEX = re.compile(r"\[\d+\]$")


def nest(dotted: str) -> dict[str, Any]:
    """`a.b.c` as {"a": {"b": {"c": {}}}} (what unknown_key_problems reads)."""
    node: dict[str, Any] = {}
    for part in reversed(dotted.split(".")):
        node = {part: node}
    return node


# How a message names each scalar type of the schema.
TYPE_WORDS = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
}


def expected_type(full_key: str) -> str:
    """The schema's type of `full_key` in words ("an integer or null", "a string (list
    element)")."""
    tp = field_type(INDEX.sub("", full_key))
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    optional = type(None) in typing.get_args(tp)
    base = args[0] if optional and args else tp
    if INDEX.search(full_key):
        inner = typing.get_args(base)
        return (
            f"{TYPE_WORDS.get(inner[0], 'a value')} (list element)" if inner else "a list element"
        )
    if tp is None:
        return "a value of the schema's type"
    word = TYPE_WORDS.get(base, str(base).replace("typing.", ""))
    return f"{word} or null" if optional else word


def not_mapping_files() -> list[str]:
    """Group files that hold something other than key: value pairs (found after a failure)."""
    import yaml

    problems = []
    for path in sorted(resources.conf_dir().glob("*/*.yaml")):
        try:
            node = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
        if node is not None and not isinstance(node, (dict, list)):  # lists fail elsewhere
            problems.append(
                f"{path.parent.name}={path.stem}: {path} must hold keys and values "
                f"(key: value), not {type(node).__name__} {str(node)[:40]!r}"
            )
    return problems


def yaml_problem(exc: BaseException) -> str:
    """One line for a YAML syntax error in a config file: the file, line, column and problem."""
    mark = getattr(exc, "problem_mark", None)
    what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark else "a file"
    return f"{where}: invalid YAML: {what}"


def explain(exc: BaseException) -> str:
    """One line from a Hydra/OmegaConf exception: the key, what was wrong, what is expected.

    An error inside a config file ("In 'model/x': ...") also says which file.
    """
    message = _explain_root(exc)
    in_file = re.match(r"In '([\w.-]+)/([\w.-]+)'", str(exc))
    if not in_file:
        return message
    group, name = in_file.groups()
    path = f"recipes/{name}.yaml" if group == "recipe" else f"conf/{group}/{name}.yaml"
    return message if message.startswith("In '") else f"{message} (in {path})"


def _explain_root(exc: BaseException) -> str:
    # The deepest exception of the chain that names a key, else the deepest. Hydra chains the
    # OmegaConf error of an override as __cause__, of a config file as __context__.
    chain: list[BaseException] = [exc]
    while len(chain) < 20:
        nxt = chain[-1].__cause__ or chain[-1].__context__
        if nxt is None or nxt in chain:
            break
        chain.append(nxt)
    keyed = [e for e in chain if getattr(e, "full_key", None)]
    root = keyed[-1] if keyed else chain[-1]
    full_key = getattr(root, "full_key", None)
    lines = [line.strip() for line in str(root).splitlines() if line.strip()]
    text = lines[0] if lines else type(root).__name__
    if text.endswith(":") and len(lines) > 1:  # "... raised while composing config:" + why
        text = f"{text} {lines[1]}"
    if full_key:
        unknown = re.match(r"Key '[^']*' not in '", text)
        if unknown and full_key.split(".")[0] != "hydra":
            problems = unknown_key_problems(nest(INDEX.sub("", full_key)))
            if problems:
                return problems[0]
        match = re.match(r"Value '(.*)' of type '(\w+)' could not be converted to (\w+)", text)
        if match:
            value, kind = match.group(1), match.group(2)
            expected = expected_type(full_key)
            hint = ""
            if kind == "float" and "integer" in expected:
                try:
                    number = float(value)
                    if number.is_integer():
                        hint = f"; write it as an integer: {full_key}={int(number)}"
                except (OverflowError, ValueError):
                    pass
            return f"{full_key}={value}: expected {expected}, got {kind} {value!r}{hint}"
        bool_match = re.match(r"Value '(.*)' is not a valid bool", text)
        if bool_match:
            return f"{full_key}={bool_match.group(1)}: expected true or false"
        if "does not support deletion" in text:
            return cannot_delete(full_key)
        if "is not in struct" in text:
            return f"{full_key}: not set yet; add it with +{full_key}=VALUE"
        if "Missing mandatory value" in text or "missing" in text.lower():
            return f"{full_key}: a value is required here (it was deleted or left as ???)"
        return f"{full_key}: {text}"
    missing = re.search(r"Could not find '([\w-]+)/([\w.-]+)'", text)
    if missing:
        group, option = missing.groups()
        options = group_options(group) if group in groups() else []
        return (
            f"{group}={option}: no such {group}{did_you_mean(option, options)}; "
            f"available: {', '.join(options) or 'none'} (selected by {text.split(':')[0]})"
        )
    deleted = re.match(r"Could not delete from config\. '([^']+)' does not exist", text)
    if deleted and deleted.group(1) in all_schema_keys():  # a key whose value is null
        return cannot_delete(deleted.group(1))
    if "Could not delete" in text or "Could not find" in text or "Could not append" in text:
        return f"{text}. Check the key with `llmtrain show`."
    return text


def cannot_delete(key: str) -> str:
    return (
        f"~{key}: a schema key cannot be deleted; set it instead "
        f"({key}=VALUE, or {key}=null where null is allowed)"
    )
