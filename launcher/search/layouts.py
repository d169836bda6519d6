"""Search the layouts the configured backend runs and the validation rules allow for the fastest
one that fits: `plan --search` (``search``), or over every backend (``search_backends``,
`--any-backend`). Every proposed override line names its backend (``backend=NAME``).

The space (``search_space``): tp, cp and pp among the divisors of the world size (tp up to
``max_tp``, by default the GPUs of one node; cp up to ``max_cp``, by default seq_length / 1024:
at least 1024 tokens per rank; pp up to the layer count), dp implied, ep among the
divisors of the expert count (MoE models), the micro-batch size among the divisors of the global
batch (which stays as configured), the pipeline schedule (gpipe, 1f1b, interleaved with vpp 2 to
``max_vpp``), recomputation, sequence parallelism (with tp > 1), ZeRO stage and optimizer offload.
A key the user fixed on the command line keeps its configured value. The backend's table
(launcher/backends/) restricts the values of keys not fixed: only the degrees, ZeRO stages,
offloads, schedules and sequence parallelism it runs are in the space.

How it stays fast while using the planner's own formulas (nothing is re-derived here):
1. Divisibility pruning, level by level (tp, cp, pp, ep, micro-batch, schedule, recompute, then
   zero/offload/sequence parallel): the error conditions of ``launcher.validate.rules`` written
   for the values that vary (``LayoutSpace.violated_rule``); a pruned value counts every layout
   under it against that rule. Then the backend's own refusals (``backends.raw_refusals``, the
   function validate's backend-capabilities rule calls), memoised on the values they depend on.
   Tests compare this with ``check()`` on every layout of small spaces, and every layout returned
   is checked with ``check()`` again.
2. Best-first with bounds: a step is never shorter than (compute + exposed TP/CP/EP/PP
   communication of one micro-batch) x micro-batches x (1 + bubble overhead)
   (``timing.microbatch_compute_s``, ``timing.microbatch_time``, ``schedule.bubble_overhead``).
   Groups of layouts (same everything but ZeRO stage and offload) are visited in decreasing order
   of that bound on tokens/s, first with compute alone, then with the communication added; the
   search stops when the bound falls below the k-th best found (``outranked``: they cannot enter
   the top k). Both terms are proportional to the tokens of a micro-batch, so they are computed
   once at one sequence per micro-batch and scaled; every timed layout asserts that its tokens/s
   respects its bound, and every returned layout is re-planned with ``check()`` + ``make_plan()``.
3. Memory before time: the model states (``memory.stage_states``) shared by many layouts are
   computed once and reject, on their own, every layout they overflow; otherwise stages are
   assembled from memoized parts (``stage_states``, ``stage_activations``, ``stage_buffers``,
   ``assemble_stage``: the pieces ``stage_memory`` is made of), the first and last stage first,
   stopping at the first that overflows. Only layouts that fit are timed (``estimate_time``).
4. The smallest cluster, when nothing fits: node counts upward from one more than configured, each
   asked only whether any layout fits (``first_fit``): the model states of the first, last and
   largest stages reject most layouts before the other stages are computed, and the backend's
   refusals are asked only of the layouts that fit.
Step times are priced as `plan` prices them (``planner.priced_hardware``): from a profile of
``llmtrain calibrate`` when one is chosen, and then the bound takes every measured operator class
at its fastest measured rate (``profile.Rates.optimistic``), so it still bounds.
Pass ``exhaustive=True`` to switch the bound off (every valid layout's memory is evaluated).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import shlex
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from launcher.backends import all_backends, raw_refusals
from launcher.backends.common import Backend, expert_tensor_parallel
from launcher.config.layout import Layout, auto_split, derive_layout, split_keys
from launcher.config.layout_rules import (
    chunks_have_layers,
    cp_splits_sequence,
    ep_divides_experts,
    ep_fits_span,
    microbatches,
    pipeline_fills,
    sp_splits_sequence,
    split_counts_fit,
    tp_divides_heads,
    tp_fits_kv_heads,
    tp_splits,
    virtual_stages_scheduled,
)
from launcher.config.overrides import override_key
from launcher.config.pipeline_split import (
    EMBEDDING,
    FIRST,
    LAST,
    LAYOUT,
    LOSS,
    SPLIT_KEYS,
    SplitError,
    SplitKeys,
    accepted_splits,
    bubble_scale,
    even_split_ok,
    megatron_split,
)
from launcher.config.schema import LLMTrainConfig
from launcher.errors import UserError
from launcher.plan.flops import FlopsPerToken, config_flops
from launcher.plan.grad_liveness import reserved_reuses_activations
from launcher.plan.memory import (
    HardwareView,
    MemoryPlan,
    StageMemory,
    StageParams,
    StageStates,
    assemble_stage,
    stage_activations,
    stage_buffers,
    stage_not_coexisting,
    stage_params,
    stage_states,
)
from launcher.plan.model_shape import ModelShape
from launcher.plan.planner import (
    Plan,
    hardware_view,
    make_plan,
    priced_hardware,
    pricing_line,
)
from launcher.plan.schedule import bubble_overhead
from launcher.plan.timing import TimePlan, estimate_time, microbatch_compute_s, microbatch_time
from launcher.validate.finetune_rules import engine_refusals
from launcher.validate.rules import check, divisors

_T = TypeVar("_T")
SCHEDULES = ("gpipe", "1f1b", "interleaved")
# Default cap on cp: at least this many tokens per context-parallel rank. Below it the attention
# blocks are too small to hide the K/V ring behind, and the planner's bandwidth-only collective
# model (no per-message latency, comm.py) no longer holds; pass max_cp to search further.
MIN_TOKENS_PER_CP_RANK = 1024
RECOMPUTE = ("none", "selective", "full")
MEMORY = "memory"
OUTRANKED = "outranked"

# The keys the search varies (and a few it resets); a fixed one keeps the configured value.
SEARCH_KEYS = frozenset(
    {
        "parallel.tp",
        "parallel.pp",
        "parallel.vpp",
        "parallel.cp",
        "parallel.ep",
        "parallel.dp",
        "parallel.sequence_parallel",
        "parallel.pp_schedule",
        "parallel.pp_layers",
        *SPLIT_KEYS,
        "zero.stage",
        "zero.offload_optimizer",
        "zero.offload_params",
        "train.micro_batch_size",
        "train.recompute",
        "train.grad_accum",
    }
)
# A group override (`zero=stage3`) fixes every search key of its section.
_GROUP_KEYS = {"zero": ("zero.stage", "zero.offload_optimizer", "zero.offload_params")}


def fixed_keys(overrides: Iterable[str]) -> set[str]:
    """The dotted keys set by command-line overrides (`+`, `++` and `~` forms included)."""
    keys: set[str] = set()
    for line in overrides:
        key = override_key(line).split("@", 1)[0].strip()
        keys.update(_GROUP_KEYS.get(key, (key,)))
    return keys


@dataclass(frozen=True, order=True)
class Choice:
    """One layout: the values of the searched keys (dp is implied by the world size)."""

    tp: int
    cp: int
    pp: int
    ep: int
    micro_batch_size: int
    pp_schedule: str
    vpp: int
    recompute: str
    zero_stage: int
    offload_optimizer: str
    sequence_parallel: bool


@dataclass(frozen=True)
class Candidate:
    """A layout that fits, with the planner's predictions for it."""

    choice: Choice
    overrides: tuple[str, ...]
    dp: int
    grad_accum: int
    memory_bytes: float  # heaviest GPU, reserved + overhead (the planner's device total)
    capacity_bytes: float
    step_s: float
    tokens_per_s: float
    mfu: float
    bubble_fraction: float
    compute_s: float
    bubble_s: float
    exposed_comm_s: float
    optimizer_s: float

    @property
    def line(self) -> str:
        """The overrides as one shell line (a layout string is quoted)."""
        return " ".join(shlex.quote(word) for word in self.overrides)

    @property
    def backend(self) -> str:
        """The backend this layout is for (the first override names it)."""
        return self.overrides[0].split("=", 1)[1] if self.overrides else ""

    @property
    def headroom(self) -> float:
        """Fraction of the GPU's memory left free on the heaviest rank."""
        return 1.0 - self.memory_bytes / self.capacity_bytes

    def rank_key(self) -> tuple[float, float, str]:
        """Faster first; ties: more headroom, then the override line (deterministic)."""
        return (-self.tokens_per_s, self.memory_bytes, self.line)


@dataclass(frozen=True)
class SearchResult:
    model: str
    gpu: str
    num_nodes: int
    gpus_per_node: int
    global_batch_size: int
    min_headroom: float
    top: int
    candidates: tuple[Candidate, ...]
    space_size: int  # layouts in the grid
    evaluated: int  # layouts whose memory was evaluated
    fitting: int  # of those, the ones that fit
    timed: int  # of those, the ones whose step time was predicted
    rejected: dict[str, int]  # rule name | "memory" | "outranked" -> layouts
    smallest_cluster: int | None  # num_nodes, when nothing fits
    elapsed_s: float
    given: Candidate | None = None  # the configuration as given, when valid and fitting
    given_status: str = ""
    given_rank: int | None = None  # 1-based, when asked for (rank_given=True)
    notes: tuple[str, ...] = field(default_factory=tuple)
    backends: tuple[str, ...] = ()  # the backends searched
    pricing: str = ""  # where the step times come from (planner.pricing_line)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node


def _with(obj: _T, **changes: object) -> _T:
    """A copy of a config dataclass with some fields changed: dataclasses.replace without the
    __init__ round trip (the config sections have no __post_init__), which the search does for
    every layout it asks the backend about."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__, **changes)
    return new


# --- the space ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayoutSpace:
    """The grid of layouts for one configuration and cluster, and the rules' arithmetic on it."""

    base: LLMTrainConfig
    fixed: frozenset[str]
    world: int
    global_batch_size: int
    tp: tuple[int, ...]
    cp: tuple[int, ...]
    pp: tuple[int, ...]
    ep: tuple[int, ...]
    micro_batch_size: tuple[int, ...]
    recompute: tuple[str, ...]
    zero: tuple[int, ...]
    offload: tuple[str, ...]
    max_vpp: int
    backend: Backend | None = None
    # Memo of the backend's refusals (see backend_rule); not part of the space's identity.
    _backend_memo: dict[tuple[object, ...], bool] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )
    # Memo of the split keys chosen per (pp, vpp) (see split_for).
    _split_memo: dict[tuple[int, int], SplitKeys] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )
    _scale_memo: dict[tuple[int, int], float] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    # Dependent value lists.
    def schedules(self, pp: int) -> tuple[tuple[str, int], ...]:
        p = self.base.parallel
        if "parallel.pp_schedule" in self.fixed:
            names: tuple[str, ...] = (p.pp_schedule,)
        elif pp > 1:
            b = self.backend
            names = tuple(s for s in SCHEDULES if b is None or s in b.schedules)
        else:
            names = ("1f1b",)
        out: list[tuple[str, int]] = []
        for name in names:
            if "parallel.vpp" in self.fixed:
                vpps: Iterable[int] = (p.vpp,)
            elif name == "interleaved":
                vpps = range(2, self.max_vpp + 1)
            else:
                vpps = (1,)
            out += [(name, v) for v in vpps]
        return tuple(out)

    def sequence_parallel(self, tp: int) -> tuple[bool, ...]:
        if "parallel.sequence_parallel" in self.fixed:
            return (self.base.parallel.sequence_parallel,)
        runs = self.backend is None or self.backend.runs_feature("sequence-parallel")
        return (False, True) if tp > 1 and runs else (False,)

    def size(self) -> int:
        sched = sum(len(self.schedules(pp)) for pp in self.pp)
        sp = sum(len(self.sequence_parallel(tp)) for tp in self.tp)
        rest = len(self.ep) * len(self.micro_batch_size) * len(self.recompute)
        return sp * len(self.cp) * sched * rest * len(self.zero) * len(self.offload)

    def choices(self) -> Iterator[Choice]:
        """Every layout of the grid (brute force; the search itself never lists them all)."""
        for tp in self.tp:
            for cp in self.cp:
                for pp in self.pp:
                    for ep in self.ep:
                        for mbs in self.micro_batch_size:
                            for sched, vpp in self.schedules(pp):
                                for r in self.recompute:
                                    for z in self.zero:
                                        for off in self.offload:
                                            for sp in self.sequence_parallel(tp):
                                                yield Choice(
                                                    tp, cp, pp, ep, mbs, sched, vpp, r, z, off, sp
                                                )

    # The rules' error conditions for the values that vary, level by level (None: allowed).
    # (launcher.config.layout_rules: the predicates validate's rules call too)
    def tp_rule(self, tp: int) -> str | None:
        m = self.base.model
        shape = ModelShape(m)
        if not tp_divides_heads(m.num_attention_heads, tp) or (
            not shape.is_mla and not tp_fits_kv_heads(shape.kv_heads, tp)
        ):
            return "attention-heads"
        if not tp_splits(m.ffn_hidden_size, tp) or (
            m.moe_ffn_hidden_size and not tp_splits(m.moe_ffn_hidden_size, tp)
        ):
            return "tensor-parallel-shapes"
        return None

    def cp_rule(self, cp: int) -> str | None:
        if not cp_splits_sequence(self.base.model.seq_length, cp):
            return "context-parallel"
        return None

    def dp_of(self, tp: int, cp: int, pp: int) -> int | None:
        """The data-parallel degree, or None when the world size does not work out."""
        mp = tp * cp * pp
        if "parallel.dp" in self.fixed and self.base.parallel.dp is not None:
            return self.base.parallel.dp if self.base.parallel.dp * mp == self.world else None
        return self.world // mp if self.world % mp == 0 else None

    def ep_rule(self, ep: int, dp: int, cp: int, tp: int) -> str | None:
        experts = self.base.model.num_experts or 0
        if experts <= 1:
            return "expert-parallel" if ep > 1 else None
        # The ranks expert groups are carved from: backends.expert_span (dp x cp, or tp x cp x dp
        # with Megatron-core's MoE parallel folding).
        span = dp * cp
        if self.backend is not None and "tp" in self.backend.expert_span:
            span *= tp
        if not ep_divides_experts(experts, ep) or not ep_fits_span(span, ep):
            return "expert-parallel"
        return None

    def microbatches(self, mbs: int, dp: int, pp: int) -> int | None:
        """Micro-batches per step, or None when the batch arithmetic fails."""
        accum = self.base.train.grad_accum if "train.grad_accum" in self.fixed else None
        m = microbatches(self.global_batch_size, mbs, dp, accum)
        return m if m is not None and pipeline_fills(m, pp) else None

    def schedule_rule(self, pp: int, sched: str, vpp: int) -> str | None:
        p = self.base.parallel
        layers = self.base.model.num_layers
        if not virtual_stages_scheduled(pp, sched, vpp):
            return "pipeline-split"
        if self._fixed_split_keys():
            try:
                megatron_split(layers, pp, vpp, split_keys(self.base), explain=False)
            except SplitError:
                return "pipeline-split"
        elif self._explicit_split():
            if not split_counts_fit(list(p.pp_layers or []), pp * vpp, layers):
                return "pipeline-split"
        elif not chunks_have_layers(layers, pp * vpp):
            return "pipeline-split"
        return None

    def free_rule(self, tp: int, cp: int, pp: int, zero: int, offload: str, sp: bool) -> str | None:
        if sp and tp > 1 and not sp_splits_sequence(self.base.model.seq_length, cp, tp):
            return "tensor-parallel-shapes"
        return None

    def backend_rule(self, c: Choice, microbatches: int) -> str | None:
        """The backend's refusals (``backends.raw_refusals``, what validate reports), memoised on
        what they can depend on: everything but the micro-batch size and recomputation."""
        key: tuple[object, ...] = (c.tp, c.cp, c.pp, c.ep, c.vpp, c.pp_schedule, c.zero_stage)
        key += (c.offload_optimizer, c.sequence_parallel, microbatches)
        refused = self._backend_memo.get(key)
        if refused is None:
            cfg = self.apply(c)
            refused = bool(raw_refusals(cfg.backend.name, cfg))
            # finetune=lora|qlora: the layouts the engines run with adapters (validate's
            # "finetune" rule), on the same keys; reported under the backend's rule.
            refused = refused or bool(engine_refusals(cfg))
            self._backend_memo[key] = refused
        return "backend-capabilities" if refused else None

    def violated_rule(self, c: Choice) -> str | None:
        """The rule the search excludes this layout by (None: the rules allow it)."""
        rule = self.tp_rule(c.tp) or self.cp_rule(c.cp)
        if rule:
            return rule
        dp = self.dp_of(c.tp, c.cp, c.pp)
        if dp is None:
            return "world-size"
        rule = self.ep_rule(c.ep, dp, c.cp, c.tp)
        if rule:
            return rule
        m = self.microbatches(c.micro_batch_size, dp, c.pp)
        if m is None:
            return "batch-arithmetic"
        return (
            self.schedule_rule(c.pp, c.pp_schedule, c.vpp)
            or self.free_rule(
                c.tp, c.cp, c.pp, c.zero_stage, c.offload_optimizer, c.sequence_parallel
            )
            or self.backend_rule(c, m)
        )

    # Configurations.
    def _fixed_split_keys(self) -> bool:
        """The user fixed Megatron-Core's split keys on the command line (they stay as given)."""
        return self._base_split[1]

    @functools.cached_property
    def _base_split(self) -> tuple[SplitKeys, bool]:
        keys = split_keys(self.base)
        return keys, bool(self.fixed & set(SPLIT_KEYS)) and keys.any

    def split_for(self, pp: int, vpp: int) -> SplitKeys:
        """Megatron-Core's split keys this layout gets: as fixed by the user; none when the layers
        split evenly or the backend runs its automatic split; else the first split Megatron-Core
        accepts (config/pipeline_split.py accepted_splits) that the backend runs."""
        key = (pp, vpp)
        if key in self._split_memo:
            return self._split_memo[key]
        layers = self.base.model.num_layers
        if self._fixed_split_keys():
            self._split_memo[key] = self._base_split[0]
        elif pp <= 1 or self._explicit_split() or even_split_ok(layers, pp, vpp):
            self._split_memo[key] = SplitKeys()
        else:
            chosen = SplitKeys()
            sched = "interleaved" if vpp > 1 else "1f1b"
            probe = Choice(1, 1, pp, 1, 1, sched, vpp, "none", 0, "none", False)
            if self._refuses_split(self._configure(probe, SplitKeys())):
                for keys in accepted_splits(layers, pp, vpp):
                    if keys.any and not self._refuses_split(self._configure(probe, keys)):
                        chosen = keys
                        break
            self._split_memo[key] = chosen
        return self._split_memo[key]

    def _refuses_split(self, cfg: LLMTrainConfig) -> bool:
        """The backend refuses this configuration's pipeline split (a refusal naming the layer
        count or a split key)."""
        split = {"model.num_layers", "parallel.pp_layers", *SPLIT_KEYS}
        return any(set(r.keys) & split for r in raw_refusals(cfg.backend.name, cfg))

    def bubble_scale(self, pp: int, vpp: int) -> float:
        """The bubble of this (pp, vpp)'s split relative to an even one (timing.estimate_time
        uses the same factor, so the bounds stay bounds)."""
        if (pp, vpp) not in self._scale_memo:
            self._scale_memo[(pp, vpp)] = self._bubble_scale(pp, vpp)
        return self._scale_memo[(pp, vpp)]

    def _bubble_scale(self, pp: int, vpp: int) -> float:
        layers = self.base.model.num_layers
        keys = self.split_for(pp, vpp)
        chunks: tuple[int, ...] | None = None
        if keys.any:
            try:
                chunks = megatron_split(layers, pp, vpp, keys, explain=False)
            except SplitError:
                chunks = None
        elif self._explicit_split() and self.base.parallel.pp_layers:
            chunks = tuple(self.base.parallel.pp_layers)
        if chunks is None or len(chunks) != pp * vpp:
            chunks = auto_split(layers, pp * vpp)
        return bubble_scale(tuple(sum(chunks[s::pp]) for s in range(pp)))

    def _explicit_split(self) -> bool:
        return "parallel.pp_layers" in self.fixed and self.base.parallel.pp_layers is not None

    def _offload_params(self) -> str:
        z = self.base.zero
        return z.offload_params if "zero.offload_params" in self.fixed else "none"

    def apply(self, c: Choice) -> LLMTrainConfig:
        """The configuration with this layout (dp inferred unless fixed)."""
        return self._configure(c, self.split_for(c.pp, c.vpp))

    def _configure(self, c: Choice, keys: SplitKeys) -> LLMTrainConfig:
        b = self.base
        p = b.parallel
        parallel = _with(
            p,
            tp=c.tp,
            pp=c.pp,
            vpp=c.vpp,
            cp=c.cp,
            ep=c.ep,
            dp=p.dp if "parallel.dp" in self.fixed else None,
            sequence_parallel=c.sequence_parallel,
            pp_schedule=c.pp_schedule,
            pp_layers=list(p.pp_layers) if self._explicit_split() and p.pp_layers else None,
        )
        if keys != self._base_split[0]:
            parallel = _with(
                parallel,
                account_for_embedding_in_pipeline_split=keys.embedding,
                account_for_loss_in_pipeline_split=keys.loss,
                num_layers_in_first_pipeline_stage=keys.first,
                num_layers_in_last_pipeline_stage=keys.last,
                pipeline_layout=keys.layout,
            )
        zero = _with(
            b.zero,
            stage=c.zero_stage,
            offload_optimizer=c.offload_optimizer,
            offload_params=self._offload_params(),
        )
        train = _with(
            b.train,
            micro_batch_size=c.micro_batch_size,
            recompute=c.recompute,
            global_batch_size=self.global_batch_size,
            grad_accum=b.train.grad_accum if "train.grad_accum" in self.fixed else None,
        )
        return _with(b, parallel=parallel, zero=zero, train=train)

    def overrides(self, c: Choice) -> tuple[str, ...]:
        """The override line that turns the configuration into this layout."""
        b = self.base
        out = [
            f"backend={b.backend.name}",
            f"parallel.tp={c.tp}",
            f"parallel.pp={c.pp}",
            f"parallel.vpp={c.vpp}",
            f"parallel.pp_schedule={c.pp_schedule}",
            f"parallel.cp={c.cp}",
        ]
        if (b.model.num_experts or 0) > 1 or b.parallel.ep != c.ep:
            out.append(f"parallel.ep={c.ep}")
        out.append(f"zero.stage={c.zero_stage}")
        if c.offload_optimizer != "none" or b.zero.offload_optimizer != c.offload_optimizer:
            out.append(f"zero.offload_optimizer={c.offload_optimizer}")
        out += [
            f"train.micro_batch_size={c.micro_batch_size}",
            f"train.recompute={c.recompute}",
            f"parallel.sequence_parallel={'true' if c.sequence_parallel else 'false'}",
        ]
        if b.parallel.pp_layers is not None and not self._explicit_split():
            out.append("parallel.pp_layers=null")
        if not self._fixed_split_keys():
            keys, given = self.split_for(c.pp, c.vpp), split_keys(b)
            out += keys.overrides()
            resets = (
                (given.layout is not None and keys.layout is None, f"{LAYOUT}=null"),
                (given.first is not None and keys.first is None, f"{FIRST}=null"),
                (given.last is not None and keys.last is None, f"{LAST}=null"),
                (given.embedding and not keys.embedding, f"{EMBEDDING}=false"),
                (given.loss and not keys.loss, f"{LOSS}=false"),
            )
            out += [word for needed, word in resets if needed]
        if b.parallel.dp is not None and "parallel.dp" not in self.fixed:
            out.append("parallel.dp=null")
        if b.train.grad_accum is not None and "train.grad_accum" not in self.fixed:
            out.append("train.grad_accum=null")
        if b.train.global_batch_size is None:
            out.append(f"train.global_batch_size={self.global_batch_size}")
        if b.zero.offload_params != self._offload_params():
            out.append(f"zero.offload_params={self._offload_params()}")
        return tuple(out)


def search_space(
    cfg: LLMTrainConfig,
    *,
    fixed: Iterable[str] = (),
    max_tp: int | None = None,
    max_pp: int | None = None,
    max_cp: int | None = None,
    max_vpp: int = 8,
    max_micro_batch_size: int | None = None,
) -> LayoutSpace:
    """The grid searched for this configuration (see the module docstring)."""
    fixed_set = frozenset(fixed)
    base_layout = derive_layout(cfg)
    world = base_layout.world_size
    gbs = base_layout.global_batch_size
    m, p, z, t = cfg.model, cfg.parallel, cfg.zero, cfg.train

    def ints(key: str, value: int, values: Iterable[int]) -> tuple[int, ...]:
        return (value,) if key in fixed_set else tuple(values)

    def words(key: str, value: str, values: Iterable[str]) -> tuple[str, ...]:
        return (value,) if key in fixed_set else tuple(values)

    tp_cap = max_tp if max_tp is not None else max(1, cfg.cluster.gpus_per_node)
    pp_cap = min(m.num_layers, max_pp if max_pp is not None else m.num_layers)
    cp_cap = max_cp if max_cp is not None else max(1, m.seq_length // MIN_TOKENS_PER_CP_RANK)
    mbs_cap = max_micro_batch_size if max_micro_batch_size is not None else gbs
    experts = m.num_experts or 0
    world_divisors = divisors(world)
    backend = all_backends().get(cfg.backend.name)

    def runs(degree: str, values: Iterable[int]) -> Iterable[int]:
        """Only 1 for a degree the backend does not run (a fixed key keeps its value)."""
        return values if backend is None or degree in backend.degrees else (1,)

    zero_stages = backend.zero_stages if backend else range(4)
    offloads = ("none", "cpu") if backend is None or backend.offload_optimizer_stages else ("none",)
    return LayoutSpace(
        base=cfg,
        fixed=fixed_set,
        world=world,
        global_batch_size=gbs,
        tp=ints("parallel.tp", p.tp, runs("tp", [d for d in world_divisors if d <= tp_cap])),
        cp=ints("parallel.cp", p.cp, runs("cp", [d for d in world_divisors if d <= cp_cap])),
        pp=ints("parallel.pp", p.pp, runs("pp", [d for d in world_divisors if d <= pp_cap])),
        ep=ints("parallel.ep", p.ep, runs("ep", divisors(experts) if experts > 1 else (1,))),
        micro_batch_size=ints(
            "train.micro_batch_size", t.micro_batch_size, (d for d in divisors(gbs) if d <= mbs_cap)
        ),
        recompute=words("train.recompute", t.recompute, RECOMPUTE),
        zero=ints("zero.stage", z.stage, zero_stages),
        offload=words("zero.offload_optimizer", z.offload_optimizer, offloads),
        max_vpp=max(1, max_vpp),
        backend=backend,
    )


# --- the search -----------------------------------------------------------------------------------

# A group: layouts that share everything but the ZeRO stage and offload, and so share the bounds
# on tokens/s. Fields: tp, cp, pp, dp, ep, micro-batch, micro-batches, schedule, vpp, recompute,
# sequence parallel, the allowed (zero stage, offload) pairs.
_Group = tuple[int, int, int, int, int, int, int, str, int, str, bool, tuple[tuple[int, str], ...]]

# Relative slack on the bound, so that rounding never prunes a layout that ties the k-th best.
_BOUND_SLACK = 1e-9


class _Search:
    """One search over one space: memoized parts, counters, the best layouts found.

    `first_fit` (with `exhaustive`) only answers whether any layout fits (``fitting``): it asks
    the backend's refusals after memory, of the few layouts that fit, so its rejection counts
    differ from a full search's and are never reported.
    """

    def __init__(
        self,
        space: LayoutSpace,
        hw: HardwareView,
        headroom: float,
        top: int,
        *,
        exhaustive: bool,
        first_fit: bool,
        given: Candidate | None,
    ) -> None:
        self.space = space
        self.hw = hw
        self.headroom = headroom
        self.top = top
        self.exhaustive = exhaustive
        self.first_fit = first_fit
        self.given = given
        self.usable = MemoryPlan((), float(hw.memory_bytes), headroom).usable
        self.rejected: dict[str, int] = {}
        self.evaluated = 0
        self.fitting = 0
        self.timed = 0
        self.better_than_given = 0
        self.best: list[Candidate] = []
        self.threshold = -math.inf
        self._flops: dict[str, FlopsPerToken] = {}
        self._unit_compute: dict[tuple[int, str, int, str], float] = {}
        self._states: dict[tuple[int, ...], tuple[StageStates, ...]] = {}
        self._states_bound: dict[tuple[int, ...], float] = {}
        self._acts: dict[tuple[object, ...], tuple[float, int]] = {}
        self._params: dict[tuple[int, ...], StageParams] = {}
        self._layers: dict[tuple[int, int], tuple[int, ...]] = {}
        self._built: dict[tuple[object, ...], tuple[LLMTrainConfig, Layout]] = {}
        self._tight: dict[tuple[object, ...], float] = {}
        self._bufs: dict[tuple[object, ...], float] = {}

    def reject(self, rule: str, count: int) -> None:
        if count:
            self.rejected[rule] = self.rejected.get(rule, 0) + count

    def flops(self, recompute: str) -> FlopsPerToken:
        if recompute not in self._flops:
            self._flops[recompute] = config_flops(self.space.base, recompute)
        return self._flops[recompute]

    # Bound ---------------------------------------------------------------------------------------
    def unit_compute_s(self, pp: int, sched: str, vpp: int, recompute: str) -> float:
        """Compute of one micro-batch on the heaviest stage at tp = cp = 1, one sequence."""
        key = (pp, sched, vpp, recompute)
        if key not in self._unit_compute:
            choice = Choice(1, 1, pp, 1, 1, sched, vpp, recompute, 0, "none", False)
            cfg = self.space.apply(choice)
            layout = derive_layout(cfg)
            seconds, _, _ = microbatch_compute_s(cfg, layout, self.hw, self.flops(recompute))
            self._unit_compute[key] = seconds
        return self._unit_compute[key]

    def bound(
        self, tp: int, cp: int, pp: int, mbs: int, m: int, sched: str, vpp: int, recompute: str
    ) -> float:
        """Upper bound on tokens/s: the step is at least m x compute x (1 + bubble overhead)."""
        compute = self.unit_compute_s(pp, sched, vpp, recompute) * mbs / (cp * tp)
        bubble = bubble_overhead(pp, m, vpp) * self.space.bubble_scale(pp, vpp)
        step = compute * m * (1.0 + bubble)
        tokens = self.space.global_batch_size * self.space.base.model.seq_length
        return tokens / step * (1.0 + _BOUND_SLACK) if step > 0 else math.inf

    def base(self, g: _Group) -> tuple[LLMTrainConfig, Layout]:
        """The configuration and layout of a group's first layout (the others differ in zero)."""
        key = g[:11]
        if key not in self._built:
            tp, cp, pp, _, ep, mbs, _, sched, vpp, r, sp, free = g
            z, off = free[0]
            self._built[key] = self.build(Choice(tp, cp, pp, ep, mbs, sched, vpp, r, z, off, sp))
        return self._built[key]

    def tight_bound(self, g: _Group) -> float:
        """Upper bound on tokens/s with the exposed per-micro-batch communication counted too.

        Computed at one sequence per micro-batch and scaled by the micro-batch size: every term
        of ``timing.microbatch_time`` (compute, the TP/EP/PP messages, the CP ring and the
        attention it hides behind) is proportional to the tokens of a micro-batch.
        """
        tp, cp, pp, dp, ep, mbs, m, sched, vpp, r, sp, free = g
        key = (tp, cp, pp, dp, ep, vpp, r, sp)  # gpipe and 1f1b time the same
        if key not in self._tight:
            z, off = free[0]
            cfg, layout = self.build(Choice(tp, cp, pp, ep, 1, sched, vpp, r, z, off, sp))
            per_mb = microbatch_time(cfg, layout, self.hw, self.flops(r))
            self._tight[key] = per_mb.compute_s + per_mb.exposed_s
        bubble = bubble_overhead(pp, m, vpp) * self.space.bubble_scale(pp, vpp)
        step = self._tight[key] * mbs * m * (1.0 + bubble)
        tokens = self.space.global_batch_size * self.space.base.model.seq_length
        return tokens / step * (1.0 + _BOUND_SLACK) if step > 0 else math.inf

    # Enumeration ---------------------------------------------------------------------------------
    def groups(self) -> list[tuple[float, _Group]]:
        """Every group the rules allow with its compute bound, counting the excluded layouts."""
        sp = self.space
        n_ep, n_mbs, n_r = len(sp.ep), len(sp.micro_batch_size), len(sp.recompute)
        n_zo = len(sp.zero) * len(sp.offload)
        scheds = {pp: sp.schedules(pp) for pp in sp.pp}
        sched_total = sum(len(v) for v in scheds.values())
        out: list[tuple[float, _Group]] = []
        for tp in sp.tp:
            sps = sp.sequence_parallel(tp)
            n_free = n_zo * len(sps)
            rule = sp.tp_rule(tp)
            if rule:
                self.reject(rule, len(sp.cp) * sched_total * n_ep * n_mbs * n_r * n_free)
                continue
            for cp in sp.cp:
                rule = sp.cp_rule(cp)
                if rule:
                    self.reject(rule, sched_total * n_ep * n_mbs * n_r * n_free)
                    continue
                for pp in sp.pp:
                    per_mbs = len(scheds[pp]) * n_r * n_free
                    dp = sp.dp_of(tp, cp, pp)
                    if dp is None:
                        self.reject("world-size", n_ep * n_mbs * per_mbs)
                        continue
                    free_rules: dict[str, int] = {}
                    free: list[tuple[bool, tuple[tuple[int, str], ...]]] = []
                    for s in sps:
                        pairs: list[tuple[int, str]] = []
                        for z in sp.zero:
                            for off in sp.offload:
                                rule = sp.free_rule(tp, cp, pp, z, off, s)
                                if rule:
                                    free_rules[rule] = free_rules.get(rule, 0) + 1
                                else:
                                    pairs.append((z, off))
                        if pairs:
                            free.append((s, tuple(pairs)))
                    sched_rules: dict[str, int] = {}
                    valid_scheds: list[tuple[str, int]] = []
                    for sched, vpp in scheds[pp]:
                        rule = sp.schedule_rule(pp, sched, vpp)
                        if rule:
                            sched_rules[rule] = sched_rules.get(rule, 0) + 1
                        else:
                            valid_scheds.append((sched, vpp))
                    passed = 0  # (ep, mbs) pairs the rules allow
                    for ep in sp.ep:
                        rule = sp.ep_rule(ep, dp, cp, tp)
                        if rule:
                            self.reject(rule, n_mbs * per_mbs)
                            continue
                        for mbs in sp.micro_batch_size:
                            m = sp.microbatches(mbs, dp, pp)
                            if m is None:
                                self.reject("batch-arithmetic", per_mbs)
                                continue
                            passed += 1
                            for sched, vpp in valid_scheds:
                                # First fit asks the backend only about layouts that fit.
                                runnable = free
                                if not self.first_fit:
                                    runnable = self.backend_pairs(
                                        tp, cp, pp, ep, mbs, m, sched, vpp, free
                                    )
                                for r in sp.recompute:
                                    ub = self.bound(tp, cp, pp, mbs, m, sched, vpp, r)
                                    for s, pairs_t in runnable:
                                        group = (tp, cp, pp, dp, ep, mbs, m, sched, vpp, r, s)
                                        out.append((ub, (*group, pairs_t)))
                    for rule, count in sched_rules.items():
                        self.reject(rule, passed * count * n_r * n_free)
                    for rule, count in free_rules.items():
                        self.reject(rule, passed * len(valid_scheds) * n_r * count)
        return out

    def backend_pairs(
        self,
        tp: int,
        cp: int,
        pp: int,
        ep: int,
        mbs: int,
        m: int,
        sched: str,
        vpp: int,
        free: list[tuple[bool, tuple[tuple[int, str], ...]]],
    ) -> list[tuple[bool, tuple[tuple[int, str], ...]]]:
        """The (sequence parallel, zero/offload pairs) the backend runs; the others are counted
        (once per recomputation choice) against backend-capabilities."""
        sp = self.space
        out = []
        refused = 0
        for s, pairs in free:
            kept = []
            for z, off in pairs:
                choice = Choice(tp, cp, pp, ep, mbs, sched, vpp, "none", z, off, s)
                if sp.backend_rule(choice, m):
                    refused += 1
                else:
                    kept.append((z, off))
            if kept:
                out.append((s, tuple(kept)))
        self.reject("backend-capabilities", refused * len(sp.recompute))
        return out

    # Evaluation ----------------------------------------------------------------------------------
    def run(self) -> None:
        groups = self.groups()
        if self.exhaustive:
            for ub, g in groups:
                self.evaluate_group(g, ub)
                if self.first_fit and self.fitting:
                    return
            self.trim()
            return
        # Best first: pop the largest bound; a compute-only bound is first tightened with the
        # group's communication and pushed back; a tight bound is evaluated. Stop when the
        # largest bound cannot reach the k-th best.
        heap: list[tuple[float, int, int, _Group]] = [
            (-ub, 0, i, g) for i, (ub, g) in enumerate(groups)
        ]
        heapq.heapify(heap)
        while heap:
            neg, tight, i, g = heap[0]
            if -neg < self.cutoff():
                self.reject(OUTRANKED, sum(len(item[3][11]) for item in heap))
                break
            heapq.heappop(heap)
            if not tight:
                if self.overflows(g):
                    continue
                heapq.heappush(heap, (-min(-neg, self.tight_bound(g)), 1, i, g))
                continue
            self.evaluate_group(g, -neg)
            self.trim()
        self.trim()

    def cutoff(self) -> float:
        if self.given is not None:
            return min(self.threshold, self.given.tokens_per_s)
        return self.threshold

    def trim(self) -> None:
        if len(self.best) >= self.top:
            self.best.sort(key=Candidate.rank_key)
            del self.best[self.top :]
            self.threshold = self.best[-1].tokens_per_s

    def overflows(self, g: _Group) -> bool:
        """True (and counted) when the model states alone overflow for every pair of the group.

        Only looks at states already computed for other groups, so it costs no planning.
        """
        tp, cp, pp, dp, ep, _, _, _, vpp, _, _, pairs = g
        for zero, offload in pairs:
            bound = self._states_bound.get((tp, cp, pp, vpp, ep, dp, zero, offload == "cpu"))
            if bound is None or bound <= self.usable:
                return False
        self.evaluated += len(pairs)
        self.reject(MEMORY, len(pairs))
        return True

    def evaluate_group(self, g: _Group, bound: float) -> None:
        if self.overflows(g):
            return
        cfg, layout = self.base(g)
        self._built.pop(g[:11], None)
        for zero, offload in g[11]:
            self.evaluate(g, zero, offload, bound, cfg, layout)
            if self.first_fit and self.fitting:
                return

    def evaluate(
        self,
        g: _Group,
        zero: int,
        offload: str,
        bound: float,
        base_cfg: LLMTrainConfig,
        layout: Layout,
    ) -> None:
        """Memory (stopping at the first stage that overflows), then time if it fits."""
        tp, cp, pp, dp, ep, mbs, m, sched, vpp, r, sp, _ = g
        self.evaluated += 1
        cfg: LLMTrainConfig | None = None
        if base_cfg.zero.stage == zero and base_cfg.zero.offload_optimizer == offload:
            cfg = base_cfg

        def with_zero() -> LLMTrainConfig:
            zc = dataclasses.replace(base_cfg.zero, stage=zero, offload_optimizer=offload)
            return dataclasses.replace(base_cfg, zero=zc)

        skey = (tp, cp, pp, vpp, ep, dp, zero, offload == "cpu")
        if skey not in self._states_bound:
            cfg = cfg or with_zero()
            self.states_for(skey, cfg, layout)
        if self._states_bound[skey] > self.usable:
            self.reject(MEMORY, 1)
            return
        states = self._states[skey]
        bkey = (zero, sp, mbs, tp, cp, pp, ep)  # ZeRO-3 gathers 1/ep of the experts
        if bkey not in self._bufs:
            cfg = cfg or with_zero()
            self._bufs[bkey] = stage_buffers(cfg, layout)
        buffers = self._bufs[bkey]
        layers = self.stage_layers(layout)
        stages: list[StageMemory | None] = [None] * pp
        for stage in (0, *range(pp - 1, 0, -1)):
            # ep: the MoE dispatcher's buffers (memory.dispatcher_bytes).
            akey = (mbs, m, tp, cp, pp, vpp, ep, sched, sp, r, stage)
            act = self._acts.get(akey)
            if act is None:
                # Activations do not depend on the ZeRO stage: the group's configuration will do.
                act = self._acts[akey] = stage_activations(base_cfg, layout, stage)
            lazy, reused = 0.0, True
            # Gradients made during the backward (plan/grad_liveness.py).
            if layout.pp == 1 and layout.num_microbatches == 1:
                cfg = cfg or with_zero()
                lazy = stage_not_coexisting(cfg, layout, stage, states[stage], buffers)
                reused = reserved_reuses_activations(cfg)
            mem = assemble_stage(
                stage, layers[stage], self.hw, states[stage], act, buffers, lazy, reused
            )
            if mem.device_total > self.usable:
                self.reject(MEMORY, 1)
                return
            stages[stage] = mem
        memory = MemoryPlan(
            tuple(s for s in stages if s is not None), float(self.hw.memory_bytes), self.headroom
        )
        choice = Choice(tp, cp, pp, ep, mbs, sched, vpp, r, zero, offload, sp)
        if self.first_fit:
            # groups() left the backend's refusals to here: asked only of layouts that fit.
            rule = self.space.backend_rule(choice, m)
            if rule:
                self.reject(rule, 1)
                return
            self.fitting += 1
            return
        self.fitting += 1
        cfg = cfg or with_zero()
        timing = estimate_time(cfg, layout, self.hw, self.flops(r), memory.stages)
        self.timed += 1
        if timing.tokens_per_s > bound:
            raise AssertionError(
                f"search bound violated for {choice}: {timing.tokens_per_s} > {bound} tokens/s"
            )
        if self.given is not None and (
            timing.tokens_per_s > self.given.tokens_per_s
            or (
                timing.tokens_per_s == self.given.tokens_per_s
                and memory.heaviest.device_total < self.given.memory_bytes
            )
        ):
            self.better_than_given += 1
        if timing.tokens_per_s < self.threshold:
            return
        self.best.append(_candidate(choice, self.space.overrides(choice), dp, m, memory, timing))

    def build(self, choice: Choice) -> tuple[LLMTrainConfig, Layout]:
        cfg = self.space.apply(choice)
        return cfg, derive_layout(cfg)

    def stage_layers(self, layout: Layout) -> tuple[int, ...]:
        key = (layout.pp, layout.vpp)
        if key not in self._layers:
            self._layers[key] = layout.stage_layers
        return self._layers[key]

    def states_for(self, skey: tuple[int, ...], cfg: LLMTrainConfig, layout: Layout) -> None:
        """The model states of every stage, and the memory they alone take on the heaviest.

        Activations and buffers are never negative: the states alone bound the memory below. The
        stages likeliest to be heaviest (the first and last, with the embedding and the output
        layer, and one with the most layers) are looked at first; when one of them already
        overflows, that partial maximum is the bound (still a lower bound on the layout's memory)
        and the other stages are never computed.
        """
        layers = self.stage_layers(layout)

        def one(s: int) -> StageStates:
            # The expert tensor parallel size folds in dp x cp (backends.expert_tensor_parallel).
            etp = expert_tensor_parallel(cfg, layout)
            pkey = (layout.tp, layout.ep, etp, layout.pp, layout.vpp, s)
            if pkey not in self._params:
                self._params[pkey] = stage_params(cfg, layout, s)
            return stage_states(cfg, layout, s, self._params[pkey])

        def alone(s: int, st: StageStates) -> float:
            # Gradients made during the backward may never coexist with the rest (memory.
            # stage_not_coexisting): leaving them out keeps the bound a lower bound.
            lazy = st.gradients if layout.pp == 1 and layout.num_microbatches == 1 else 0.0
            return assemble_stage(s, layers[s], self.hw, st, (0.0, 0), 0.0, lazy).device_total

        probe = {s: one(s) for s in {0, layout.pp - 1, layers.index(max(layers))}}
        bound = max(alone(s, st) for s, st in probe.items())
        if bound > self.usable:
            self._states_bound[skey] = bound
            return
        states = tuple(probe[s] if s in probe else one(s) for s in range(layout.pp))
        self._states[skey] = states
        self._states_bound[skey] = max(alone(s, st) for s, st in enumerate(states))


def candidate_from_plan(plan: Plan, choice: Choice | None, overrides: tuple[str, ...]) -> Candidate:
    """A Candidate with make_plan's numbers (the configuration as given, or a check of a result)."""
    t, mem, lay = plan.time, plan.memory, plan.layout
    return _candidate(
        choice
        or Choice(
            lay.tp,
            lay.cp,
            lay.pp,
            lay.ep,
            lay.micro_batch_size,
            plan.config.parallel.pp_schedule,
            lay.vpp,
            plan.config.train.recompute,
            plan.config.zero.stage,
            plan.config.zero.offload_optimizer,
            plan.config.parallel.sequence_parallel,
        ),
        overrides,
        lay.dp,
        lay.grad_accum,
        mem,
        t,
    )


def _candidate(
    choice: Choice,
    overrides: tuple[str, ...],
    dp: int,
    grad_accum: int,
    memory: MemoryPlan,
    timing: TimePlan,
) -> Candidate:
    """A Candidate from a layout's memory and time predictions."""
    return Candidate(
        choice=choice,
        overrides=overrides,
        dp=dp,
        grad_accum=grad_accum,
        memory_bytes=memory.heaviest.device_total,
        capacity_bytes=memory.capacity,
        step_s=timing.step_s,
        tokens_per_s=timing.tokens_per_s,
        mfu=timing.mfu,
        bubble_fraction=timing.bubble_fraction,
        compute_s=timing.compute_s,
        bubble_s=timing.bubble_s,
        exposed_comm_s=timing.exposed_comm_s,
        optimizer_s=timing.optimizer_s,
    )


# Keys whose violations the search can change; any other error is the configuration's own (a
# backend refusal of a non-layout key, e.g. optim.name, included: --any-backend may fix those).
_LAYOUT_KEYS = SEARCH_KEYS | {"train.global_batch_size", "cluster.num_nodes"}


def _config_errors(cfg: LLMTrainConfig) -> list[str]:
    # A value out of its key's range (parallel.tp=0, cluster.num_nodes=1250000, optim.lr=1e39)
    # is the configuration's own error even on a layout key: `plan` exits 2 on it, so does this.
    return [
        f"[{v.rule}] {v.message}"
        for v in check(cfg)
        if v.is_error
        and (v.rule == "positive-values" or not (set(v.keys) - {"backend"}) & _LAYOUT_KEYS)
    ]


def _given(cfg: LLMTrainConfig, headroom: float) -> tuple[Candidate | None, str]:
    """The configuration as given: its Candidate when valid and fitting, and a status line."""
    errors = sorted({v.rule for v in check(cfg) if v.is_error})
    if errors:
        return None, "not valid (" + ", ".join(errors) + ")"
    plan = make_plan(cfg, headroom=headroom)
    if not plan.memory.fits:
        return None, "does not fit"
    return candidate_from_plan(plan, None, ()), "fits"


def _verified(space: LayoutSpace, cand: Candidate, headroom: float) -> Candidate:
    """Re-plan a result from scratch: it must pass check() and make_plan must agree."""
    cfg = space.apply(cand.choice)
    errors = [v for v in check(cfg) if v.is_error]
    if errors:
        raise AssertionError(f"search returned an invalid layout {cand.line}: {errors[0].message}")
    plan = make_plan(cfg, headroom=headroom)
    again = candidate_from_plan(plan, cand.choice, cand.overrides)
    if not plan.memory.fits or not math.isclose(again.tokens_per_s, cand.tokens_per_s):
        raise AssertionError(f"search and make_plan disagree on {cand.line}")
    return again


def _smallest_cluster(
    cfg: LLMTrainConfig, space_args: dict[str, object], headroom: float, limit: int
) -> int | None:
    """The fewest nodes (from one more than configured, up to `limit`) on which a layout fits."""
    hw = hardware_view(cfg)
    for nodes in range(cfg.cluster.num_nodes + 1, limit + 1):
        bigger = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, num_nodes=nodes))
        space = search_space(bigger, **space_args)  # type: ignore[arg-type]
        run = _Search(space, hw, headroom, 1, exhaustive=True, first_fit=True, given=None)
        run.run()
        if run.fitting:
            return nodes
    return None


def search(
    cfg: LLMTrainConfig,
    *,
    top: int = 10,
    min_headroom: float = 0.10,
    max_tp: int | None = None,
    max_pp: int | None = None,
    max_cp: int | None = None,
    max_vpp: int = 8,
    max_micro_batch_size: int | None = None,
    fixed: Iterable[str] = (),
    exhaustive: bool = False,
    rank_given: bool = False,
    max_nodes: int = 1024,
) -> SearchResult:
    """The `top` fastest layouts of `cfg`'s model on its cluster that fit with `min_headroom`.

    `fixed`: dotted keys the user set (see ``fixed_keys``); they keep their configured value.
    `rank_given`: also rank the configuration as given among all fitting layouts (slower: every
    layout faster than it is evaluated). When nothing fits, the smallest cluster that fits is
    searched up to `max_nodes` nodes.
    """
    start = time.perf_counter()
    if top < 1:
        raise UserError(f"--top={top}: must be at least 1")
    if not 0.0 <= min_headroom < 1.0:
        raise UserError(f"--headroom={min_headroom}: must be a fraction in [0, 1), e.g. 0.10")
    for name, value in (("--max-tp", max_tp), ("--max-pp", max_pp), ("--max-cp", max_cp)):
        if value is not None and value < 1:
            raise UserError(f"{name}={value}: must be at least 1")
    fixed = frozenset(fixed)
    for key, value, name, cap in (
        ("parallel.tp", cfg.parallel.tp, "--max-tp", max_tp),
        ("parallel.pp", cfg.parallel.pp, "--max-pp", max_pp),
        ("parallel.cp", cfg.parallel.cp, "--max-cp", max_cp),
    ):
        if key in fixed and cap is not None and value > cap:
            raise UserError(
                f"{key}={value} is fixed on the command line but {name}={cap} allows at most "
                f"{cap}; drop one of them, e.g. {name}={value} or {key}={cap}"
            )
    problems = _config_errors(cfg)
    if problems:
        hint = (
            f"\n(no layout of backend={cfg.backend.name} fixes these; --any-backend searches every "
            "backend)"
            if any(p.startswith("[backend-capabilities]") for p in problems)
            else ""
        )
        raise UserError(
            "the configuration has errors no layout can fix:\n  " + "\n  ".join(problems) + hint
        )
    space_args: dict[str, object] = {
        "fixed": fixed,
        "max_tp": max_tp,
        "max_pp": max_pp,
        "max_cp": max_cp,
        "max_vpp": max_vpp,
        "max_micro_batch_size": max_micro_batch_size,
    }
    space = search_space(cfg, **space_args)  # type: ignore[arg-type]
    # Priced as `plan` prices (a profile from llmtrain calibrate when one is chosen).
    hw, profile, profile_note = priced_hardware(cfg)
    given, given_status = _given(cfg, min_headroom)
    run = _Search(
        space,
        hw,
        min_headroom,
        top,
        exhaustive=exhaustive,
        first_fit=False,
        given=given if rank_given else None,
    )
    run.run()
    best = tuple(_verified(space, c, min_headroom) for c in run.best)
    smallest = None
    notes: list[str] = []
    if not best:
        if run.evaluated:
            smallest = _smallest_cluster(cfg, space_args, min_headroom, max_nodes)
            if smallest is None:
                notes.append(f"no layout fits on up to {max_nodes} nodes")
        else:
            notes.append("no layout passes the validation rules; see the rejections")
    return SearchResult(
        model=cfg.model.name,
        gpu=hw.name,
        num_nodes=cfg.cluster.num_nodes,
        gpus_per_node=cfg.cluster.gpus_per_node,
        global_batch_size=space.global_batch_size,
        min_headroom=min_headroom,
        top=top,
        candidates=best,
        space_size=space.size(),
        evaluated=run.evaluated,
        fitting=run.fitting,
        timed=run.timed,
        rejected=dict(sorted(run.rejected.items(), key=lambda kv: (-kv[1], kv[0]))),
        smallest_cluster=smallest,
        elapsed_s=time.perf_counter() - start,
        given=given,
        given_status=given_status,
        given_rank=1 + run.better_than_given if rank_given and given is not None else None,
        notes=tuple(notes) + ((profile_note,) if profile_note else ()),
        backends=(cfg.backend.name,),
        pricing=pricing_line(profile),
    )


def search_backends(configs: dict[str, LLMTrainConfig], **options: object) -> SearchResult:
    """`--any-backend`: search each backend's configuration (the same request composed with
    backend=NAME) and rank all their layouts together. The first configuration is the one as
    given (its status heads the report). A backend that cannot run the request at all (a config
    error no layout fixes) is left out with a note; if every one is, the first error is raised."""
    results: list[SearchResult] = []
    skipped: list[str] = []
    first_error: UserError | None = None
    for name, cfg in configs.items():
        try:
            results.append(search(cfg, **options))  # type: ignore[arg-type]
        except UserError as exc:
            first_error = first_error or exc
            lines = str(exc).splitlines()
            reason = (lines[1] if len(lines) > 1 else lines[0]).strip()
            skipped.append(f"backend={name} left out: {reason}")
    if not results:
        assert first_error is not None
        raise UserError("no backend can run this request:\n  " + "\n  ".join(skipped))
    top = results[0].top
    merged = sorted((c for r in results for c in r.candidates), key=Candidate.rank_key)[:top]
    rejected: dict[str, int] = {}
    for r in results:
        for rule, count in r.rejected.items():
            rejected[rule] = rejected.get(rule, 0) + count
    base = results[0]
    return dataclasses.replace(
        base,
        candidates=tuple(merged),
        space_size=sum(r.space_size for r in results),
        evaluated=sum(r.evaluated for r in results),
        fitting=sum(r.fitting for r in results),
        timed=sum(r.timed for r in results),
        rejected=dict(sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0]))),
        smallest_cluster=min(
            (r.smallest_cluster for r in results if r.smallest_cluster is not None), default=None
        ),
        elapsed_s=sum(r.elapsed_s for r in results),
        given_rank=None,
        notes=tuple(f"backend={r.backends[0]}: {n}" for r in results for n in r.notes)
        + tuple(skipped),
        backends=tuple(n for r in results for n in r.backends),
    )
