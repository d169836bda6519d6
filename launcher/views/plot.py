"""`llmtrain plot`: runs' metrics drawn against steps, as an image (matplotlib, the `plot` extra).

Four panels (loss, validation loss, learning rate, throughput in tokens/s), one line per run,
so that several runs compare at a glance. Only this module imports matplotlib, and only the
`plot` command imports this module. The image is made in memory (the Agg backend: no display
needed) and returned as bytes; the command writes it.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

from launcher.errors import UserError

FORMATS = ("png", "svg", "pdf")
INSTALL = "pip install 'llmtrain[plot]'"
PANELS = (
    ("loss", "loss"),
    ("val_loss", "validation loss"),
    ("lr", "learning rate"),
    ("tokens_per_s", "tokens/s"),
)


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise UserError(
            f"llmtrain plot draws with matplotlib, which is not installed: {INSTALL}"
        ) from None
    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def figure_bytes(runs: Sequence[tuple[str, Sequence[dict[str, float]]]], fmt: str) -> bytes:
    """The image (`fmt`: png, svg or pdf) of `runs`: (name, metrics history) each."""
    if fmt not in FORMATS:
        raise UserError(
            f"--out: {fmt or 'no suffix'!r} is not an image format llmtrain writes (give a file "
            f"ending in .{', .'.join(FORMATS)})"
        )
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    try:
        for ax, (key, title) in zip(axes.flat, PANELS, strict=True):
            drawn = False
            for name, history in runs:
                points = [(r["step"], r[key]) for r in history if key in r]
                if points:
                    steps, values = zip(*points, strict=True)
                    marker = "o" if len(points) < 30 else None
                    ax.plot(steps, values, label=name, marker=marker, markersize=3)
                    drawn = True
            ax.set_title(title)
            ax.grid(True, alpha=0.3)
            if key == "lr":
                ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
            if not drawn:
                ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        for ax in axes[1]:
            ax.set_xlabel("step")
        handles, labels = axes.flat[0].get_legend_handles_labels()
        if handles:
            fig.legend(handles, labels, loc="upper center", ncol=min(4, len(labels)))
        fig.tight_layout(rect=(0, 0, 1, 0.93))
        buffer = io.BytesIO()
        fig.savefig(buffer, format=fmt, dpi=110)
        return buffer.getvalue()
    finally:
        plt.close(fig)
