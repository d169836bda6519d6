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
from launcher.plan.calibration.reference_runs import ReferenceRun, points, predicted
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


def test_verdict_tight_within_the_band() -> None:
    # Llama 3 70B at tp=2 on 80 GB: allocated far above capacity -> does_not_fit; the same with
    # the band widened to cover the excess -> tight (memory.fits stays False either way).
    plan = make_plan(_tp_cfg(1))
    mem = plan.memory
    assert mem.verdict == "does_not_fit" and not mem.fits
    h = mem.heaviest
    need = (h.allocated + h.overhead) / mem.capacity  # > 1
    wide = dataclasses.replace(mem, band=1.0 - 1.0 / need + 1e-6)
    assert wide.verdict == "tight" and not wide.fits
