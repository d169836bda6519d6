"""What the attention core of packed rows costs (data.packing=true on chat data): the kernel
launcher/backends/packed_attention.py picks, priced against causal FlashAttention-2-class
attention (kernels.py's "sdpa" rate, whatever backend.attention_kernel says: neither kernel is
Transformer Engine's). Pure arithmetic, no torch; kernels.py (the catalog) and measured.py (a
profile) both call it.

- flex: FlexAttention's (forward, backward) rate over FlashAttention-2's: A100 0.90, 0.85 (PyTorch
  blog "FlexAttention: The Flexibility of PyTorch with the Performance of FlashAttention",
  2024-08-07: "90% of FlashAttention2's performance in the forward pass and 85% in the backward
  pass"); H100 1.25, 1.03 (D. Guessous, "FlexAttention: The Flexibility of PyTorch With the
  Performance of FlashAttention", NVIDIA GTC 2025 session abstract: forward ~25% and backward ~3%
  faster than FlashAttention-2); Blackwell taken as Hopper. Its block mask skips the blocks
  between examples too, but the plan does not know the examples' lengths: it prices the causal
  square (an upper bound; n equal examples in a row do 1/n of it).
- sdpa with a dense [b, 1, s, s] mask: under an explicit mask SDPA runs its memory-efficient
  kernel, which skips no key block (causal block skipping needs is_causal): the whole square's
  FLOPs, twice the causal half, at the same rate, plus the mask, converted to the compute dtype,
  read from HBM once per head in the forward and again in the backward (b x s^2 x heads elements
  a pass). Against the one measurement (bench/results/h200-2026-11-27/sft_attention.txt, H200,
  4 layers, h 2048, 16 heads of 128, 2 rows of 8,192 tokens): the mask path took 36.3 ms more than
  is_causal (1.42x the step); this prices the step at 1.45x (the causal attention again plus
  4 layers x 2 passes x 0.9 ms of mask reads; tests/unit/plan/timing/test_packed_rows.py).

The packed kernels' seconds a layer, forward and backward, from the causal ones (fwd, bwd):

    flex:  fwd / r_fwd,              bwd / r_bwd            (r: FLEX_RATE_VS_FA2[arch])
    sdpa:  2 fwd + m e / B,          2 bwd + m e / B        (m = b s^2 heads, e bytes, B HBM)
"""

from __future__ import annotations

from launcher.backends.packed_attention import packed_attention
from launcher.config.schema import LLMTrainConfig

FLEX_RATE_VS_FA2: dict[str, tuple[float, float]] = {
    "ampere": (0.90, 0.85),
    "hopper": (1.25, 1.03),
    "blackwell": (1.25, 1.03),
}


def packed_kernel_of(cfg: LLMTrainConfig) -> str:
    """The kernel of the run's packed rows (flex | sdpa), "" where rows are not packed."""
    found = packed_attention(cfg)
    return "" if found is None else found[0]


def packed_attention_s(
    kernel: str,
    causal: tuple[float, float],
    arch: str,
    mask_elements: float,
    elem_bytes: float,
    hbm_bytes_per_s: float,
) -> tuple[float, float]:
    """(forward, backward) seconds of packed rows' attention core from the causal FA2-class
    (forward, backward) seconds `causal` (module docstring): flex at FLEX_RATE_VS_FA2; sdpa's
    dense mask at twice the FLOPs plus `mask_elements` (b x s^2 x local heads) of `elem_bytes`
    read a pass."""
    fwd, bwd = causal
    if kernel == "flex":
        f, b = FLEX_RATE_VS_FA2.get(arch, FLEX_RATE_VS_FA2["hopper"])
        return fwd / f, bwd / b
    if kernel == "sdpa":
        mask_s = mask_elements * elem_bytes / hbm_bytes_per_s
        return 2.0 * fwd + mask_s, 2.0 * bwd + mask_s
    raise ValueError(f"packed attention kernel {kernel!r}: expected flex or sdpa")
