"""A profile that prices more than one process: the per-step overhead of a layout family
(launch/step_overhead.py) and the collectives' size ladder, read, checked and priced by the plan.

Expected values are derived by hand in the comments.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.layout import derive_layout
from launcher.plan.hardware import profile as prof
from launcher.plan.hardware.profile_rates import layout_family, overhead_units, rates
from launcher.plan.planner import make_plan
from tests.unit.plan.hardware.test_plan_profile import TINY, tiny_profile

pytestmark = pytest.mark.unit
MS = 1e-3
DP2 = [*TINY, "cluster.gpus_per_node=2", "train.global_batch_size=16"]  # 2 ranks, 1 micro-batch
FAMILY = "torch dp2 tp1 pp1 cp1 ep1 zero0"


def dp2_profile(seconds: float = 6 * MS, units: int = 1) -> dict[str, Any]:
    """tiny_profile's figures, measured with the threads of a 2-process run, plus an overhead."""
    doc = tiny_profile()
    threads = prof.cpu_threads(2)
    for section in prof.SECTIONS:
        for e in doc.get(section, []):
            e["threads"] = threads
    doc["overhead"] = [
        {"layout": FAMILY, "threads": threads, "ranks": 2, "units": units, "seconds": seconds}
    ]
    doc["digest"] = prof.digest(doc)
    return doc


def planned(overrides: list[str], path: Path | None) -> Any:
    extra = [f"cluster.profile={path}"] if path else ["cluster.profile=none"]
    return make_plan(compose_config([*overrides, *extra]).config)


def test_layout_family_names_backend_degrees_and_zero() -> None:
    cfg = compose_config(DP2).config
    assert layout_family(cfg, derive_layout(cfg)) == FAMILY
    tp = compose_config([*TINY, "cluster.gpus_per_node=2", "parallel.tp=2"]).config
    assert layout_family(tp, derive_layout(tp)) == "torch dp1 tp2 pp1 cp1 ep1 zero0"


@pytest.mark.parametrize(
    ("layout", "units"),
    [
        (["train.global_batch_size=32"], 1),  # dp=2, 2 micro-batches: once per step
        (["parallel.tp=2", "train.micro_batch_size=4", "train.global_batch_size=8"], 8),
        (["parallel.pp=2", "model.tie_embeddings=false", "train.global_batch_size=32"], 4),
        ([], 1),  # dp=2, 1 micro-batch
    ],
    ids=["dp2-2mb", "tp2-4layers-2mb", "pp2-4mb", "dp2"],
)
def test_overhead_units_count_where_the_ranks_meet(layout: list[str], units: int) -> None:
    cfg = compose_config([*TINY, "cluster.gpus_per_node=2", *layout]).config
    lay = derive_layout(cfg)
    assert overhead_units(lay, max(lay.stage_layers)) == units


def test_overhead_is_the_line_through_the_cut_runs() -> None:
    doc = dp2_profile(6 * MS, units=4)
    doc["overhead"].append({**doc["overhead"][0], "units": 8, "seconds": 10 * MS})
    r = rates(doc, "fp32", prof.cpu_threads(2))
    # 6 ms at 4 synchronisations, 10 ms at 8: 2 ms + 1 ms each, so 16 are priced 18 ms.
    assert r.overhead_s(FAMILY, 4) == pytest.approx(6 * MS)
    assert r.overhead_s(FAMILY, 16) == pytest.approx(18 * MS)
    assert r.overhead_s("torch dp1 tp2 pp1 cp1 ep1 zero0", 4) is None  # not measured
    assert rates(doc, "fp32", 99).overhead_s(FAMILY, 4) is None  # other threads
    # Runs at one number of synchronisations only (dp: once per step): their mean, at any count.
    flat = dp2_profile(6 * MS, units=1)
    flat["overhead"].append({**flat["overhead"][0], "seconds": 8 * MS})
    assert rates(flat, "fp32", prof.cpu_threads(2)).overhead_s(FAMILY, 1) == pytest.approx(7 * MS)
    # A line never goes below 0 nor falls with more synchronisations.
    down = dp2_profile(10 * MS, units=4)
    down["overhead"].append({**down["overhead"][0], "units": 8, "seconds": 6 * MS})
    assert rates(down, "fp32", prof.cpu_threads(2)).overhead_s(FAMILY, 16) == pytest.approx(8 * MS)


def test_plan_adds_the_measured_overhead_as_a_row(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(dp2_profile(6 * MS, units=1)))
    with_overhead = planned(DP2, path)
    path.write_text(json.dumps(dp2_profile(0.0, units=1)))
    without = planned(DP2, path)
    # dp=2 synchronises once per step: 1 unit, the measured 6 ms exactly.
    assert with_overhead.time.step_s == pytest.approx(without.time.step_s + 6 * MS, rel=1e-9)
    assert with_overhead.time.exposed_comm_s == pytest.approx(
        without.time.exposed_comm_s + 6 * MS, rel=1e-9
    )
    rows = [c for c in with_overhead.time.collectives if c.kind == "overhead"]
    assert len(rows) == 1 and rows[0].time_s == pytest.approx(6 * MS)
    assert rows[0].group_size == 2 and "calibrate" in rows[0].note
    assert not [c for c in without.time.collectives if c.kind == "overhead"]  # 0: no row


def test_a_plan_without_a_profile_has_no_overhead_row() -> None:
    plan = planned(DP2, None)
    assert not [c for c in plan.time.collectives if c.kind == "overhead"]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"seconds": -1.0}, "overhead[0].seconds"),
        ({"seconds": True}, "overhead[0].seconds"),
        ({"seconds": float("inf")}, "overhead[0].seconds"),
        ({"seconds": 1e9}, "longer than any step"),
        ({"units": 2.5}, "overhead[0].units"),
        ({"units": 0}, "overhead[0].units"),
        ({"ranks": "2"}, "overhead[0].ranks"),
        ({"layout": "x" * 65}, "overhead[0].layout"),
        ({"layout": "a\x1bb"}, "overhead[0].layout"),
        ({"threads": -1}, "overhead[0].threads"),
    ],
)
def test_a_forged_overhead_entry_is_refused(change: dict[str, Any], says: str) -> None:
    doc = dp2_profile()
    doc["overhead"][0].update(change)
    doc["digest"] = prof.digest(doc)
    with pytest.raises(prof.ProfileError, match=re.escape(says)):
        prof.validate(json.loads(json.dumps(doc, allow_nan=True)))


def test_a_profile_without_an_overhead_section_still_reads() -> None:
    doc = tiny_profile()  # written before the section existed
    assert "overhead" not in doc and prof.validate(doc) is doc
    assert rates(doc, "fp32", prof.cpu_threads(1)).overheads == ()


def test_merge_replaces_the_same_layout_and_size_and_keeps_the_others() -> None:
    old = dp2_profile(6 * MS, units=4)
    old["overhead"].append({**old["overhead"][0], "layout": "torch dp1 tp2 pp1 cp1 ep1 zero0"})
    new = dp2_profile(9 * MS, units=4)
    merged = prof.merge(old, new)
    by = {e["layout"]: e["seconds"] for e in merged["overhead"]}
    assert by == {FAMILY: 9 * MS, "torch dp1 tp2 pp1 cp1 ep1 zero0": 6 * MS}
    assert prof.validate(merged) is merged  # the digest is the merged document's


@pytest.mark.parametrize(
    ("layout", "layers"),
    [
        (["cluster.gpus_per_node=2", "train.global_batch_size=16"], 1),
        (["cluster.gpus_per_node=2", "parallel.tp=2"], 1),
        (["cluster.gpus_per_node=2", "parallel.pp=2", "model.tie_embeddings=false"], 2),
        (["cluster.gpus_per_node=2", "parallel.pp=2", "parallel.vpp=2", "model.num_layers=8"], 4),
        (["model.num_layers=1"], 1),
    ],
    ids=["dp2", "tp2", "pp2", "pp2-vpp2", "one-layer"],
)
def test_the_cut_run_keeps_one_layer_per_pipeline_chunk(layout: list[str], layers: int) -> None:
    from launcher.launch.step_overhead import cut_layers

    cfg = compose_config([*TINY, "backend=torch", *layout]).config
    assert cut_layers(cfg) == layers


@pytest.mark.parametrize(
    ("layout", "runs"),
    [
        # tp: the ranks meet in every layer: 1 and 2 layers, the configuration's batch.
        (["parallel.tp=2"], [(1, None), (2, None)]),
        # tp with only 2 layers: 2 per chunk would be the whole model: micro-batches instead.
        (["parallel.tp=2", "model.num_layers=2"], [(1, None), (1, 16)]),
        # dp: once per step; pp: once per micro-batch: the micro-batches double.
        (["train.global_batch_size=16"], [(1, None), (1, 32)]),
        (
            ["parallel.pp=2", "model.tie_embeddings=false", "train.global_batch_size=16"],
            [(2, None), (2, 32)],
        ),
    ],
    ids=["tp2", "tp2-2layers", "dp2", "pp2"],
)
def test_the_two_cut_runs_differ_in_what_the_layout_synchronises(
    layout: list[str], runs: list[tuple[int, int | None]]
) -> None:
    from launcher.launch.step_overhead import cut_variants

    overrides = [*TINY, "cluster.gpus_per_node=2", *layout]
    got = cut_variants(compose_config(overrides).config, overrides)
    want = [
        (overrides + ([f"train.global_batch_size={gbs}"] if gbs else []), layers)
        for layers, gbs in runs
    ]
    assert got == want


def test_a_layout_over_several_nodes_is_not_cut_run_here() -> None:
    from launcher.launch.step_overhead import run_cut

    cfg = compose_config(["recipe=tiny", "cluster.num_nodes=2"]).config
    said = run_cut(cfg, ["recipe=tiny", "cluster.num_nodes=2"], 1, lambda _line: None)
    assert isinstance(said, str) and "cluster.num_nodes=2" in said
