"""Adam's moments stored small: bf16 (optim.state_dtype=bf16), 8-bit or 4-bit block-quantized
(optim.name=adamw8bit | adamw4bit), on torchao's optimizers (torchao/optim/adam.py, 0.18).

torchao keeps m and v as tensor subclasses (OptimState8bit: one uint8 code a value and one fp32
scale per 256-value block, Dettmers et al. 2022 "8-bit Optimizers via Block-wise Quantization";
OptimState4bit: two codes a byte and one scale per 128 values, Li et al. 2023 "Memory Efficient
Optimizers with 4-bit States"); a tensor under 4096 values, or one its block does not divide,
keeps plain states in the parameter's dtype. Every update computes in fp32 (single_param_adam).
launcher/plan/optimizer_states.py prices the same bytes.

torchao runs each parameter's update through torch.compile(fullgraph=True). On CUDA that is
kept; elsewhere (the CPU engine, tests) the same function runs eagerly: compiling it for the CPU
takes tens of seconds a shape for no gain on tiny models. The learning rate, a float the loop
sets every step, becomes the tensor torchao expects.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchao.optim import AdamW4bit, AdamW8bit
from torchao.optim.adam import _AdamBase, single_param_adam


class _EagerOffCuda(_AdamBase):  # type: ignore[misc]
    """torchao's step on CUDA, the same update run eagerly on any other device."""

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for group in self.param_groups:
            if not isinstance(group["lr"], Tensor):
                group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32)
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        if params and all(p.device.type == "cuda" for p in params):
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: Tensor, group: dict[str, Any]) -> None:
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = self._new_buffer(p, True)
            state["exp_avg_sq"] = self._new_buffer(p, False)
        state["step"] += 1
        single_param_adam(
            p.detach(),
            p.grad,
            state["step"],
            state["exp_avg"],
            state["exp_avg_sq"],
            None,
            group["lr"],
            group["betas"][0],
            group["betas"][1],
            group["weight_decay"],
            group["eps"],
            self.is_adamw,
            False,
        )


class AdamW8bitStates(_EagerOffCuda, AdamW8bit):  # type: ignore[misc]
    """optim.name=adamw8bit."""


class AdamW4bitStates(_EagerOffCuda, AdamW4bit):  # type: ignore[misc]
    """optim.name=adamw4bit."""


class AdamBf16States(_EagerOffCuda):
    """optim.state_dtype=bf16 with optim.name=adam|adamw: m and v in bf16 whatever the
    parameter's dtype, the update in fp32."""

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        is_adamw: bool = True,
    ) -> None:
        super().__init__(
            params,
            lr,
            betas,
            eps,
            weight_decay,
            False,
            block_size=0,
            bf16_stochastic_round=False,
            is_adamw=is_adamw,
        )

    def _new_buffer(self, p: Tensor, signed: bool) -> Tensor:
        return torch.zeros_like(p, dtype=torch.bfloat16)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load_state_dict casts every floating state to its parameter's dtype
        (Optimizer._process_value_according_to_param_policy): the moments come back bf16 here, so
        a resumed run keeps half the bytes and steps bit-identically (bf16 -> fp32 -> bf16 is
        exact)."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    state[key] = state[key].to(torch.bfloat16)


def state_optimizer(
    name: str, options: dict[str, Any]
) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    """The class and options of small-state Adam for optim.name `name` (adamw8bit, adamw4bit;
    adam or adamw: bf16 states). `options`: torch Adam's (torchao has no fused flag)."""
    kept: dict[str, Any] = {k: options[k] for k in ("lr", "betas", "eps") if k in options}
    chosen: type[torch.optim.Optimizer] = AdamBf16States
    if name == "adamw8bit":
        chosen = AdamW8bitStates
    elif name == "adamw4bit":
        chosen = AdamW4bitStates
    else:
        kept["is_adamw"] = name == "adamw"
    return chosen, kept
