"""The plan screen at 80 columns without colour: no line wider than 80, legends never split,
forward and backward told apart by glyph, the interleaved schedule drawn interleaved."""

from __future__ import annotations

import io
import itertools
import re

import pytest
from rich.console import Console

from launcher.config.composition.compose import compose_config
from launcher.plan.planner import make_plan
from launcher.plan.schedule import bubble_fraction, timeline
from launcher.views.plan import render_plan

pytestmark = pytest.mark.unit


def screen(*overrides: str, detail: bool = True) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=80, no_color=True, color_system=None)
    render_plan(make_plan(compose_config(list(overrides)).config), console, detail=detail)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "overrides",
    [
        ("recipe=llama3-70b",),  # fits, pp=4
        ("recipe=llama3-70b", "parallel.tp=2", "parallel.pp=1"),  # does not fit: fixes listed
        ("recipe=deepseek-v3",),
        (  # host memory line
            "recipe=llama3-70b",
            "backend=deepspeed",
            "parallel.pp=1",
            "zero.stage=3",
            "zero.offload_optimizer=cpu",
            "zero.offload_params=cpu",
        ),
    ],
)
def test_the_answer_comes_first_in_thirty_lines(overrides: tuple[str, ...]) -> None:
    # Without --detail: verdict, fixes (when it does not fit), memory, step time, MFU and cost
    # in at most 30 lines of 80 columns; the tables and assumptions only with --detail.
    lines = screen(*overrides, detail=False).splitlines()
    assert len(lines) <= 30 and max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    verdict_at = next(i for i, line in enumerate(lines) if "heaviest rank" in line)
    assert verdict_at <= 3
    assert "MFU" in text and "step " in text and "GPU-hours" in text and "--detail" in text
    assert "Assumptions" not in text and "Time per step" not in text
    if "does not fit" in lines[verdict_at]:
        fixes_at = next(i for i, line in enumerate(lines) if "Smallest changes that fit" in line)
        assert fixes_at < next(i for i, line in enumerate(lines) if line.startswith("memory"))
        assert "zero.stage=3 -> " in text
    assert screen(*overrides, detail=True).startswith(text.split("more: --detail")[0])


INTERLEAVED = (
    "recipe=llama3-8b",
    "parallel.pp=4",
    "parallel.vpp=2",
    "parallel.pp_schedule=interleaved",
    "parallel.tp=2",
    "zero.stage=2",
)


def test_eighty_columns_and_whole_legends() -> None:
    text = screen(*INTERLEAVED)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    for item in ("w weights", "h overhead", "f fragmentation", "capacity - headroom"):
        assert any(item in line for line in lines), item
    assert any(re.search(r"activations \d+\.\d", line) for line in lines)  # value with its name
    assert any("a-j its backward" in line and "0-9 forward" in line for line in lines)


def test_forward_and_backward_glyphs_and_interleaving() -> None:
    text = screen(*INTERLEAVED)
    assert "2 chunks per stage" in text and "drawn as 1F1B" not in text
    rows = [line for line in text.splitlines() if line.startswith("stage  0 ")]
    (row,) = rows
    cells = row.removeprefix("stage  0 ")
    assert set("0123") & set(cells) and set("abcd") & set(cells)
    # Interleaved: stage 0 runs micro-batch 0's first chunk, then 1..3's, then 0's second chunk
    # before any backward (pp=4 micro-batches per group).
    runs = [key for key, _ in itertools.groupby(cells) if key != "·"]
    assert runs[:8] == list("01230123"), runs


def test_interleaved_timeline_has_the_published_bubble() -> None:
    for pp, m, v in ((4, 8, 2), (2, 4, 3), (8, 16, 4)):
        slots = timeline("interleaved", pp, m, vpp=v)
        end = max(s.end for s in slots)
        busy = sum(s.end - s.start for s in slots if s.stage == 0)
        assert 1 - busy / end == pytest.approx(bubble_fraction(pp, m, v))
        assert {s.chunk for s in slots} == set(range(v))


def test_show_sources_at_80_columns_cuts_nothing() -> None:
    # At 80 columns the three-column table cut sources to `backend/torc…`; now each source is a
    # heading with its keys below it: no line over 80, nothing elided, every key once.
    from launcher.config.composition.provenance import value_sources
    from launcher.views.config import flatten, show_config

    composed = compose_config(["recipe=llama3-70b", "parallel.tp=4"])
    sources = value_sources(composed)
    buffer = io.StringIO()
    show_config(Console(file=buffer, width=80, no_color=True), composed, sources)
    lines = buffer.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in buffer.getvalue()
    keys = [line.split(" = ")[0].strip() for line in lines if line.startswith("  ")]
    assert sorted(keys) == sorted(flatten(composed.values))
    assert lines[1] == "command line" and "  parallel.tp = 4" in lines
    assert "model/llama3-70b.yaml (chosen by recipe llama3-70b)" in lines
