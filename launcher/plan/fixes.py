"""`plan`'s "Smallest changes that fit": the changes that make the heaviest rank fit, each with
its memory and the step time it costs (``suggest_fixes``).

One change each, as a user types it:
- the layout: ZeRO stage up, selective then full recompute, a smaller micro-batch (a global
  batch given kept through more accumulation; a derived one shrinks with it), tp up within the
  world, pp up, ZeRO's CPU offload of the optimizer (with the stage it needs) and the zero
  group's options (``zero=stage3-offload``);
- the torch engine's memory savers (launcher/backends/memory_savers.py and optimizer_offload.py
  say which engine runs which; launcher/plan/memory/memory_savers.py and offload.py price them):
  ``precision=bf16-pure`` from bf16 mixed precision (full training: no fp32 master),
  ``optim.name=adamw8bit`` from adamw, ``optim.state_dtype=bf16`` for adam / adamw,
  ``optim.in_backward=true``, ``optim.offload=cpu``, ``train.activation_offload=true``. A saver
  is a candidate only where the backend's table runs it (no refusal naming its key); the
  number-changing ones (pure bf16 rounds small updates away, 8-bit states) are offered like the
  others, their step time beside them, for the user to weigh.

Every candidate must pass ``accept`` (validate's rules, which the layers above plan pass in: plan
never imports validate; a fix that validate refuses is no fix) and is re-planned with the same
memory function. When no single change fits, pairs are tried, then triples (issue #40: Llama 2
7B fully fine-tuned on one RTX 4090 needs pure bf16, the states on the host and one more); the
fewest changes that fit are offered, fastest first: by tokens a second (a smaller derived global
batch makes a shorter step, not a faster run), ties by less memory.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from launcher.backends.common import backend_of, raw_refusals
from launcher.config.layout import derive_layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan import preference
from launcher.plan.flops import config_flops
from launcher.plan.memory.estimate import HardwareView, MemoryPlan, estimate_memory
from launcher.plan.timing.estimate import estimate_time

# The most changes a fix combines (issue #40's example needs three).
MAX_CHANGES = 3

# The memory savers tried (module docstring), as the screen names them.
SAVERS = (
    "precision=bf16-pure",
    "optim.name=adamw8bit",
    "optim.state_dtype=bf16",
    "optim.in_backward=true",
    "optim.offload=cpu",
    "train.activation_offload=true",
)

# section -> key -> value: what one change sets.
Changes = dict[str, dict[str, object]]


@dataclass(frozen=True)
class Fix:
    """One change that makes the configuration fit: the override line and the memory it gives."""

    overrides: tuple[str, ...]
    device_bytes: float
    fits: bool
    # The step time with the fix (what it costs in speed beside what it saves); 0: not priced.
    step_s: float = 0.0
    tokens_per_s: float = 0.0
    # Sequences a step with the fix (a smaller micro-batch shrinks a derived global batch).
    global_batch_size: int = 0

    @property
    def line(self) -> str:
        return " ".join(self.overrides)


@dataclass(frozen=True)
class _Change:
    """One candidate: the words a user types and the values they set."""

    overrides: tuple[str, ...]
    changes: Changes

    @property
    def keys(self) -> frozenset[str]:
        """What it changes, for telling combinable changes apart: a key, or its whole section
        for zero and precision (``zero.stage=3`` and ``zero=stage3-offload`` both change zero)."""
        out = set()
        for line in self.overrides:
            key = line.split("=", 1)[0]
            section = key.split(".", 1)[0]
            out.add(section if section in ("zero", "precision") else key)
        return frozenset(out)


def is_saver(override: str) -> bool:
    """Whether an override of a fix is one of the memory savers (not a layout change)."""
    return override in SAVERS


def with_sections(cfg: LLMTrainConfig, **parts: dict[str, object]) -> LLMTrainConfig:
    """`cfg` with some keys of its sections replaced (``zero={"stage": 3}``: zero.stage=3)."""
    changes = {
        name: dataclasses.replace(getattr(cfg, name), **vals) for name, vals in parts.items()
    }
    return dataclasses.replace(cfg, **changes)


def memory_only(cfg: LLMTrainConfig, hw: HardwareView, headroom: float) -> MemoryPlan:
    """The memory `make_plan` gives `cfg` (preference objectives priced as it prices them)."""
    priced = preference.priced_config(cfg)
    memory = estimate_memory(priced, derive_layout(priced), hw, headroom)
    return preference.with_reference_copy(cfg, memory)


@functools.cache
def group_options(group: str) -> dict[str, dict[str, object]]:
    """conf/GROUP/NAME.yaml's keys by option name (flat key: value files)."""
    import yaml

    from launcher import resources

    options: dict[str, dict[str, object]] = {}
    for name in resources.group_options(group):
        path = resources.conf_dir() / group / f"{name}.yaml"
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(values, dict):
            options[name] = {k: v for k, v in values.items() if k != "defaults"}
    return options


def _layout_changes(cfg: LLMTrainConfig) -> list[_Change]:
    """ZeRO, recompute, micro-batch, tp, pp, ZeRO offload and the zero group's options."""
    layout = derive_layout(cfg)
    world = layout.world_size
    out: list[_Change] = []
    z = cfg.zero.stage
    out += [_Change((f"zero.stage={s}",), {"zero": {"stage": s}}) for s in range(z + 1, 4)]
    order = ["none", "selective", "full"]
    for r in order[order.index(cfg.train.recompute) + 1 :]:
        out.append(_Change((f"train.recompute={r}",), {"train": {"recompute": r}}))
    mbs = layout.micro_batch_size
    while mbs > 1:
        mbs //= 2
        out.append(_micro_batch(cfg, mbs, layout.global_batch_size // max(1, mbs * layout.dp)))
    for tp in (2, 4, 8, 16):
        mp = tp * layout.pp * layout.cp
        if tp > layout.tp and world % mp == 0 and cfg.model.num_attention_heads % tp == 0:
            out.append(_Change((f"parallel.tp={tp}",), {"parallel": {"tp": tp, "dp": None}}))
    for pp in (2, 4, 8, 16, 32):
        mp = layout.tp * pp * layout.cp
        if pp > layout.pp and world % mp == 0 and cfg.model.num_layers >= pp:
            parallel: dict[str, object] = {"pp": pp, "dp": None, "pp_layers": None}
            out.append(_Change((f"parallel.pp={pp}",), {"parallel": parallel}))
    if cfg.zero.offload_optimizer != "cpu":
        for stage in range(max(1, z), 4):
            lead = () if stage == z else (f"zero.stage={stage}",)
            zero: dict[str, object] = {"stage": stage, "offload_optimizer": "cpu"}
            out.append(_Change((*lead, "zero.offload_optimizer=cpu"), {"zero": zero}))
    # The zero group's options (`zero=stage3-offload`): several keys at once, as a user types them.
    for option, values in group_options("zero").items():
        changed = with_sections(cfg, zero=values)
        if changed.zero != cfg.zero and changed.zero.stage >= z:
            out.append(_Change((f"zero={option}",), {"zero": values}))
    return out


def _micro_batch(cfg: LLMTrainConfig, mbs: int, accum: int) -> _Change:
    """A smaller micro-batch as pasting it gives: a global batch given stays (more accumulation,
    derived, or `accum` typed beside it where train.grad_accum is set); a derived one (null)
    shrinks with it."""
    words: tuple[str, ...] = (f"train.micro_batch_size={mbs}",)
    train: dict[str, object] = {"micro_batch_size": mbs}
    if cfg.train.global_batch_size is not None and cfg.train.grad_accum is not None:
        words += (f"train.grad_accum={max(1, accum)}",)
        train["grad_accum"] = max(1, accum)
    return _Change(words, {"train": train})


def _saver_changes(cfg: LLMTrainConfig) -> list[_Change]:
    """The torch engine's memory savers not yet in force (module docstring), where the backend's
    table runs them."""
    o, p, t = cfg.optim, cfg.precision, cfg.train
    out: list[_Change] = []
    pure = group_options("precision").get("bf16-pure")
    if pure and p.name == "bf16" and not p.fp8 and cfg.finetune.name == "full":
        out.append(_Change(("precision=bf16-pure",), {"precision": pure}))
    if o.name == "adamw" and o.state_dtype == "fp32" and "adamw8bit" in backend_of(cfg).optimizers:
        out.append(_Change(("optim.name=adamw8bit",), {"optim": {"name": "adamw8bit"}}))
    if o.name in ("adam", "adamw") and o.state_dtype == "fp32":
        out.append(_Change(("optim.state_dtype=bf16",), {"optim": {"state_dtype": "bf16"}}))
    if not o.in_backward:
        out.append(_Change(("optim.in_backward=true",), {"optim": {"in_backward": True}}))
    if o.offload != "cpu":
        out.append(_Change(("optim.offload=cpu",), {"optim": {"offload": "cpu"}}))
    if not t.activation_offload:
        out.append(
            _Change(("train.activation_offload=true",), {"train": {"activation_offload": True}})
        )
    return [c for c in out if not _refused(cfg, c)]


def _refused(cfg: LLMTrainConfig, change: _Change) -> bool:
    """The backend's table refuses the change itself: a refusal naming one of its keys."""
    changed = with_sections(cfg, **change.changes)
    named = {key for section, vals in change.changes.items() for key in _dotted(section, vals)}
    return any(set(r.keys) & named for r in raw_refusals(cfg.backend.name, changed))


def _dotted(section: str, values: dict[str, object]) -> list[str]:
    """The dotted keys a change sets, and its section (a group option names the section)."""
    return [section, *(f"{section}.{k}" for k in values)]


def _combined(changes: tuple[_Change, ...]) -> _Change | None:
    """Several changes at once, or None when two touch the same key."""
    seen: set[str] = set()
    merged: Changes = {}
    for change in changes:
        if seen & change.keys:
            return None
        seen |= change.keys
        for section, vals in change.changes.items():
            merged[section] = {**merged.get(section, {}), **vals}
    return _Change(tuple(w for c in changes for w in c.overrides), merged)


def suggest_fixes(
    cfg: LLMTrainConfig,
    hw: HardwareView,
    headroom: float,
    limit: int = 6,
    accept: Callable[[LLMTrainConfig], bool] | None = None,
) -> tuple[Fix, ...]:
    """The fewest changes that make the heaviest rank fit, fastest first (module docstring)."""
    valid = accept or (lambda _: True)
    singles = [
        c
        for c in (*_layout_changes(cfg), *_saver_changes(cfg))
        if valid(with_sections(cfg, **c.changes))
    ]
    for size in range(1, MAX_CHANGES + 1):
        fitting: list[Fix] = []
        for group in itertools.combinations(singles, size):
            change = _combined(group)
            if change is None:
                continue
            changed = with_sections(cfg, **change.changes)
            memory = memory_only(changed, hw, headroom)
            # Memory first (arithmetic); validate's rules only for what fits (singles passed).
            if memory.fits and (size == 1 or valid(changed)):
                fitting.append(_timed(change.overrides, changed, hw, memory))
        if fitting:
            ranked = sorted(fitting, key=lambda f: (-f.tokens_per_s, f.device_bytes, f.line))
            return tuple(ranked[:limit])
    return ()


def _timed(
    overrides: tuple[str, ...], cfg: LLMTrainConfig, hw: HardwareView, memory: MemoryPlan
) -> Fix:
    """The fix with the step time of its configuration (the speed it costs)."""
    layout = derive_layout(cfg)
    time = estimate_time(cfg, layout, hw, config_flops(cfg), memory.stages)
    return Fix(
        overrides,
        memory.heaviest.device_total,
        memory.fits,
        time.step_s,
        time.tokens_per_s,
        layout.global_batch_size,
    )
