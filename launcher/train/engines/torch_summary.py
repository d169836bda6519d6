"""What the torch engine records of itself in each checkpoint's extra state (the engine's
``extra_state``): its mesh, data parallelism, loss scale, fp8 layers, pipeline schedule, loss,
fine-tuning method and parameter counts, read back by ``llmtrain status`` and the summary."""

from __future__ import annotations

from typing import Any

from torch.distributed.tensor import DTensor

from launcher.config.schema import LLMTrainConfig
from launcher.train.model import fp8


def fp8_kind(cfg: LLMTrainConfig) -> str:
    """How fp8 runs: torchao float8 with its recipe, emulated where asked."""
    recipe = cfg.precision.fp8_recipe
    return ("emulated " if cfg.precision.fp8_emulate else "") + f"torchao float8 {recipe}"


def engine_summary(engine: Any) -> dict[str, Any]:
    """The torch engine `engine` (a TorchEngine) described for its checkpoint's extra state."""
    self = engine
    lay = self.layout
    return {
        "engine": "torch",
        "mesh": {"pp": lay.pp, "dp": lay.dp, "cp": lay.cp, "tp": lay.tp, "ep": lay.ep},
        "data_parallel": "fsdp2"
        if self.fsdp
        else ("ddp" if lay.dp * lay.cp > 1 else "none") + ("+zero1" if self.zero == 1 else ""),
        "loss_scale": self.scaler.get_scale() if self.scaler is not None else None,
        "fp8": fp8_kind(self.cfg) if self.fp8 else None,
        "fp8_layers": sum(fp8.is_float8_linear(m) for part in self.parts for m in part.modules())
        if self.fp8
        else 0,
        "pp_schedule": self.cfg.parallel.pp_schedule if lay.pp > 1 else None,
        "loss": "chunked"
        if self.chunked_loss
        else "vocab-parallel"
        if self.vocab_parallel
        else "full logits",
        "chunks": self.chunk_ids,
        "finetune": self.cfg.finetune.name,
        "params_trainable": sum(
            (p.to_local() if isinstance(p, DTensor) else p).numel()
            for p in self._params()
            if p.requires_grad
        ),
        "params_local": sum(
            (p.to_local() if isinstance(p, DTensor) else p).numel() for p in self._params()
        ),
    }
