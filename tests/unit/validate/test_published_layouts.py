"""The "it ran" suite: published benchmark layouts (tests/data/published_layouts.yaml: Megatron-
Bridge's scripts/performance configurations and torchtitan's benchmark tables, each citing the
repository, file and commit it was read from) are accepted by `plan` and predicted to fit the GPU
at headroom 0: allocated + CUDA/NCCL overhead of the heaviest rank <= the GPU's memory.

No constant is fitted to these layouts; a layout that still does not fit after the engines'
mechanisms are priced carries an `xfail` reason in the data file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from launcher.config.composition.compose import compose_config
from launcher.plan.planner import make_plan
from launcher.validate.rules import check

pytestmark = pytest.mark.unit

DATA = Path(__file__).resolve().parents[2] / "data" / "published_layouts.yaml"
GIB = 1024**3


def _layouts() -> list[Any]:
    rows = yaml.safe_load(DATA.read_text(encoding="utf-8"))["layouts"]
    out = []
    for row in rows:
        marks = [pytest.mark.xfail(reason=row["xfail"], strict=True)] if row.get("xfail") else []
        out.append(pytest.param(row, id=row["id"], marks=marks))
    return out


def _overrides(row: dict[str, Any]) -> list[str]:
    return [*row.get("common", []), *row.get("model", []), *row["overrides"]]


def test_every_row_cites_its_source() -> None:
    text = DATA.read_text(encoding="utf-8")
    # The commits the layouts were read at are stated once, in the file's header.
    assert "c810129341a84e58f4cbed3093f70668a088c028" in text  # Megatron-Bridge v0.4.2
    assert "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a" in text  # torchtitan
    assert "7af9601c9da746d21481194356295bfe23df3737" in text  # Megatron-Bridge v0.2.0
    rows = yaml.safe_load(text)["layouts"]
    assert len(rows) >= 20
    for row in rows:
        assert row["source"].split()[0] in ("Megatron-Bridge", "torchtitan"), row["id"]
    assert len({r["id"] for r in rows}) == len(rows)


@pytest.mark.parametrize("row", _layouts())
def test_published_layout_is_accepted_and_fits(row: dict[str, Any]) -> None:
    cfg = compose_config(_overrides(row)).config
    errors = [v for v in check(cfg) if v.severity == "error"]
    assert not errors, f"{row['id']}: refused: {errors}"
    plan = make_plan(cfg, headroom=0.0)
    h = plan.memory.heaviest
    need = h.allocated + h.overhead
    assert need <= plan.memory.capacity, (
        f"{row['id']}: stage {h.stage} needs {need / GIB:.1f} GiB (activations "
        f"{h.activations / GIB:.1f}, weights {h.weights / GIB:.1f}, gradients "
        f"{h.gradients / GIB:.1f}, optimizer {h.optimizer / GIB:.1f}) of "
        f"{plan.memory.capacity / GIB:.0f}"
    )
    assert plan.memory.verdict != "does_not_fit"
