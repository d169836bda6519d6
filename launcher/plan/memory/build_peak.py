"""Each rank's peak while the engine builds and loads the model, beside the steady state.

Priced from what ``launcher.train.parallel.build`` does (its docstring has the order), per rank:

- Steady weights: the heaviest stage's ``weights`` bucket (``model_states.stage_states``): the
  whole build ends holding them; gradients and optimizer states come at the first step.
- Device transient, beyond them, at the heaviest moment:
  - a parameter is filled box by box (``build.Filler``): the box in the weight's dtype is copied
    to the device, at most the largest local tensor (largest whole tensor / (tp x FSDP shards));
  - DeepSpeed ZeRO-3 constructs each module under ``deepspeed.zero.Init``, whole on the device
    until it leaves the module's constructor (partition_parameters.py, v0.19.8): the largest whole
    tensor in the weight dtype;
  - qlora without FSDP2: a block is materialised in fp32 (the meta model's dtype; the NF4 bases
    are not cast) and each adapted weight converted from a bf16 copy (``lora.to_nf4_param``): the
    block's NF4 weights at 4 bytes, plus 2 bytes of the largest and torchao's quantization
    temporaries for it (``nf4_quantize_bytes``);
  - qlora under FSDP2: the whole tensor is quantized on the host (``build.fill_nf4``, with the
    same temporaries there); the device receives the rank's NF4 rows, which are the steady state.
- Host, per rank: the initialiser draws each parameter whole in fp32 on the CPU and keeps the box
  (``init_weights.InitRule.full``), one tensor at a time; train.init_from reads the box alone
  (``init_from.HFSlices``, plain file reads, nothing mapped; the file's dtype is not known to the
  plan: priced in fp32, its upper bound) and draws only what the files lack (the adapters);
  fine-tuning digests each frozen tensor of its share, from the initialiser's whole tensor or
  from the file in chunks of rows (``DIGEST_CHUNK_BYTES``, read and as fp32); qlora under FSDP2
  quantizes the whole tensor on the host (a bf16 copy and its NF4). Per node: x ranks per node.
  The same box read holds for every source train.init_from takes: a Hugging Face folder (GPT-2's
  transposed weights by their columns), our DCP checkpoints (``consolidate.DcpTensors.box``) and
  DeepSpeed's (``deepspeed_tensors``, ZeRO-3 merged per box), none read whole.

Never imports torch (plan, validate).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.backends.build_order import builds_in_zero_init, shards_before_materialising
from launcher.config.adapters import ALL_LINEAR
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan.dtypes import DTYPE_BYTES
from launcher.plan.finetune import NF4_BYTES_PER_WEIGHT, projections, targets
from launcher.plan.memory.model_states import zero_shard
from launcher.plan.model_shape import ModelShape

if TYPE_CHECKING:
    from launcher.plan.memory.estimate import StageMemory

FP32, BF16 = 4.0, 2.0
# torchao's to_nf4 (torchao/quantization/quantize_/workflows/nf4/nf4_tensor.py, 0.18:
# convert_to_norm_float_weight, quantize_tensor_nearest): beside its bf16 input it holds the
# scaled copy (bf16, 2 bytes a weight) and the uint8 codes (1), and finds each code CHUNK_SIZE =
# 2^20 values at a time from their distances to the 16 NF4 values: the difference and its
# absolute value, [2^20, 16] in bf16 each. (Measured with torch.profiler on the CPU, 4096 x 4096
# bf16: 3 bytes a weight + 64.75 MiB.) Before pytorch/ao#196 (May 2024) the distances were
# taken over the whole tensor at once: 66 bytes a weight.
NF4_QUANTIZE_BYTES_PER_WEIGHT = 2.0 + 1.0
NF4_QUANTIZE_CHUNK_BYTES = 2 * 16 * BF16 * 2**20


def nf4_quantize_bytes(elements: float) -> float:
    """torchao's to_nf4 temporaries for a weight of `elements` values, beyond its bf16 input."""
    return elements * NF4_QUANTIZE_BYTES_PER_WEIGHT + NF4_QUANTIZE_CHUNK_BYTES


# The most a rank reads at once to digest a frozen tensor of train.init_from (fp32 bytes), used by
# launcher/train/checkpoint/safetensors_slices.py.
DIGEST_CHUNK_BYTES = 64 << 20


@dataclass(frozen=True)
class BuildPeak:
    """Bytes of one rank while building and loading (module docstring)."""

    weights: float  # the steady weights the build ends with
    device_transient: float  # beyond them, at the heaviest moment
    host_per_rank: float
    gpus_per_node: int
    mechanism: str  # which transient dominates, in words

    @property
    def device(self) -> float:
        return self.weights + self.device_transient

    @property
    def host_per_node(self) -> float:
        return self.host_per_rank * self.gpus_per_node


def largest_tensor(cfg: LLMTrainConfig) -> int:
    """Elements of the model's largest whole parameter: the embedding or head (V x h), a block
    projection, or an MoE layer's stacked routed experts (E x ffn x h, one grouped tensor)."""
    m, shape = cfg.model, ModelShape(cfg.model)
    sizes = [m.vocab_size * m.hidden_size]
    sizes += [p.fan_in * p.fan_out for p in projections(m).values()]
    if shape.is_moe:
        ffn = m.moe_ffn_hidden_size or m.ffn_hidden_size
        sizes.append((m.num_experts or 0) * ffn * m.hidden_size)
    return max(sizes)


def nf4_block_elements(cfg: LLMTrainConfig, tp: int) -> tuple[float, float]:
    """(elements of one block's NF4 weights, of the largest of them) on a tp rank (qlora)."""
    if cfg.finetune.quantize == ALL_LINEAR:
        chosen = list(projections(cfg.model).values())
    else:
        chosen = targets(cfg)
    sizes = [p.fan_in * p.fan_out / tp for p in chosen]
    return sum(sizes), max(sizes, default=0.0)


def weight_bytes(cfg: LLMTrainConfig) -> float:
    """Bytes of a weight as built: fp32 on the CPU, the compute dtype under DeepSpeed's bf16/fp16
    (its zero.Init casts), fp32 master weights otherwise (torch keeps fp32 parameters)."""
    if cfg.cluster.gpu == "cpu" or not builds_in_zero_init(cfg):
        return FP32
    return float(DTYPE_BYTES[cfg.precision.compute_dtype])


def build_peak(cfg: LLMTrainConfig, layout: Layout, weights: float) -> BuildPeak:
    """`weights`: the heaviest rank's steady weights (``StageMemory.weights``)."""
    fsdp = cfg.zero.stage >= 2 and shards_before_materialising(cfg)
    zero3 = cfg.zero.stage == 3 and builds_in_zero_init(cfg)
    shards = zero_shard(layout) if (fsdp or zero3) else 1
    largest = float(largest_tensor(cfg))
    local = largest / (max(1, layout.tp) * shards)
    qlora = cfg.finetune.name == "qlora"
    tuned = cfg.finetune.name != "full"
    # Device: the box copied in (every layout), or what dominates it.
    device, mechanism = local * weight_bytes(cfg), "a box of the largest tensor"
    if zero3:
        device = largest * weight_bytes(cfg)
        mechanism = "zero.Init: largest tensor whole"
    block, top = nf4_block_elements(cfg, max(1, layout.tp))
    if qlora and not fsdp:
        device = block * FP32 + top * BF16 + nf4_quantize_bytes(top)
        mechanism = "a block in fp32 before NF4"
    elif qlora:
        device = local * NF4_BYTES_PER_WEIGHT
        mechanism = "NF4 rows from the host"
    # Host: the whole fp32 tensor drawn (no init_from), the box; with init_from, fine-tuning
    # digests each frozen tensor in chunks of rows (read, and as fp32).
    loaded = cfg.train.init_from is not None
    host = (0.0 if loaded else largest * FP32) + local * FP32
    if loaded and tuned:
        host += 2 * DIGEST_CHUNK_BYTES
    if qlora and fsdp:
        host += largest * (BF16 + NF4_BYTES_PER_WEIGHT) + nf4_quantize_bytes(top)
    return BuildPeak(weights, device, host, max(1, cfg.cluster.gpus_per_node), mechanism)


def device_total(peak: BuildPeak, fragmentation: float, overhead: float) -> float:
    """What the device must hold while building: as ``StageMemory.device_total`` (allocated x
    the allocator's fragmentation + the runtime's overhead)."""
    return peak.device * fragmentation + overhead


def of_plan(cfg: LLMTrainConfig, layout: Layout, heaviest: StageMemory) -> tuple[BuildPeak, float]:
    """The build peak of a plan's heaviest rank and its device total."""
    peak = build_peak(cfg, layout, heaviest.weights)
    return peak, device_total(peak, heaviest.fragmentation, heaviest.overhead)


def build_json(cfg: LLMTrainConfig, layout: Layout, heaviest: StageMemory) -> dict[str, object]:
    """plan --json's memory.build: the per-rank build peak beside the steady state."""
    peak, total = of_plan(cfg, layout, heaviest)
    return {
        "device_bytes": int(total),
        "allocated_bytes": int(peak.device),
        "transient_bytes": int(peak.device_transient),
        "host_bytes_per_rank": int(peak.host_per_rank),
        "host_bytes_per_node": int(peak.host_per_node),
        "mechanism": peak.mechanism,
    }


def build_line(cfg: LLMTrainConfig, layout: Layout, heaviest: StageMemory) -> str:
    """The memory bar's line under it: the build peak per rank and the host per node."""
    peak, total = of_plan(cfg, layout, heaviest)
    gib = 1024**3
    return (
        f"build  {total / gib:.1f} GiB per GPU, host {peak.host_per_node / gib:.1f} GiB per node "
        f"({peak.mechanism})"
    )
