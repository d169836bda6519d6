"""What each activation-recompute mode runs again in the backward: the one place kernels.py,
measured.py and flops.py take it from (memory.py's layer_activation_terms says what each keeps).

Modes (backends.common.recompute_mode turns train.recompute into one per backend and layer kind):
- none: nothing.
- full: one more forward of the whole layer: its GEMMs, attention and element-wise work
  (Narayanan et al. 2021; only the layer input is kept).
- op: op-level selective checkpointing (PyTorch's selective activation checkpointing with the
  policy torchtitan calls "op"; llmtrain's dense blocks,
  launcher/train/model/selective_checkpoint.py): every other linear product and the attention
  kernel's output are kept, so half the layer's GEMM forwards and all its element-wise forward run
  again; eager attention's products and softmax (not kept) run again too.
- core: the attention core only (Korthikanti et al. 2022's selective recompute; Megatron-Core's
  default --recompute-modules core_attn; llmtrain's MoE blocks): one more attention forward.
- selective: what plan said before modes were per backend: op with flash attention, core with
  eager (kept for callers that price a layer without a backend).
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("none", "full", "op", "core")


@dataclass(frozen=True)
class ExtraForwards:
    """Forwards run again per layer, as fractions of the layer's own forward, by class."""

    gemm: float
    attention: float
    elementwise: float


def resolve(mode: str, eager: bool) -> str:
    """A mode of MODES ("selective" resolved by the attention kind)."""
    if mode == "selective":
        return "core" if eager else "op"
    if mode not in MODES:
        raise ValueError(f"recompute mode {mode!r}: expected one of {', '.join(MODES)}")
    return mode


def extra_forwards(mode: str, eager: bool) -> ExtraForwards:
    m = resolve(mode, eager)
    if m == "full":
        return ExtraForwards(1.0, 1.0, 1.0)
    if m == "op":
        return ExtraForwards(0.5, 1.0 if eager else 0.0, 1.0)
    if m == "core":
        return ExtraForwards(0.0, 1.0, 0.0)
    return ExtraForwards(0.0, 0.0, 0.0)


def recomputes_scores(mode: str, eager: bool) -> bool:
    """Whether eager attention's softmax over the scores runs again (its bytes priced once more)."""
    return eager and resolve(mode, eager) in ("op", "core")
