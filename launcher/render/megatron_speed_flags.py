"""Megatron-LM flags of the speed features (launcher/backends/speed_features.py checks them first).

Flag names as NVIDIA/Megatron-LM core_v0.16.1 (commit 55ac7082517c3878ae653c07c09c534b8aed49f6)
spells them: the TransformerConfig / ModelParallelConfig fields become flags through
megatron/training/argument_utils.py (a bool defaulting to False is a store_true --flag, a Literal
a choice): --tp-comm-overlap, --cuda-graph-impl, --fp8-recipe, --moe-permute-fusion,
--moe-router-fusion; megatron/training/arguments.py adds --cuda-graph-scope (nargs +),
--overlap-grad-reduce, --overlap-param-gather, --overlap-param-gather-with-optimizer-step and
--ckpt-format. Nothing is rendered for a key at its default.
"""

from __future__ import annotations

from launcher.config.schema import LLMTrainConfig


def megatron_speed_flags(cfg: LLMTrainConfig) -> list[str]:
    """The speed keys' flags, in a fixed order (unquoted words)."""
    b = cfg.backend
    args: list[str] = []
    if b.tp_comm_overlap:
        # Transformer Engine userbuffers: the sequence-parallel all-gather / reduce-scatter run
        # in chunks beside the linear GEMMs (Megatron-LM's default userbuffers configuration).
        args.append("--tp-comm-overlap")
    if b.cuda_graphs != "none":
        args += ["--cuda-graph-impl", b.cuda_graphs]
        if b.cuda_graph_scope:
            args += ["--cuda-graph-scope", *b.cuda_graph_scope]
    if b.overlap_param_gather_with_optimizer_step:
        # arguments.py requires --overlap-param-gather (which requires --overlap-grad-reduce)
        # and no distributed checkpoint (use_dist_ckpt = ckpt_format != "torch").
        args += [
            "--overlap-grad-reduce",
            "--overlap-param-gather",
            "--overlap-param-gather-with-optimizer-step",
            "--ckpt-format", "torch",
        ]  # fmt: skip
    if b.fp8_scaling is not None:
        args += ["--fp8-recipe", b.fp8_scaling]
    if b.moe_permute_fusion:
        args.append("--moe-permute-fusion")
    if b.moe_router_fusion:
        args.append("--moe-router-fusion")
    return args


__all__ = ["megatron_speed_flags"]
