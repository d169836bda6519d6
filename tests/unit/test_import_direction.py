"""The package's import graph, read from the source (ast, every import statement, also those inside
functions): plan/ never imports validate/ or search/; render/ never imports train/; no import
cycle between launcher's top-level subpackages."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2] / "launcher"

# Edges that exist today and are removed by other work of issue 12 (item 5: rundir.py names the
# run directory's files, so the sbatch renderer stops importing train/ for them). The test fails
# when one of them disappears, so that it is taken off this list.
KNOWN = {("launcher/render/sbatch.py", "launcher.train.checkpoint")}


def known(edge: tuple[str, str]) -> bool:
    return any(edge[0] == f and (edge[1] + ".").startswith(m + ".") for f, m in KNOWN)


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
    found = {
        (f, m)
        for f, m in imports()
        if f.startswith("launcher/render/") and m.startswith("launcher.train")
    }
    assert {e for e in found if not known(e)} == set()
    assert found >= KNOWN, "a known exception is gone: remove it from KNOWN"


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
        if known((f, m)):
            continue
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
