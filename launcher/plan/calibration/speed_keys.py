"""The speed keys (launcher/backends/speed_features.py) each calibration row ran with, kept apart
from launcher/plan/calibration/reference_runs.py so that the rows' layouts and their speed features
are typed by whoever reads each source.

- NB (NeMo 25.02 on DGX-B200): NVIDIA/NeMo scripts/performance/recommended_model_configs/
  model_configs_b200.csv (read at commit 026c682ec2a262389f0ac13cccd45df99d6a902e; the layouts
  agree with the rows' d26ad52fa4) has cuda_graphs=1 for the pre_train rows of llama3 8b and 70b,
  nemotron4 15b and 340b and mixtral 8x7b (fp8), 0 for gpt3 175b, llama31 405b and mixtral 8x22b.
  NeMo 2.0's enable_cuda_graph is Megatron-Core's local implementation, whole layers (no scope),
  hence cuda_graphs=local. (Megatron-LM's own arguments.py would ask an inference-only padding
  flag of NB7, ep 8 with local graphs; NeMo builds the TransformerConfig directly, so it ran.)
  Its fp8 is Transformer Engine's delayed scaling (the key's default); tp-comm-overlap is already
  set by calibration.py.
- NP, NL (NeMo 24.07 / 24.03), N, P482: no CUDA graphs, delayed fp8, no MoE: the defaults.
- T, AM, MP, AO run torch engines: none of the Megatron-only keys.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from launcher.config.schema import LLMTrainConfig

# Values of any backend key type (bool, str, list).
SPEED_KEYS: dict[str, dict[str, Any]] = {
    "NB2": {"cuda_graphs": "local"},
    "NB3": {"cuda_graphs": "local"},
    "NB5": {"cuda_graphs": "local"},
    "NB6": {"cuda_graphs": "local"},
    "NB7": {"cuda_graphs": "local"},
}


def with_speed_keys(row_id: str, cfg: LLMTrainConfig) -> LLMTrainConfig:
    """`cfg` with the backend speed keys row `row_id` ran with (unchanged for other rows)."""
    keys = SPEED_KEYS.get(row_id)
    if not keys:
        return cfg
    return replace(cfg, backend=replace(cfg.backend, **keys))


__all__ = ["SPEED_KEYS", "with_speed_keys"]
