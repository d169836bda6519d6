"""The package's import graph, read from the source (ast, every import statement, also those inside
functions): plan/ never imports validate/ or search/; render/ never imports train/; no import
cycle between launcher's top-level subpackages."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2] / "launcher"


def imports() -> list[tuple[str, str]]:
    """(file relative to the repository, imported launcher module) for every import."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = str(path.relative_to(ROOT.parent))
        package = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts[:-1])
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            out += [(rel, n) for n in names if n == "launcher" or n.startswith("launcher.")]
    return out


def subpackage(module_or_file: str) -> str | None:
    parts = module_or_file.replace("/", ".").removesuffix(".py").split(".")
    if len(parts) < 3:  # launcher.cli, launcher/verdict.py: top-level modules
        return None
    name = parts[1]
    return name if (ROOT / name).is_dir() else None


def test_plan_never_imports_validate_or_search() -> None:
    bad = [
        (f, m)
        for f, m in imports()
        if f.startswith("launcher/plan/") and m.startswith(("launcher.validate", "launcher.search"))
    ]
    assert bad == []


def test_render_never_imports_train() -> None:
    # The run directory's file names come from launcher/rundir.py, not from train/.
    found = {
        (f, m)
        for f, m in imports()
        if f.startswith("launcher/render/") and m.startswith("launcher.train")
    }
    assert found == set()


def test_backends_import_nothing_above_config() -> None:
    above = [
        (f, m)
        for f, m in imports()
        if f.startswith("launcher/backends/") and subpackage(m) not in (None, "config", "backends")
    ]
    assert above == []


def test_no_cycle_between_subpackages() -> None:
    graph: dict[str, set[str]] = {}
    for f, m in imports():
        a, b = subpackage(f), subpackage(m)
        if a and b and a != b:
            graph.setdefault(a, set()).add(b)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    cycles = sorted(a for a in graph if reaches(a, a, {a}))
    assert cycles == [], {a: sorted(graph[a]) for a in cycles}


def test_the_graph_is_read() -> None:
    # The parser sees imports inside functions too (the CLI's lazy imports).
    found = set(imports())
    assert ("launcher/cli.py", "launcher.search.layouts") in found
    assert ("launcher/search/layouts.py", "launcher.validate.rules") in found
