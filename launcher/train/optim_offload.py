"""optim.offload=cpu: the optimizer's states in host memory, on the device only for an update.

Each parameter has its own optimizer (built by the same factory as the whole-model one, so its
weight-decay group, state dtype and update are a plain step's). Two hooks every torch optimizer
runs (``Optimizer.register_step_pre_hook`` / ``register_step_post_hook``, torch 2.0+) carry its
states: before its step they are copied to the parameter's device, after it they are copied back
into host buffers (pinned on CUDA, so the copies run at PCIe speed) and the device copies are
dropped. States created by the first step are born on the device and leave after it. A state
loaded from a checkpoint (``Optimizer.load_state_dict`` casts every state onto its parameter's
device) is moved back by ``register_load_state_dict_post_hook``. Anything that steps the
optimizer goes through the hooks: the per-parameter step below, optim.in_backward's
post-accumulate-grad hook (launcher/train/optim_in_backward.py), DCP's lazy state init.

What moves: every tensor of the state but ``step`` (torch's fused Adam keeps it on the device,
the others on the CPU already); torchao's 8-bit / 4-bit states are tensor subclasses whose inner
codes and scales move (their ``_to_copy`` and ``copy_``; pinned through ``__tensor_flatten__``).
The copies run on the current stream, in order with the update: nothing overlaps them (the plan
charges them whole: launcher/plan/memory/offload.py); the copies up are waited for before the
states are read on the host (``register_state_dict_pre_hook``: a checkpoint). On a CPU device
the "device" copy is a fresh tensor all the same (torchao's subclasses aside: their inner
tensors stay shared there), so the CPU runs the same moves and tests them.

Sources: bitsandbytes' paged optimizers (docs "Paged optimizers": the states in CUDA unified
memory, paged to the CPU when the GPU runs short; torchtune's single-device full recipes run
PagedAdamW8bit with optimizer_in_bwd) hold the same bytes on the host; torchao's
CPUOffloadOptimizer (torchao/optim/cpu_offload.py, 0.18) and ZeRO-Offload (Ren et al. 2021,
"ZeRO-Offload: Democratizing Billion-Scale Model Training") step on the host instead, with the
fp32 master there too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from launcher.train.optim_in_backward import PerParameterOptimizers

KEPT = "step"  # the state entry that stays where the optimizer put it


def _pinned(t: Tensor) -> Tensor:
    """A host copy of `t`, pinned when CUDA is there (a subclass: its inner tensors)."""
    host = t.detach().to("cpu", copy=True)
    if not torch.cuda.is_available():
        return host
    flatten = getattr(host, "__tensor_flatten__", None)
    if flatten is None:
        return host.pin_memory()
    names, context = flatten()
    inner = {name: getattr(host, name).pin_memory() for name in names}
    return type(host).__tensor_unflatten__(inner, context, host.shape, host.stride())  # type: ignore[attr-defined, no-any-return]


def _moved(value: Any) -> bool:
    return isinstance(value, Tensor)


def _kind(t: Tensor) -> tuple[type, torch.dtype, tuple[int, ...]]:
    """What a host buffer must match to be copied into (a resumed bf16 state is bf16 again)."""
    return type(t), t.dtype, tuple(t.shape)


class StatesOnHost:
    """The hooks that keep one optimizer's states on the host between its steps."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.host: dict[tuple[int, str], Tensor] = {}
        optimizer.register_step_pre_hook(self._to_device)
        optimizer.register_step_post_hook(self._to_host)
        optimizer.register_load_state_dict_post_hook(self._loaded)
        optimizer.register_state_dict_pre_hook(self._synchronized)

    def _params(self) -> Iterator[Tensor]:
        for group in self.optimizer.param_groups:
            yield from group["params"]

    def _to_device(self, *_: Any) -> None:
        for param in self._params():
            state = self.optimizer.state.get(param, {})
            for key, value in state.items():
                if key != KEPT and _moved(value):
                    state[key] = value.to(param.device, non_blocking=True, copy=True)

    def _to_host(self, *_: Any) -> None:
        for param in self._params():
            state = self.optimizer.state.get(param, {})
            for key, value in state.items():
                if key == KEPT or not _moved(value):
                    continue
                buffer = self.host.get((id(param), key))
                if buffer is None or _kind(buffer) != _kind(value):
                    buffer = _pinned(value)
                    self.host[(id(param), key)] = buffer
                else:
                    buffer.copy_(value, non_blocking=True)
                state[key] = buffer

    def _synchronized(self, *_: Any) -> None:
        """Before the states are read on the host (a checkpoint): the copies up have landed."""
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def _loaded(self, *_: Any) -> None:
        self.host.clear()
        self._to_host()


def offloaded(optimizer: torch.optim.Optimizer, where: str = "cpu") -> torch.optim.Optimizer:
    """`optimizer`, with its states kept on the host when `where` (optim.offload) is cpu."""
    if where == "cpu":
        StatesOnHost(optimizer)
    return optimizer


class StepInTurn(PerParameterOptimizers):
    """optim.offload=cpu without optim.in_backward: one optimizer a parameter, stepped one after
    the other after the backward, so one parameter's states are on the device at a time. DCP's
    get_state_dict / set_state_dict take it as an iterable of optimizers (as
    InBackwardOptimizer)."""

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()
