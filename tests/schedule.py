"""How `pytest -n 3` hands out the tests: units of work, costliest first, from a measured table.

A unit of work (an xdist "scope") is a whole file under PROCESS_DIRS (its module- and session-
scoped launches run once, its tests in order, on one worker) or a single test elsewhere. Each
worker takes the next unit when it is nearly idle, so handing them out costliest first (longest
processing time first) keeps every worker busy to the end: a 70 s test taken last would leave
the other worker idle for 70 s.

The cost of a unit is its seconds in tests/costs.json (measured: run the suite with
LLMTRAIN_TEST_COSTS=PATH to write a fresh table, see docs/development.md); a unit missing from
the table (a new test) costs DEFAULT_S per test, so new process files still go early.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

PROCESS_DIRS = ("tests/integration/", "tests/slurm/", "tests/gpu/")
COSTS = Path(__file__).with_name("costs.json")
# A test not in the table: the median cost of a process test's in the table was ~6 s (2026-11-27,
# tests/costs.json); unit tests not listed there took under 1 s each.
DEFAULT_S = {"process": 6.0, "unit": 0.3}
# The table lists the units that took at least this long; the rest are DEFAULT_S["unit"].
LISTED_FROM_S = 1.0


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its file under PROCESS_DIRS, else the test itself."""
    return nodeid.split("::", 1)[0] if nodeid.startswith(PROCESS_DIRS) else nodeid


def load_costs(path: Path = COSTS) -> dict[str, float]:
    if not path.is_file():
        return {}
    document = json.loads(path.read_text())
    return {str(k): float(v) for k, v in document["seconds"].items()}


def cost(scope: str, tests: int, costs: dict[str, float]) -> float:
    if scope in costs:
        return costs[scope]
    kind = "process" if scope.startswith(PROCESS_DIRS) else "unit"
    return DEFAULT_S[kind] * tests


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's load-scope scheduler with the units above, costliest first."""
    from xdist.scheduler import LoadScopeScheduling

    costs = load_costs()

    class CostliestFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def schedule(self) -> None:
            # The queue is ordered once, when the collection is complete (LoadScopeScheduling
            # fills it in schedule()); later calls only hand out what is left.
            first = self.collection is None and self.collection_is_completed
            if first and self._check_nodes_have_same_collection():
                collection = next(iter(self.registered_collections.values()))
                units: dict[str, dict[str, bool]] = {}
                for nodeid in collection:
                    units.setdefault(scope_of(nodeid), {})[nodeid] = False
                order = sorted(units, key=lambda s: -cost(s, len(units[s]), costs))
                self.collection = list(collection)
                for scope in order:
                    self.workqueue[scope] = units[scope]
                for node in self.nodes:
                    if self.workqueue:
                        self._assign_work_unit(node)
            super().schedule()

    return CostliestFirst(config, log)


class CostRecorder:
    """Adds up the seconds (setup, call, teardown) of each unit of work and writes the table at
    the end of the session; only units of at least LISTED_FROM_S are written."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[scope_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):
            return  # an xdist worker: the controller sees every report and writes the table
        listed = {k: round(v, 1) for k, v in self.seconds.items() if v >= LISTED_FROM_S}
        document = {
            "about": "seconds per unit of work (tests/schedule.py), from one run of the suite",
            "seconds": dict(sorted(listed.items(), key=lambda kv: -kv[1])),
        }
        self.out.write_text(json.dumps(document, indent=1) + "\n")


def register_recorder(config: pytest.Config) -> None:
    out = os.environ.get("LLMTRAIN_TEST_COSTS")
    if out:
        config.pluginmanager.register(CostRecorder(Path(out)), "llmtrain-test-costs")
