"""Which configuration differences a resume accepts (launcher.config.run_config), and the command
that resumes a run as it was started: it must compose to the run's recorded values."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.run_config import (
    changes_trajectory,
    config_changes,
    override_value,
    restoring_overrides,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "key",
    [
        "model.hidden_size",
        "data.path",
        "train.global_batch_size",
        "train.micro_batch_size",
        "optim.lr",
        "optim.schedule",
        "train.steps",
        "train.tokens",
        "train.seed",
        "precision.compute_dtype",
        "parallel.tp",
        "cluster.gpus_per_node",
        "backend.name",
        "zero.stage",
        "brand_new.key",  # a key this list does not know yet changes training until said not to
    ],
)
def test_what_the_run_trains_is_a_trajectory_change(key: str) -> None:
    assert changes_trajectory(key)


@pytest.mark.parametrize(
    "key",
    [
        "train.log_every",
        "train.eval_every",
        "train.eval_steps",
        "checkpoint.every_steps",
        "checkpoint.keep_last",
        "run.root_dir",
        "logging.wandb",
        "slurm.time",
        "cluster.env.NCCL_DEBUG",
        "train.max_nonfinite_skips",
    ],
)
def test_logging_cadence_paths_and_trackers_are_not(key: str) -> None:
    assert not changes_trajectory(key)


def test_changes_list_trajectory_keys_first() -> None:
    old = compose_config(["train.steps=300"]).values
    new = compose_config(["train.log_every=7", "optim.lr=0.0123"]).values
    changes = config_changes(old, new)
    assert [(c.key, c.trajectory) for c in changes] == [
        ("optim.lr", True),
        ("train.steps", True),
        ("train.log_every", False),
    ]
    assert changes[1].line() == f"train.steps: 300 -> {new['train']['steps']}"
    assert config_changes(old, old) == []


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (["train.steps=300"], []),  # the reviewer's case: the recipe's steps came back
        (["train.tokens=1000000"], ["train.steps=7"]),  # the other budget key
        (["optim.lr=0.001", "optim.betas=[0.8,0.9]"], ["optim.lr=0.002"]),
        (["model=tiny", "model.hidden_size=64"], ["model.hidden_size=96"]),
        (["data.path='/my data/it\\'s'"], ["slurm.job_name=x", "train.seed=7"]),
        (["data.blend=[0.5,/a,0.5,/b]"], []),
    ],
)
def test_the_suggested_command_composes_to_the_run_s_own_configuration(
    first: list[str], second: list[str]
) -> None:
    recorded = compose_config(first).values
    now = compose_config(second)
    changes = config_changes(recorded, now.values)
    assert any(c.trajectory for c in changes)
    again = compose_config(restoring_overrides(now.overrides, changes)).values
    assert [c.key for c in config_changes(recorded, again) if c.trajectory] == []


@pytest.mark.parametrize(
    "value", [None, True, False, 3, -2, 1e-8, 3.0e-4, "plain", "two words", "it's", [0.9, 0.95]]
)
def test_override_values_read_back_as_written(value: object) -> None:
    key = "slurm.job_name" if isinstance(value, str) or value is None else None
    if isinstance(value, bool):
        key = "backend.overlap_comm"
    elif isinstance(value, int):
        key = "train.seed" if value >= 0 else "slurm.chain"
    elif isinstance(value, float):
        key = "optim.lr"
    elif isinstance(value, list):
        key = "optim.betas"
    assert key is not None
    cfg_values = compose_config([f"{key}={override_value(value)}"]).values
    section, name = key.split(".")
    assert cfg_values[section][name] == value


@pytest.mark.parametrize("in_environment", [True, False])
def test_the_refusal_never_prints_a_secret_given_on_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_environment: bool
) -> None:
    from launcher.launch.resume_refusal import resume_refusal
    from launcher.rundir import RunDir

    secret = "supersecret-value-123"
    if in_environment:
        monkeypatch.setenv("WANDB_API_KEY", secret)
    else:
        monkeypatch.delenv("WANDB_API_KEY", raising=False)
    recorded = compose_config(["train.steps=300"]).values
    now = compose_config([f"+cluster.env.WANDB_API_KEY={secret}", "train.seed=5"])
    text = resume_refusal(
        RunDir(tmp_path), recorded, now, config_changes(recorded, now.values), "local"
    )
    assert secret not in text
    assert "train.steps: 300 -> " in text and "(not set on this command" in text
    assert "train.seed: " in text and " -> 5\n" in text
    shown = "'+cluster.env.WANDB_API_KEY=${oc.env:WANDB_API_KEY}'" if in_environment else "***"
    assert shown in text, text
    resume = next(x for x in text.splitlines() if "as it was started:" in x)
    assert "train.steps=300" in resume and "train.seed=" in resume
