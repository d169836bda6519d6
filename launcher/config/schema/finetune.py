"""The fine-tuning group (`finetune.*`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from launcher.config.schema.allowed import bounds, one_of

# Every projection of the blocks: a word of finetune.targets and of finetune.quantize
# (launcher/config/adapters.py lists the projections).
ALL_LINEAR = "all-linear"


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
    quantize: str = field(default="targets", metadata=one_of("targets", ALL_LINEAR))
    """qlora: which frozen weights are stored in NF4: the adapted projections (targets), or every
    linear of the transformer blocks (all-linear), adapted or not."""
    objective: str = field(default="sft", metadata=one_of("sft", "dpo", "simpo", "orpo"))
    """What the model learns from (docs/finetuning.md, train/finetune/preference_loss.py): sft
    (next-token loss on the data's trained tokens), or from preference pairs
    (`data prepare --input-format preference`, data.builtin=preference): dpo (Rafailov et al.
    2023, against a reference model), simpo (Meng et al. 2024, length-normalised, no reference)
    or orpo (Hong et al. 2024, SFT loss plus an odds-ratio term, no reference)."""
    beta: float = field(default=0.1, metadata=bounds(gt=0, example="0.1"))
    """dpo: beta, the strength of the KL penalty towards the reference (TRL's default 0.1; for
    loss_type=ipo, IPO's tau); simpo: beta, the reward scale (the paper uses 2.0 to 2.5); orpo:
    lambda, the weight of the odds-ratio term (the paper's 0.1)."""
    loss_type: str = field(default="sigmoid", metadata=one_of("sigmoid", "ipo"))
    """dpo's loss on the reward margin: sigmoid (DPO's -log sigmoid(beta m)) or ipo (Azar et al.
    2023: (m - 1/(2 beta))^2 on the per-token mean log-ratios)."""
    label_smoothing: float = field(default=0.0, metadata=bounds(ge=0, lt=0.5, example="0.1"))
    """dpo (sigmoid) and simpo: the share epsilon of pairs assumed mislabelled (conservative DPO):
    -(1 - eps) log sigmoid(beta m) - eps log sigmoid(-beta m); 0: plain DPO."""
    simpo_gamma: float = field(default=0.5, metadata=bounds(ge=0, example="0.5"))
    """simpo: gamma, the target reward margin subtracted inside the sigmoid (absolute, as in the
    paper's equation 6)."""
    reference: str = field(
        default="auto", metadata=one_of("auto", "adapters-off", "precomputed", "copy")
    )
    """dpo's reference model: adapters-off (finetune=lora|qlora: the same model with its adapters
    switched off, a forward under no_grad each step, no second copy), precomputed (one pass over
    the data before step 1 stores the reference's log-probabilities in the run directory, with the
    base's digest), copy (finetune=full: a second, frozen model built from the same
    train.init_from and sharded as the policy, a forward under no_grad each step; its weights cost
    memory, and it serves train.eval_every), or auto (adapters-off with adapters, else
    precomputed). simpo and orpo use no reference."""
