"""The accelerator catalog: what each GPU (or TPU chip, or a plain CPU) can do, looked up by the
name a user types.

Every planner estimate (per-GPU memory, step time, MFU, communication time, cost) starts from a
``GPUSpec`` looked up here with ``get_gpu(key)``. Cluster profiles (``conf/cluster/*.yaml``) name a
catalog key in ``cluster.gpu`` and may override the bandwidth and price figures per site. The
type, its units and conventions are in launcher/plan/hardware/gpu_spec.py; the entries, with their
sources, are data in launcher/plan/hardware/gpu_catalog.py.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from launcher.plan.hardware.gpu_catalog import CATALOG
from launcher.plan.hardware.gpu_spec import ARCHES, PRECISIONS, Arch, GiB, GPUSpec, MiB

__all__ = [
    "ARCHES",
    "CATALOG",
    "PRECISIONS",
    "Arch",
    "GPUSpec",
    "GiB",
    "MiB",
    "UnknownGPUError",
    "get_gpu",
    "known_gpus",
]


# Names people type for a catalog key (used only to suggest, never to resolve silently).
_ALIASES: dict[str, str] = {
    "h100": "h100-sxm",
    "h100-80gb": "h100-sxm",
    "h100-sxm5": "h100-sxm",
    "h100-nvl": "h100-pcie",
    "a100": "a100-80gb",
    "a100-sxm": "a100-80gb",
    "v100": "v100-32gb",
    "mi300": "mi300x",
    "tpu-v5": "tpu-v5p",
    "tpu": "tpu-v5p",
    "gb200-nvl72": "gb200",
    "b100": "b200",
}


class UnknownGPUError(KeyError):
    """``cluster.gpu`` names no catalog entry. Carries the known keys and a did-you-mean."""

    def __init__(self, key: str, known_keys: Sequence[str], suggestion: str | None) -> None:
        super().__init__(key)
        self.key = key
        self.known_keys: tuple[str, ...] = tuple(sorted(known_keys))
        self.suggestion = suggestion

    def __str__(self) -> str:
        hint = f"; did you mean {self.suggestion!r}?" if self.suggestion else ""
        return f"unknown GPU {self.key!r}{hint} Known GPUs: {', '.join(self.known_keys)}"


def _normalize(key: str) -> str:
    return key.strip().lower().replace("_", "-").replace(" ", "-")


def _compact(key: str) -> str:
    return "".join(ch for ch in key if ch.isalnum())


def _suggest(key: str) -> str | None:
    norm = _normalize(key)
    if norm in _ALIASES:
        return _ALIASES[norm]
    by_compact = {_compact(k): k for k in CATALOG}
    if _compact(norm) in by_compact:
        return by_compact[_compact(norm)]
    prefixed = sorted(k for k in CATALOG if k.startswith(norm)) if norm else []
    if prefixed:
        return prefixed[0]
    close = difflib.get_close_matches(norm, list(CATALOG), n=1, cutoff=0.5)
    return close[0] if close else None


def known_gpus() -> list[str]:
    """The catalog keys, sorted."""
    return sorted(CATALOG)


def get_gpu(key: str) -> GPUSpec:
    """The catalog entry for ``key`` (case and ``_``/``-`` insensitive); UnknownGPUError if none."""
    spec = CATALOG.get(_normalize(key))
    if spec is None:
        raise UnknownGPUError(key, known_gpus(), _suggest(key))
    return spec
