"""The reference data the planner's constants are fitted on: bench/data/calibration.csv, read and
held against the published reference runs (launcher/plan/calibration/reference_runs.py).

The runs carry what the planner needs (a configuration, each choice where a source is silent) and
the figure each source published; this module checks that every such figure is in the csv row the
run names (``ReferenceRun.csv_row``: its own, or for a variant like T1c the row whose notes hold
it), so that a figure typed into the code and the data it was read from cannot drift apart.

Usage: PYTHONPATH=. .venv/bin/python bench/reference_data.py   (prints each run and its row; exits
1 naming every run whose figure is not in its row)
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launcher.plan.calibration.reference_runs import ReferenceRun, points

CSV = Path(__file__).resolve().parent / "data" / "calibration.csv"
NUMBER = re.compile(r"(?<![0-9.])[0-9]+(?:\.[0-9]+)?")


def rows(path: Path = CSV) -> dict[str, dict[str, str]]:
    """id -> the row's cells, as the file holds them."""
    with path.open(newline="", encoding="utf-8") as fh:
        return {r["id"]: r for r in csv.DictReader(fh)}


def numbers(row: dict[str, str]) -> set[float]:
    """Every number written in the row's cells (measured value, notes, variants)."""
    return {float(n) for cell in row.values() if cell for n in NUMBER.findall(cell)}


def problems(runs: list[ReferenceRun], table: dict[str, dict[str, str]]) -> list[str]:
    """Each run whose row is missing from the csv or does not hold its published figure."""
    out = []
    for run in runs:
        row = table.get(run.csv_row)
        if row is None:
            out.append(f"{run.id}: no row {run.csv_row!r} in {CSV.name}")
        elif run.published not in numbers(row):
            out.append(f"{run.id}: {run.published:g} is not in row {run.csv_row} of {CSV.name}")
    return out


def checked_points(path: Path = CSV) -> list[ReferenceRun]:
    """The reference runs, after checking their figures against the csv (SystemExit naming each
    one that is not there)."""
    runs = points()
    found = problems(runs, rows(path))
    if found:
        raise SystemExit(f"{path}: " + "; ".join(found))
    return runs


def main() -> int:
    runs, table = points(), rows()
    for run in runs:
        print(f"{run.id:<10} {run.metric:<16} published {run.published:<10g} row {run.csv_row}")
    found = problems(runs, table)
    for p in found:
        print("MISSING", p)
    used = {r.csv_row for r in runs}
    unused = [k for k in table if k not in used]
    print(f"\n{len(runs)} runs from {len(used)} of the {len(table)} rows of {CSV}")
    if unused:
        print(f"rows not used (the reference runs' docstring says why): {', '.join(unused)}")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
