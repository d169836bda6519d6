"""fp8 training for the torch engine (``precision=fp8``): torchao's float8 linear layers.

What is converted: the ``nn.Linear`` projections inside the transformer blocks whose GEMM gains
from fp8 by torchao's size rule (``launcher.backends.engine_choices.fp8_converts``, which `plan`
states; all of them when emulated): attention (wq wk wv wo, or MLA's wq/wq_a/wq_b/wkv_a/wkv_b/wo)
and the MLP (w1 w2 w3). The token embedding and the output head stay in bf16, as torchtitan does
(the vocabulary-sized head GEMM is the most sensitive to fp8 rounding). MoE models are refused
(launcher/backends/torch.py: the experts run as grouped GEMMs, not linear layers). Each converted
layer is torchao's ``Float8Linear`` with dynamic scaling by ``precision.fp8_recipe``: tensorwise
(``Float8LinearConfig()``: per GEMM, the input and weight cast to e4m3 and the output gradient to
e5m2, each with one scale = fp8 max / amax of the tensor; Micikevicius et al. 2022, "FP8 Formats
for Deep Learning") or rowwise (``Float8LinearConfig.from_recipe_name("rowwise")``: a scale per
row, e4m3 throughout, power-of-2 scales). The weights stay plain tensors in the parameter dtype
(fp32 masters), so optimizer, checkpoints and export see the same parameters as a bf16 run.
Everything outside the converted GEMMs computes in bf16 (FSDP2's MixedPrecisionPolicy or
``torch.autocast``). On a GPU the blocks are compiled by default (``backend.compile`` null):
eager float8 runs its casts as separate kernels and was measured 2x slower than bf16.

``precision.fp8_emulate=true`` is torchao's ``Float8LinearConfig(emulate=True)``: the same casts
and scales, with the fp8 matmul emulated in higher precision, so fp8 numerics can be checked on a
CPU (no speedup anywhere). Real fp8 matmuls (``torch._scaled_mm``) need CUDA compute capability
8.9 or newer (Ada, Hopper, Blackwell).

With FSDP2 (zero.stage=2/3) and tensorwise scaling the weights are all-gathered in fp8
(``enable_fsdp_float8_all_gather``) and their scales computed for all layers in one all-reduce
after each optimizer step (``precompute_float8_dynamic_scale_for_fsdp``), as torchao's float8
README documents (torchao supports it for tensorwise only); with tensor parallel the converted
tensorwise layers take torchao's ``Float8ColwiseParallel`` / ``Float8RowwiseParallel``, the other
layers (and rowwise, as torchtitan does) torch's styles.

torchao is imported here only, inside the training processes (never by plan/validate/render).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, cast

import torch
from torch import nn

from launcher.backends.engine_choices import fp8_converts
from launcher.config.schema import PrecisionConfig

# Real fp8 matmuls need CUDA compute capability 8.9 (Ada) or newer.
FP8_MIN_CAPABILITY = (8, 9)


class _DropImportNoise(logging.Filter):
    """Drops the two warnings torchao 0.18 logs on import with a CPU/other-ABI torch: its optional
    C++ kernels (mxfp8, cutlass) failing to load, which float8 training does not use, and torch's
    deprecation note about torchao registering an Enum as a pytree constant."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        return not (
            (text.startswith("Failed to load") and ".so" in record.getMessage())
            or "is an Enum subclass and is now natively supported" in text
        )


@contextmanager
def _quiet_import() -> Iterator[None]:
    noise = _DropImportNoise()
    loggers = [logging.getLogger("torchao"), logging.getLogger("torch.utils._pytree")]
    for log in loggers:
        log.addFilter(noise)
    try:
        yield
    finally:
        for log in loggers:
            log.removeFilter(noise)


def float8() -> ModuleType:
    """``torchao.float8``, imported without its import-time noise."""
    with _quiet_import():
        import torchao.float8 as module
    return cast(ModuleType, module)


def float8_config(*, emulate: bool, fsdp: bool, recipe: str = "tensorwise") -> Any:
    """torchao's config for `recipe` (tensorwise: ``Float8LinearConfig()``; rowwise: its
    ``from_recipe_name("rowwise")``); fp8 all-gather under FSDP2 with tensorwise only (torchao
    supports it for tensorwise scaling only)."""
    f8 = float8()
    if recipe == "rowwise":
        return dataclasses.replace(
            f8.Float8LinearConfig.from_recipe_name("rowwise"), emulate=emulate
        )
    return f8.Float8LinearConfig(emulate=emulate, enable_fsdp_float8_all_gather=fsdp)


def _block_linear(module: nn.Module, fqn: str) -> bool:
    return isinstance(module, nn.Linear) and fqn.split(".")[0] == "layers"


def convert_as_configured(model: nn.Module, precision: PrecisionConfig, fsdp: bool) -> list[str]:
    """``convert`` with the run's precision.fp8_emulate and precision.fp8_recipe."""
    return convert(model, emulate=precision.fp8_emulate, fsdp=fsdp, recipe=precision.fp8_recipe)


def convert(
    model: nn.Module, *, emulate: bool, fsdp: bool, recipe: str = "tensorwise"
) -> list[str]:
    """Swap the block projections of `model` that gain from fp8 (``engine_choices.fp8_converts``:
    torchao's size rule; all of them when emulated) for Float8Linear in place; return their
    names."""

    def wanted(module: nn.Module, fqn: str) -> bool:
        return _block_linear(module, fqn) and fp8_converts(
            cast(nn.Linear, module).out_features,
            cast(nn.Linear, module).in_features,
            recipe,
            emulate,
        )

    expected = [name for name, m in model.named_modules() if wanted(m, name)]
    float8().convert_to_float8_training(
        model,
        module_filter_fn=wanted,
        config=float8_config(emulate=emulate, fsdp=fsdp, recipe=recipe),
    )
    converted = [name for name, m in model.named_modules() if is_float8_linear(m)]
    assert converted == expected, f"float8 layers {converted}, expected {expected}"
    return converted


def is_float8_linear(module: nn.Module) -> bool:
    from torchao.float8.float8_linear import Float8Linear

    return isinstance(module, Float8Linear)


def tp_styles(recipe: str) -> tuple[type[Any], type[Any]]:
    """(colwise, rowwise) tensor-parallel styles that pick, per module, torchao's
    Float8ColwiseParallel / Float8RowwiseParallel for a tensorwise Float8Linear (they cast the
    activations with tensorwise scales) and torch's ColwiseParallel / RowwiseParallel otherwise
    (bf16 layers, and the rowwise recipe, as torchtitan does)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

    with _quiet_import():
        from torchao.float8.float8_tensor_parallel import (
            Float8ColwiseParallel,
            Float8RowwiseParallel,
        )

    def adaptive(fp8_style: type[Any], plain: type[Any]) -> type[Any]:
        class Style(ParallelStyle):
            def __init__(self, **kwargs: Any):
                super().__init__()
                self.kwargs = kwargs

            def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
                use_fp8 = recipe == "tensorwise" and is_float8_linear(module)
                style = (fp8_style if use_fp8 else plain)(**self.kwargs)
                return cast(nn.Module, style._apply(module, device_mesh))

        Style.__name__ = f"Adaptive{plain.__name__}"
        return Style

    return (
        adaptive(Float8ColwiseParallel, ColwiseParallel),
        adaptive(Float8RowwiseParallel, RowwiseParallel),
    )


def precompute_fsdp_scales(model: nn.Module) -> None:
    """After the optimizer step under FSDP2: every fp8 weight's scale in one all-reduce."""
    float8().precompute_float8_dynamic_scale_for_fsdp(model)


def plain_tensors(state: Any) -> Any:
    """`state` (nested dicts/lists of a model or optimizer state dict) with torchao's FSDP
    weight wrapper (``WeightWithDynamicFloat8CastTensor``, under fp8 all-gather) replaced by the
    plain tensor it wraps, sharing its storage. Checkpoints then hold plain tensors: readable
    without torchao (``llmtrain export``, weights-only loading) and by a bf16 run."""
    from torch.distributed.tensor import DTensor
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor as Wrapped

    if isinstance(state, dict):
        return {k: plain_tensors(v) for k, v in state.items()}
    if isinstance(state, list):
        return [plain_tensors(v) for v in state]
    if isinstance(state, DTensor) and isinstance(state._local_tensor, Wrapped):
        return DTensor.from_local(
            state._local_tensor._tensor,
            state.device_mesh,
            state.placements,
            run_check=False,
            shape=state.shape,
            stride=state.stride(),
        )
    if isinstance(state, Wrapped):
        return state._tensor
    return state


def device_problem(device: torch.device, emulate: bool) -> str | None:
    """Why this rank's device cannot run real fp8 matmuls (None: it can, or they are emulated)."""
    if emulate:
        return None
    if device.type != "cuda":
        return (
            "precision=fp8 runs real fp8 matmuls on CUDA GPUs with compute capability 8.9 or "
            f"newer, but this rank computes on {device.type}; run on such a GPU (e.g. "
            "cluster=h100-80gb), set precision.fp8_emulate=true to check fp8 numerics without "
            "a speedup, or use precision=bf16"
        )
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < FP8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return (
            f"precision=fp8 needs CUDA compute capability 8.9 or newer (Ada, Hopper, Blackwell); "
            f"{name} has {major}.{minor}; use precision=bf16, or precision.fp8_emulate=true to "
            "check fp8 numerics without a speedup"
        )
    return None
