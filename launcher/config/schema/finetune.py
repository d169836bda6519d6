"""The fine-tuning group (`finetune.*`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.config.schema.allowed import bounds, one_of


@dataclass
class FinetuneConfig:
    """How the model trains (conf/finetune/; docs/finetuning.md): full (every weight), lora
    (frozen base weights, a trainable low-rank update B @ A on each target projection, Hu et al.
    2021, arXiv:2106.09685) or qlora (lora over base weights stored in NF4, Dettmers et al. 2023,
    arXiv:2305.14314; launcher/train/finetune/lora.py)."""

    name: str = field(default="full", metadata=one_of("full", "lora", "qlora"))
    """The fine-tuning method."""
    rank: int = field(default=16, metadata=bounds(ge=1, example="16"))
    """The adapter's rank r: A is [r, in], B is [out, r]; 1 <= r <= min(in, out) of every
    target."""
    alpha: float = field(default=32.0, metadata=bounds(gt=0, example="32"))
    """The update is scaled by alpha / r."""
    dropout: float = field(default=0.0, metadata=bounds(ge=0, lt=1, example="0.05"))
    """Dropout on the adapter branch's input."""
    targets: list[str] = field(default_factory=lambda: ["q", "k", "v", "o"])
    """Projections to adapt: q k v o (attention), gate up down (MLP; gate only with swiglu), or
    all-linear (every one of them the model has)."""
