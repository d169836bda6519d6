"""Every scored published reference run (bench/data/calibration.csv) against the committed constants
(launcher/plan/calibration/fitted.py): its error lies within the cross-validated band `plan` prints
for its regime (launcher/plan/calibration/error_bands.py, written by bench/plan_calibration.py
--write), and no layout that really ran is called "does not fit". The configurations and the choices
made for each source are in launcher/plan/calibration/reference_runs.py; every figure they use is in
its row of the csv (bench/reference_data.py).
"""

from __future__ import annotations

import dataclasses

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.composition.presets import model_preset
from launcher.config.schema import (
    BackendConfig,
    ClusterConfig,
    LLMTrainConfig,
    ParallelConfig,
    TrainConfig,
    ZeroConfig,
)
from launcher.plan.calibration.bands import error_band
from launcher.plan.calibration.reference_layouts import GIB
from launcher.plan.calibration.reference_runs import ReferenceRun, points, predicted
from launcher.plan.memory.estimate import MemoryPlan, StageMemory
from launcher.plan.planner import hardware_view, make_plan

pytestmark = pytest.mark.unit

SCORED = [p for p in points() if p.scored]


def test_every_published_figure_is_in_its_csv_row() -> None:
    from bench.reference_data import CSV, problems, rows

    table = rows()
    assert CSV.is_file() and len(table) == 60  # the reference data ships with the repository
    runs = points()
    assert problems(runs, table) == []
    # A figure typed wrong, or a row missing, is named.
    wrong = [dataclasses.replace(runs[0], published=runs[0].published + 1), runs[1]]
    assert problems(wrong, table) == [f"N1: 138 is not in row N1 of {CSV.name}"]
    gone = {k: v for k, v in table.items() if k != "T1"}
    t1c = next(r for r in runs if r.id == "T1c")
    assert t1c.csv_row == "T1" and problems([t1c], gone) == [f"T1c: no row 'T1' in {CSV.name}"]


@pytest.mark.parametrize("point", SCORED, ids=lambda p: f"{p.id}-{p.metric}")
def test_calibration_row_within_its_cross_validated_band(point: ReferenceRun) -> None:
    value = predicted(point)
    error = value / point.measured - 1.0
    metric = "time" if point.metric == "step_s" else "memory"
    band = error_band(metric, point.config, hardware_view(point.config).arch)
    assert abs(error) <= band.worst + 1e-9, (
        f"{point.id} {point.metric}: predicted {value:.4g}, measured {point.measured:.4g} "
        f"({error:+.1%}; band of {band.regime}: typical {band.typical:.0%}, worst {band.worst:.0%})"
    )


@pytest.mark.parametrize("point", SCORED, ids=lambda p: f"{p.id}-{p.metric}")
def test_published_layouts_are_not_refused(point: ReferenceRun) -> None:
    assert make_plan(point.config).memory.verdict != "does_not_fit"


def test_narayanan_measured_step_time_from_the_paper_formula() -> None:
    # N1: 96 * 512 * 2048 * 24 * 2304^2 * (1 + 2048/13824 + 51200/(16*24*2304)) = 1.5467e16 FLOPs
    # per iteration; at 137 TFLOP/s on 32 GPUs: 1.5467e16 / (137e12 * 32) = 3.528 s per step.
    n1 = points()[0]
    assert n1.measured == pytest.approx(3.528, rel=1e-3)


def test_tokens_per_second_converted_to_step_time() -> None:
    # NP5: Llama 2 7B, GBS 128 x 4096 tokens at 16934 tokens/s/GPU on 8 GPUs:
    # 524288 / (16934 * 8) = 3.870 s per step.
    np5 = next(p for p in points() if p.id == "NP5")
    assert np5.measured == pytest.approx(3.870, rel=1e-3)


def _tp_cfg(tp: int) -> LLMTrainConfig:
    return LLMTrainConfig(
        model=model_preset("llama3-70b", seq_length=8192),
        parallel=ParallelConfig(tp=tp, sequence_parallel=tp > 1),
        zero=ZeroConfig(stage=1),
        train=TrainConfig(micro_batch_size=1, global_batch_size=64, steps=1),
        cluster=ClusterConfig(gpu="h100-sxm", num_nodes=8, gpus_per_node=8),
        backend=BackendConfig(name="megatron"),
    )


def test_memory_falls_as_tp_grows() -> None:
    device = [make_plan(_tp_cfg(tp)).memory.heaviest.allocated for tp in (1, 2, 4, 8)]
    assert device == sorted(device, reverse=True)
    assert device[-1] < 0.3 * device[0]


def _stage(allocated_gib: float, fragmentation: float = 1.1, stage: int = 0) -> StageMemory:
    """A stage whose buckets sum to `allocated_gib` (all weights), with a 2.5 GiB CUDA context."""
    return StageMemory(
        stage, 1, 0, allocated_gib * GIB, 0, 0, 0, 0, 2.5 * GIB, 1, 0.0, fragmentation
    )


def test_verdict_tight_only_within_the_physical_memory() -> None:
    # 80 GiB, 10% headroom: usable 72 GiB. CUDA context 2.5 GiB, fragmentation 1.1.
    def verdict(*stages: StageMemory, band: float = 0.0) -> str:
        return MemoryPlan(stages, 80 * GIB, 0.1, band=band).verdict

    # 60 allocated: reserved 66 + 2.5 = 68.5 <= 72 -> fits.
    assert verdict(_stage(60)) == "fits"
    # 70 allocated: 77 + 2.5 = 79.5 > 72, but 70 + 2.5 = 72.5 <= 80 -> tight.
    assert verdict(_stage(70)) == "tight"
    # 77.5 allocated: 77.5 + 2.5 = 80.0 <= 80 -> tight (the edge); 77.6: 80.1 > 80 -> does not
    # fit, whatever the band (the band rule said tight: 80.1 x (1 - 0.456) = 43.6 <= 80).
    assert verdict(_stage(77.5)) == "tight"
    assert verdict(_stage(77.6)) == "does_not_fit"
    assert verdict(_stage(77.6), band=0.456) == "does_not_fit"
    # The band never changes the word.
    for gib in (60, 70, 77.5, 77.6, 110.6):
        assert verdict(_stage(gib), band=0.456) == verdict(_stage(gib))
    # Every GPU counts, not only the one with the largest reserve: stage 0 reserves 70 x 1.2 =
    # 84 (the heaviest), stage 1 reserves 78 x 1.0 = 78 but must hold 78 + 2.5 = 80.5 > 80.
    assert verdict(_stage(70, 1.2, 0), _stage(78, 1.0, 1)) == "does_not_fit"
    assert verdict(_stage(70, 1.2, 0), _stage(77, 1.0, 1)) == "tight"


def test_nothing_above_the_gpus_memory_is_tight() -> None:
    # Allocated from 0 to twice the capacity, bands 0 .. 0.6: "tight" only when allocated +
    # overhead is within the physical memory, "does not fit" exactly when it is not.
    for tenth in range(0, 1600, 7):
        stage = _stage(tenth / 10)
        need = stage.allocated + stage.overhead
        for band in (0.0, 0.088, 0.3, 0.456, 0.6):
            word = MemoryPlan((stage,), 80 * GIB, 0.1, band=band).verdict
            assert (word == "does_not_fit") == (need > 80 * GIB), (tenth, band)
    # Issue #40: Llama 2 7B fully fine-tuned in pure bf16 on one RTX 4090, 35.7 GiB planned on
    # the card's 24 GiB, was printed "tight".
    cfg = compose_config(
        [
            "model=llama2-7b",
            "finetune=full",
            "cluster=rtx4090",
            "optim.name=adamw8bit",
            "optim.in_backward=true",
            "precision=bf16-pure",
            "train.recompute=full",
            "train.micro_batch_size=4",
            "model.seq_length=2048",
        ]
    ).config
    mem = make_plan(cfg, with_fixes=False).memory
    h = mem.heaviest
    assert h.allocated + h.overhead > mem.capacity and mem.verdict == "does_not_fit"
