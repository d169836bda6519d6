"""A local run's status in words (pure functions): the loss so far as a sparkline, and the lines
`llmtrain status RUN` prints (launcher.launch.handles.LocalRun)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from launcher.config.differences import backend_name
from launcher.launch.local_runs import RunInfo, when_text
from launcher.launch.run_record import layout_text, overrides_text

# Eight heights of a unicode bar (U+2581..U+2588), as spark(1) and most sparkline tools draw.
BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 40) -> str:
    """`values` drawn in at most `width` unicode blocks, each the mean of an equal share of the
    values (lowest ▁, highest █; a flat series is all ▄); '' for no values."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    buckets = min(width, len(finite))
    means = []
    for i in range(buckets):
        chunk = finite[i * len(finite) // buckets : (i + 1) * len(finite) // buckets]
        means.append(sum(chunk) / len(chunk))
    low, high = min(means), max(means)
    if high - low <= 1e-12 * max(1.0, abs(high)):
        return BLOCKS[3] * buckets
    top = len(BLOCKS) - 1
    return "".join(BLOCKS[round((m - low) / (high - low) * top)] for m in means)


def loss_picture(history: Sequence[dict[str, float]], width: int = 40) -> str | None:
    """``loss ▇▅▃▂▁ 5.42 -> 2.81 (steps 1-40)`` from metrics history; None without losses."""
    points = [(r["step"], r["loss"]) for r in history if "loss" in r]
    if not points:
        return None
    line = sparkline([loss for _, loss in points], width)
    first, last = points[0], points[-1]
    text = (
        f"loss {line} {first[1]:.4f} -> {last[1]:.4f} "
        f"(steps {int(first[0])}-{int(last[0])}, min {min(v for _, v in points):.4f})"
    )
    val = [r["val_loss"] for r in history if "val_loss" in r]
    if val:
        text += f"; val loss {val[-1]:.4f}"
    return text


def status_lines(info: RunInfo, history: list[dict[str, float]] | None, resume: str) -> list[str]:
    """`llmtrain status RUN` for a local run: state, progress, the loss so far as a sparkline,
    backend and layout, the command that started it, and what to do next (`resume`: the command
    that resumes it)."""
    progress = f"step {info.step if info.step is not None else '-'}/{info.total or '?'}"
    if info.loss is not None:
        progress += f", loss {info.loss:.4f}"
    lines = [
        f"run {info.name} ({info.recipe or 'recipe unknown'}): {info.status}",
        f"progress: {progress}",
    ]
    picture = loss_picture(history or [])
    if picture is not None:
        lines.append(picture)
    backend, layout = backend_name(info.values), layout_text(info.layout, info.values)
    if backend or layout:
        lines.append(f"backend {backend or '?'}, layout {layout or '?'}")
    if info.command is not None:
        lines.append(f"overrides: {overrides_text(info.command)}")
    lines.append(f"started {when_text(info.started)}; folder {info.folder}")
    if info.status == "running" and info.holder_pid:
        lines.append(
            f"held by pid {info.holder_pid}: `llmtrain logs {info.name} --follow` shows it, "
            f"`llmtrain cancel {info.name}` stops it"
        )
    lines += [f"unreadable: {problem}" for problem in info.problems]
    if info.status == "unreadable":
        lines.append(
            "fix or remove the file(s) above (llmtrain reads run files only as regular files)"
        )
    elif info.status in ("interrupted", "failed"):
        lines.append(f"resume it (from its newest checkpoint, if any): {resume}")
        if info.status == "failed":
            lines.append(f"why it failed: `llmtrain logs {info.name}`")
    return lines
