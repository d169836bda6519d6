"""Build a model part shard by shard: every engine, every layout, the same order.

    meta -> expert / pipeline split -> fine-tuning adapters (and fp8 layers) -> context and
    tensor parallel -> recompute, compile -> [NF4 on meta: qlora under FSDP2] -> FSDP2 ->
    materialise the local shard -> fill it (drawn from the initialiser, or read from
    train.init_from; an NF4 shard from its whole tensor quantized) -> NF4 (qlora) -> DDP

as torchtitan builds (``torchtitan/train.py``, v0.1.0: the model on ``meta``, ``parallelize_fn``,
then ``to_empty`` and ``init_weights`` on the local shards) and torchtune loads
(``torchtune/training/_distributed.py``, v0.6.0, ``load_from_full_model_state_dict``: each rank
copies only its slice). DeepSpeed ZeRO-3 builds under ``deepspeed.zero.Init``
(``deepspeed/runtime/zero/partition_parameters.py``, v0.19.8: each module's parameters are
partitioned as soon as it is constructed) and fills each rank's flat partition the same way.

What a rank holds of a parameter is a ``Region``: a box of the whole tensor (offsets and shape;
DTensor shards: torch's ``compute_local_shape_and_global_offset``, the function DCP plans its
reads with) and, for a ZeRO-3 partition, a range of that box flattened. A ``Source`` gives the
values of a box: the initialiser draws the whole tensor of one parameter (seeded by its name,
``launcher.train.model.init_weights``) and keeps the box, so the weights are the same whatever the
layout and at most one whole tensor exists at a time; train.init_from reads the box alone from
the files (``launcher.train.weight_source``). The frozen base's digest (fine-tuning) is taken
over whole tensors, each rank hashing its share, one tensor at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from launcher.train.finetune import adapters
from launcher.train.finetune.lora import base_digest, plain_name
from launcher.train.model.init_weights import InitRule, clean_name, init_rules


class Source(Protocol):
    """Where a parameter's values come from."""

    def has(self, name: str) -> bool: ...

    def box(self, name: str, offsets: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
        """The values of the box `offsets` + `shape` of the whole tensor `name`."""
        ...


class Drawn:
    """The initialiser's values (``init_weights.init_rules``): the whole tensor drawn, the box
    kept."""

    def __init__(self, rules: dict[str, InitRule], shapes: dict[str, tuple[int, ...]]):
        self.rules, self.shapes = rules, shapes

    def has(self, name: str) -> bool:
        return name in self.rules

    def box(self, name: str, offsets: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
        return self.rules[name].full(self.shapes[name])[box_index(offsets, shape)]


class Chain:
    """The first source that has the parameter (train.init_from, then the initialiser for what
    it lacks: the adapters)."""

    def __init__(self, *sources: Source):
        self.sources = sources

    def has(self, name: str) -> bool:
        return any(s.has(name) for s in self.sources)

    def box(self, name: str, offsets: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
        for source in self.sources:
            if source.has(name):
                return source.box(name, offsets, shape)
        raise KeyError(name)


def box_index(offsets: tuple[int, ...], shape: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(o, o + n) for o, n in zip(offsets, shape, strict=True))


@dataclass(frozen=True)
class Region:
    """What this rank holds of one parameter: `target` (the local tensor to write), the box of
    the whole tensor it comes from, and for a ZeRO-3 flat partition the [start, end) of that
    box flattened (None: the box is the target's shape)."""

    target: torch.Tensor
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    flat: tuple[int, int] | None = None


def region(param: torch.Tensor) -> Region:
    """This rank's Region of `param`: plain (whole), a DTensor shard, or a ZeRO-3 partition."""
    if isinstance(param, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offsets = compute_local_shape_and_global_offset(
            param.shape, param.device_mesh, param.placements
        )
        return Region(param.to_local(), tuple(offsets), tuple(shape))
    ds_tensor = getattr(param, "ds_tensor", None)
    if ds_tensor is not None:
        return _zero3_region(param, ds_tensor)
    return Region(param, (0,) * param.dim(), tuple(param.shape))


def _zero3_region(param: Any, ds_tensor: Any) -> Region:
    """DeepSpeed ZeRO-3: rank r of the parameter's group holds elements [r*n, (r+1)*n) of the
    flattened whole tensor (n = ds_tensor.ds_numel; the last partition padded), as
    ``Init._partition_param`` copies them (v0.19.8)."""
    import torch.distributed as dist

    shape = tuple(param.ds_shape)
    total, size = int(param.ds_numel), int(ds_tensor.ds_numel)
    start = size * dist.get_rank(group=param.ds_process_group)
    end = min(start + size, total)
    target = ds_tensor.narrow(0, 0, max(0, end - start))
    if start >= total or not shape:
        return Region(target, (0,) * len(shape), shape if start < total else (0,) * len(shape))
    row = math.prod(shape[1:])
    first, last = start // row, -(-end // row)
    offsets = (first,) + (0,) * (len(shape) - 1)
    return Region(
        target, offsets, (last - first, *shape[1:]), (start - first * row, end - first * row)
    )


@torch.no_grad()
def fill(region_: Region, values: torch.Tensor) -> None:
    """Copy `values` (the region's box) into its target, converting the dtype on the way."""
    if region_.flat is not None:
        start, end = region_.flat
        values = values.reshape(-1)[start:end]
    region_.target.copy_(values.to(dtype=region_.target.dtype, device=region_.target.device))


def nf4_before_sharding(model: nn.Module, cfg: Any) -> None:
    """qlora under FSDP2: the NF4 weights made NF4 on meta, before ``fully_shard``, so that
    FSDP2 shards them as NF4 (torchao's ``NF4Tensor`` splits by rows and implements FSDP2's
    ``fsdp_pre_all_gather`` / ``fsdp_post_all_gather``, torchao 0.18 nf4_tensor.py; torchtune
    v0.6.0 builds its QLoRA models so); each shard is filled by ``fill_nf4``."""
    for _, unit, in_block in units(model):
        adapters.quantize(unit, cfg, in_block)


@torch.no_grad()
def fill_nf4(region_: Region, whole: torch.Tensor) -> None:
    """qlora under FSDP2: the NF4 shard `region_.target` (quantized on meta before sharding) from
    the whole tensor quantized as one process quantizes it (``lora.to_nf4_param``: from bf16),
    this rank's rows kept: the same codes and scalers whatever the layout, and the scaler mean
    of the whole tensor, which torchao's NF4 row split copies to every shard (``nf4_split``)
    and ``to_empty`` leaves on meta (it reaches the sharded inner tensors only)."""
    from launcher.train.finetune.lora import to_nf4_param

    rows = region_.shape[0]
    part: Any = torch.chunk(to_nf4_param(whole).data, whole.shape[0] // rows, dim=0)[
        region_.offsets[0] // rows
    ]
    target: Any = region_.target  # an NF4Tensor
    device = target.quantized_data.device
    target.copy_(part.to(device))
    target.scaler_mean = part.scaler_mean.to(device).clone()
    target.nf4 = part.nf4.to(device).clone()


def named_params(module: nn.Module, prefix: str = "") -> Iterator[tuple[str, nn.Parameter]]:
    """`module`'s parameters under their model names (wrappers' names removed)."""
    for name, param in module.named_parameters():
        yield clean_name(f"{prefix}{name}"), param


@dataclass
class Filler:
    """Fills materialised parameters from a Source, digesting the frozen base's whole tensors
    of this rank's share (``share(name)``) on the way (fine-tuning)."""

    source: Source
    share: Callable[[str], bool] | None = None
    digests: dict[str, str] | None = None

    def fill_module(self, module: nn.Module, prefix: str = "") -> int:
        count = 0
        for name, param in named_params(module, prefix):
            self.fill_param(name, param)
            count += 1
        return count

    def fill_param(self, name: str, param: torch.Tensor) -> None:
        where = region(param)
        if adapters.nf4_param(where.target):
            whole = _whole_shape(param)
            # The DTensor's own local NF4 (to_local gives an alias: a new NF4Tensor object
            # whose scaler mean FSDP2's all-gather would not see).
            local = getattr(param, "_local_tensor", where.target)
            fill_nf4(
                Region(local, where.offsets, where.shape),
                self.source.box(name, (0,) * len(whole), whole),
            )
        elif math.prod(where.shape) > 0:
            fill(where, self.source.box(name, where.offsets, where.shape))
        if self.share is not None and not adapters.is_adapter(name) and self.share(name):
            assert self.digests is not None
            self.digests[plain_name(name)] = digest_of(self.source, name, _whole_shape(param))


def digest_of(source: Source, name: str, whole: tuple[int, ...]) -> str:
    """``lora.base_digest``'s hex of the whole tensor `name`: from the source's own bounded
    reader where it has one (``init_from.HFSlices.digest``), else from the whole tensor."""
    for one in getattr(source, "sources", (source,)):
        if one.has(name):
            if hasattr(one, "digest"):
                return str(one.digest(name))
            values = one.box(name, (0,) * len(whole), whole).float()
            return base_digest({plain_name(name): values})[plain_name(name)]
    raise KeyError(name)


def _whole_shape(param: Any) -> tuple[int, ...]:
    return tuple(param.ds_shape) if hasattr(param, "ds_shape") else tuple(param.shape)


def drawn(model: nn.Module, seed: int) -> Drawn:
    """The initialiser of `model` (any device, wrapped or not): rules and whole shapes."""
    shapes = {name: _whole_shape(p) for name, p in named_params(model)}
    return Drawn(init_rules(model, seed), shapes)


def units(model: nn.Module) -> Iterator[tuple[str, nn.Module, bool]]:
    """(prefix, module, is a block) in the order a model is materialised: each transformer
    block on its own, then every other top-level child (embeddings, final norm, head)."""
    for name, child in model.named_children():
        if name == "layers":
            for key, block in child.named_children():
                yield f"layers.{key}.", block, True
        else:
            yield f"{name}.", child, False


@torch.no_grad()
def materialise(
    model: nn.Module,
    device: torch.device,
    filler: Filler,
    after_unit: Callable[[nn.Module, bool], Any] | None = None,
    *,
    whole: bool = False,
) -> None:
    """Materialise `model` (built on meta, split and parallelized) on `device` and fill it.

    Unit by unit (a block, then the rest), each filled and passed to `after_unit` (qlora's NF4)
    before the next is allocated, so a unit's unquantized weights are the most that exists at
    once beyond the model built so far; with `whole` (FSDP2, whose sharded parameters are reset
    by the root's ``to_empty``: it holds only this rank's shards) in one ``to_empty``."""
    if whole:
        model.to_empty(device=device)
    for prefix, unit, in_block in units(model):
        if not whole:
            unit.to_empty(device=device)
        filler.fill_module(unit, prefix)
        if after_unit is not None:
            after_unit(unit, in_block)
    direct = list(model.named_parameters(recurse=False))
    if direct:
        raise TypeError(f"parameters outside the model's units: {[n for n, _ in direct]}")


class Loaded:
    """Whole tensors already in memory (a consolidated checkpoint), by the plain model's names:
    the box is sliced out of each."""

    def __init__(self, state: dict[str, torch.Tensor]):
        self.state = state

    def has(self, name: str) -> bool:
        return plain_name(name) in self.state

    def box(self, name: str, offsets: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
        return self.state[plain_name(name)][box_index(offsets, shape)]


def as_source(init_state: Any) -> Source | None:
    """train.init_from as the engines receive it (None, a Source, or whole tensors)."""
    if init_state is None or hasattr(init_state, "box"):
        return init_state  # type: ignore[no-any-return]
    return Loaded(dict(init_state))


def base_share(names: list[str], ranks: int, place: int) -> Callable[[str], bool]:
    """Which frozen tensors this rank digests: every `ranks`-th of the base's names, sorted
    (the union over the ranks is every name once, whatever the layout)."""
    base = sorted(n for n in names if not adapters.is_adapter(n))
    mine = {n for i, n in enumerate(base) if i % ranks == place}
    return mine.__contains__


@torch.no_grad()
def whole_tensors(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, the whole tensor on the host) for each parameter of `module`, one at a time (a
    collective: every rank holding a shard of the module calls it in the same order). A DTensor
    is gathered (``full_tensor``), a ZeRO-3 parameter under ``GatheredParameters``, an NF4
    weight dequantized; the previous tensor is released before the next is gathered."""
    for name, param in named_params(module):
        if hasattr(param, "ds_tensor"):
            import deepspeed

            with deepspeed.zero.GatheredParameters([param]):
                yield name, param.detach().to("cpu").clone()
            continue
        tensor: torch.Tensor = param.detach()
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        yield name, lora_dequantized(tensor).to("cpu")


def lora_dequantized(tensor: torch.Tensor) -> torch.Tensor:
    from launcher.train.finetune.lora import dequantized

    return dequantized(tensor)
