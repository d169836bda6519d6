"""The typed schema of an llmtrain configuration.

Every key a user can type lives here, as a field of a dataclass registered in Hydra's
ConfigStore (see ``compose.py``), with a docstring below it (docs/configuration.md's reference
is generated from them: ``python -m launcher.config.schema.reference_doc``) and, where its values
are limited, an ``Allowed`` in its metadata (``launcher/config/schema/allowed.py``): the words it
takes (``one_of``) or its bounds (``bounds``). Keys whose value is one of a fixed set of words are
plain ``str`` fields: OmegaConf matches enums by member name, which cannot spell ``1f1b``, so the
choice check is ours (``compose.py`` applies it after composition; validate checks the bounds).

Derived quantities (dp inferred from the world size, gradient accumulation, ...) are not stored
here: ``launcher.config.layout`` computes them from these values, one source of truth.

The fields live in one module per config group, re-exported here: ``common``, ``backend``,
``model``, ``parallel``, ``training``, ``data``, ``cluster``, ``run``, ``finetune``, ``root``.
"""

from __future__ import annotations

from launcher.config.schema.backend import BackendConfig, backend_names
from launcher.config.schema.cluster import ClusterConfig, LauncherConfig, SlurmConfig
from launcher.config.schema.common import (
    ABOVE_0,
    AT_LEAST_0,
    AT_LEAST_1,
    GPUS_PER_NODE_TYPO,
    HIDDEN_TYPO,
    LAYERS_TYPO,
    MAX_SEED,
    NODES_TYPO,
    SEQUENCE_TYPO,
)
from launcher.config.schema.data import DataConfig
from launcher.config.schema.finetune import FinetuneConfig
from launcher.config.schema.model import ModelConfig
from launcher.config.schema.parallel import ParallelConfig, ZeroConfig
from launcher.config.schema.root import LLMTrainConfig
from launcher.config.schema.run import CheckpointConfig, LoggingConfig, RunConfig
from launcher.config.schema.training import OptimConfig, PrecisionConfig, TrainConfig

__all__ = [
    "ABOVE_0",
    "AT_LEAST_0",
    "AT_LEAST_1",
    "GPUS_PER_NODE_TYPO",
    "HIDDEN_TYPO",
    "LAYERS_TYPO",
    "MAX_SEED",
    "NODES_TYPO",
    "SEQUENCE_TYPO",
    "BackendConfig",
    "CheckpointConfig",
    "ClusterConfig",
    "DataConfig",
    "FinetuneConfig",
    "LLMTrainConfig",
    "LauncherConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "PrecisionConfig",
    "RunConfig",
    "SlurmConfig",
    "TrainConfig",
    "ZeroConfig",
    "backend_names",
]
