"""LoRA and QLoRA adapters on llmtrain's model (``finetune=lora|qlora``; docs/finetuning.md).

LoRA (Hu et al. 2021, arXiv:2106.09685): a target projection y = W x keeps W frozen and learns a
low-rank update, y = W x + (alpha / r) * B (A dropout(x)), A [r, in], B [out, r]. A starts as
PEFT and the paper do (Kaiming-uniform, bound 1/sqrt(in)), B at zero, so training starts from
the base model exactly. Each A draws from a generator seeded by its name and the run's seed, so a
pipeline chunk's adapters equal those layers' adapters in the unsplit model.

QLoRA (Dettmers et al. 2023, arXiv:2305.14314): the same adapters over base weights stored in
NormalFloat-4 (torchao's ``NF4Tensor``: 4-bit codes in blocks of 64 weights, each block's absmax
scaler quantized to int8 in blocks of 256 scalers with one bf16 factor each), dequantized to the
compute dtype inside each matmul (torchao's ``linear_nf4``; its backward never forms a weight
gradient). Every frozen weight that is not a target (embeddings, norms, head) stays in its
dtype.

Targets (``finetune.targets``): the table of launcher/config/adapters.py.

Adaptable: the dense blocks' attention and MLP
projections. Not adaptable (refused by ``launcher.validate.finetune_rules``): MoE experts (their
weights are grouped GEMM tensors, ``launcher.train.model.experts``, not linears) and multi-head
latent attention's projections.

Names: an adapted module ``layers.0.attention.wq`` becomes a ``LoRALinear`` holding ``base``
(the frozen linear), ``lora_a`` and ``lora_b``; ``merged_state`` and ``adapter_state`` give the
state under the plain model's names (``...wq.weight``) and the adapters alone.
"""

from __future__ import annotations

import hashlib
import math
import zlib
from collections.abc import Iterator, Mapping
from typing import Any, cast

import torch
from torch import nn

from launcher.config import adapters
from launcher.config.schema import FinetuneConfig, ModelConfig

ADAPTER_PREFIX = "lora_"


def target_modules(m: ModelConfig, targets: list[str]) -> dict[str, str]:
    """{target: module name} the model has for `targets` (all-linear: every one); unknown or
    absent targets are left out (``finetune_rules`` names them)."""
    known = adapters.target_modules(m.activation)
    if adapters.ALL_LINEAR in targets:
        return known
    return {t: known[t] for t in targets if t in known}


def is_adapter(name: str) -> bool:
    """A parameter name of an adapter (trained) rather than of the base model (frozen)."""
    return f".{ADAPTER_PREFIX}" in name or name.startswith(ADAPTER_PREFIX)


class LoRALinear(nn.Module):
    """A frozen linear (plain, or with its weight in NF4) plus its trainable low-rank update."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float, nf4: bool):
        super().__init__()
        self.base = base
        self.in_features, self.out_features = base.in_features, base.out_features
        self.rank, self.scale, self.nf4 = rank, alpha / rank, nf4
        device = base.weight.device
        self.lora_a = nn.Linear(self.in_features, rank, bias=False, device=device)
        self.lora_b = nn.Linear(rank, self.out_features, bias=False, device=device)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.enabled = True  # False: the frozen base alone (launcher.train.finetune)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.nf4:
            from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import linear_nf4

            out: torch.Tensor = linear_nf4(x, self.base.weight)
            if self.base.bias is not None:
                out = out + self.base.bias.to(out.dtype)
        else:
            out = self.base(x)
        if not self.enabled:
            return out
        update: torch.Tensor = self.lora_b(self.lora_a(self.dropout(x)))
        return out + update * self.scale

    @torch.no_grad()
    def reset_adapters(self, seed: int) -> None:
        """A: Kaiming-uniform (a = sqrt(5), bound 1/sqrt(in), as nn.Linear and PEFT); B: zero."""
        bound = 1.0 / math.sqrt(self.in_features)
        values = torch.empty(self.lora_a.weight.shape, dtype=self.lora_a.weight.dtype)
        values.uniform_(-bound, bound, generator=torch.Generator().manual_seed(seed))
        self.lora_a.weight.copy_(values)
        self.lora_b.weight.zero_()

    def merged_weight(self) -> torch.Tensor:
        """W + (alpha / r) * B @ A in fp32 (the weight the merged export writes)."""
        weight = dequantized(self.base.weight).float()
        return weight + self.scale * (self.lora_b.weight.float() @ self.lora_a.weight.float())


def dequantized(weight: torch.Tensor) -> torch.Tensor:
    """An NF4 weight back in its original dtype; any other tensor as it is."""
    get = getattr(weight, "get_original_weight", None)
    return cast(torch.Tensor, get()) if callable(get) else weight


def adapter_seed(seed: int, name: str) -> int:
    """The seed of the A matrix of the adapter on projection `name` (``layers.0.attention.wq``)."""
    return (seed * 1_000_003 + zlib.crc32(f"{name}.lora_a".encode())) % (2**63 - 1)


def adapted(model: nn.Module) -> Iterator[tuple[str, LoRALinear]]:
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            yield name, module


@torch.no_grad()
def apply_lora(
    model: nn.Module, m: ModelConfig, ft: FinetuneConfig, seed: int, frozen_dtype: torch.dtype
) -> int:
    """Freeze `model` and put adapters on its target projections (in place); returns how many.
    For a materialised model: the adapters drawn (``reset_adapters``) and, with qlora, the base
    weights quantized to NF4 from the weights as loaded. The engines build on the meta device
    instead (``wrap_adapters``, then ``train.parallel.build`` draws and quantizes per shard)."""
    count = wrap_adapters(model, m, ft, frozen_dtype)
    for name, module in adapted(model):
        module.reset_adapters(adapter_seed(seed, name))
    quantize_bases(model)
    return count


@torch.no_grad()
def wrap_adapters(
    model: nn.Module, m: ModelConfig, ft: FinetuneConfig, frozen_dtype: torch.dtype
) -> int:
    """Freeze `model` and wrap its target projections in ``LoRALinear`` (in place, on any device,
    the meta device included: nothing is drawn or quantized here); returns how many.

    Frozen weights are cast to `frozen_dtype` (bf16 for bf16 training on a GPU, fp32 on the CPU;
    the adapters stay fp32, the optimizer's master weights); with qlora the wrapped bases are
    marked for NF4 (``quantize_bases``)."""
    names = set(target_modules(m, list(ft.targets)).values())
    nf4 = ft.name == "qlora"
    for param in model.parameters():
        param.requires_grad_(False)
    count = 0
    for block_name, block in list(model.named_modules()):
        for rel in names:
            owner_name, _, leaf = rel.rpartition(".")
            owner = block.get_submodule(owner_name) if _has(block, owner_name) else None
            linear = getattr(owner, leaf, None) if owner is not None else None
            if not isinstance(linear, nn.Linear) or not block_name.startswith("layers."):
                continue
            if block_name.count(".") != 1:  # a transformer block: "layers.N"
                continue
            if not nf4:
                linear.to(frozen_dtype)
            setattr(owner, leaf, LoRALinear(linear, ft.rank, ft.alpha, ft.dropout, nf4))
            count += 1
    for name, param in model.named_parameters():
        if is_adapter(name):
            param.requires_grad_(True)
        elif param.dtype.is_floating_point and param.dtype != frozen_dtype and not nf4_param(param):
            if nf4 and name.endswith(".base.weight"):
                continue  # quantized from its loaded dtype (quantize_bases)
            param.data = param.data.to(frozen_dtype)
    return count


def to_nf4_param(weight: torch.Tensor) -> nn.Parameter:
    """A frozen NF4 parameter from `weight` (quantized from bf16, as QLoRA stores its base)."""
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    return nn.Parameter(to_nf4(weight.detach().to(torch.bfloat16)), requires_grad=False)


@torch.no_grad()
def quantize_bases(module: nn.Module) -> int:
    """The bases of `module`'s qlora adapters (materialised, not yet NF4) to NF4, one at a time;
    returns how many."""
    count = 0
    for _, wrapped in adapted(module):
        if wrapped.nf4 and not nf4_param(wrapped.base.weight):
            wrapped.base.weight = to_nf4_param(wrapped.base.weight)
            count += 1
    return count


def nf4_param(param: torch.Tensor) -> bool:
    """An NF4 weight, or an FSDP2 shard (DTensor) of one."""
    local = getattr(param, "_local_tensor", param)
    return callable(getattr(local, "get_original_weight", None))


def _has(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def plain_name(name: str) -> str:
    """A parameter's name in the plain model: ``...wq.base.weight`` -> ``...wq.weight``."""
    return name.replace(".base.", ".")


@torch.no_grad()
def merged_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The plain model's state dict with every adapter merged into its weight (fp32 for adapted
    weights, each other tensor in its own dtype)."""
    out: dict[str, torch.Tensor] = {}
    merged = {f"{name}.weight": mod.merged_weight() for name, mod in adapted(model)}
    for name, tensor in model.state_dict().items():
        if is_adapter(name):
            continue
        plain = plain_name(name)
        out[plain] = merged.get(plain, dequantized(tensor))
    return out


def merge_adapters(
    base: Mapping[str, torch.Tensor], adapters: Mapping[str, torch.Tensor], scale: float
) -> dict[str, torch.Tensor]:
    """`base` (the plain model's names) with W + scale * B @ A for each adapter pair in
    `adapters` (``...wq.lora_a.weight``, ``...wq.lora_b.weight``), in fp32."""
    out = dict(base)
    for name in adapters:
        if not name.endswith(".lora_a.weight"):
            continue
        stem = name[: -len(".lora_a.weight")]
        a, b = adapters[name].float(), adapters[f"{stem}.lora_b.weight"].float()
        key = f"{stem}.weight"
        out[key] = base[key].float() + scale * (b @ a)
    return out


def base_digest(named: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """sha256 of each frozen tensor's bytes (name -> hex), for ``combined_digest``."""
    out: dict[str, str] = {}
    for name, tensor in named.items():
        data = tensor.detach().to("cpu").contiguous().reshape(-1)
        out[plain_name(name)] = hashlib.sha256(data.view(torch.uint8).numpy().tobytes()).hexdigest()
    return out


def combined_digest(per_tensor: Mapping[str, str]) -> str:
    """One sha256 over the per-tensor digests in name order: the base weights' identity,
    whatever layout holds them (a pipeline chunk's names are the unsplit model's)."""
    text = "".join(f"{k}={per_tensor[k]}\n" for k in sorted(per_tensor))
    return hashlib.sha256(text.encode()).hexdigest()


def trainable_summary(model: nn.Module) -> dict[str, Any]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return {"trainable": trainable, "total": total}


# In a checkpoint's engine folder (rank 0): which base weights its adapters apply to.
BASE_FILE = "base_weights.json"


def gathered_digest(mine: Mapping[str, str]) -> str:
    """``combined_digest`` over the union of every rank's per-tensor digests (a collective):
    each rank hashes its share of the frozen tensors it holds (``share``)."""
    import torch.distributed as dist

    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, dict(mine))
    union: dict[str, str] = {}
    for part in everyone:
        union.update(part)
    return combined_digest(union)


def base_record(ft: FinetuneConfig, digest: str, init_from: str | None) -> dict[str, Any]:
    """The contents of BASE_FILE."""
    return {
        "finetune": ft.name,
        "rank": ft.rank,
        "alpha": ft.alpha,
        "targets": list(ft.targets),
        "base_sha256": digest,
        "base": init_from or "random init (train.seed)",
    }


def base_problem(saved: Any, digest: str) -> str | None:
    """Why a checkpoint's adapters cannot resume on these base weights (None: they can)."""
    if not isinstance(saved, dict) or not isinstance(saved.get("base_sha256"), str):
        return f"{BASE_FILE}: not a base-weights record written by llmtrain"
    if saved["base_sha256"] != digest:
        return (
            f"the checkpoint's adapters were trained on base weights {saved['base_sha256'][:16]} "
            f"({saved.get('base')}), but this run's base is {digest[:16]}: set train.init_from "
            "to the base the adapters were trained on"
        )
    return None
