"""The residual stream's dtype per layout (plan/memory/layer_activations.py residual_stream): the
plan's per-layer saved bytes against what autograd saves for one block of the torch engine's
model, measured on the CPU with torch.autograd.graph.saved_tensors_hooks.

The measured total is every distinct storage the block saves (its input included: the norm
saves it), weights and their autocast copies left out (activation_offload.is_weight). The plan
leaves out the norms' fp32 mean and rstd (8 bytes a token each) and RoPE's cos/sin tables
(2 x s x head_dim x 4 bytes a layer): with the shape below about 2% of the total, inside
TOLERANCE. model.norm=layernorm: the CPU runs torch's fused layer_norm kernel, which saves what
the fused CUDA kernels of both norms save (its input); the CPU's RMSNorm is composite (it also
saves fp32 copies), a GPU's is not (aten's _fused_rms_norm).
"""

from __future__ import annotations

import pytest
import torch

from launcher.backends.engine_choices import engine_choices
from launcher.config.composition.compose import compose_config
from launcher.config.layout import derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan.memory.stage_activations import activation_parts
from launcher.train.model.activation_offload import is_weight
from launcher.train.model.transformer import build_model

pytestmark = pytest.mark.unit

TOLERANCE = 0.03
# A Llama block (GQA, SwiGLU, RoPE) with layernorm (module docstring), one layer, one rank.
SHAPE = [
    "model=llama3-1b",
    "model.norm=layernorm",
    "model.num_layers=1",
    "model.hidden_size=128",
    "model.num_attention_heads=4",
    "model.num_kv_heads=2",
    "model.head_dim=32",
    "model.ffn_hidden_size=320",
    "model.vocab_size=256",
    "model.seq_length=64",
    "train.micro_batch_size=4",
    "train.global_batch_size=4",
    "train.recompute=none",
    "cluster=cpu",
    "backend=torch",
    "zero.stage=0",
]


def measured_block_bytes(cfg: LLMTrainConfig) -> int:
    """Bytes one block saves for its backward, as the torch engine runs it without FSDP2:
    fp32 parameters under torch.autocast (mixed precision), bf16 ones with no master
    (precision=bf16-pure, the same stream as FSDP2's bf16 parameters without autocast);
    backend.compile=true: the block under torch.compile with AOTAutograd's min-cut partitioner
    and no code generation (aot_eager_decomp_partition: on this block it saves what inductor's
    graphs save, and compiles in about a second)."""
    model = build_model(cfg.model, "cpu", seed=0)
    pure = not cfg.precision.master_weights
    if pure:
        model.to(torch.bfloat16)
    layout = derive_layout(cfg)
    tokens = torch.randint(0, cfg.model.vocab_size, (layout.micro_batch_size, cfg.model.seq_length))
    block = model.layers["0"]
    # A compiled graph saves autocast's weight copies as plain tensors (no grad_fn to follow).
    weights = {tuple(p.shape) for p in block.parameters()}
    weights |= {shape[::-1] for shape in weights}
    if cfg.backend.compile:
        block = torch.compile(block, backend="aot_eager_decomp_partition")
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        weight = is_weight(t) or (t.grad_fn is None and tuple(t.shape) in weights)
        if not weight:
            saved.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    assert model.tok_embeddings is not None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x = model.tok_embeddings(tokens)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            block(x)
    return sum(saved.values())


def planned_block_bytes(cfg: LLMTrainConfig) -> float:
    """The plan's kept activations of the one layer (one micro-batch in flight)."""
    parts = activation_parts(cfg, derive_layout(cfg), 0)
    assert parts.in_flight == 1
    return parts.kept


@pytest.mark.parametrize(
    ("precision", "compiled"),
    [("bf16", False), ("bf16-pure", False), ("bf16", True)],
    ids=["autocast-fp32-stream", "bf16-stream", "autocast-compiled"],
)
def test_plan_prices_the_saved_bytes_of_one_block(precision: str, compiled: bool) -> None:
    compile_key = f"backend.compile={'true' if compiled else 'false'}"
    cfg = compose_config([*SHAPE, f"precision={precision}", compile_key]).config
    assert engine_choices(cfg).compiled_blocks == compiled
    measured = measured_block_bytes(cfg)
    planned = planned_block_bytes(cfg)
    assert planned == pytest.approx(measured, rel=TOLERANCE), (planned, measured)


def test_fsdp2_prices_the_bf16_stream() -> None:
    """zero.stage=2 (FSDP2's MixedPrecisionPolicy, bf16 parameters, no autocast): the layer
    as pure bf16 runs it; zero.stage=0 under autocast keeps the fp32 stream and more copies."""
    eager = [*SHAPE, "backend.compile=false"]
    fsdp = compose_config([*eager, "precision=bf16", "zero.stage=2"]).config
    pure = compose_config([*eager, "precision=bf16-pure"]).config
    mixed = compose_config([*eager, "precision=bf16"]).config
    assert planned_block_bytes(fsdp) == pytest.approx(planned_block_bytes(pure))
    assert planned_block_bytes(mixed) > 1.2 * planned_block_bytes(fsdp)
