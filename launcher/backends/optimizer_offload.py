"""optim.offload=cpu: the optimizer's states in host memory, brought to the device one parameter
at a time for its update (launcher/train/optim_offload.py); backend=torch alone.

The torch engine runs it over plain local tensors: one optimizer a parameter (or one in each
parameter's post-accumulate-grad hook with optim.in_backward), its states moved by the
optimizer's own step hooks. Refused where the states are not a plain tensor per parameter
(tensor or expert parallel: DTensor and expert shards; ZeRO-1's ZeroRedundancyOptimizer and
FSDP2 shard them themselves, FSDP2 with its own CPUOffloadPolicy), and with dynamic loss scaling
(GradScaler steps one optimizer, not one a parameter). DeepSpeed's and Megatron's offloads are
zero.offload_optimizer=cpu: the states and the step on the host (CPU Adam).
"""

from __future__ import annotations

from launcher.backends.common import Refusal
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig

KEY = "optim.offload"
OFF = f"or {KEY}=none"


def torch_state_offload(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    """What optim.offload=cpu cannot run with on the torch engine."""
    if cfg.optim.offload == "none":
        return None
    for degree in ("tp", "ep"):
        if getattr(layout, degree) > 1:
            return Refusal(
                (KEY, f"parallel.{degree}"),
                f"{KEY}=cpu with parallel.{degree}={getattr(layout, degree)}: the states of "
                f"sharded parameters are not moved this way; use parallel.{degree}=1 {OFF}",
            )
    if cfg.zero.stage >= 1:
        return Refusal(
            (KEY, "zero.stage"),
            f"{KEY}=cpu with zero.stage={cfg.zero.stage}: the sharding optimizer keeps its own "
            "states; use zero.stage=0, or zero.stage=3 zero.offload_params=cpu "
            f"zero.offload_optimizer=cpu (FSDP2's CPUOffloadPolicy) {OFF}",
        )
    if cfg.precision.loss_scaling == "dynamic":
        return Refusal(
            (KEY, "precision"),
            f"{KEY}=cpu with dynamic loss scaling: the scaler steps one optimizer, not one a "
            f"parameter; use precision=bf16 or bf16-pure {OFF}",
        )
    return None


def state_offload_not_run(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    """Engines other than torch."""
    if cfg.optim.offload == "none":
        return None
    return Refusal(
        (KEY, "backend"),
        f"{KEY}=cpu: only backend=torch moves the states to the device for each update; use "
        f"backend=torch, or zero.offload_optimizer=cpu (states and step on the host) {OFF}",
    )
