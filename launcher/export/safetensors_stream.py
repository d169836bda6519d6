"""Safetensors files written tensor by tensor: the header from names, dtypes and shapes alone, then
each tensor's bytes as it is made, so that no more than one tensor need exist at a time.

The file is the one ``safetensors.torch.save_file`` writes (v0.8.0; its format: README "Format"):
8 bytes, the header's length N (little-endian u64); N bytes of compact JSON, ``__metadata__``
first, then every tensor ``{"dtype", "shape", "data_offsets"}`` in the order its data follows,
padded with spaces to a multiple of 8; then the data. The library orders the data by dtype (its
``Dtype`` order, largest first: ``prepare`` in safetensors/src/tensor.rs) then by name; that order
is read here from the library itself (``dtype_order``) rather than restated. One difference: the
library writes ``__metadata__``'s keys in a Rust HashMap's random order (two saves of the same
tensors differ there); here they are written in the order given. The tensors' bytes, the offsets
and the header's length are the library's.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

# safetensors' dtype names (safetensors/src/tensor.rs, Dtype) of the torch dtypes llmtrain meets.
DTYPE_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
TORCH_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
ALIGN = 8  # the header is padded to a multiple of this (safetensors' N_LEN alignment)


@dataclass(frozen=True)
class Spec:
    """A tensor to be written: its name, dtype and shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@functools.cache
def dtype_order() -> dict[torch.dtype, int]:
    """Each dtype's rank in the library's data order (0 first), from a file it writes."""
    from safetensors.torch import save

    dtypes = list(DTYPE_NAMES)
    data = save({f"t{i}": torch.zeros(1, dtype=d) for i, d in enumerate(dtypes)})
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    begins = sorted((header[f"t{i}"]["data_offsets"][0], i) for i in range(len(dtypes)))
    return {dtypes[i]: rank for rank, (_, i) in enumerate(begins)}


def data_order(specs: Iterable[Spec]) -> list[Spec]:
    order = dtype_order()
    return sorted(specs, key=lambda s: (order[s.dtype], s.name))


def header_bytes(specs: Iterable[Spec], metadata: Mapping[str, str] | None) -> bytes:
    """The 8-byte length and the padded JSON header of a file holding `specs`."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for spec in data_order(specs):
        header[spec.name] = {
            "dtype": DTYPE_NAMES[spec.dtype],
            "shape": list(spec.shape),
            "data_offsets": [offset, offset + spec.nbytes],
        }
        offset += spec.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % ALIGN)
    return struct.pack("<Q", len(text)) + text


def write_file(
    path: Path,
    specs: list[Spec],
    make: Callable[[str], torch.Tensor],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write the safetensors file `path` holding `specs`, each tensor made by `make(name)` when
    its turn comes and dropped once written (it must have the spec's dtype and shape)."""
    with open(path, "wb") as f:
        f.write(header_bytes(specs, metadata))
        for spec in data_order(specs):
            tensor = make(spec.name).detach().to("cpu").contiguous()
            if tensor.dtype != spec.dtype or tuple(tensor.shape) != spec.shape:
                raise ValueError(
                    f"{spec.name}: made as {tensor.dtype} {list(tensor.shape)}, announced as "
                    f"{spec.dtype} {list(spec.shape)}"
                )
            if tensor.numel():
                f.write(tensor.reshape(-1).view(torch.uint8).numpy().data)
            del tensor


@dataclass(frozen=True)
class Streamed:
    """Tensors announced by their specs and made one at a time (``make(name)``)."""

    specs: list[Spec]
    make: Callable[[str], torch.Tensor]

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor]) -> Streamed:
        """Tensors already in memory."""
        specs = [Spec(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()]
        return cls(specs, lambda name: tensors[name])

    @property
    def largest(self) -> int:
        """The bytes of the largest tensor (0 when there is none)."""
        return max((s.nbytes for s in self.specs), default=0)
