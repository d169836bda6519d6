"""The grid of layouts `plan --search` looks through for one configuration and cluster
(``search_space``, ``LayoutSpace``): the values of each searched key, the configuration of each
layout and the override line that makes it, and the validation rules applied to partial layouts.

The rules are not restated here: every error condition declared in launcher/validate/ (a
``LayoutRule``: the layout values it reads, its check) prunes at the first level of ``LEVELS``
where every value it reads is fixed, in the registry's order, memoised on those values
(``LayoutSpace.refused``). The backend's refusals (``backends.raw_refusals``, what validate's
backend-capabilities rule reports) are asked of whole layouts (``LayoutSpace.backend_rule``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from launcher.backends import all_backends, raw_refusals, refuses
from launcher.backends.common import Backend
from launcher.config.composition.overrides import override_key
from launcher.config.layout import auto_split, derive_layout, split_keys
from launcher.config.layout_rules import microbatches
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
from launcher.validate.finetune_rules import engine_refusals
from launcher.validate.rule import LAYOUT_VALUES
from launcher.validate.rules import ERROR, LayoutRule, divisors, layout_conditions

_T = TypeVar("_T")
SCHEDULES = ("gpipe", "1f1b", "interleaved")
# Default cap on cp: at least this many tokens per context-parallel rank. Below it the attention
# blocks are too small to hide the K/V ring behind, and the planner's bandwidth-only collective
# model (no per-message latency, comm.py) no longer holds; pass max_cp to search further.
MIN_TOKENS_PER_CP_RANK = 1024
RECOMPUTE = ("none", "selective", "full")

# The levels a layout's values are fixed at, in the search's order (every LAYOUT_VALUES once; dp
# and microbatches are derived, from the world size and from the batch sizes). A condition
# prunes at the first level where every value it reads is fixed; BASE holds those reading none.
LEVELS: tuple[tuple[str, ...], ...] = (
    (),
    ("tp",),
    ("cp",),
    ("pp",),
    ("dp",),
    ("ep",),
    ("micro_batch_size",),
    ("microbatches",),
    ("pp_schedule", "vpp"),
    ("sequence_parallel", "zero_stage", "offload_optimizer"),
)
BASE, TP, CP, PP, DP, EP, MBS, MICROBATCHES, SCHEDULE, FREE = range(len(LEVELS))
assert sorted(v for level in LEVELS for v in level) == sorted(LAYOUT_VALUES)

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


def copy_replacing(obj: _T, **changes: object) -> _T:
    """A copy of a config dataclass with some fields changed: dataclasses.replace without the
    __init__ round trip (the config sections have no __post_init__), which the search does for
    every layout it asks the backend about."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__, **changes)
    return new


# --- the space ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayoutSpace:
    """The grid of layouts for one configuration and cluster, and the rules on partial layouts."""

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
    # Memos of the rules' verdicts (see refused and allowed).
    _rule_memo: dict[tuple[Any, ...], str | None] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )
    _options_memo: dict[tuple[Any, ...], tuple[tuple[tuple[Any, ...], ...], dict[str, int]]] = (
        field(default_factory=dict, compare=False, hash=False, repr=False)
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

    # The rules, level by level (launcher/validate/rule.py: the conditions validate reports).
    @functools.cached_property
    def template(self) -> LLMTrainConfig:
        """The configuration the conditions read beside the layout values: the base as `apply`
        makes it (dp, grad_accum, the global batch and the layer split as the search sets them),
        with the values the search varies set to None, so that a condition reading one of them
        from the configuration instead of its values fails loudly."""
        probe = Choice(1, 1, 1, 1, 1, "1f1b", 1, "none", 0, "none", False)
        keys = self._base_split[0] if self._fixed_split_keys() else SplitKeys()
        cfg = self._configure(probe, keys)
        varied = ("tp", "pp", "vpp", "cp", "ep", "sequence_parallel", "pp_schedule")
        train = copy_replacing(cfg.train, micro_batch_size=None, recompute=None)
        zero = copy_replacing(cfg.zero, stage=None, offload_optimizer=None)
        parallel = copy_replacing(cfg.parallel, **dict.fromkeys(varied))
        return copy_replacing(cfg, parallel=parallel, zero=zero, train=train)

    @functools.cached_property
    def _levels(self) -> tuple[tuple[tuple[str, ...], tuple[LayoutRule, ...]], ...]:
        """Per level of LEVELS: the values its conditions read, and its error conditions (in the
        registry's order). Read from the registry when the space is made."""
        level_of = {value: i for i, values in enumerate(LEVELS) for value in values}
        conditions: list[list[LayoutRule]] = [[] for _ in LEVELS]
        for c in layout_conditions():
            if c.severity == ERROR:
                conditions[max((level_of[v] for v in c.reads), default=BASE)].append(c)
        return tuple(
            (tuple(sorted({v for c in cs for v in c.reads})), tuple(cs)) for cs in conditions
        )

    def refused(self, level: int, values: Mapping[str, Any]) -> str | None:
        """The rule of the first condition of this level that the partial layout `values`
        (fixed through this level) violates; None when they all hold."""
        reads, conditions = self._levels[level]
        key = (level, *(values[v] for v in reads))
        if key not in self._rule_memo:
            self._rule_memo[key] = next(
                (c.name for c in conditions if not c.holds(self.template, values)), None
            )
        return self._rule_memo[key]

    def allowed(
        self,
        level: int,
        values: Mapping[str, Any],
        options: tuple[tuple[Any, ...], ...],
    ) -> tuple[tuple[tuple[Any, ...], ...], dict[str, int]]:
        """The options for this level's values (in LEVELS' order) that its conditions allow after
        `values`, and the others counted by rule; memoised on what the conditions read."""
        names = LEVELS[level]
        reads, _ = self._levels[level]
        key = (level, options, *(values[v] for v in reads if v not in names))
        if key not in self._options_memo:
            kept: list[tuple[Any, ...]] = []
            counts: dict[str, int] = {}
            for option in options:
                rule = self.refused(level, {**values, **dict(zip(names, option, strict=True))})
                if rule:
                    counts[rule] = counts.get(rule, 0) + 1
                else:
                    kept.append(option)
            self._options_memo[key] = (tuple(kept), counts)
        return self._options_memo[key]

    def dp_of(self, tp: int, cp: int, pp: int) -> int | None:
        """The data-parallel degree, or None when the world size does not work out."""
        mp = tp * cp * pp
        if "parallel.dp" in self.fixed and self.base.parallel.dp is not None:
            return self.base.parallel.dp if self.base.parallel.dp * mp == self.world else None
        return self.world // mp if self.world % mp == 0 else None

    def microbatches(self, mbs: int, dp: int) -> int | None:
        """Micro-batches per step, or None when the batch arithmetic fails."""
        accum = self.base.train.grad_accum if "train.grad_accum" in self.fixed else None
        return microbatches(self.global_batch_size, mbs, dp, accum)

    def free_options(self, tp: int) -> tuple[tuple[bool, int, str], ...]:
        """(sequence parallel, ZeRO stage, offload) of the FREE level, in the search's order."""
        return tuple(
            (s, z, off)
            for s in self.sequence_parallel(tp)
            for z in self.zero
            for off in self.offload
        )

    def backend_rule(self, c: Choice, microbatches: int) -> str | None:
        """backend-capabilities when the backend refuses the layout (``backends.refuses``: one
        of ``raw_refusals``, what validate reports), memoised on what that can depend on:
        everything but the micro-batch size and recomputation."""
        key: tuple[object, ...] = (c.tp, c.cp, c.pp, c.ep, c.vpp, c.pp_schedule, c.zero_stage)
        key += (c.offload_optimizer, c.sequence_parallel, microbatches)
        refused = self._backend_memo.get(key)
        if refused is None:
            cfg = self.apply(c)
            refused = refuses(cfg.backend.name, cfg)
            # finetune=lora|qlora: the layouts the engines run with adapters (validate's
            # "finetune" rule), on the same keys; reported under the backend's rule.
            refused = refused or bool(engine_refusals(cfg))
            self._backend_memo[key] = refused
        return "backend-capabilities" if refused else None

    def violated_rule(self, c: Choice) -> str | None:
        """The rule the search excludes this layout by (None: the rules allow it)."""
        values: dict[str, Any] = {}
        for level, add in enumerate(({}, {"tp": c.tp}, {"cp": c.cp}, {"pp": c.pp})):
            values.update(add)
            rule = self.refused(level, values)
            if rule:
                return rule
        values["dp"] = self.dp_of(c.tp, c.cp, c.pp)
        values.update(ep=c.ep, micro_batch_size=c.micro_batch_size)
        for level in (DP, EP, MBS):
            rule = self.refused(level, values)
            if rule:
                return rule
        m = values["microbatches"] = self.microbatches(c.micro_batch_size, values["dp"])
        if m is None:
            raise AssertionError(f"{c} passed the batch rules without micro-batches")
        values.update(pp_schedule=c.pp_schedule, vpp=c.vpp)
        values.update(sequence_parallel=c.sequence_parallel, zero_stage=c.zero_stage)
        values["offload_optimizer"] = c.offload_optimizer
        for level in (MICROBATCHES, SCHEDULE, FREE):
            rule = self.refused(level, values)
            if rule:
                return rule
        return self.backend_rule(c, m)

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
        parallel = copy_replacing(
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
            parallel = copy_replacing(
                parallel,
                account_for_embedding_in_pipeline_split=keys.embedding,
                account_for_loss_in_pipeline_split=keys.loss,
                num_layers_in_first_pipeline_stage=keys.first,
                num_layers_in_last_pipeline_stage=keys.last,
                pipeline_layout=keys.layout,
            )
        zero = copy_replacing(
            b.zero,
            stage=c.zero_stage,
            offload_optimizer=c.offload_optimizer,
            offload_params=self._offload_params(),
        )
        train = copy_replacing(
            b.train,
            micro_batch_size=c.micro_batch_size,
            recompute=c.recompute,
            global_batch_size=self.global_batch_size,
            grad_accum=b.train.grad_accum if "train.grad_accum" in self.fixed else None,
        )
        return copy_replacing(b, parallel=parallel, zero=zero, train=train)

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
