"""The package's import graph, read from the source (ast, every import statement, also those inside
functions): plan/ never imports validate/ or search/; render/ never imports train/; no import
cycle between launcher's top-level subpackages, nor between any two modules; and no import runs
back up the layers (LAYERS, lowest first)."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2] / "launcher"


@functools.cache
def parsed() -> tuple[tuple[Path, ast.Module], ...]:
    """Every module of the package and its syntax tree, parsed once a process (~2 CPU s)."""
    return tuple((path, ast.parse(path.read_text())) for path in sorted(ROOT.rglob("*.py")))


@functools.cache
def imports() -> tuple[tuple[str, str], ...]:
    """(file relative to the repository, imported launcher module) for every import."""
    out = []
    for path, tree in parsed():
        rel = str(path.relative_to(ROOT.parent))
        package = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts[:-1])
        for node in ast.walk(tree):
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
    return tuple(out)


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
    assert ("launcher/commands/planning.py", "launcher.search.layouts") in found
    assert ("launcher/search/layouts.py", "launcher.validate.rules") in found


# The layers of the flow, lowest first: a module imports only from layers below its own (or from
# its own subpackage). compose -> validate -> plan -> render -> launch -> train reads, as modules:
# the schema and its helpers, the backends' tables and the data formats, the planner, the rules
# and the renderers (beside each other), the search, the training runtime (the ranks: it uses
# render's ds_config and export's formats), the launchers (which check the runtime's
# preconditions), the verdict, the views, the CLI.
LAYERS: tuple[tuple[str, ...], ...] = (
    # launcher/__init__.py holds only the version: `from launcher import X` runs nothing above.
    ("__init__", "bounded_read", "errors", "excerpt"),
    ("health", "orphans", "runfiles"),
    ("cache_dir", "file_lock", "fsio", "resources", "rundir"),
    ("output_marker",),
    ("outputs",),
    ("config",),
    ("backends", "data"),
    ("plan",),
    ("validate", "render", "export"),
    ("search",),
    ("train",),
    ("launch",),
    ("verdict",),
    ("views",),
    ("cli_hints",),
    ("commands",),
    ("cli",),
    ("__main__",),
)


def unit(module_or_file: str) -> str:
    """The subpackage or top-level module (launcher/cli.py: cli; launcher.plan.memory.estimate:
    plan)."""
    parts = module_or_file.replace("/", ".").removesuffix(".py").split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_no_import_runs_back_up_the_layers() -> None:
    rank = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    found = {
        unit(str(p.relative_to(ROOT.parent))) for p in ROOT.iterdir() if p.name != "__pycache__"
    }
    assert found - set(rank) == set(), "place each new subpackage or module in LAYERS"
    upward = sorted(
        (f, m)
        for f, m in imports()
        if unit(f) != unit(m) and rank.get(unit(m), -1) >= rank[unit(f)]
    )
    assert upward == []


def modules_graph() -> dict[str, set[str]]:
    """module -> the launcher modules it imports (a package's __init__ by the package's name)."""

    def name(path: Path) -> str:
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name(p) for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for f, m in imports():
        a = name(ROOT.parent / f)
        if m in modules and m != a:
            graph.setdefault(a, set()).add(m)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_cycle_between_modules() -> None:
    assert cycles(modules_graph()) == []


def test_cycles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}}) == []


def module_of(name: str) -> str | None:
    """The launcher module (a .py file or a package's __init__) that `name` imports."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        base = ROOT.parent.joinpath(*parts[:end])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return ".".join(parts[:end])
    return None


def module_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for f, m in imports():
        source = f.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        target = module_of(m)
        if target is not None and target != source and not source.startswith(target + "."):
            graph.setdefault(source, set()).add(target)
    return graph


def module_cycles(graph: dict[str, set[str]], within: str) -> list[list[str]]:
    """Every import circle among the modules under `within` (one path per module on one)."""
    found = []
    for start in sorted(g for g in graph if g.startswith(within)):
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ())):
                if not nxt.startswith(within):
                    continue
                if nxt == start:
                    found.append([*path, start])
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    return found


def test_no_import_circle_between_train_modules() -> None:
    # Issue 20: train/consolidate -> engines/deepspeed_engine -> train/init_from -> consolidate
    # was one; safe loading now lives in train/checkpoint/safe_load.py, which imports no engine.
    assert module_cycles(module_graph(), "launcher.train") == []


def test_the_loading_circle_is_gone_and_would_be_seen() -> None:
    graph = module_graph()
    assert (
        "launcher.train.engines.deepspeed_engine"
        not in graph["launcher.train.checkpoint.consolidate"]
    )
    assert "launcher.train.engines" not in " ".join(
        sorted(graph["launcher.train.checkpoint.safe_load"])
    )
    # The detector finds a circle when there is one (the old edges, put back here only; the
    # engines no longer import init_from since the build reads train.init_from by shard):
    old = {k: set(v) for k, v in graph.items()}
    old["launcher.train.checkpoint.consolidate"].add("launcher.train.engines.deepspeed_engine")
    old["launcher.train.engines.deepspeed_engine"].add("launcher.train.checkpoint.init_from")
    assert any(
        "launcher.train.checkpoint.init_from" in circle
        for circle in module_cycles(old, "launcher.train")
    )


# Rooms below the rest of their floor (docs/development.md's rooms): the schema imports nothing
# else of config/, the GPU catalog and its profiles nothing else of plan/.
BASE_ROOMS = {
    "launcher/config/schema/": "launcher.config.schema",
    "launcher/plan/hardware/": "launcher.plan.hardware",
}


def above_base_rooms(found: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    out = []
    for f, m in found:
        for folder, room in BASE_ROOMS.items():
            floor = room.rsplit(".", 1)[0]
            inside = m == room or m.startswith(room + ".")
            if f.startswith(folder) and m.startswith(floor + ".") and not inside:
                out.append((f, m))
    return out


def test_the_base_rooms_import_nothing_else_of_their_floor() -> None:
    assert above_base_rooms(imports()) == []
    # What it reports, on an edge that would run up (plan/hardware -> plan/memory):
    up = ("launcher/plan/hardware/profile.py", "launcher.plan.memory.estimate")
    assert above_base_rooms([up, ("launcher/config/schema/keys.py", "launcher.errors")]) == [up]


def module_level_graph() -> dict[str, set[str]]:
    """module -> the launcher modules its top-level statements import (what importing it runs)."""
    graph: dict[str, set[str]] = {}
    for path, tree in parsed():
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            graph.setdefault(module, set()).update(n for n in names if n.startswith("launcher."))
    return graph


def test_a_rank_starts_without_importing_the_planner() -> None:
    # Every rank imports launcher.train.trainer at start-up; it reads plan.json's figures
    # (launcher.plan.figures), never the planner that wrote them (~0.14 CPU s a rank).
    graph = module_level_graph()
    seen, todo = set(), ["launcher.train.loop", "launcher.train.trainer"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph.get(module, ())
    assert "launcher.plan.figures" in seen
    assert not {"launcher.plan.planner", "launcher.plan.document"} & seen, sorted(seen)
