"""The package's size limits (issue #43, items 8-9; docs/development.md): no module over 600
lines but the data tables, no function over 100 lines, and no folder of launcher/ holding more
than 20 modules, so the folder map keeps saying where a change belongs."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "launcher"
MODULE_LINES = 600
FUNCTION_LINES = 100
FOLDER_MODULES = 20
# Modules that are data, not logic: they grow by rows (a GPU, a fitted band), not by code.
DATA_TABLES = {"plan/hardware/gpu_catalog.py", "plan/calibration/error_bands.py"}


def modules() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def long_modules(limit: int) -> dict[str, int]:
    out = {}
    for path in modules():
        name = str(path.relative_to(ROOT))
        lines = len(path.read_text().splitlines())
        if lines > limit and name not in DATA_TABLES:
            out[name] = lines
    return out


def long_functions(limit: int) -> dict[str, int]:
    out = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    return out


def crowded_folders(limit: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in modules():
        if path.name != "__init__.py":
            folder = str(path.parent.relative_to(ROOT.parent))
            counts[folder] = counts.get(folder, 0) + 1
    return {folder: n for folder, n in counts.items() if n > limit}


def test_no_module_over_the_limit() -> None:
    assert long_modules(MODULE_LINES) == {}


def test_no_function_over_the_limit() -> None:
    assert long_functions(FUNCTION_LINES) == {}


def test_no_folder_over_the_limit() -> None:
    assert crowded_folders(FOLDER_MODULES) == {}


@pytest.mark.parametrize("check", [long_modules, long_functions, crowded_folders])
def test_each_check_reports_what_is_over_a_lower_limit(
    check: Callable[[int], dict[str, int]],
) -> None:
    found = check(1)
    assert found and all(n > 1 for n in found.values()), found
