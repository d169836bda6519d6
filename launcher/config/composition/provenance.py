"""Where each value of a composed configuration came from (`llmtrain show --sources`).

Precedence, highest first: a command-line override of the key, the group file of a group option
chosen on the command line (or in a --config file), the recipe's own body, the group file chosen
for the key's group by default or by the recipe, and the schema default.
"""

from __future__ import annotations

from typing import Any

from launcher import resources
from launcher.config.composition import config_file
from launcher.config.composition.compose import RECIPE_SCALE_KEYS, Composed
from launcher.config.composition.overrides import is_group_choice, override_key
from launcher.config.schema.keys import BUDGET_PARTNER, IN_BACKWARD_SETS


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dict -> {dotted.key: leaf}; lists and empty dicts are leaves."""
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): node}


def _yaml_keys(path: Any) -> tuple[set[str], list[Any]]:
    """Dotted keys set by a YAML file, and its defaults list."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else {}
    assert isinstance(data, dict)
    defaults = data.pop("defaults", [])
    return set(flatten(data)), list(defaults)


def _yaml_values(path: Any) -> dict[str, Any]:
    """Dotted key -> value of a YAML file (its defaults list left out)."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else {}
    assert isinstance(data, dict)
    data.pop("defaults", None)
    return flatten(data)


def value_sources(composed: Composed) -> dict[str, str]:
    recipe = composed.choices.get("recipe", "none")
    cli_keys: set[str] = set()
    cli_groups: set[str] = set()
    for text in composed.overrides:
        key, is_group = override_key(text), is_group_choice(text)
        (cli_groups if is_group and key in composed.choices else cli_keys).add(key)
    files: dict[str, str] = {}  # dotted key or group -> the --config file that set it
    for text in composed.overrides:
        if text in config_file.ORIGINS:
            key, is_group = override_key(text), is_group_choice(text)
            (cli_groups if is_group and key in composed.choices else cli_keys).discard(key)
            files[key] = config_file.ORIGINS[text]
    recipe_path = config_file.recipe_file(recipe) or resources.recipes_dir() / f"{recipe}.yaml"
    recipe_keys, recipe_defaults = _yaml_keys(recipe_path)
    recipe_groups = {
        str(next(iter(entry))).split()[-1].lstrip("/")
        for entry in recipe_defaults
        if isinstance(entry, dict)
    }
    group_keys: dict[str, tuple[str, set[str]]] = {}
    group_nulls: dict[str, bool] = {}  # a null in a group file never wins over the recipe
    for group, option in composed.choices.items():
        if group == "recipe":
            continue
        keys, _ = _yaml_keys(resources.conf_dir() / group / f"{option}.yaml")
        if group in files:
            how = f"chosen in {files[group]}"
        elif group in cli_groups:
            how = "chosen on the command line"
        elif group in recipe_groups:
            how = f"chosen by recipe {recipe}"
        else:
            how = "default"
        group_keys[group] = (f"{group}/{option}.yaml ({how})", {f"{group}.{k}" for k in keys})
        for key, value in _yaml_values(resources.conf_dir() / group / f"{option}.yaml").items():
            group_nulls[f"{group}.{key}"] = value is None

    def chosen_by_user(group: str) -> bool:
        return group in cli_groups or group in files

    derived = dict(composed.derived)  # values taken from the data (compose._vocab_from_data)
    sources = {}
    for leaf in flatten(composed.values):
        if leaf in derived:
            sources[leaf] = derived[leaf]
            continue
        group = leaf.split(".", 1)[0]
        in_file = [k for k in files if leaf == k or leaf.startswith(f"{k}.")]
        if leaf == "recipe" and "recipe" in files:
            sources[leaf] = f"config file {files['recipe']}"
        elif leaf == "recipe":
            sources[leaf] = "command line" if "recipe" in cli_groups else "default recipe"
        elif any(leaf == k or leaf.startswith(f"{k}.") for k in cli_keys):
            sources[leaf] = "command line"
        elif leaf in IN_BACKWARD_SETS and _set_by_in_backward(
            leaf, composed.values, cli_keys | set(files)
        ):
            where = files.get("optim.in_backward")
            sources[leaf] = (
                f"config file {where} (optim.in_backward sets it)"
                if where
                else "command line (optim.in_backward=true sets it)"
            )
        elif BUDGET_PARTNER.get(leaf) in cli_keys:
            sources[leaf] = f"command line ({BUDGET_PARTNER[leaf]} replaces it)"
        elif in_file:
            sources[leaf] = f"config file {files[in_file[0]]}"
        elif BUDGET_PARTNER.get(leaf) in files:
            partner = BUDGET_PARTNER[leaf]
            sources[leaf] = f"config file {files[partner]} ({partner} replaces it)"
        elif (
            group in group_keys
            and leaf in group_keys[group][1]
            and chosen_by_user(group)
            and leaf not in RECIPE_SCALE_KEYS
            and not (leaf in recipe_keys and group_nulls.get(leaf, False))
        ):
            # A group option the user chose wins over the recipe's own keys in that group.
            in_recipe = leaf in recipe_keys or any(leaf.startswith(f"{k}.") for k in recipe_keys)
            over = f"; wins over recipe {recipe}'s value" if in_recipe else ""
            where, _ = group_keys[group]
            sources[leaf] = f"{where[:-1]}{over})" if where.endswith(")") else where + over
        elif leaf in recipe_keys or any(leaf.startswith(f"{k}.") for k in recipe_keys):
            shown = f" ({recipe_path})" if recipe in config_file.FILE_RECIPES else ""
            sources[leaf] = f"recipe {recipe}{shown}"
        elif group in group_keys and leaf in group_keys[group][1]:
            sources[leaf] = group_keys[group][0]
        else:
            sources[leaf] = "schema default"
    return sources


def _set_by_in_backward(leaf: str, values: dict[str, Any], given: set[str]) -> bool:
    """Whether compose set `leaf` because optim.in_backward=true was given in `given`
    (compose._in_backward_sets; a batch key given there keeps both batch keys)."""
    optim = values.get("optim")
    if "optim.in_backward" not in given or leaf in given or not isinstance(optim, dict):
        return False
    batch = {"train.global_batch_size", "train.grad_accum"}
    return optim.get("in_backward") is True and not (leaf in batch and batch & given)
