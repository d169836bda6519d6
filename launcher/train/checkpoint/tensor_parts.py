"""What a tensor the engines hold is made of, for the checks that look at every weight (the
trainer's finite-weights check before a checkpoint, the weights digest, the LoRA base digest).

The engines hold more than plain tensors: DTensors (FSDP2 and tensor-parallel shards, their
local shard inside), torchao's ``NF4Tensor`` (QLoRA's frozen base: uint8 codes, int8 scalers,
a float factor and mean), torchao's fp8 training wrappers around an fp32 weight, and tensors in
the float8 dtypes (no ``isfinite`` kernel for them on the CPU). Each of these is a traceable
wrapper subclass: ``__tensor_flatten__`` names the inner tensors it is made of (the protocol
``torch.utils._python_dispatch.is_traceable_wrapper_subclass`` checks, torch v2.13), so one
recursion reaches the plain tensors whatever the wrapper, without dequantizing anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

FLOAT8 = tuple(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, name)
)


def plain_parts(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """The plain tensors `tensor` is stored in (itself when it is plain), in a fixed order."""
    if is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()
        for name in names:  # DTensor also names its device mesh: not a tensor
            inner = getattr(tensor, name)
            if isinstance(inner, torch.Tensor):
                yield from plain_parts(inner)
        return
    yield tensor


def part_finite(part: torch.Tensor) -> bool:
    """A plain tensor holds no NaN or infinity (integer codes always pass)."""
    if not (part.dtype.is_floating_point or part.dtype.is_complex):
        return True
    if part.dtype in FLOAT8:  # no isfinite kernel for the float8 dtypes: their values in fp32
        part = part.float()
    return bool(torch.isfinite(part).all())


def all_finite(tensors: Iterable[torch.Tensor]) -> bool:
    """Every value stored in `tensors` (whatever their kind) is finite."""
    return all(part_finite(p) for t in tensors for p in plain_parts(t.detach()))


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The bytes `tensor` is stored in (each plain part's, in order), on the host."""
    out = []
    for part in plain_parts(tensor.detach()):
        # A copy in the contiguous layout: a one-element view may keep a stride that `view`
        # refuses (NF4's scaler mean after a round trip through a checkpoint).
        data = part.to("cpu").reshape(-1).clone(memory_format=torch.contiguous_format)
        out.append(data.view(torch.uint8).numpy().tobytes())
    return b"".join(out)
