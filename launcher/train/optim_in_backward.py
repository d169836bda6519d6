"""optim.in_backward: each parameter stepped in its post-accumulate-grad hook, its gradient freed
at once, so a step holds one parameter's gradient instead of all of them (PyTorch tutorial "How
to save memory by fusing the optimizer step into the backward pass", torch 2.1+
``Tensor.register_post_accumulate_grad_hook``; torchtune's optimizer_in_bwd does the same).

One optimizer per parameter, built by the same factory as the whole-model optimizer (so its
weight-decay group, its state dtype and its update are the ones a plain step would use). The
engine sets the learning rate on ``param_groups`` before the backward, as for any optimizer.
Checkpoints: DCP's get_state_dict / set_state_dict take an iterable of optimizers, and this
object is one (``__iter__``): every parameter's state under its own name, so a resumed run
steps bit-identically. The gradient norm is summed in the hooks (no clipping can apply: the
earlier parameters are already stepped when the last gradient exists).

Valid only with one micro-batch a step, no gradient clipping, no loss scaling and one rank
(launcher/backends/optimizer_in_backward.py refuses the rest).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn


class PerParameterOptimizers:
    """One optimizer a parameter, made by `make` (the whole-model optimizer's factory), seen by
    the engine as one optimizer: its param_groups for the learning rate, zero_grad, and an
    iterable of optimizers for DCP's get_state_dict / set_state_dict."""

    def __init__(
        self,
        params: list[nn.Parameter],
        make: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
    ) -> None:
        self.optimizers = [make([param]) for param in params]

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:
        return iter(self.optimizers)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)


class InBackwardOptimizer(PerParameterOptimizers):
    """Per-parameter optimizers stepped from the backward (module docstring)."""

    def __init__(
        self,
        params: list[nn.Parameter],
        make: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
    ) -> None:
        super().__init__(params, make)
        self._squares = torch.zeros((), dtype=torch.float32)
        self._handles: list[Any] = [
            param.register_post_accumulate_grad_hook(self._hook(optimizer))  # type: ignore[no-untyped-call]
            for param, optimizer in zip(params, self.optimizers, strict=True)
        ]

    def _hook(self, optimizer: torch.optim.Optimizer) -> Callable[[torch.Tensor], None]:
        # Weak references: the hook lives on the parameter, in autograd's C++ metadata, which
        # the garbage collector does not traverse; a strong one (hook -> optimizer -> parameter
        # -> hook) would be a cycle no collection breaks, keeping the weights and states of a
        # dropped engine for the life of the process.
        owner, stepper = weakref.ref(self), weakref.ref(optimizer)

        def step_now(param: torch.Tensor) -> None:
            this, one = owner(), stepper()
            if this is None or one is None:  # the optimizer is gone: the gradient stays
                return
            assert param.grad is not None
            grad = param.grad.detach()
            this._squares = this._squares.to(grad.device) + grad.float().square().sum()
            one.step()
            one.zero_grad(set_to_none=True)

        return step_now

    def take_grad_norm(self) -> float:
        """The global gradient norm of the backward just run (then reset)."""
        norm = float(self._squares.sqrt())
        self._squares = torch.zeros((), dtype=torch.float32)
        return norm

    def step(self) -> None:
        """Nothing left to do: every parameter was stepped in the backward."""

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
