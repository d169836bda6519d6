"""Values derived from the configuration: world size, dp, batch arithmetic, pipeline stage split.

These are the only places the derivations are written. They never raise on inconsistent input: a
derivation that does not work out (world size not divisible, say) gives a best-effort value, and the
validation rules (``launcher.validate.rules``) report the inconsistency with the numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache, cached_property

from launcher.config.epoch_rows import epoch_rows, epoch_steps
from launcher.config.pipeline_split import SplitError, SplitKeys, megatron_split
from launcher.config.schema import LLMTrainConfig


@dataclass(frozen=True)
class Layout:
    world_size: int
    tp: int
    pp: int
    vpp: int
    cp: int
    ep: int
    dp: int
    # True when dp was not given and was computed as world_size // (tp * pp * cp).
    dp_inferred: bool
    micro_batch_size: int
    global_batch_size: int
    grad_accum: int
    # Transformer layers per pipeline chunk, in execution order: pp * vpp entries; chunk i runs on
    # stage i % pp (Megatron's interleaved assignment). With vpp == 1 this is one entry per stage.
    chunk_layers: tuple[int, ...]
    # True when the split came from parallel.pp_layers or Megatron-Core's split keys
    # (launcher/config/pipeline_split.py), False when automatic.
    explicit_split: bool
    steps: int
    seq_length: int

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp * self.cp

    @cached_property  # read for every stage the planner prices; the fields never change
    def stage_layers(self) -> tuple[int, ...]:
        """Transformer layers held by each pipeline stage (all its virtual chunks together)."""
        return tuple(sum(self.chunk_layers[s :: self.pp]) for s in range(self.pp))

    @property
    def num_microbatches(self) -> int:
        """Micro-batches each pipeline processes per optimizer step."""
        return self.grad_accum

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_length


def world_size(cfg: LLMTrainConfig) -> int:
    return cfg.cluster.num_nodes * cfg.cluster.gpus_per_node


def infer_dp(cfg: LLMTrainConfig) -> int:
    if cfg.parallel.dp is not None:
        return cfg.parallel.dp
    model_parallel = max(1, cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.cp)
    return max(1, world_size(cfg) // model_parallel)


def batch_sizes(cfg: LLMTrainConfig, dp: int) -> tuple[int, int, int]:
    """(micro_batch_size, global_batch_size, grad_accum) with the omitted ones derived.

    global = micro * dp * accum. With global given and accum omitted, accum = global // (micro * dp)
    (at least 1); with global omitted, global = micro * dp * accum (accum defaulting to 1).
    """
    micro = max(1, cfg.train.micro_batch_size)
    per_pass = micro * max(1, dp)
    if cfg.train.global_batch_size is None:
        accum = max(1, cfg.train.grad_accum or 1)
        return micro, per_pass * accum, accum
    total = cfg.train.global_batch_size
    accum = cfg.train.grad_accum if cfg.train.grad_accum is not None else max(1, total // per_pass)
    return micro, total, max(1, accum)


@cache  # pure; the layout search asks for the same few splits many times
def auto_split(num_layers: int, chunks: int) -> tuple[int, ...]:
    """Layers per pipeline chunk, as even as possible.

    When num_layers divides evenly, every chunk gets the same count. Otherwise the embedding and
    the output layer each count as one layer's worth of work on the first and last chunk, the
    num_layers + 2 slots are spread evenly (extra slots to the middle chunks), and the first and
    last chunk give their slot back. Llama 3 405B: 126 layers on 16 stages -> 7, 8 x 14, 7 (Llama 3
    paper, section 3.3.2: one Transformer layer fewer on the first and on the last stage).
    """
    if chunks <= 1:
        return (num_layers,)
    if num_layers % chunks == 0:
        return (num_layers // chunks,) * chunks
    # Leftover slots go to the middle chunks, centre outwards, then to the two ends.
    order = sorted(range(1, chunks - 1), key=lambda i: (abs(i - (chunks - 1) / 2), i))
    order += [0, chunks - 1]
    base, extra = divmod(num_layers + 2, chunks)
    counts = [base] * chunks
    for i in order[:extra]:
        counts[i] += 1
    counts[0] -= 1
    counts[-1] -= 1
    if min(counts) >= 1:
        return tuple(counts)
    # Too few layers to lighten the ends: a plain split, remainder to the middle.
    base, extra = divmod(num_layers, chunks)
    counts = [base] * chunks
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


_NO_SPLIT_KEYS = SplitKeys()


def split_keys(cfg: LLMTrainConfig) -> SplitKeys:
    """Megatron-Core's pipeline split keys as set in the config."""
    p = cfg.parallel
    if (
        p.pipeline_layout is None
        and p.num_layers_in_first_pipeline_stage is None
        and p.num_layers_in_last_pipeline_stage is None
        and not p.account_for_embedding_in_pipeline_split
        and not p.account_for_loss_in_pipeline_split
    ):
        return _NO_SPLIT_KEYS
    return SplitKeys(
        first=p.num_layers_in_first_pipeline_stage,
        last=p.num_layers_in_last_pipeline_stage,
        embedding=p.account_for_embedding_in_pipeline_split,
        loss=p.account_for_loss_in_pipeline_split,
        layout=p.pipeline_layout,
        mtp=cfg.model.mtp_layers,
    )


def derive_layout(cfg: LLMTrainConfig) -> Layout:
    p = cfg.parallel
    dp = infer_dp(cfg)
    micro, total, accum = batch_sizes(cfg, dp)
    chunks = max(1, p.pp) * max(1, p.vpp)
    keys = split_keys(cfg)
    chunk_layers: tuple[int, ...] | None = None
    if keys.any:
        # Megatron-Core's uneven split; when it refuses the keys, the pipeline-split rule says
        # so and the automatic split stands in.
        try:
            chunk_layers = megatron_split(cfg.model.num_layers, p.pp, p.vpp, keys)
        except SplitError:
            chunk_layers = None
    elif p.pp_layers is not None:
        chunk_layers = tuple(p.pp_layers)
    if chunk_layers is None:
        chunk_layers = auto_split(cfg.model.num_layers, chunks)
    return Layout(
        world_size=world_size(cfg),
        tp=p.tp,
        pp=p.pp,
        vpp=p.vpp,
        cp=p.cp,
        ep=p.ep,
        dp=dp,
        dp_inferred=p.dp is None,
        micro_batch_size=micro,
        global_batch_size=total,
        grad_accum=accum,
        chunk_layers=chunk_layers,
        explicit_split=p.pp_layers is not None or keys.any,
        steps=train_steps(cfg, total),
        seq_length=cfg.model.seq_length,
    )


def train_steps(cfg: LLMTrainConfig, global_batch_size: int) -> int:
    """Optimizer steps of the run: train.epochs over data.path's rows where their number can be
    read (launcher/config/epoch_rows.py; the trainer counts them on the opened data), else
    train.steps, or train.tokens rounded up to whole steps."""
    if cfg.train.epochs is not None:
        rows = epoch_rows(cfg)
        if rows is not None:
            return epoch_steps(cfg.train.epochs, rows.rows, global_batch_size)
    if cfg.train.tokens is not None:
        per_step = max(1, global_batch_size * cfg.model.seq_length)
        return max(1, math.ceil(cfg.train.tokens / per_step))
    return cfg.train.steps if cfg.train.steps is not None else 0
