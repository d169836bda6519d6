"""A user's own YAML files: ``--config my.yaml`` and a recipe given by path (``recipe=./r.yaml``).

``--config FILE`` holds keys and values as ``llmtrain show`` prints them (nested or dotted), plus
group choices as plain strings at the top level (``model: llama3-8b``, ``recipe: llama3-8b`` or a
recipe file path, relative to FILE's folder). It becomes Hydra overrides placed before the
command line's, so it is composed with the shipped groups and recipes exactly like overrides, and
a key given on the command line wins over the file (the file's value is dropped; train.steps and
train.tokens count as one key). Unknown keys are refused naming the key and the file;
``ORIGINS`` remembers which file each override came from, for ``show --sources`` and messages.

A recipe file (``recipe=PATH``, a path: it has a ``/`` or ends in ``.yaml``) is a recipe like the
shipped ones (keys, and a ``defaults`` list of ``override /group: option``); it is registered
under ``<stem>-<sha256 of its content>``, so the compose cache keys on its content, not its path.

Either file is read defensively: a regular file (not a symbolic link, not a folder) of at most
``MAX_BYTES``, YAML without anchors/aliases (no "billion laughs" expansion), a mapping, nested at
most ``MAX_DEPTH`` deep; a recipe path must end in .yaml or .yml (it is not read otherwise). Every
problem is a ``ConfigError`` (exit 2) naming the file, never quoting its content.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Any

from launcher import bounded_read
from launcher.config.composition.overrides import override_key
from launcher.config.schema.keys import (
    BUDGET_PARTNER,
    groups,
    is_mapping_field,
    unknown_key_problems,
)
from launcher.errors import ConfigError

MAX_BYTES = 1 << 20
MAX_DEPTH = 16
# override text -> the file it came from (this process; the CLI is one command per process).
ORIGINS: dict[str, str] = {}
# registered recipe name -> (file, content) of the recipes given by path.
FILE_RECIPES: dict[str, tuple[Path, str]] = {}
_BACKSLASHES = re.compile(r"(\\+)('|$)")


def read_yaml_file(path: Path, what: str) -> tuple[dict[str, Any], str]:
    """(mapping, text) of a user's YAML file, or ConfigError naming `what` and the file."""
    import yaml

    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise ConfigError([f"{what}={path}: no such file"]) from None
    except OSError as exc:
        raise ConfigError([f"{what}={path}: cannot be read ({exc.strerror})"]) from None
    if stat.S_ISLNK(info.st_mode):
        raise ConfigError(
            [f"{what}={path}: is a symbolic link; give the file it points to ({os.readlink(path)})"]
        )
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError([f"{what}={path}: is a folder; give a YAML file (key: value lines)"])
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError([f"{what}={path}: is not a regular file"])
    if info.st_size > MAX_BYTES:
        raise ConfigError(
            [f"{what}={path}: {info.st_size:,} bytes; a config file holds at most {MAX_BYTES:,}"]
        )
    try:
        # The bounded reader opens without blocking and checks the opened file again: a FIFO
        # swapped in after the stat above is refused, never waited on.
        data = bounded_read.read_regular(path, MAX_BYTES, follow_symlinks=True)
        text = data.decode("utf-8")
    except (OSError, ValueError) as exc:  # FileRefused and UnicodeDecodeError are ValueErrors
        raise ConfigError([f"{what}={path}: cannot be read as UTF-8 text ({exc})"]) from None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        for event in yaml.parse(text, Loader=loader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise ConfigError(
                    [f"{what}={path}: uses YAML anchors/aliases (& and *); write values out"]
                )
        node = yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError([f"{what}={path}{where}: invalid YAML: {problem}"]) from None
    if node is None:
        node = {}
    if not isinstance(node, dict):
        # Never quote the content: the file may be anything readable (/etc/passwd, a key file).
        kinds: dict[type, str] = {list: "a list", str: "plain text"}
        kind = kinds.get(type(node), f"a single {type(node).__name__}")
        raise ConfigError(
            [
                f"{what}={path}: must hold keys and values (key: value lines as `llmtrain show` "
                f"prints them), not {kind}; is it the file you meant?"
            ]
        )
    if _depth(node) > MAX_DEPTH:
        raise ConfigError([f"{what}={path}: nested more than {MAX_DEPTH} levels deep"])
    return node, text


def _depth(node: Any) -> int:
    if isinstance(node, dict):
        return 1 + max((_depth(v) for v in node.values()), default=0)
    if isinstance(node, list):
        return 1 + max((_depth(v) for v in node), default=0)
    return 0


def is_path(option: str) -> bool:
    """A recipe option that names a file rather than a shipped recipe."""
    return "/" in option or option.endswith((".yaml", ".yml"))


def register_recipe_file(option: str, base: Path | None = None) -> str:
    """Read the recipe file `option` (relative to `base`) and return its registered name."""
    path = Path(option).expanduser()
    if base is not None and not path.is_absolute():
        path = base / path
    if path.suffix not in (".yaml", ".yml"):
        # Not read at all: a path that is not a YAML file is a mistake (recipe=/etc/passwd).
        raise ConfigError(
            [
                f"recipe={option}: a recipe given by path is a YAML file named *.yaml or *.yml "
                "(keys as `llmtrain show` prints them); for a shipped recipe give its name, e.g. "
                "recipe=tiny (`llmtrain recipes` lists them)"
            ]
        )
    node, text = read_yaml_file(path, "recipe")
    del node
    stem = re.sub(r"[^A-Za-z0-9_-]", "_", path.stem) or "recipe"
    name = f"{stem}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    FILE_RECIPES[name] = (path, text)
    return name


def rewrite_recipe_paths(overrides: tuple[str, ...]) -> tuple[str, ...]:
    """`recipe=./r.yaml` -> `recipe=<registered name>` (the name carries the content's hash)."""
    out = []
    for text in overrides:
        key, sep, value = text.partition("=")
        if sep and key.strip() == "recipe" and is_path(value.strip().strip("'\"")):
            name = register_recipe_file(value.strip().strip("'\""))
            new = f"recipe={name}"
            if text in ORIGINS:
                ORIGINS[new] = ORIGINS[text]
            out.append(new)
        else:
            out.append(text)
    return tuple(out)


def _flatten(node: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and value and not is_mapping_field(full):
            out.update(_flatten(value, f"{full}."))
        else:
            out[full] = value
    return out


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = root
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return root


def render_value(value: Any) -> str:
    """A YAML value as Hydra's override grammar reads it back with the same type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ",".join(render_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{render_value(v)}" for k, v in value.items()) + "}"
    # Hydra's quoted strings: a quote is escaped as \', and backslashes are doubled only where
    # they precede a quote or end the string (elsewhere they stand for themselves).
    escaped = _BACKSLASHES.sub(lambda m: m.group(1) * 2 + m.group(2), str(value))
    return "'" + escaped.replace("'", "\\'") + "'"


def expand(config: str | None, overrides: list[str]) -> list[str]:
    """The overrides `--config FILE` stands for, followed by `overrides` (which win)."""
    if not config:
        return list(overrides)
    path = Path(config).expanduser()
    node, _ = read_yaml_file(path, "--config")
    group_names = set(groups())
    choices: list[tuple[str, str]] = []
    values: dict[str, Any] = {}
    for key, value in node.items():
        if not isinstance(key, str):
            raise ConfigError([f"--config={path}: key {key!r} is not a string"])
        if key in group_names and isinstance(value, str):
            if key == "recipe" and is_path(value):
                value = register_recipe_file(value, base=path.parent)
            choices.append((key, value))
        else:
            values[key] = value
    flat = _flatten(values)
    problems = [f"{p} (in {path})" for p in unknown_key_problems(_nest(flat))]
    if problems:
        raise ConfigError(problems)
    given = {override_key(o) for o in overrides}
    given |= {BUDGET_PARTNER[k] for k in given if k in BUDGET_PARTNER}
    out: list[str] = []
    for key, option in choices:
        if key not in given:
            out.append(f"{key}={option}")
    for key, value in flat.items():
        if key not in given:
            out.append(f"{key}={render_value(value)}")
    for text in out:
        ORIGINS[text] = str(path)
    return out + list(overrides)


def annotate(problems: list[str], overrides: tuple[str, ...]) -> list[str]:
    """Add '(from FILE)' to problems that name a key a config file set."""
    by_key = {override_key(o): ORIGINS[o] for o in overrides if o in ORIGINS}
    out = []
    for problem in problems:
        key = problem.split(":", 1)[0].split("=", 1)[0].strip()
        source = by_key.get(key)
        out.append(f"{problem} (from {source})" if source and source not in problem else problem)
    return out


def recipe_file(name: str) -> Path | None:
    entry = FILE_RECIPES.get(name)
    return entry[0] if entry else None
