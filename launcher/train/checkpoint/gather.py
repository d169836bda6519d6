"""A checkpoint's model, one tensor at a time: what `llmtrain export` writes and `llmtrain sample`
loads, without the whole model in memory at once where the checkpoint allows it (issue #39).

- torch engine (DCP: one process, DDP, FSDP2, tensor / pipeline / expert parallel): each tensor
  gathered whole on its own from the parts of the saved chunks that hold it
  (``consolidate.DcpTensors``), used, and dropped before the next is read.
- DeepSpeed engine (ZeRO 0-2, pipeline stages, ZeRO-3): each tensor read on its own from where
  its values lie (``deepspeed_tensors.DeepSpeedTensors``: a ZeRO-3 parameter merged from the
  ranks' fp32 partitions, bit for bit what DeepSpeed's ``zero_to_fp32`` gives), used, and
  dropped before the next is read.
- A finetune=lora|qlora run (``merged``): each weight is its base tensor (train.init_from read by
  slice, or the seeded initialiser's draw: ``train.parallel.build``'s sources, as the engines
  fill a model) plus scale * B @ A, in fp32; the base's digest is taken tensor by tensor on the way
  and checked against the checkpoint's record by ``check`` once every tensor was made (an export
  calls it before its folder is put in place, so a refused base leaves nothing behind).

``how`` is the line the commands print: what was held at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from launcher.config.schema import LLMTrainConfig
from launcher.errors import UserError

MIB = 1 << 20
Specs = dict[str, tuple[tuple[int, ...], torch.dtype]]


def mib(nbytes: int) -> str:
    return f"{nbytes / MIB:,.1f} MiB"


def _bytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return int(torch.Size(shape).numel()) * dtype.itemsize


@dataclass
class ModelTensors:
    """{name: (shape, dtype)} of a model's tensors, each made by `tensor(name)` when asked for;
    `check` runs once every tensor was made (a LoRA base's digest)."""

    specs: Specs
    tensor: Callable[[str], torch.Tensor]
    check: Callable[[], None] = field(default=lambda: None)

    @property
    def total(self) -> int:
        return sum(_bytes(s, d) for s, d in self.specs.values())

    def how(self, largest: int | None = None) -> str:
        """What was held at once, for the screen (`largest`: the largest tensor made of these)."""
        peak = max((_bytes(s, d) for s, d in self.specs.values()), default=0)
        peak = max(peak, largest or 0)
        return f"gathered tensor by tensor: peak one tensor of {mib(peak)} (of {mib(self.total)})"


def open_checkpoint(engine_dir: Path, num_layers: int, files: Any) -> ModelTensors:
    """The model tensors of the checkpoint engine folder `engine_dir` (files checked by
    `files`, ``safe_load.CheckpointFiles``), DCP or DeepSpeed alike."""
    from launcher.train.checkpoint.consolidate import open_tensors

    tensors = open_tensors(engine_dir, num_layers, files)
    return ModelTensors(tensors.specs(), tensors.tensor)


def adapters(checkpoint: ModelTensors, where: Path) -> dict[str, torch.Tensor]:
    """The adapter tensors of a finetune run's checkpoint, in fp32 (refused when none)."""
    from launcher.train.finetune import lora

    found = {k: checkpoint.tensor(k).float() for k in checkpoint.specs if lora.is_adapter(k)}
    if not found:
        raise UserError(f"{where}: a finetune run's checkpoint without adapter tensors")
    return found


def base_source(cfg: LLMTrainConfig) -> Any:
    """The frozen base as the run built it: train.init_from (by slice where it can be), else the
    seeded initialiser (the same draws as ``build_model(cfg.model, seed=train.seed)``)."""
    from launcher.train.checkpoint.init_from import InitFromError, open_source
    from launcher.train.model.transformer import build_model
    from launcher.train.parallel.build import Chain, as_source, drawn

    initialiser = drawn(build_model(cfg.model, "meta"), cfg.train.seed)
    if cfg.train.init_from is None:
        return initialiser
    try:
        given = as_source(open_source(cfg))
    except InitFromError as exc:
        raise UserError(f"the run's base: {exc}") from None
    assert given is not None
    return Chain(given, initialiser)


def merged(
    cfg: LLMTrainConfig,
    checkpoint: ModelTensors,
    engine_dir: Path,
    files: Any,
    outcome: str = "nothing was exported",
) -> ModelTensors:
    """The plain model, each weight its base plus the adapters' update, made tensor by tensor;
    ``check`` compares the base's digest with the checkpoint's (a refusal ends with `outcome`)."""
    from launcher.train.checkpoint.init_from import expected_shapes
    from launcher.train.checkpoint.safe_load import read_json
    from launcher.train.finetune import lora

    pairs = adapters(checkpoint, engine_dir)
    scale = cfg.finetune.alpha / cfg.finetune.rank
    source = base_source(cfg)
    shapes = expected_shapes(cfg.model)
    digests: dict[str, str] = {}

    def base(name: str) -> torch.Tensor:
        values: torch.Tensor = source.box(name, (0,) * len(shapes[name]), shapes[name]).float()
        digests.setdefault(name, lora.base_digest({name: values})[name])
        return values

    def tensor(name: str) -> torch.Tensor:
        stem = name.removesuffix(".weight")
        a = pairs.get(f"{stem}.lora_a.weight")
        if a is None:
            return base(name)
        return base(name) + scale * (pairs[f"{stem}.lora_b.weight"] @ a)

    def check() -> None:
        for name in shapes.keys() - digests.keys():  # a tensor no export needed: digest it
            base(name)
        try:
            saved = read_json(files, engine_dir / lora.BASE_FILE)
        except (OSError, ValueError, KeyError) as exc:
            raise UserError(f"{engine_dir}: no readable {lora.BASE_FILE} ({exc})") from None
        problem = lora.base_problem(saved, lora.combined_digest(digests))
        if problem is not None:
            raise UserError(f"{engine_dir}: {problem}; {outcome}")

    specs = {name: (shape, torch.float32) for name, shape in shapes.items()}
    return ModelTensors(specs, tensor, check=check)
