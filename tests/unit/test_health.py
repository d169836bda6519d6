"""Training health (issue 19): what counts as a non-finite step, the loss-spike detector, and the
validation of the values that make a run diverge or crash in the rank (exit 2, naming the key)."""

from __future__ import annotations

import math

import pytest

from launcher.health import LossSpikes, finite_or_none, nonfinite, robust_zscore
from tests.cli import invoke, shown

pytestmark = pytest.mark.unit


def test_nonfinite_names_the_quantity_and_leaves_the_scaler_its_overflows() -> None:
    assert nonfinite(2.5, 1.0, dynamic_scaling=False) == ()
    assert nonfinite(math.nan, 1.0, dynamic_scaling=False) == ("loss",)
    assert nonfinite(math.inf, math.nan, dynamic_scaling=False) == ("loss", "grad_norm")
    assert nonfinite(2.5, math.inf, dynamic_scaling=False) == ("grad_norm",)
    # Dynamic loss scaling skips an overflowing step itself and lowers the scale: not an event.
    assert nonfinite(2.5, math.inf, dynamic_scaling=True) == ()
    assert nonfinite(math.nan, math.inf, dynamic_scaling=True) == ("loss",)
    # An engine that cannot tell the norm reports None: not counted as non-finite.
    assert nonfinite(2.5, None, dynamic_scaling=False) == ()
    assert finite_or_none(math.nan) is None and finite_or_none(3.0) == 3.0


def test_robust_zscore_ignores_a_single_outlier_in_the_window() -> None:
    history = [3.0 + 0.01 * (i % 5) for i in range(40)]
    calm = robust_zscore(3.02, history)
    assert calm is not None and abs(calm) < 2
    # One earlier spike in the window moves a mean/std score, not the median/MAD one.
    spiky = [*history, 50.0]
    z = robust_zscore(3.5, spiky)
    assert z is not None and z > 20
    assert robust_zscore(3.0, history[:5]) is None  # too little history
    assert robust_zscore(9.0, [3.0] * 30) is None  # no spread: no verdict


def test_loss_spikes_flag_upward_jumps_only_and_skip_nonfinite_losses() -> None:
    spikes = LossSpikes(window=20, threshold=6.0)
    flags = []
    for step in range(60):
        loss = 4.0 - 0.01 * step + 0.02 * ((step * 7) % 3)
        if step == 40:
            loss = 9.0
        if step == 45:
            loss = 1.0  # a sudden drop is not a spike
        if step == 50:
            loss = math.nan
        z, spike = spikes.observe(loss)
        flags.append(spike)
        if step == 50:
            assert z is None
    assert [i for i, f in enumerate(flags) if f] == [40]
    assert len(spikes.window) == 20 and all(math.isfinite(v) for v in spikes.window)
    assert not LossSpikes(window=20, threshold=0).observe(1e9)[1]  # 0 disables


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("train.seed=-1", "train.seed"),
        ("train.seed=4294967296", "train.seed"),
        ("optim.lr=inf", "optim.lr"),
        ("optim.lr=nan", "optim.lr"),
        ("optim.lr=-0.001", "optim.lr"),
        ("optim.eps=0", "optim.eps"),
        ("optim.eps=inf", "optim.eps"),
        ("optim.betas=[0.9,1.0]", "optim.betas"),
        ("optim.betas=[0.9,nan]", "optim.betas"),
        ("optim.weight_decay=-0.1", "optim.weight_decay"),
        ("optim.grad_clip=-1", "optim.grad_clip"),
        ("optim.grad_clip=inf", "optim.grad_clip"),
        ("train.max_nonfinite_skips=-1", "train.max_nonfinite_skips"),
        ("train.loss_spike_window=0", "train.loss_spike_window"),
        ("train.loss_spike_zscore=nan", "train.loss_spike_zscore"),
        ("run.name=..", "run.name"),
        ("run.name=a/b", "run.name"),
    ],
)
def test_validate_refuses_values_that_crash_or_diverge_in_the_rank(override: str, key: str) -> None:
    result = invoke("validate", override)
    assert result.returncode == 2, shown(result)
    assert f"{key}=" in shown(result) and "Traceback" not in shown(result)


def test_run_dry_run_refuses_a_bad_run_name_as_run_does() -> None:
    # `run --dry-run` exited 0 for run.name=.. while `run` exited 2 (issue 19, item 11).
    result = invoke("run", "--dry-run", "run.name=..")
    assert result.returncode == 2, shown(result)
    assert "run.name='..'" in shown(result)


def test_hot_lr_and_long_warmup_are_warnings_not_errors() -> None:
    # The diverging reproduction must still launch (it then stops with exit 3).
    result = invoke("validate", "optim.lr=30", "optim.warmup_steps=500")
    assert result.returncode == 0, shown(result)
    assert "optim.lr=30" in shown(result) and "optim.warmup_steps=500" in shown(result)
