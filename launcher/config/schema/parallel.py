"""The layout groups: `parallel.*` (degrees, pipeline schedule) and `zero.*`."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.config.schema.allowed import bounds, one_of
from launcher.config.schema.common import AT_LEAST_1


@dataclass
class ParallelConfig:
    """Parallel degrees. Rank placement order, innermost first: tp, cp, ep-within-dp, dp, pp."""

    tp: int = field(default=1, metadata=AT_LEAST_1)
    """Tensor parallel degree."""
    pp: int = field(default=1, metadata=AT_LEAST_1)
    """Pipeline parallel degree (stages)."""
    vpp: int = field(default=1, metadata=AT_LEAST_1)
    """Virtual pipeline stages (model chunks) per pipeline rank, for the interleaved schedule."""
    cp: int = field(default=1, metadata=AT_LEAST_1)
    """Context parallel degree (load-balanced: seq_length must divide by 2 x cp)."""
    ep: int = field(default=1, metadata=AT_LEAST_1)
    """Expert parallel degree."""
    etp: int | None = None
    """Expert tensor parallel: how many ranks split each expert's weights (Megatron-core's
    --expert-tensor-parallel-size). None: tp, or 1 where ep does not divide dp x cp
    (launcher/backends/common.py expert_tensor_parallel); other values on backend=megatron
    only."""
    dp: int | None = field(default=None, metadata=AT_LEAST_1)
    """Data parallel degree; None: inferred as world_size // (tp * pp * cp)."""
    sequence_parallel: bool = False
    """Shard the norms' and dropouts' activations over the tensor-parallel ranks along the
    sequence (Megatron-LM's sequence parallelism)."""
    pp_schedule: str = field(default="1f1b", metadata=one_of("gpipe", "1f1b", "interleaved"))
    """Pipeline schedule."""
    pp_layers: list[int] | None = None
    """Layer count per pipeline stage (length pp); None: automatic split."""
    account_for_embedding_in_pipeline_split: bool = False
    """Megatron-Core's uneven split: the embedding counted as a layer of the first stage
    (launcher/config/pipeline_split.py has the conditions)."""
    account_for_loss_in_pipeline_split: bool = False
    """Megatron-Core's uneven split: the loss counted as a layer of the last stage."""
    num_layers_in_first_pipeline_stage: int | None = None
    """Megatron-Core's uneven split: the first stage's own layer count."""
    num_layers_in_last_pipeline_stage: int | None = None
    """Megatron-Core's uneven split: the last stage's own layer count."""
    pipeline_layout: str | None = None
    """Megatron-Core's explicit layout string ("Et|(tt|)*30L": E embedding, t layer, L loss,
    | between stages)."""


@dataclass
class ZeroConfig:
    """ZeRO / FSDP sharding of model states over data parallel ranks."""

    stage: int = field(default=0, metadata=bounds(ge=0, le=3))
    """ZeRO stage: 0 none, 1 optimizer states, 2 and gradients, 3 and parameters sharded."""
    offload_optimizer: str = field(default="none", metadata=one_of("none", "cpu"))
    """Keep the optimizer states (and step) in host memory."""
    offload_params: str = field(default="none", metadata=one_of("none", "cpu"))
    """Keep the parameters in host memory (ZeRO-3)."""
