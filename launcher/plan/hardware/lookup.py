"""The accelerator catalog: what each GPU (or TPU chip, or a plain CPU) can do, looked up by the
name a user types.

Every planner estimate (per-GPU memory, step time, MFU, communication time, cost) starts from a
``GPUSpec`` looked up here with ``get_gpu(key)``. Cluster profiles (``conf/cluster/*.yaml``) name a
catalog key in ``cluster.gpu`` and may override the bandwidth and price figures per site. The
type, its units and conventions are in launcher/plan/hardware/gpu_spec.py; the entries, with their
sources, are data in launcher/plan/hardware/gpu_catalog.py.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence

from launcher.plan.hardware.gpu_catalog import CATALOG
from launcher.plan.hardware.gpu_spec import ARCHES, PRECISIONS, Arch, GiB, GPUSpec, MiB

__all__ = [
    "ARCHES",
    "CATALOG",
    "CUSTOM",
    "PRECISIONS",
    "Arch",
    "GPUSpec",
    "GiB",
    "MiB",
    "UnknownGPUError",
    "cluster_gpu",
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
        return (
            f"unknown GPU {self.key!r}{hint} Known GPUs: {', '.join(self.known_keys)}; or "
            "cluster.gpu=custom with cluster.gpu_memory_gib, gpu_bf16_tflops and gpu_memory_gbps"
        )


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
    """The catalog entry for ``key`` (case and ``_``/``-`` insensitive); UnknownGPUError if none.
    ``custom``: the base of a GPU described by keys (``cluster_gpu`` applies them)."""
    if _normalize(key) == CUSTOM:
        return _CUSTOM_BASE
    spec = CATALOG.get(_normalize(key))
    if spec is None:
        raise UnknownGPUError(key, known_gpus(), _suggest(key))
    return spec


# cluster.gpu=custom: a GPU described by the cluster's keys alone (launcher/config/schema/
# ClusterConfig gpu_memory_gib, gpu_bf16_tflops, gpu_memory_gbps, intra_node_bandwidth_gbps).
CUSTOM = "custom"
CUSTOM_KEYS = ("gpu_memory_gib", "gpu_bf16_tflops", "gpu_memory_gbps")
# What a described GPU is assumed to have beside its keys (estimates, stated in the plan's
# assumptions): fp32 matmuls at a quarter of bf16 (tf32 class on Ampere-type tensor cores, A100:
# 78 of 312 counting tf32 at half), the A100 PCIe's measured matmul fraction ([MAMF-EST] in
# gpu_catalog_owned.py), PCIe Gen4 x16 between GPUs, no price unless cluster.price_per_gpu_hour.
_CUSTOM_BASE = GPUSpec(
    key=CUSTOM,
    name="custom GPU (cluster.gpu_* keys)",
    vendor="generic",
    arch="ampere",
    memory_bytes=24 * GiB,
    memory_bandwidth_gbps=1000.0,
    peak_tflops={"fp32": 25.0, "bf16": 100.0, "fp16": 100.0},
    supports_bf16=True,
    supports_fp8=False,
    matmul_efficiency=0.81,
    intra_node_bandwidth_gbps=31.5,
    inter_node_bandwidth_gbps=1.25,
    default_gpus_per_node=1,
    scale_up_domain=8,
    price_per_gpu_hour=0.0,
    cuda_context_bytes=int(2.5 * GiB),
    intra_node_link="PCIe Gen4 x16 (assumed)",
    inter_node_link="10 GbE (assumed)",
)


def missing_custom_keys(cluster: object) -> list[str]:
    """The cluster.gpu_* keys cluster.gpu=custom needs and `cluster` leaves unset."""
    if _normalize(str(getattr(cluster, "gpu", ""))) != CUSTOM:
        return []
    return [f"cluster.{k}" for k in CUSTOM_KEYS if getattr(cluster, k, None) is None]


def cluster_gpu(cluster: object) -> GPUSpec:
    """The GPU of a cluster section: the catalog entry of cluster.gpu (or the custom base) with
    cluster.gpu_memory_gib, gpu_bf16_tflops and gpu_memory_gbps in place of its figures.
    UnknownGPUError as get_gpu; ValueError when cluster.gpu=custom lacks a key."""
    key = str(getattr(cluster, "gpu", ""))
    missing = missing_custom_keys(cluster)
    if missing:
        raise ValueError(f"cluster.gpu=custom needs {', '.join(missing)}")
    spec = _CUSTOM_BASE if _normalize(key) == CUSTOM else get_gpu(key)
    memory = getattr(cluster, "gpu_memory_gib", None)
    tflops = getattr(cluster, "gpu_bf16_tflops", None)
    gbps = getattr(cluster, "gpu_memory_gbps", None)
    changes: dict[str, object] = {}
    if memory is not None:
        changes["memory_bytes"] = int(float(memory) * GiB)
    if gbps is not None:
        changes["memory_bandwidth_gbps"] = float(gbps)
    if tflops is not None:
        # Every precision scales with the bf16 figure given (the card's own ratios kept).
        scale = float(tflops) / spec.peak_tflops["bf16"] if spec.supports_bf16 else 1.0
        peaks = {p: v * scale for p, v in spec.peak_tflops.items()}
        peaks["bf16"] = float(tflops)
        changes.update(peak_tflops=peaks, supports_bf16=True)
    return dataclasses.replace(spec, **changes) if changes else spec  # type: ignore[arg-type]
