"""What the training engine will run for a configuration, decided in one place (no torch import):
``plan`` states it and prices it, the engines follow it.

- Compilation (``backend.compile``: true | false | null = the backend's default). backend=torch
  compiles each transformer block separately (``torch.compile`` per block, so compile time grows
  with the number of distinct blocks, not the model) when compile is in force. Defaults:
  precision=fp8 on a GPU compiles (eager float8 measured 2x slower than bf16, see FP8_EAGER_NOTE);
  a dense model on a GPU compiles when the run is long enough to pay the compile time back
  (COMPILE_NOTE: measured break-even ~375 steps; on from COMPILE_MIN_STEPS); MoE models (token
  counts per expert change every step), context parallel (refused with compile) and the CPU run
  eager. backend=deepspeed has no compile path
  (its engine runs eager; an explicit true is refused by launcher/backends/deepspeed.py).
  backend=megatron fuses element-wise kernels by hand (priced as compiled, kernels.py).
- fp8 (precision=fp8, backend=torch): torchao float8 with the ``precision.fp8_recipe`` scaling
  recipe (tensorwise | rowwise) on the block projections whose GEMM gains, by torchao 0.18's own
  size rule (``torchao.float8.float8_linear_utils._auto_filter_for_recipe``, thresholds from its
  H100 microbenchmarks, README "Performance"): tensorwise converts unless K <= 4096 and N <= 1024;
  rowwise converts unless N <= 2048, K <= 1024, or N <= 4096 and K <= 2048 (N = out features,
  K = in features of the unsharded layer). With precision.fp8_emulate every block projection
  converts (a numerics check, no speed to gain or lose). The output layer and the embeddings stay
  in bf16 (torchtitan's choice; the vocabulary-sized GEMM is the most rounding-sensitive).
- The loss: over chunks of tokens without full fp32 logits (``launcher.train.model.chunked_loss``)
  where the whole head is on one rank inside the model's forward (torch engine, tp=1 and pp=1);
  with tp > 1 the torch engine keeps the logits split over the vocabulary and computes the loss
  with torch's loss_parallel (torchtitan's default under tp); otherwise the full logits in the
  compute dtype plus fp32 copies.
- MoE experts: grouped GEMMs over tokens sorted by expert (``launcher.train.model.experts``).
- Packed rows' attention: flex or sdpa (``launcher.backends.packed_attention``).
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.backends.common import Refusal, device_of, precision_of
from launcher.backends.packed_attention import packed_attention
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig, ModelConfig

# What each packed-rows kernel is, as plan states it (launcher/backends/packed_attention.py).
PACKED_KERNEL_TEXT = {
    "flex": "flex_attention with a document BlockMask (compiled; blocks between examples skipped)",
    "sdpa": "SDPA with a dense [b, 1, s, s] document mask (memory-efficient kernel, no flash)",
}

# The chunked loss's fp32 logits per chunk: at most 2**27 elements (512 MiB); at V = 128k that is
# ~1k tokens, a [1k x h x 128k] GEMM, large enough to run at full speed on a GPU.
LOSS_CHUNK_ELEMENTS = 2**27


def loss_chunk_tokens(vocab: int) -> int:
    """Tokens per chunk of the chunked loss (at least 1)."""
    return max(1, LOSS_CHUNK_ELEMENTS // max(1, vocab))


# The measurement behind fp8 compiling by default (issue 23, one H100 80GB, llama3-1b, seq 8192,
# micro-batch 1, backend=torch): per step.
FP8_EAGER_NOTE = (
    "measured on one H100 80GB (llama3-1b, seq 8192): fp8 eager 470 ms per step against bf16 "
    "eager 240 ms, fp8 compiled 213 ms (torchao's scaling casts run as separate kernels unless "
    "compiled)"
)


# The measurement behind compiling dense torch runs by default (one H100 80GB, 2026-11-25,
# bench/results/h100-80gb-2026-11-25, llama3-1b, seq 8192, micro-batch 1, bf16, 20 steps).
COMPILE_NOTE = (
    "measured on one H100 80GB (llama3-1b, seq 8192): compiled 200.1 ms per step against eager "
    "228.7 ms; the first step took 12.9 s compiled against 2.2 s eager, so compiling pays back "
    "after ~375 steps"
)
# Steps from which a dense run on a GPU compiles by default: a few times the measured break-even,
# so that a short debugging run starts at once.
COMPILE_MIN_STEPS = 1000


def fp8_gemm_gains(out_features: int, in_features: int, recipe: str) -> bool:
    """torchao 0.18's size rule for a float8 linear being faster than bf16 (module docstring)."""
    n, k = out_features, in_features
    if n % 16 or k % 16:
        return False
    if recipe == "rowwise":
        return not (n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048))
    return not (k <= 4096 and n <= 1024)


def fp8_converts(out_features: int, in_features: int, recipe: str, emulate: bool) -> bool:
    """Whether llmtrain converts a block projection of this shape to float8."""
    if emulate:
        return out_features % 16 == 0 and in_features % 16 == 0
    return fp8_gemm_gains(out_features, in_features, recipe)


def block_projections(m: ModelConfig) -> list[tuple[str, int, int]]:
    """(name, out features, in features) of each linear in a dense transformer block."""
    h, n = m.hidden_size, m.num_attention_heads
    d = m.head_dim or h // max(1, n)
    out: list[tuple[str, int, int]] = []
    if m.kv_lora_rank is None:
        kv = (m.num_kv_heads or n) * d
        out += [("wq", n * d, h), ("wk", kv, h), ("wv", kv, h), ("wo", h, n * d)]
    else:
        r, v = m.qk_rope_head_dim or 0, m.v_head_dim or d
        if m.q_lora_rank is None:
            out.append(("wq", n * (d + r), h))
        else:
            out += [("wq_a", m.q_lora_rank, h), ("wq_b", n * (d + r), m.q_lora_rank)]
        out += [("wkv_a", m.kv_lora_rank + r, h), ("wkv_b", n * (d + v), m.kv_lora_rank)]
        out.append(("wo", h, n * v))
    f = m.ffn_hidden_size
    out += [("w1", f, h), ("w2", h, f)]
    if m.activation == "swiglu":
        out.append(("w3", f, h))
    return out


@dataclass(frozen=True)
class EngineChoices:
    compile: bool
    compile_why: str
    fp8_recipe: str | None  # None: no fp8
    fp8_layers: tuple[str, ...]  # block projections converted
    bf16_layers: tuple[str, ...]  # block projections kept in bf16 (too small to gain)
    chunked_loss: bool
    loss_why: str
    moe: str | None
    # The blocks run under torch.compile (llmtrain's torch engine), whose partitioner recomputes
    # point-wise results instead of saving them (plan.memory.layer_activation_terms).
    compiled_blocks: bool = False
    # llmtrain's torch engine under tp > 1: the logits stay split over the vocabulary and the loss
    # is torch's loss_parallel (plan.memory.LOSS_PARALLEL_BACKWARD_BYTES prices it).
    vocab_parallel_loss: bool = False
    # Packed rows: the kernel that keeps their examples apart (sdpa | flex) and why;
    # None where rows are not packed (launcher/backends/packed_attention.py).
    packed_attention: str | None = None
    packed_why: str = ""

    def summary(self) -> str:
        """One short line for plan's first screen (the full lines come with --detail)."""
        parts = ["compiled per block" if self.compile else "eager"]
        if self.fp8_recipe is not None:
            total = len(self.fp8_layers) + len(self.bf16_layers)
            parts.append(f"fp8 {self.fp8_recipe} on {len(self.fp8_layers)}/{total} block GEMMs")
        parts.append(
            "chunked loss"
            if self.chunked_loss
            else "vocab-parallel loss"
            if self.vocab_parallel_loss
            else "full-logits loss"
        )
        if self.moe:
            parts.append("grouped-GEMM experts")
        if self.packed_attention:
            parts.append(f"packed rows: {self.packed_attention} document mask")
        return ", ".join(parts)

    def lines(self) -> list[str]:
        mode = "per transformer block" if self.compile else "off (eager)"
        out = [f"compile: {mode} ({self.compile_why})"]
        if self.fp8_recipe is not None:
            kept = ", ".join(self.bf16_layers) or "none"
            out.append(
                f"fp8: torchao {self.fp8_recipe} on {', '.join(self.fp8_layers) or 'no layer'}; "
                f"bf16: output layer, embeddings, block projections too small to gain ({kept})"
            )
        loss = (
            "chunked, no full fp32 logits"
            if self.chunked_loss
            else "vocabulary-parallel over tp (torch loss_parallel), no full logits"
            if self.vocab_parallel_loss
            else "full logits"
        )
        out.append(f"loss: {loss} ({self.loss_why})")
        if self.moe:
            out.append(f"experts: {self.moe}")
        if self.packed_attention:
            out.append(
                f"packed rows: {PACKED_KERNEL_TEXT[self.packed_attention]} ({self.packed_why})"
            )
        return out


def compile_in_force(cfg: LLMTrainConfig) -> tuple[bool, str]:
    """(compile on, why) for this configuration (module docstring)."""
    explicit = cfg.backend.compile
    name = cfg.backend.name
    if name == "deepspeed":
        return False, "backend=deepspeed runs eager"
    if name == "megatron":
        return True, "backend=megatron: hand-fused element-wise kernels"
    if explicit is not None:
        return bool(explicit), f"backend.compile={'true' if explicit else 'false'}"
    fp8 = precision_of(cfg) == "fp8"
    gpu = device_of(cfg) == "cuda"
    if fp8 and not cfg.precision.fp8_emulate and gpu:
        return True, "default with precision=fp8: eager float8 is slower than bf16"
    if not gpu:
        return False, "default on the CPU"
    if (cfg.model.num_experts or 0) > 1:
        return False, "default for MoE: token counts per expert change every step (recompiles)"
    if cfg.parallel.cp > 1:
        return False, "default with context parallel (not compiled)"
    if cfg.train.steps is not None and cfg.train.steps < COMPILE_MIN_STEPS:
        return False, (
            f"default for runs under {COMPILE_MIN_STEPS:,} steps: compile time would not pay "
            "back (~375 steps on one H100)"
        )
    return True, f"default for dense runs of {COMPILE_MIN_STEPS:,}+ steps on a GPU ({COMPILE_NOTE})"


def compiled_blocks(cfg: LLMTrainConfig) -> bool:
    """The blocks run under torch.compile (EngineChoices.compiled_blocks): llmtrain's torch
    engine with compile in force. The planner asks it of every stage it prices."""
    return compile_in_force(cfg)[0] and cfg.backend.name == "torch"


def chunked_loss_problem(cfg: LLMTrainConfig) -> str | None:
    """Why the chunked loss does not apply to this configuration (None: it does)."""
    if cfg.backend.name != "torch":
        return f"backend={cfg.backend.name} computes the loss on full logits"
    if cfg.parallel.tp > 1:
        return "the head is split over tp (its loss is vocabulary-parallel)"
    if cfg.parallel.pp > 1:
        return "the pipeline schedule computes the loss from the last stage's logits"
    if cfg.finetune.objective != "sft":
        return (
            f"finetune.objective={cfg.finetune.objective} needs each response token's "
            "log-probability (launcher/train/finetune/preference_loss.py)"
        )
    return None


def chunked_loss_elsewhere(cfg: LLMTrainConfig, layout: Layout) -> Refusal | None:
    """train.chunked_loss=true where it does not apply (a backend combo rule)."""
    problem = chunked_loss_problem(cfg)
    if cfg.train.chunked_loss is not True or problem is None:
        return None
    return Refusal(
        ("train.chunked_loss",),
        f"train.chunked_loss=true: {problem}; the chunked loss runs with backend=torch, "
        "parallel.tp=1 and parallel.pp=1; leave train.chunked_loss unset (null: wherever it "
        "applies) or false",
    )


def engine_choices(cfg: LLMTrainConfig) -> EngineChoices:
    compile_on, why = compile_in_force(cfg)
    m = cfg.model
    torch_engine = cfg.backend.name == "torch"
    recipe: str | None = None
    fp8_layers: list[str] = []
    bf16_layers: list[str] = []
    if torch_engine and precision_of(cfg) == "fp8":
        recipe = cfg.precision.fp8_recipe
        for layer, n, k in block_projections(m):
            if fp8_converts(n, k, recipe, cfg.precision.fp8_emulate):
                fp8_layers.append(layer)
            else:
                bf16_layers.append(layer)
    problem = chunked_loss_problem(cfg)
    chunked = problem is None and cfg.train.chunked_loss is not False
    if chunked:
        loss_why = "backend=torch, tp=1, pp=1"
    elif problem is None:
        loss_why = "train.chunked_loss=false"
    else:
        loss_why = problem
    packed = packed_attention(cfg)
    moe = None
    if torch_engine and (m.num_experts or 0) > 1:
        moe = "grouped GEMMs (torch._grouped_mm on CUDA bf16, else padded bmm)"
    return EngineChoices(
        compile=compile_on,
        compile_why=why,
        fp8_recipe=recipe,
        fp8_layers=tuple(fp8_layers),
        bf16_layers=tuple(bf16_layers),
        chunked_loss=chunked,
        loss_why=loss_why,
        moe=moe,
        compiled_blocks=compiled_blocks(cfg),
        vocab_parallel_loss=torch_engine and cfg.parallel.tp > 1,
        packed_attention=None if packed is None else packed[0],
        packed_why="" if packed is None else packed[1],
    )


def engine_json(cfg: LLMTrainConfig) -> dict[str, object]:
    """The choices as plan --json carries them (under "engine")."""
    c = engine_choices(cfg)
    return {
        "compile": c.compile,
        "compile_why": c.compile_why,
        "fp8_recipe": c.fp8_recipe,
        "fp8_layers": list(c.fp8_layers),
        "bf16_layers": list(c.bf16_layers),
        "chunked_loss": c.chunked_loss,
        "loss_why": c.loss_why,
        "moe": c.moe,
        "packed_attention": c.packed_attention,
    }
