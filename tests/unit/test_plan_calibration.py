"""Every row of ../shared/reference/calibration.csv, reproduced within 10% with one set of
constants (launcher.plan.timing.STEP_EFFICIENCY, launcher.plan.memory.FRAGMENTATION and the hardware
catalog). The configurations and the choices made for each source are in
launcher/plan/calibration.py.
"""

from __future__ import annotations

import pytest

from launcher.plan.calibration import CalibrationPoint, points, predicted

pytestmark = pytest.mark.unit

TOLERANCE = 0.10


@pytest.mark.parametrize("point", points(), ids=lambda p: f"{p.id}-{p.metric}")
def test_calibration_point_within_tolerance(point: CalibrationPoint) -> None:
    value = predicted(point)
    error = value / point.measured - 1.0
    assert abs(error) <= TOLERANCE, (
        f"{point.id} {point.metric}: predicted {value:.4g}, measured {point.measured:.4g} "
        f"({error:+.1%}, {point.note})"
    )


def test_narayanan_measured_step_time_from_the_paper_formula() -> None:
    # N1: 96 * 512 * 2048 * 24 * 2304^2 * (1 + 2048/13824 + 51200/(16*24*2304)) = 1.5467e16 FLOPs
    # per iteration; at 137 TFLOP/s on 32 GPUs: 1.5467e16 / (137e12 * 32) = 3.528 s per step.
    n1 = points()[0]
    assert n1.measured == pytest.approx(3.528, rel=1e-3)
