"""Hydra's composition of conf/ and the recipes, each list of group choices composed once a process.

Hydra 1.3 composes in two parts (``hydra/_internal/config_loader_impl.py``,
``_load_configuration_impl``): the defaults list (the group options and the recipe: every file
read, parsed and merged, and the config repository built anew on each call), then, on that tree in
struct mode, each ``key=value`` config override in command-line order
(``ConfigLoaderImpl._apply_overrides_to_config``). The first part is nearly all of a composition's
cost (0.12 s warm for the default recipe, 0.35 s for llama3-8b; 0.9 s cold) and depends only on
the group choices and the files. So it runs once for each list of group overrides (and the files'
sizes and modification times), is kept here from the second composition on (a command that
composes once pays nothing for it), and each composition applies its config overrides to a copy
with Hydra's own function, as Hydra itself would.

Only plain ``key=value`` config overrides take that path. A composition with anything else (``+``
/ ``++`` / ``~`` on a key, a sweep, ``group@package``, a ``hydra.*`` key, a mapping given to a
group) goes through Hydra whole, as before; so does everything when this Hydra lacks the function.
``tests/unit/config/test_hydra_tree.py`` holds both paths equal, values and errors.
"""

from __future__ import annotations

import copy
import os
from collections import OrderedDict
from typing import Any

from launcher import resources
from launcher.config.schema.keys import groups

_KEEP = 32  # group-choice lists kept (each a composed tree of ~100 kB)
_TREES: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_SEEN: set[tuple[Any, ...]] = set()  # group-choice lists composed once already, by Hydra whole


def _files_stamp() -> tuple[tuple[str, int, int], ...]:
    stamp = []
    for path in resources.config_files():
        info = os.stat(path)
        stamp.append((path, info.st_size, info.st_mtime_ns))
    return tuple(stamp)


def compose_tree(overrides: tuple[str, ...], parsed: list[Any]) -> Any:
    """The composed DictConfig (with its ``hydra`` node) for `overrides`, as Hydra's
    ``compose("config", overrides, return_hydra_config=True)`` returns it; `parsed`: Hydra's
    Override for each of them (compose._parse made them)."""
    split = _split(parsed)
    if split is None:
        return _hydra(overrides)
    group_texts, config_overrides = split
    key = (group_texts, str(resources.conf_dir()), _files_stamp())
    tree = _TREES.get(key)
    if tree is None:
        if key not in _SEEN:  # a process that composes once (most commands): Hydra, as before
            if len(_SEEN) >= _KEEP * 32:
                _SEEN.clear()
            _SEEN.add(key)
            return _hydra(overrides)
        tree = _TREES[key] = _hydra(group_texts)
        while len(_TREES) > _KEEP:
            _TREES.popitem(last=False)
    else:
        _TREES.move_to_end(key)
    tree = copy.deepcopy(tree)
    _apply(config_overrides, tree)
    return tree


def _split(parsed: list[Any]) -> tuple[tuple[str, ...], list[Any]] | None:
    """(the group overrides' texts, the config overrides) when every override is one or the other
    in its plain form; else None (Hydra composes it all)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.types import OverrideType

    if not hasattr(ConfigLoaderImpl, "_apply_overrides_to_config"):
        return None
    known = set(groups())
    group_texts: list[str] = []
    config_overrides: list[Any] = []
    for ov in parsed:
        key = ov.key_or_group
        if ov.is_sweep_override() or ov.package is not None or "/" in key:
            return None
        if key.split(".")[0] == "hydra":
            return None
        if key in known:  # a group: Hydra reads it into the defaults list
            if isinstance(ov.value(), dict):  # Hydra takes that for a config override
                return None
            group_texts.append(ov.input_line)
        elif ov.type == OverrideType.CHANGE:
            config_overrides.append(ov)
        else:  # +key, ++key, ~key: their order among the others matters; Hydra does it all
            return None
    return tuple(group_texts), config_overrides


def _hydra(overrides: tuple[str, ...]) -> Any:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(resources.conf_dir()), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def _apply(config_overrides: list[Any], tree: Any) -> None:
    """Hydra's own step: the overrides onto the struct-mode tree, its errors wrapped as
    ``ConfigLoaderImpl.load_configuration`` wraps them."""
    import sys

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.errors import ConfigCompositionException
    from omegaconf.errors import OmegaConfBaseException

    try:
        ConfigLoaderImpl._apply_overrides_to_config(config_overrides, tree)
    except OmegaConfBaseException as exc:
        raise ConfigCompositionException().with_traceback(sys.exc_info()[2]) from exc
