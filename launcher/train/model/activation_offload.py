"""train.activation_offload: the tensors autograd saves for the backward go to pinned host memory
during the forward and come back when the backward needs them (torchtune's OffloadActivations,
torchtune/training/_activation_offloading.py, v0.6; PyTorch's
``torch.autograd.graph.saved_tensors_hooks``, of which ``save_on_cpu`` is the synchronous form).

On a GPU each copy runs on a side stream: the device-to-host copy of a saved tensor starts once
the compute stream has produced it (an event), and the compute stream does not wait for it; the
tensor's device memory is released when the copy's event completes (the caching allocator is
told the side stream uses it, ``record_stream``). On the backward the host copy comes back on the
side stream and the compute stream waits for that copy alone.

What stays on the device: parameters (autograd saves the weight itself, which the device keeps
anyway) and torch.autocast's compute-dtype copies of them (views and casts of a parameter back
to its AccumulateGrad node: weights, not activations; the plan prices them on the device and
sends no PCIe time for them), what the forward saves after the last block (``keep_after``:
the final norm, the head and the loss, needed first by the backward), and tensors under
MIN_OFFLOAD_BYTES (torchtune's threshold too:
copies that small cost more in launches than they free). On the CPU the hooks run but keep every
tensor where it is (there is no other memory to move it to): training is identical, the loss bit
for bit; ``stats.movable_bytes`` counts what a GPU would move (bench/lora_memory.py --savers).
launcher/plan/memory/memory_savers.py prices what it frees and the PCIe time it cannot hide.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# Saved tensors smaller than this stay on the device (torchtune's min_offload_size, 1024 bytes).
MIN_OFFLOAD_BYTES = 1024
# Autograd nodes of a view or a dtype cast: one input, the same values (a weight's copy).
_VIEW_OR_CAST = {"ToCopyBackward0", "TBackward0", "TransposeBackward0", "ViewBackward0"}


def is_weight(tensor: torch.Tensor) -> bool:
    """A parameter, or a view or cast of one (torch.autocast saves ``weight.to(bf16).t()``)."""
    if isinstance(tensor, nn.Parameter):
        return True
    node = tensor.grad_fn
    while node is not None and node.name() in _VIEW_OR_CAST:
        node = node.next_functions[0][0]
    return isinstance(getattr(node, "variable", None), nn.Parameter)  # AccumulateGrad's leaf


@dataclass
class OffloadStats:
    """What the hooks saw in one forward: tensors and bytes saved, and moved to the host."""

    saved: int = 0
    saved_bytes: int = 0
    moved: int = 0
    moved_bytes: int = 0
    movable_bytes: int = 0  # what a GPU would move (= moved_bytes there; counted on the CPU too)


@dataclass
class ActivationOffload:
    """The saved-tensor hooks of one engine (one side stream, reused every forward)."""

    stream: Any = None
    stats: OffloadStats = field(default_factory=OffloadStats)
    past_last_block: bool = False  # the rest of this forward stays on the device

    def keep_after_blocks(self, model: nn.Module) -> None:
        """``keep_after`` the last of the model's blocks (``model.layers``, DDP's inner model's)."""
        layers = getattr(getattr(model, "module", model), "layers", None)
        if layers:
            self.keep_after(list(layers.values())[-1])

    def keep_after(self, last_block: nn.Module) -> None:
        """Keep on the device what the forward saves once `last_block` has run: the final
        norm, the output layer and the loss, whose saved tensors the backward needs first, so a
        copy out would come straight back (torchtune keeps its output layer's likewise,
        get_act_offloading_ctx_manager, v0.6; the chunked loss saves the output layer's fp32
        weight gradient, vocab x hidden)."""

        def passed(*_: Any) -> None:
            self.past_last_block = True

        last_block.register_forward_hook(passed)

    def _pack(self, tensor: torch.Tensor) -> Any:
        nbytes = tensor.numel() * tensor.element_size()
        self.stats.saved += 1
        self.stats.saved_bytes += nbytes
        if nbytes < MIN_OFFLOAD_BYTES or is_weight(tensor) or self.past_last_block:
            return tensor
        self.stats.movable_bytes += nbytes
        if tensor.device.type != "cuda":
            return tensor
        self.stats.moved += 1
        self.stats.moved_bytes += nbytes
        if self.stream is None:
            self.stream = torch.cuda.Stream(tensor.device)  # type: ignore[no-untyped-call]
        compute = torch.cuda.current_stream(tensor.device)
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            host = torch.empty(tensor.size(), dtype=tensor.dtype, pin_memory=True)
            host.copy_(tensor, non_blocking=True)
            tensor.record_stream(self.stream)  # freed once the copy is done
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self.stream)
        return (tensor.device, host, done)

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        device, host, done = packed
        compute = torch.cuda.current_stream(device)
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(done)
            back: torch.Tensor = host.to(device, non_blocking=True)
            back.record_stream(compute)
        compute.wait_stream(self.stream)
        return back

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        """Offload what the forward inside saves (the backward unpacks it wherever it runs)."""
        self.stats = OffloadStats()
        self.past_last_block = False
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield
