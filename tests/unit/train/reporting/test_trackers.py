"""Tracker switches: off by default, a missing package refused naming the pip extra, a run id
that is the same for every job of one run directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.train.reporting.trackers import numeric, problems, run_id, without_credentials

pytestmark = pytest.mark.unit


def test_off_by_default_and_missing_packages_name_the_extra() -> None:
    cfg = compose_config([]).config
    assert not cfg.logging.wandb and not cfg.logging.mlflow
    assert problems(cfg, find_spec=lambda name: None) == []
    on = compose_config(["logging.wandb=true", "logging.mlflow=true"]).config
    found = problems(on, find_spec=lambda name: None)
    assert len(found) == 2
    assert "pip install 'llmtrain[wandb]'" in found[0]
    assert "pip install 'llmtrain[mlflow]'" in found[1]
    assert problems(on, find_spec=lambda name: object()) == []


def test_run_id_is_stable_per_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = run_id(tmp_path / "runs" / "x")
    monkeypatch.chdir(tmp_path)
    assert run_id(Path("runs/x")) == a  # relative or absolute: the same directory
    assert run_id(tmp_path / "runs" / "y") != a
    assert len(a) == 16 and int(a, 16) >= 0


def test_only_finite_numbers_are_sent_and_uris_lose_credentials() -> None:
    row = {"step": 3, "loss": 2.5, "mfu": None, "x": float("nan"), "time": 1.0, "flag": True}
    assert numeric(row) == {"loss": 2.5}
    assert without_credentials("https://me:pw@host/x") == "https://***@host/x"
