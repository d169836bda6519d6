"""Runs pictured in text (pure functions): the `llmtrain runs` table. A local run's loss
sparkline and `status` lines are launcher.launch.run_status's (its run handle prints them)."""

from __future__ import annotations

from typing import Any

from launcher.config.differences import backend_name
from launcher.launch.local_runs import RunInfo, when_text
from launcher.launch.run_record import layout_text, overrides_text
from launcher.launch.run_status import loss_picture, sparkline

__all__ = ["loss_picture", "runs_rows", "sparkline"]


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
