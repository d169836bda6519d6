"""The options of a config group, as `group=option` takes them."""

from __future__ import annotations

from launcher import resources
from launcher.config.composition import config_file


def group_options(group: str) -> list[str]:
    """conf/GROUP/*.yaml's names; for `recipe`, recipes/*.yaml's and those given by path
    (``recipe=PATH``, launcher.config.composition.config_file)."""
    if group == "recipe":
        return resources.recipe_names() + sorted(config_file.FILE_RECIPES)
    return resources.group_options(group)
