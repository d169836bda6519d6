"""Timings on a busy machine are named as noise, and fits no real step can have are refused
(issue 33, item 7): the arithmetic of launcher.plan.hardware.measurement_noise and plan --measure's
fit, and how a profile's recorded quality decides whether plan uses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.errors import UserError
from launcher.launch import measure as measure_mod
from launcher.plan.hardware import measurement_noise as noise
from launcher.plan.hardware import profile as prof

pytestmark = pytest.mark.unit


def test_spread_is_the_interquartile_range_over_the_median() -> None:
    assert noise.relative_spread([1.0]) == 0.0
    assert noise.relative_spread([1.0, 1.0, 1.0]) == 0.0
    # quartiles 1.0 and 1.1 (inclusive method), median 1.0: 10%
    assert noise.relative_spread([0.9, 1.0, 1.0, 1.1, 1.2]) == pytest.approx(0.1)
    steady = [0.100, 0.101, 0.099, 0.100, 0.102]
    busy = [0.1, 0.4, 0.12, 0.9, 0.1]
    assert not noise.is_noise(noise.relative_spread(steady))
    assert noise.is_noise(noise.relative_spread(busy))


def test_the_issues_figures_are_called_what_they_are() -> None:
    # wq backward 81.8 ms for a 0.6 ms forward: no GEMM's backward is 136x its forward
    odd = noise.ratio_problem("GEMM attention wq", 0.6e-3, 81.8e-3)
    assert odd is not None and "136.3x" in odd
    assert noise.ratio_problem("GEMM mlp w1", 1.0e-3, 2.1e-3) is None
    # the optimizer through 265 ms on 4x the parameters and 7 ms on a quarter: below zero
    line = noise.line_problem("optimizer step", (858_832, 0.265), (214_708, 0.007))
    assert line is not None and "below zero" in line
    # 4x the parameters in 3.5x the time: a fixed part and a part per parameter
    assert noise.line_problem("optimizer step", (858_832, 0.035), (214_708, 0.010)) is None
    # more work measured much faster
    faster = noise.line_problem("optimizer step", (858_832, 0.010), (214_708, 0.030))
    assert faster is not None and "more work measured faster" in faster


def test_load_per_core_says_busy() -> None:
    assert noise.Load(4.4, 2).busy and "busy" in noise.Load(4.4, 2).text()
    assert not noise.Load(0.2, 8).busy and "quiet" in noise.Load(0.2, 8).text()


def test_plan_measure_refuses_a_negative_intercept(monkeypatch: pytest.MonkeyPatch) -> None:
    # The issue's fit: step = -733.9 ms + 1133.97 ms x layers. The two runs are given as the
    # points they measured; the refusal is the arithmetic on them.
    points = {
        1: measure_mod.Point(1, 0.40007, None, 0.1, 1.0, 4, spread=0.9),
        2: measure_mod.Point(2, 1.53404, None, 0.2, 1.0, 4, spread=0.7),
    }

    def fake_run(overrides, layers, root, steps, progress):  # type: ignore[no-untyped-def]
        return points[layers], "not recorded"

    monkeypatch.setattr(measure_mod, "cut_run", fake_run)
    with pytest.raises(UserError) as info:
        measure_mod.measure(["recipe=tiny"], lambda line: None)
    text = str(info.value)
    assert "step = -733.9 ms + 1133.97 ms x layers is not a fit any real step has" in text
    assert "spread 90%" in text and "core(s)" in text and "noise" in text
    assert measure_mod.fit_problem(-0.001, 0.5) is not None
    assert measure_mod.fit_problem(0.01, 0.0) is not None
    assert measure_mod.fit_problem(0.01, 0.5) is None


def test_the_measure_table_names_a_noisy_run() -> None:
    m = measure_mod.Measured(
        points=(
            measure_mod.Point(1, 0.1, None, 0.1, 1.0, 4, spread=0.02),
            measure_mod.Point(2, 0.3, None, 0.2, 1.0, 4, spread=0.6),
        ),
        layers=4,
        step_s=0.7,
        per_layer_s=0.2,
        fixed_s=-0.0,
        memory_bytes=None,
        memory_kind="not recorded",
        predicted_step_s=0.5,
        predicted_memory_bytes=1.0,
        load=noise.Load(3.0, 2),
    )
    text = measure_mod.table(m)
    assert "noise: the 2-layer run's steps spread 60%" in text
    assert "1-layer run's steps spread" not in text
    assert "the machine was busy (load 3.00 on 2 core(s) (busy))" in text


def _profile(tmp_path: Path, quality: dict[str, object] | None) -> Path:
    doc: dict[str, object] = {
        "schema": prof.SCHEMA,
        "version": prof.VERSION,
        "device": {"cluster_gpu": "cpu", "kind": "cpu", "name": prof.host_cpu_name() or "cpu"},
        "gemm": [
            {"dtype": "fp32", "threads": 1, "m": 64, "n": 64, "k": 64, "fwd_s": 1e-4, "bwd_s": 2e-4}
        ],
    }
    if quality is not None:
        doc["quality"] = quality
    doc["digest"] = prof.digest(doc)
    path = tmp_path / f"p{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps(doc))
    return path


def test_plan_refuses_a_noisy_profile_and_names_a_forced_one(tmp_path: Path) -> None:
    problems = ["GEMM attention wq: repeats spread 80% of their median (limit 25%)"]
    noisy = _profile(tmp_path, {"problems": problems, "forced": False})
    with pytest.raises(prof.ProfileError, match="noise or not physical"):
        prof.choose("cpu", str(noisy), "fp32", 1)
    forced = _profile(tmp_path, {"problems": problems, "forced": True})
    choice, note = prof.choose("cpu", str(forced), "fp32", 1)
    assert choice is not None and note is not None and "calibrate --force" in note
    clean = _profile(tmp_path, {"problems": [], "forced": False})
    assert prof.choose("cpu", str(clean), "fp32", 1)[1] is None
    old = _profile(tmp_path, None)  # written before calibrate recorded its quality
    assert prof.choose("cpu", str(old), "fp32", 1)[0] is not None


def _session(deadline_s: float):  # type: ignore[no-untyped-def]
    import time

    import torch

    from launcher.config.composition.compose import compose_config
    from launcher.launch.calibrate import Session
    from launcher.train.op_timing import Timer

    timer = Timer(torch.device("cpu"), time.monotonic() + deadline_s)
    cfg = compose_config(["recipe=tiny", "cluster=cpu"]).config
    return Session(cfg, timer.device, timer, 1, lambda _: None, time.monotonic(), 1, {})


@pytest.mark.parametrize(
    ("spreads", "deadline_s", "kept", "tries"),
    [
        ([0.9, 0.1, 0.5], 60.0, 0.1, 2),  # a quiet second attempt is kept, no third
        ([0.9, 0.6, 0.7], 60.0, 0.6, 3),  # all noisy: the narrowest of three, judged noise
        ([0.05], 60.0, 0.05, 1),  # quiet at once: measured once
        ([0.9, 0.1], -1.0, 0.9, 1),  # the time budget spent: no second attempt
    ],
)
def test_calibrate_measures_a_noisy_figure_again(
    spreads: list[float], deadline_s: float, kept: float, tries: int
) -> None:
    s = _session(deadline_s)
    calls: list[float] = []

    def measure() -> float:
        spread = spreads[len(calls)]
        calls.append(spread)
        s.timer.spread = spread  # what Timer.measure leaves after its repeats
        return spread * 1000  # the figure of that attempt

    assert s.steady(measure) == kept * 1000
    assert len(calls) == tries
    assert s.timer.take_spread() == kept  # judged() reads the kept attempt's spread
