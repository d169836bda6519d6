"""The run's own keys: `checkpoint.*`, `run.*` and `logging.*`."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.config.schema.allowed import a_path, one_of
from launcher.config.schema.common import ABOVE_0, AT_LEAST_1


@dataclass
class CheckpointConfig:
    """When the trainer writes checkpoints (atomically, with a checksummed manifest)."""

    every_steps: int | None = field(default=None, metadata=AT_LEAST_1)
    """Every N optimizer steps. With neither this nor every_minutes set: every Young/Daly
    interval that `plan` computes (plan.json checkpoint.interval_s). Always at the end and on
    preemption."""
    every_minutes: float | None = field(default=None, metadata=ABOVE_0)
    """Also every N minutes of wall time."""
    keep_last: int = field(default=3, metadata=AT_LEAST_1)
    """Checkpoints kept; older ones are deleted."""
    resume: bool = True
    """Continue from the latest valid checkpoint in the run directory when there is one; false
    over a run that holds checkpoints is refused (start the new run with --fresh)."""


@dataclass
class RunConfig:
    """The run directory and what the ranks get from the environment."""

    name: str | None = None
    """The run directory's name; None: <recipe>-<hash of the config>, so the same command resumes
    the same run. A plain folder name of UTF-8 text, at most 239 bytes (--fresh adds 16)."""
    root_dir: str = field(default="runs", metadata=a_path())
    """The folder holding the run directories."""
    secret_env: list[str] = field(default_factory=list)
    """Names of environment variables the ranks need but that are never written down (API keys):
    values come from the launching environment; see launcher.config.secrets."""


@dataclass
class LoggingConfig:
    """Experiment trackers beside metrics.jsonl and TensorBoard: off by default, rank 0 only,
    optional extras (pip install 'llmtrain[wandb]' / 'llmtrain[mlflow]'). Credentials only from
    the environment (WANDB_API_KEY, MLFLOW_TRACKING_TOKEN, ...; see run.secret_env)."""

    wandb: bool = False
    """Log to Weights & Biases."""
    wandb_project: str = "llmtrain"
    """The W&B project."""
    wandb_entity: str | None = None
    """The W&B entity (team or user); None: your default."""
    wandb_mode: str = field(default="online", metadata=one_of("online", "offline", "disabled"))
    """W&B's mode."""
    mlflow: bool = False
    """Log to MLflow."""
    mlflow_tracking_uri: str | None = None
    """None: MLFLOW_TRACKING_URI from the environment, else mlflow's default (./mlruns)."""
    mlflow_experiment: str = "llmtrain"
    """The MLflow experiment."""
