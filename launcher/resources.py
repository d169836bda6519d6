"""Where the shipped configuration lives: `conf/` (Hydra groups) and `recipes/` (presets).

From a checkout or an editable install they sit beside the `launcher/` package; an installed wheel
carries them inside the package as `launcher/_data/{conf,recipes}` (see pyproject.toml).
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


@cache
def data_root() -> Path:
    """The folder holding `conf/` and `recipes/`."""
    for root in (_PACKAGE_DIR / "_data", _PACKAGE_DIR.parent):
        if (root / "conf" / "config.yaml").is_file() and (root / "recipes").is_dir():
            return root
    raise FileNotFoundError(
        f"llmtrain's conf/ and recipes/ were not found beside or inside {_PACKAGE_DIR}; "
        "reinstall the package (pip install llmtrain) or run from a checkout."
    )


def conf_dir() -> Path:
    return data_root() / "conf"


def recipes_dir() -> Path:
    return data_root() / "recipes"


def config_files() -> list[str]:
    """The YAML files a composition reads (conf/ and the recipes), sorted."""
    found = []
    for root in (conf_dir(), recipes_dir()):
        for folder, _, names in os.walk(root):
            found += [os.path.join(folder, n) for n in names if n.endswith(".yaml")]
    return sorted(found)


def recipe_names() -> list[str]:
    return sorted(p.stem for p in recipes_dir().glob("*.yaml"))


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))
