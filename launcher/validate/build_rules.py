"""The rule build-memory: a layout whose build or load cannot fit on the device although its
steady state would (``launcher.plan.memory.build_peak`` prices the build from what
``train.parallel.build`` does). Where the steady state does not fit either, the plan's verdict
already says so; this rule speaks only of the build. Never imports torch.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from launcher.backends.build_order import shards_before_materialising
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.validate.rule import Violation, error

if TYPE_CHECKING:
    from launcher.plan.memory.estimate import StageMemory

GIB = 1024**3


def build_overflow(
    cfg: LLMTrainConfig, layout: Layout, heaviest: StageMemory, capacity: float
) -> tuple[float, str] | None:
    """The rule's condition, in one place: (build device total, mechanism) when the build of the
    rank whose steady state is `heaviest` exceeds `capacity` (the GPU's memory, bytes) although
    training fits in it; None otherwise. `plan --search` asks it of every layout that fits
    (launcher/search/best_first.py), so that it never proposes what validate refuses."""
    from launcher.plan.memory.build_peak import of_plan

    if capacity <= 0 or cfg.cluster.gpu == "cpu" or heaviest.device_total > capacity:
        return None
    peak, build = of_plan(cfg, layout, heaviest)
    return (build, peak.mechanism) if build > capacity else None


def _heaviest(cfg: LLMTrainConfig, layout: Layout) -> tuple[StageMemory, float] | None:
    """(the heaviest rank's steady state, the GPU's memory), or None: no figure."""
    from launcher.plan.hardware.lookup import UnknownGPUError
    from launcher.plan.memory.estimate import stages_memory
    from launcher.plan.planner import hardware_view

    try:
        hw = hardware_view(cfg)
    except (UnknownGPUError, KeyError, ValueError):
        return None
    if hw.memory_bytes <= 0 or cfg.cluster.gpu == "cpu":
        return None
    stages = stages_memory(cfg, layout, hw)
    return max(stages, key=lambda s: s.device_total), float(hw.memory_bytes)


def _fits_whole(cfg: LLMTrainConfig, layout: Layout) -> bool:
    """Training and its build both fit the GPU."""
    found = _heaviest(cfg, layout)
    if found is None:
        return False
    heaviest, capacity = found
    return heaviest.device_total <= capacity and not build_overflow(cfg, layout, heaviest, capacity)


def _fixes(cfg: LLMTrainConfig, layout: Layout) -> list[tuple[str, LLMTrainConfig, Layout]]:
    """Changes that shard what the build holds whole, on backend=torch: FSDP2 (zero.stage=3)
    over the GPUs given, else over 2, 4 or 8 GPUs of the node."""
    from launcher.config.layout import derive_layout

    if not shards_before_materialising(cfg):
        return []
    zero = dataclasses.replace(cfg.zero, stage=3)
    out = []
    if layout.dp * layout.cp > 1 and cfg.zero.stage < 3:
        out.append(("zero.stage=3", dataclasses.replace(cfg, zero=zero), layout))
    for gpus in (2, 4, 8):
        if gpus <= cfg.cluster.gpus_per_node * cfg.cluster.num_nodes:
            continue
        cluster = dataclasses.replace(cfg.cluster, gpus_per_node=gpus, num_nodes=1)
        other = dataclasses.replace(cfg, zero=zero, cluster=cluster)
        try:
            out.append((f"cluster.gpus_per_node={gpus} zero.stage=3", other, derive_layout(other)))
        except ValueError:
            continue
    return out


def build_memory(cfg: LLMTrainConfig, layout: Layout) -> list[Violation]:
    from launcher.validate.finetune_rules import finetune_problems

    found = _heaviest(cfg, layout)
    if found is None:
        return []
    heaviest, capacity = found
    overflow = build_overflow(cfg, layout, heaviest, capacity)
    if overflow is None:
        return []
    build, mechanism = overflow
    steady = heaviest.device_total
    works = [
        text
        for text, other, lay in _fixes(cfg, layout)
        if not [p for p in finetune_problems(other, lay) if p[0] == "error"]
        and _fits_whole(other, lay)
    ]
    fix = works[0] if works else "a GPU with more memory (cluster.gpu)"
    return [
        error(
            "build-memory",
            ("zero.stage", "cluster.gpu"),
            f"building the model needs {build / GIB:.1f} GiB per GPU ({mechanism}), more than "
            f"the {capacity / GIB:.1f} GiB of cluster.gpu={cfg.cluster.gpu}, although training "
            f"would fit ({steady / GIB:.1f} GiB): {fix}",
        )
    ]
