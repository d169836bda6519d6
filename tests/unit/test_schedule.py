"""The units of work `pytest -n 2` hands out, costliest first (tests/schedule.py)."""

from __future__ import annotations

import json
from pathlib import Path

from tests import schedule


def test_a_process_file_is_one_unit_and_any_other_test_is_its_own() -> None:
    assert schedule.scope_of("tests/integration/test_run.py::test_a[x]") == (
        "tests/integration/test_run.py"
    )
    assert schedule.scope_of("tests/slurm/test_slurm.py::test_b") == "tests/slurm/test_slurm.py"
    unit = "tests/unit/commands/test_cli.py::test_help_lists_commands"
    assert schedule.scope_of(unit) == unit


def test_costs_come_from_the_table_else_a_default_per_test(tmp_path: Path) -> None:
    table = tmp_path / "costs.json"
    table.write_text(json.dumps({"seconds": {"tests/integration/test_a.py": 70.0}}))
    costs = schedule.load_costs(table)
    assert schedule.cost("tests/integration/test_a.py", 1, costs) == 70.0
    # Missing from the table: a process file costs DEFAULT_S["process"] a test, a unit test less.
    assert schedule.cost("tests/integration/test_new.py", 3, costs) == 3 * 6.0
    assert schedule.cost("tests/unit/test_x.py::test_y", 1, costs) == 0.3
    assert schedule.load_costs(tmp_path / "none.json") == {}


def test_the_shipped_table_is_read_and_lists_slow_units() -> None:
    costs = schedule.load_costs()
    assert costs, "tests/costs.json is missing or empty"
    assert all(seconds >= schedule.LISTED_FROM_S for seconds in costs.values())
    assert all(scope == schedule.scope_of(scope) for scope in costs)


def test_costliest_first_keeps_both_workers_busy_to_the_end() -> None:
    """Greedy hand-out (each worker takes the next unit when free), costliest first, against the
    order by number of tests: one 70 s single-test file behind many short units."""
    units = {"long.py": (1, 70.0), **{f"u{i}": (1, 1.0) for i in range(70)}}
    units["many.py"] = (20, 40.0)

    def makespan(order: list[str]) -> float:
        free = [0.0, 0.0]  # two workers
        for name in order:
            free[free.index(min(free))] += units[name][1]
        return max(free)

    by_count = sorted(units, key=lambda n: -units[n][0])  # stable: "long.py" stays before "u*"
    by_count = [n for n in by_count if n != "long.py"] + ["long.py"]  # collected last
    by_cost = sorted(units, key=lambda n: -schedule.cost(n, units[n][0], {n: units[n][1]}))
    assert makespan(by_cost) == 90.0  # (70 + 40 + 70) / 2: nothing left over at the end
    assert makespan(by_count) > makespan(by_cost) + 30
