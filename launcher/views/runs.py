"""Runs pictured in text (pure functions): the `llmtrain runs` table, fitted to a width. A local
run's loss sparkline and `status` lines are launcher.launch.run_status's (its run handle prints
them)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

from launcher.config.differences import backend_name
from launcher.launch.local_runs import RunInfo, when_text
from launcher.launch.run_record import layout_text, overrides_text
from launcher.launch.run_status import loss_picture, sparkline

__all__ = ["RunsTable", "loss_picture", "runs_rows", "runs_table", "sparkline"]

# Columns right-aligned (figures), and the ones a narrow screen leaves out first, in that order;
# name, status and step are never left out nor cut (overrides go to a line of their own first).
RIGHT = ("step", "loss")
DROPPED_FIRST = ("recipe", "started", "backend", "layout", "loss")
GAP = "  "
OVERRIDES_INDENT = "    "


def runs_rows(infos: list[RunInfo]) -> list[dict[str, Any]]:
    """The `llmtrain runs` table: one row per run, with what tells runs of a recipe apart."""
    rows = []
    for i in infos:
        rows.append(
            {
                "name": i.name,
                "recipe": i.recipe or "?",
                "backend": backend_name(i.values) or "?",
                "layout": layout_text(i.layout, i.values) or "?",
                "status": i.status,
                "step": f"{i.step if i.step is not None else '-'}/{i.total or '?'}",
                "loss": "-" if i.loss is None else f"{i.loss:.4f}",
                "started": when_text(i.started) if i.started is not None else "-",
                "overrides": overrides_text(i.command),
            }
        )
    return rows


@dataclass(frozen=True)
class RunsTable:
    header: str
    lines: list[str]  # one per run, or two with the overrides on the second (indented)
    left_out: tuple[str, ...]  # columns left out to fit the width


def _line(row: dict[str, str], widths: dict[str, int]) -> str:
    cells = [row[c].rjust(w) if c in RIGHT else row[c].ljust(w) for c, w in widths.items()]
    return GAP.join(cells).rstrip()


def runs_table(rows: list[dict[str, Any]], width: int | None) -> RunsTable:
    """`rows` (runs_rows) as lines of at most `width` characters where they can be (None: every
    column, one line per run, for a pipe or `--wide`): first the overrides move to a line of
    their own below each run, wrapped between overrides; then columns are left out, in
    DROPPED_FIRST's order. A name or status is never cut."""
    columns = list(rows[0]) if rows else []
    text = [{c: str(r[c]) for c in columns} for r in rows]

    def widths(shown: list[str]) -> dict[str, int]:
        return {c: max(len(c), *(len(r[c]) for r in text)) for c in shown}

    def total(shown: list[str]) -> int:
        return sum(widths(shown).values()) + len(GAP) * (len(shown) - 1)

    if width is None or total(columns) <= width:
        w = widths(columns)
        return RunsTable(_line({c: c for c in columns}, w), [_line(r, w) for r in text], ())
    shown = [c for c in columns if c != "overrides"]
    for column in DROPPED_FIRST:
        if total(shown) <= width:
            break
        shown.remove(column)
    w = widths(shown)
    lines = []
    for row in text:
        lines.append(_line(row, w))
        if row.get("overrides", "-") not in ("-", ""):
            lines += textwrap.wrap(
                row["overrides"],
                width=width,
                initial_indent=OVERRIDES_INDENT,
                subsequent_indent=OVERRIDES_INDENT,
                break_long_words=False,
                break_on_hyphens=False,
            )
    left_out = tuple(c for c in columns if c not in shown and c != "overrides")
    return RunsTable(_line({c: c for c in shown}, w), lines, left_out)
