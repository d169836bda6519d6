"""The whole configuration: one field per group."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.config.schema.backend import BackendConfig
from launcher.config.schema.cluster import ClusterConfig, LauncherConfig, SlurmConfig
from launcher.config.schema.data import DataConfig
from launcher.config.schema.finetune import FinetuneConfig
from launcher.config.schema.model import ModelConfig
from launcher.config.schema.parallel import ParallelConfig, ZeroConfig
from launcher.config.schema.run import CheckpointConfig, LoggingConfig, RunConfig
from launcher.config.schema.training import OptimConfig, PrecisionConfig, TrainConfig


@dataclass
class LLMTrainConfig:
    """The whole configuration: what `llmtrain show` prints."""

    recipe: str = "none"
    """The recipe (recipes/NAME.yaml, or a path) the configuration starts from."""
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    zero: ZeroConfig = field(default_factory=ZeroConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    run: RunConfig = field(default_factory=RunConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
