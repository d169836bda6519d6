"""The initial weights of the transformer (``launcher.train.model.transformer``): normal(0, 0.02)
for linears and embeddings, the residual projections (wo, w2) at 0.02/sqrt(2L) (GPT-2: Radford et
al. 2019, section 2.3), biases zero, norms one/zero. Each parameter draws from its own CPU generator
seeded by (seed, parameter name), so a pipeline stage that holds only some layers gets exactly the
weights those layers have in the whole model, on any device.
"""

from __future__ import annotations

import contextlib
import math
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from launcher.config.schema import ModelConfig

# GPT-2's initializer range (its config's initializer_range), as torchtitan and nanoGPT use.
INIT_STD = 0.02
# Linear layers whose output is added to the residual stream: scaled by 1/sqrt(2L) at init.
RESIDUAL_PROJECTIONS = ("wo", "w2")


def _param_seed(seed: int, name: str) -> int:
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1)


# Wrappers that insert a name into parameter paths without changing the parameter:
# torch.compile's OptimizedModule and torch's checkpoint wrapper.
WRAPPER_NAMES = ("_orig_mod.", "_checkpoint_wrapped_module.")


def clean_name(name: str) -> str:
    """A parameter or module path without the names wrappers insert (``WRAPPER_NAMES``)."""
    for wrapper in WRAPPER_NAMES:
        name = name.replace(wrapper, "")
    return name


@dataclass(frozen=True)
class InitRule:
    """How one parameter starts: ``kind`` normal (mean 0, ``std``, drawn from a generator seeded
    by ``seed``), uniform (+-``bound``, LoRA's A), ones or zeros."""

    kind: str
    std: float = 0.0
    bound: float = 0.0
    seed: int = 0

    def full(self, shape: tuple[int, ...]) -> torch.Tensor:
        """The whole fp32 tensor, on the CPU (the same values on every rank, whatever layout
        later keeps which slice of it)."""
        if self.kind == "ones":
            return torch.ones(shape)
        if self.kind == "zeros":
            return torch.zeros(shape)
        values = torch.empty(shape)
        generator = torch.Generator().manual_seed(self.seed)
        if self.kind == "uniform":
            return values.uniform_(-self.bound, self.bound, generator=generator)
        return nn.init.normal_(values, 0.0, self.std, generator=generator)


def init_rules(model: nn.Module, seed: int | None = None) -> dict[str, InitRule]:
    """{parameter name (``clean_name``): its InitRule} for every parameter of `model` (built on
    any device, wrapped or not, with LoRA adapters or not). A LoRA-wrapped linear's frozen base
    draws as the plain linear does (its name without ``.base``), its A from the adapter's own
    seed (``launcher.train.finetune.lora``), B at zero."""
    from launcher.train.finetune.lora import adapter_seed

    seed = torch.initial_seed() if seed is None else seed
    layers = cast(ModelConfig, model.config).num_layers  # the whole model's, on any stage
    residual_std = INIT_STD / math.sqrt(2 * layers)
    rules: dict[str, InitRule] = {}
    for raw_name, module in model.named_modules():
        module_name = clean_name(raw_name)
        plain = module_name.replace(".base", "") if module_name.endswith(".base") else module_name
        leaf = plain.rsplit(".", 1)[-1]
        for pname, _ in module.named_parameters(recurse=False):
            name = f"{module_name}.{pname}"
            if pname == "bias":
                rules[name] = InitRule("zeros")
            elif isinstance(module, nn.LayerNorm | nn.RMSNorm):
                rules[name] = InitRule("ones")
            elif leaf == "lora_a":
                bound = 1.0 / math.sqrt(cast(nn.Linear, module).in_features)
                owner = plain[: -len(".lora_a")]
                rules[name] = InitRule("uniform", bound=bound, seed=adapter_seed(seed, owner))
            elif leaf == "lora_b":
                rules[name] = InitRule("zeros")
            elif isinstance(module, nn.Linear | nn.Embedding):
                std = residual_std if leaf in RESIDUAL_PROJECTIONS else INIT_STD
                rules[name] = InitRule("normal", std=std, seed=_param_seed(seed, f"{plain}.weight"))
            else:
                raise TypeError(f"{name}: no initialisation rule for {type(module).__name__}")
    return rules


@torch.no_grad()
def init_weights(model: nn.Module, seed: int | None = None) -> None:
    """Initialise every parameter of a ``launcher.train.model.transformer.Transformer`` (the module
    docstring), whole on this process. seed None: ``torch.initial_seed()``.

    Call after ``to_empty`` when the model was built on the meta device; a sharded model is
    initialised slice by slice by ``launcher.train.parallel.build`` from the same ``init_rules``."""
    rules = init_rules(model, seed)
    for name, param in model.named_parameters():
        param.copy_(rules[clean_name(name)].full(tuple(param.shape)))


# Parameter-holding module types; init_weights initialises every one of them.
_INIT_CLASSES: tuple[type[nn.Module], ...] = (nn.Linear, nn.Embedding, nn.LayerNorm, nn.RMSNorm)
_INIT_LOCK = threading.Lock()


def _no_reset(self: nn.Module) -> None:
    pass


@contextlib.contextmanager
def skip_default_init() -> Iterator[None]:
    """Construct modules without torch's default init (init_weights replaces it anyway).

    Building DeepSeek-V3 (45k linears) on the meta device takes ~3 s this way instead of ~9 s."""
    with _INIT_LOCK:
        saved = {cls: cls.__dict__["reset_parameters"] for cls in _INIT_CLASSES}
        try:
            for cls in _INIT_CLASSES:
                setattr(cls, "reset_parameters", _no_reset)  # noqa: B010
            yield
        finally:
            for cls, method in saved.items():
                setattr(cls, "reset_parameters", method)  # noqa: B010
