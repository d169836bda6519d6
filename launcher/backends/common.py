"""The data type of a backend's capability table and the questions everyone asks it.

Each engine declares, in one file of this package (``torch.py``, ``deepspeed.py``, ``megatron.py``),
a ``BACKEND = Backend(...)``: the parallel degrees it runs above 1, the ZeRO stages, precisions,
optimizers, offloads, pipeline schedules and model features it runs, on which device kinds, whether
``llmtrain run``/``submit`` can launch it here, and the combinations it refuses beyond the table
(``combos``: functions returning a ``Refusal`` with the reason and what works instead).
``refusals(cfg)`` turns the table into reasons; validate, the search, preflight, the Megatron-LM
renderer and the engines all call it.

The same object answers what plan, render, launch and train ask of a backend (its behaviour
fields below: bytes per parameter, fp8 weight copies, the attention kernel, what it runs fused,
the run directory's extra files, the engine class, what each rank runs). Nothing outside this
package branches on a backend's name.

Adding a backend is one file here (its module name is its ``backend.name``): every module of this
package with a ``BACKEND`` is found by ``all_backends()``, and ``launcher.config.schema`` lists
the same module names as the choices of ``backend.name`` (without importing them).

No torch import, and nothing above ``launcher.config`` is imported (plan/, validate/ and search/
ask this package, never the other way round).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache

from launcher.config.layout import Layout, derive_layout
from launcher.config.schema import LLMTrainConfig, backend_names

DEGREES = ("tp", "pp", "cp", "ep")
DEGREE_WORDS = {
    "tp": "tensor parallel",
    "pp": "pipeline parallel",
    "cp": "context parallel",
    "ep": "expert parallel",
}
# Model features a backend may or may not run (docs/backends.md's table lists them in this order).
FEATURES = {
    "moe": "mixture-of-experts layers",
    "moe+tp": "mixture-of-experts layers with tp > 1",
    "mla": "multi-head latent attention",
    "mla+tp": "multi-head latent attention with tp > 1",
    "kv-replication": "tp > num_kv_heads (each key/value head replicated)",
    "tied-embeddings+pp": "tied input/output embeddings with pp > 1",
    "sequence-parallel": "sequence parallel (with tp > 1)",
    "mtp": "multi-token prediction modules (model.mtp_layers)",
}


@dataclass(frozen=True)
class Refusal:
    """Why a backend cannot run a configuration: the keys, the reason, and what works instead
    with this backend (``instead``: an override or a short phrase)."""

    keys: tuple[str, ...]
    message: str


Combo = Callable[[LLMTrainConfig, Layout], "Refusal | None"]


@dataclass(frozen=True)
class Backend:
    name: str
    summary: str
    # Can `llmtrain run` / `submit` train with it here? If not, why and what is needed.
    launchable: bool
    not_launchable: str
    needs: str  # what it needs to train beyond llmtrain ("" when nothing)
    devices: tuple[str, ...]  # "cpu", "cuda"
    degrees: frozenset[str]  # degrees it runs above 1 (tp, pp, cp, ep)
    degree_notes: dict[str, str]  # why a degree is not run (shown in the refusal)
    zero_stages: tuple[int, ...]
    zero_notes: dict[int, str]  # how each stage runs, or why it is refused
    precisions: tuple[str, ...]  # fp32 | bf16 | fp16 | fp8 (precision_of)
    optimizers: tuple[str, ...]
    offload_optimizer_stages: tuple[int, ...]  # stages with which zero.offload_optimizer=cpu runs
    offload_params_stages: tuple[int, ...]  # stages with which zero.offload_params=cpu runs
    schedules: tuple[str, ...]  # pipeline schedules (with pp > 1)
    features: frozenset[str]
    # Ranks of one pipeline stage the expert-parallel groups are carved from.
    expert_span: tuple[str, ...] = ("dp", "cp")
    combos: tuple[Combo, ...] = field(default=())
    # Why a precision is not run (shown in the refusal, before what works).
    precision_notes: dict[str, str] = field(default_factory=dict)

    # ---- behaviour: what plan, render, launch and train ask of the backend -----------------
    # "module:Class" of llmtrain's engine that the trainer builds (imported lazily, inside the
    # ranks: plan and render never import torch); "" when the ranks run `entry` instead.
    engine: str = ""
    # The script each rank runs instead of llmtrain's trainer, at the root of the user's checkout
    # of the backend (on PYTHONPATH); "" for llmtrain's trainer (`-m launcher.train.loop RUN_DIR`).
    entry: str = ""
    # Where `entry` records the step of its newest checkpoint (in RUN_DIR/checkpoints), for the
    # job script's "all steps done" check; "" for llmtrain's step folders.
    checkpoint_tracker: str = ""
    # Whether the ranks checkpoint and stop on SIGUSR1 themselves (llmtrain's trainer); if not,
    # the job script turns a preemption notice into SIGTERM for the ranks.
    answers_usr1: bool = True
    # Environment of the ranks when parallel.tp > 1.
    tp_env: dict[str, str] = field(default_factory=dict)
    # Files of the run directory besides config.yaml, plan.json and the scripts
    # (launcher.render.run_files renders each by name).
    artifacts: tuple[str, ...] = ()
    # The package precision=fp8 needs where the ranks run ("" when none is checked).
    fp8_package: str = ""
    # Bytes per parameter of the fp8 weight copies kept across a step's micro-batches.
    fp8_weight_copy_bytes: float = 0.0
    # From this ZeRO stage on, the sharded parameters are kept in fp32 and are the master copy
    # (torch FSDP2 with a MixedPrecisionPolicy); None: a separate master copy.
    fp32_sharded_params_from_stage: int | None = None
    # From this ZeRO stage on, gradients accumulate unsharded over a step's micro-batches under
    # pipelining and are reduce-scattered once (torch FSDP2); None: never.
    pipelined_unsharded_grads_from_stage: int | None = None
    # The attention kernel when backend.attention_kernel is not set (te | sdpa).
    attention_kernel: str = "sdpa"
    # Element-wise work runs fused (hand-written kernels), as if compiled, without backend.compile.
    fused_elementwise: bool = False
    # The interleaved pipeline schedule overlaps its point-to-point traffic with compute.
    overlaps_interleaved_p2p: bool = False
    # zero.stage=3 is Megatron-FSDP, with its own gather-ahead and gradient queue
    # (launcher/plan/memory/megatron_fsdp.py) instead of the generic ZeRO-3 buffers.
    megatron_fsdp: bool = False
    # ZeRO stages at which the optimizer steps one flat fp32 partition per parameter group
    # (DeepSpeed ZeRO-1/2) instead of each parameter tensor.
    flat_optimizer_stages: tuple[int, ...] = ()
    # The loss on full logits is PyTorch's eager F.cross_entropy(logits.float()) (llmtrain's
    # engines; plan.memory.logits_bytes counts its fp32 backward), not Megatron's vocab-parallel
    # cross-entropy with its gradient written in place.
    eager_loss: bool = True
    # Context parallel's ring at its peak, beyond the saved activations (plan.memory.cp_ring_bytes):
    # buffers of the rank's K/V size in the compute dtype and in fp32, and of its q size in fp32.
    # llmtrain's ring attention (launcher/train/parallel/ring_attention.py, backward, at an
    # exchange): the K/V it sends and the K/V it receives in their own dtype, the fp32 dK/dV it
    # sends and the ones it receives, and its fp32 dq accumulator.
    cp_ring_kv_buffers: float = 2.0
    cp_ring_kv_fp32_buffers: float = 2.0
    cp_ring_q_fp32_buffers: float = 1.0
    # The MoE token dispatchers the ranks can run (backend.moe_dispatcher's choices), the
    # first being the default (backend.moe_dispatcher=null). Priced by plan.timing (the expert
    # all-to-all / all-gather) and plan.memory.dispatcher_bytes.
    moe_dispatchers: tuple[str, ...] = ("alltoall",)
    # Why a dispatcher is not run (shown in the refusal, before what works).
    moe_dispatcher_note: str = ""
    # What train.recompute=selective recomputes on (dense, MoE) layers (launcher/plan/recompute.py
    # modes): "op" = op-level selective checkpointing of the whole block (llmtrain's dense blocks:
    # every other linear product and the attention kernel's output kept, torchtitan's "op"
    # policy); "core" = the attention core only (llmtrain's MoE blocks, whose dispatch stays out of
    # any replay; Megatron-Core's default --recompute-modules core_attn).
    selective_recompute: tuple[str, str] = ("op", "core")
    # With parallel.tp > 1 the embedding and the output layer are split over the tp ranks (and
    # the loss runs on vocabulary-split logits); False: every tp rank holds them whole and computes
    # the full logits and loss.
    tp_splits_vocab: bool = True
    # finetune methods besides full its engine runs (launcher/validate/finetune_rules.py), and
    # whether adapters run with its tensor and pipeline parallel (torch: yes; DeepSpeed: ZeRO only).
    adapter_methods: tuple[str, ...] = ()
    adapters_with_model_parallel: bool = False
    # With one replica (dp x cp = 1) no gradient-reduce bucket is allocated (torch: no DDP).
    bucket_needs_replicas: bool = False

    def vocab_split(self, tp: int) -> int:
        """The tp ranks the embedding, the output layer and the logits are split over."""
        return max(1, tp) if self.tp_splits_vocab else 1

    def runs_feature(self, feature: str) -> bool:
        return feature in self.features

    def env(self, cfg: LLMTrainConfig) -> dict[str, str]:
        """Environment the ranks need for this configuration (besides llmtrain's own)."""
        return dict(self.tp_env) if cfg.parallel.tp > 1 else {}

    def fp8_copy_bytes(self, cfg: LLMTrainConfig) -> float:
        return self.fp8_weight_copy_bytes if cfg.precision.fp8 else 0.0

    def fp32_sharded_params(self, cfg: LLMTrainConfig) -> bool:
        first = self.fp32_sharded_params_from_stage
        return first is not None and cfg.zero.stage >= first

    def pipelined_unsharded_grads(self, cfg: LLMTrainConfig, pp: int) -> bool:
        first = self.pipelined_unsharded_grads_from_stage
        return first is not None and cfg.zero.stage >= first and pp > 1


# backend.moe_dispatcher's values (the choices on its schema field):
# - allgather: every rank gathers the hidden states of its tp x ep group's tokens and keeps those
#   routed to its experts; the outputs go back by reduce-scatter (Megatron-core's
#   MoEAllGatherTokenDispatcher, --moe-token-dispatcher-type allgather).
# - alltoall: every routed copy of a token is sent to its expert's rank, one all-to-all each way
#   (torch all_to_all_single in llmtrain's launcher/train/parallel/expert_parallel.py;
# Megatron-core's MoEAlltoAllTokenDispatcher).
# - flex: node-deduplicated dispatch, each token crossing the network once per remote node it is
#   routed to and forwarded over NVLink there (DeepEP; Megatron-core's MoEFlexTokenDispatcher).
# plan.comm.expert_alltoall_bus_gbps prices alltoall and flex, plan.timing the allgather's
# collectives, plan.memory.dispatcher_bytes their buffers.


def recompute_mode(cfg: LLMTrainConfig, moe: bool, chosen: str | None = None) -> str:
    """train.recompute (or `chosen`) as this backend runs it on a dense or an MoE layer: none |
    full | op | core (launcher/plan/recompute.py says what each runs again)."""
    chosen = cfg.train.recompute if chosen is None else chosen
    if chosen != "selective":
        return chosen
    dense, expert = backend_of(cfg).selective_recompute
    modules = cfg.backend.recompute_modules
    if modules is not None and backend_of(cfg).name == "megatron":
        # Megatron-Core's per-module recompute (backends/activation_modules.py), priced with the
        # nearest mode that does not understate it: the MLP block run again (mlp on a dense
        # layer, moe or shared_experts on an MoE layer) as a whole layer's forward ("full", an
        # upper bound: the attention is not rerun); the attention core alone as "core"; the
        # small ones (layernorm, moe_act, mla_up_proj: a norm, an activation, two low-rank
        # projections) are not priced.
        block = {"moe", "shared_experts"} if moe else {"mlp"}
        if block & set(modules):
            return "full"
        return "core" if "core_attn" in modules else "none"
    return expert if moe else dense


def moe_dispatcher(cfg: LLMTrainConfig) -> str:
    """The MoE token dispatcher the ranks run: backend.moe_dispatcher, or the backend's default
    (the first of its Backend.moe_dispatchers) when null. The one place the default is resolved."""
    chosen = cfg.backend.moe_dispatcher
    return chosen if chosen is not None else backend_of(cfg).moe_dispatchers[0]


def precision_of(cfg: LLMTrainConfig) -> str:
    prec = cfg.precision
    return "fp8" if prec.fp8 or prec.name == "fp8" else prec.compute_dtype


def device_of(cfg: LLMTrainConfig) -> str:
    return "cpu" if cfg.cluster.gpu == "cpu" else "cuda"


def features_of(cfg: LLMTrainConfig) -> list[str]:
    """The features of FEATURES this configuration uses."""
    m, p = cfg.model, cfg.parallel
    kv = m.num_kv_heads or m.num_attention_heads
    moe, mla = (m.num_experts or 0) > 1, m.kv_lora_rank is not None
    used = []
    if moe:
        used.append("moe")
        if p.tp > 1:
            used.append("moe+tp")
    if mla:
        used.append("mla")
        if p.tp > 1:
            used.append("mla+tp")
    if not mla and p.tp > kv:
        used.append("kv-replication")
    if m.tie_embeddings and p.pp > 1:
        used.append("tied-embeddings+pp")
    if p.sequence_parallel and p.tp > 1:
        used.append("sequence-parallel")
    if m.mtp_layers > 0:
        used.append("mtp")
    return used


@cache
def all_backends() -> dict[str, Backend]:
    """Every backend declared in this package, by name (the name of its module)."""
    found: dict[str, Backend] = {}
    for name in backend_names():
        module = importlib.import_module(f"launcher.backends.{name}")
        backend = getattr(module, "BACKEND", None)
        assert isinstance(backend, Backend) and backend.name == name, (
            f"launcher/backends/{name}.py must declare BACKEND = Backend(name={name!r}, ...)"
        )
        found[name] = backend
    return found


def get_backend(name: str) -> Backend:
    return all_backends()[name]


def backend_of(cfg: LLMTrainConfig) -> Backend:
    """The configured backend (composition has checked that the name is one of backend_names)."""
    return all_backends()[cfg.backend.name]


def _words(values: Sequence[object]) -> str:
    return " or ".join(str(v) for v in values)


def _table_refusals(b: Backend, cfg: LLMTrainConfig, *, device: bool) -> Iterator[Refusal]:
    """Every reason `b`'s table gives against `cfg`, in the order of the table's fields, then
    its combinations; one at a time, so that `refuses` stops at the first."""
    yield from _device_refusals(b, cfg) if device else ()
    yield from _degree_refusals(b, cfg)
    yield from _zero_refusals(b, cfg)
    yield from _precision_and_optimizer_refusals(b, cfg)
    yield from _schedule_and_dispatcher_refusals(b, cfg)
    yield from _feature_refusals(b, cfg)
    layout = derive_layout(cfg)
    for combo in b.combos:
        found = combo(cfg, layout)
        if found is not None:
            yield found


def _device_refusals(b: Backend, cfg: LLMTrainConfig) -> list[Refusal]:
    """cluster.gpu's device kind, when the backend does not run on it."""
    if device_of(cfg) in b.devices:
        return []
    return [
        Refusal(
            ("cluster.gpu",),
            f"backend={b.name} needs {' or '.join(d.upper() for d in b.devices)} devices, but "
            f"cluster={cfg.cluster.name} has {device_of(cfg).upper()}",
        )
    ]


def _degree_refusals(b: Backend, cfg: LLMTrainConfig) -> list[Refusal]:
    """Each parallel degree above 1 that the backend does not run."""
    out = []
    for key in DEGREES:
        value = getattr(cfg.parallel, key)
        if value > 1 and key not in b.degrees:
            note = b.degree_notes.get(key, f"backend={b.name} has no {DEGREE_WORDS[key]}")
            out.append(
                Refusal(
                    (f"parallel.{key}",), f"parallel.{key}={value}: {note}; use parallel.{key}=1"
                )
            )
    return out


def _zero_refusals(b: Backend, cfg: LLMTrainConfig) -> list[Refusal]:
    """The ZeRO stage, and parameter or optimizer offload with a stage that does not offload."""
    z = cfg.zero
    tag = f"backend={b.name}"
    out: list[Refusal] = []
    if z.stage not in b.zero_stages and 0 <= z.stage <= 3:
        note = b.zero_notes.get(z.stage, f"{tag} has no ZeRO stage {z.stage}")
        out.append(
            Refusal(
                ("zero.stage",),
                f"zero.stage={z.stage}: {note}; use zero.stage={_words(list(b.zero_stages))}",
            )
        )
    if z.offload_params == "cpu" and z.stage not in b.offload_params_stages:
        use = (
            f"zero.stage={_words(list(b.offload_params_stages))}"
            if b.offload_params_stages
            else "zero.offload_params=none"
        )
        out.append(
            Refusal(
                ("zero.offload_params", "zero.stage"),
                f"zero.offload_params=cpu with zero.stage={z.stage}: {tag} offloads parameters "
                + (
                    f"with zero.stage={_words(list(b.offload_params_stages))} only"
                    if b.offload_params_stages
                    else "never"
                )
                + f"; use {use}",
            )
        )
    if z.offload_optimizer == "cpu" and z.stage not in b.offload_optimizer_stages:
        use = (
            f"zero.stage={_words(list(b.offload_optimizer_stages))}"
            if b.offload_optimizer_stages
            else "zero.offload_optimizer=none"
        )
        out.append(
            Refusal(
                ("zero.offload_optimizer", "zero.stage"),
                f"zero.offload_optimizer=cpu with zero.stage={z.stage}: {tag} offloads optimizer "
                "states "
                + (
                    f"with zero.stage={_words(list(b.offload_optimizer_stages))} only"
                    if b.offload_optimizer_stages
                    else "never"
                )
                + f"; use {use}",
            )
        )
    return out


def _precision_and_optimizer_refusals(b: Backend, cfg: LLMTrainConfig) -> list[Refusal]:
    """The precision and the optimizer, when the backend has neither."""
    tag = f"backend={b.name}"
    out: list[Refusal] = []
    prec = precision_of(cfg)
    if prec not in b.precisions:
        out.append(
            Refusal(
                ("precision",),
                f"precision={prec}: "
                + b.precision_notes.get(prec, f"{tag} does not train in {prec}")
                + "; use precision="
                + _words([x for x in b.precisions if x != "fp32"] + ["fp32"]),
            )
        )
    if cfg.optim.name not in b.optimizers:
        out.append(
            Refusal(
                ("optim.name",),
                f"optim.name={cfg.optim.name}: {tag} has {', '.join(b.optimizers)}; "
                f"use optim.name={b.optimizers[0]}",
            )
        )
    return out


def _schedule_and_dispatcher_refusals(b: Backend, cfg: LLMTrainConfig) -> list[Refusal]:
    """The pipeline schedule (with pp > 1) and backend.moe_dispatcher, when not the backend's."""
    p = cfg.parallel
    tag = f"backend={b.name}"
    out: list[Refusal] = []
    if p.pp > 1 and "pp" in b.degrees and p.pp_schedule not in b.schedules:
        out.append(
            Refusal(
                ("parallel.pp_schedule",),
                f"parallel.pp_schedule={p.pp_schedule}: {tag} runs the "
                f"{', '.join(b.schedules)} schedules; use parallel.pp_schedule={b.schedules[0]}",
            )
        )
    chosen = cfg.backend.moe_dispatcher
    if chosen is not None and chosen not in b.moe_dispatchers:
        note = b.moe_dispatcher_note or f"{tag} has no {chosen} dispatcher"
        out.append(
            Refusal(
                ("backend.moe_dispatcher",),
                f"backend.moe_dispatcher={chosen}: {note}; use backend.moe_dispatcher="
                f"{_words(list(b.moe_dispatchers))} (or null: {tag}'s default, "
                f"{b.moe_dispatchers[0]})",
            )
        )
    return out


def _feature_refusals(b: Backend, cfg: LLMTrainConfig) -> list[Refusal]:
    """Each model feature of `cfg` (features_of) the backend does not run."""
    return [
        Refusal(
            _FEATURE_KEYS[feature],
            f"backend={b.name} does not run {FEATURES[feature]}; {_FEATURE_FIX[feature]}",
        )
        for feature in features_of(cfg)
        if feature not in b.features
    ]


_FEATURE_KEYS = {
    "moe": ("model.num_experts",),
    "moe+tp": ("model.num_experts", "parallel.tp"),
    "mla": ("model.kv_lora_rank",),
    "mla+tp": ("model.kv_lora_rank", "parallel.tp"),
    "kv-replication": ("parallel.tp", "model.num_kv_heads"),
    "tied-embeddings+pp": ("model.tie_embeddings", "parallel.pp"),
    "sequence-parallel": ("parallel.sequence_parallel",),
    "mtp": ("model.mtp_layers",),
}
_FEATURE_FIX = {
    "moe": "use a dense model (model.num_experts=null)",
    "moe+tp": "use parallel.tp=1 (shard the experts with zero.stage=2 or 3)",
    "mla": "use standard attention (model.kv_lora_rank=null)",
    "mla+tp": "use parallel.tp=1",
    "kv-replication": "use a parallel.tp that divides model.num_kv_heads",
    "tied-embeddings+pp": "set model.tie_embeddings=false, or parallel.pp=1",
    "sequence-parallel": "set parallel.sequence_parallel=false",
    "mtp": "use model.mtp_layers=0, or backend=megatron",
}


def raw_refusals(name: str, cfg: LLMTrainConfig, *, device: bool = True) -> list[Refusal]:
    """Why backend `name` cannot run `cfg` (whatever cfg.backend says), with what works; [] if it
    can. `device=False` leaves out the device kind (for rendering arguments for another machine)."""
    return list(_table_refusals(get_backend(name), cfg, device=device))


def refuses(name: str, cfg: LLMTrainConfig) -> bool:
    """Whether `raw_refusals(name, cfg)` has any, found at the first (the search asks it of
    every layout)."""
    return next(_table_refusals(get_backend(name), cfg, device=True), None) is not None


def runnable_by(cfg: LLMTrainConfig, *, exclude: str = "") -> list[str]:
    """The backends that run `cfg` as it is (their whole table agrees), by name."""
    return [n for n in all_backends() if n != exclude and not refuses(n, cfg)]


def refusals(cfg: LLMTrainConfig, *, device: bool = True) -> list[Refusal]:
    """Why the configured backend cannot run `cfg`. Each message ends with what works for this
    backend, and names another backend only when that one runs the whole configuration."""
    name = cfg.backend.name
    if name not in all_backends():
        return [
            Refusal(
                ("backend",), f"backend={name}: unknown; use backend={_words(list(all_backends()))}"
            )
        ]
    found = raw_refusals(name, cfg, device=device)
    if not found:
        return []
    others = runnable_by(cfg, exclude=name)
    if not others:
        return found
    tail = (
        ", or " + " or ".join(f"backend={o}" for o in others) + " (runs this configuration as is)"
    )
    return [Refusal(r.keys, r.message + tail) for r in found]


def planning_preset_needs(cfg: LLMTrainConfig) -> str | None:
    """What a configuration whose backend is plan/render-only needs to train (None: launchable)."""
    b = all_backends().get(cfg.backend.name)
    return None if b is None or b.launchable else b.needs


def launch_refusal(cfg: LLMTrainConfig) -> str | None:
    """Why `llmtrain run`/`submit` cannot train with the configured backend here (None: it can)."""
    b = all_backends().get(cfg.backend.name)
    if b is None or b.launchable:
        return None
    runnable = [n for n in runnable_by(cfg) if all_backends()[n].launchable]
    instead = " or ".join(f"backend={n}" for n in runnable)
    return f"backend={b.name}: {b.not_launchable}" + (
        f"; {instead} runs this configuration here" if instead else ""
    )


def expert_span_names(cfg: LLMTrainConfig) -> tuple[str, ...]:
    """The degrees whose ranks hold the expert-parallel groups for this backend."""
    b = all_backends().get(cfg.backend.name)
    return b.expert_span if b else ("dp", "cp")


def expert_span(cfg: LLMTrainConfig, layout: Layout) -> tuple[tuple[str, ...], int]:
    """The degrees whose ranks hold the expert-parallel groups for this backend, and their product
    (Megatron-core's MoE parallel folding draws them from tp x cp x dp; the others from dp x cp)."""
    names = expert_span_names(cfg)
    size = 1
    for n in names:
        size *= getattr(layout, n)
    return names, size


def expert_group_stride(cfg: LLMTrainConfig, layout: Layout) -> int:
    """Global-rank distance between neighbours of an expert-parallel group (what decides how
    many nodes it spans, plan.comm.place_group).

    Megatron-core builds the expert groups with their own rank generator, expert-tensor parallel
    innermost, then expert parallel, context parallel folded away (megatron/core/
    parallel_state.py, initialize_model_parallel's expert RankGenerator): neighbours are the
    expert tensor parallel size apart. llmtrain's engines carve ep out of the data-parallel
    ranks (torch_engine's ep mesh pp x edp x ep x cp x tp): tp x cp apart."""
    if "tp" in backend_of(cfg).expert_span:
        return expert_tensor_parallel(cfg, layout)
    return max(1, layout.tp) * max(1, layout.cp)


def expert_tensor_parallel(cfg: LLMTrainConfig, layout: Layout) -> int:
    """How many ranks split each expert's weights (Megatron-core's expert tensor parallel size).

    Megatron-core's MoE parallel folding (its MoE docs; --expert-tensor-parallel-size, default tp)
    re-folds a stage's tp x cp x dp ranks into expert-tensor x expert x expert-data parallel
    groups. llmtrain renders --expert-tensor-parallel-size 1 when ep does not divide dp x cp (the
    expert groups then span tensor-parallel ranks; launcher/render/megatron_args.py): each expert
    whole on its rank. Everywhere else the experts split over tp like the dense weights.
    parallel.etp, when set, is the size (validate's expert-parallel rule checks it)."""
    if cfg.parallel.etp is not None:
        return max(1, cfg.parallel.etp)
    if cfg.backend.name == "megatron" and layout.ep > 1 and (layout.dp * layout.cp) % layout.ep:
        return 1
    return max(1, layout.tp)


def expert_data_parallel(cfg: LLMTrainConfig, layout: Layout) -> float:
    """Ranks that hold the same expert shard (what ZeRO / the distributed optimizer shards expert
    states over): tp x cp x dp / (ep x expert tensor parallel); dp x cp / ep when the experts
    split over tp."""
    ranks = max(1, layout.tp) * max(1, layout.cp) * max(1, layout.dp)
    return max(1.0, ranks / (max(1, layout.ep) * expert_tensor_parallel(cfg, layout)))
