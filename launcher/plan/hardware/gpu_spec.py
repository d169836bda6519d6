"""The type of one accelerator's entry in the GPU catalog (``GPUSpec``), its units and checks.

The entries themselves are data, in launcher/plan/hardware/gpu_catalog.py; looking one up by the
name a user types (``get_gpu``) is launcher/plan/hardware/lookup.py.

Conventions
-----------
* Units: GB = 1e9 bytes, GiB = 2**30 bytes, MiB = 2**20 bytes. All bandwidths are decimal GB/s
  (1e9 bytes/s); all compute is TFLOP/s (1e12 floating-point operations per second, an FMA = 2).
* ``memory_bytes`` is the total device memory *as the device reports it* (``nvidia-smi
  --query-gpu=memory.total``, ``rocm-smi --showmeminfo vram``), in exact bytes. The marketed
  figure differs: NVIDIA's "80GB" is 80 GiB of HBM of which the driver reports 81559 MiB
  (79.6 GiB) on an H100. For TPUs, where no driver log was found, it is Google's documented
  per-chip HBM capacity. The CUDA runtime sees a little less again (``torch.cuda.mem_get_info``
  total is about 0.5 GiB under the nvidia-smi total); that gap is counted in
  ``cuda_context_bytes``.
* ``cuda_context_bytes`` is the fixed per-process overhead the planner subtracts before placing
  any tensor: driver reservation + CUDA context and kernels + NCCL/RCCL communicator buffers.
* ``peak_tflops`` holds DENSE tensor-core peaks (no 2:4 structured sparsity) from the vendor
  datasheets, for the precisions the hardware runs natively. Vendors often print sparse figures
  (2x); those are halved here and the comment says so. A precision missing from the dict is not
  supported natively (e.g. bf16 on V100, fp8 before Hopper). ``fp32`` is the fastest full-fp32
  matmul path without reduced-precision inputs (CUDA cores on NVIDIA, matrix cores on MI300X,
  6 bfloat16 passes on TPU); ``tf32`` is NVIDIA/AMD TensorFloat-32.
* ``matmul_efficiency`` is one constant per GPU type: the fraction of the dense bf16 peak that a
  large, well-shaped GEMM actually reaches (measured "maximum achievable matmul FLOPS", MAMF).
  It is an upper bound for model FLOPs utilization, not a prediction of it.
* ``intra_node_bandwidth_gbps`` is the per-GPU UNIDIRECTIONAL scale-up bandwidth (NVLink,
  Infinity Fabric, TPU ICI, PCIe), i.e. half of the "bidirectional" figure vendors print; it is
  the peak that nccl-tests' bus bandwidth approaches. ``scale_up_domain`` is how many devices
  share that fabric: 8 for an HGX/OAM server, 72 for a GB200 NVL72 rack, a whole pod slice for
  TPUs (whose hosts are joined by ICI, not by the data-center network).
* ``inter_node_bandwidth_gbps`` is the per-GPU UNIDIRECTIONAL scale-out injection bandwidth of a
  typical training cluster of that GPU (NIC line rate / GPUs per NIC), e.g. one 400 Gb/s NDR
  InfiniBand NIC per H100 = 50 GB/s. For TPUs it is the data-center network (DCN), used only
  between slices.
* ``price_per_gpu_hour`` is a public on-demand list price in USD per GPU (or chip) hour; the
  provider and the date the page was read are in the comment. Prices move; override them with
  ``cluster.price_per_gpu_hour``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

GiB = 2**30
MiB = 2**20

Arch = Literal["volta", "ampere", "hopper", "blackwell", "cdna3", "tpu", "cpu"]
ARCHES: tuple[str, ...] = ("volta", "ampere", "hopper", "blackwell", "cdna3", "tpu", "cpu")

# The precisions a spec may list in peak_tflops.
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One accelerator type. See the module docstring for units and conventions."""

    key: str
    name: str
    vendor: str  # nvidia | amd | google | generic
    arch: Arch
    # Total device memory as the device reports it, bytes.
    memory_bytes: int
    # HBM (or DRAM) bandwidth, GB/s.
    memory_bandwidth_gbps: float
    # Dense peak TFLOP/s per natively supported precision (keys from PRECISIONS; fp32 always).
    peak_tflops: Mapping[str, float]
    supports_bf16: bool
    supports_fp8: bool
    # Achievable fraction of the dense bf16 peak for large GEMMs (one constant per GPU type).
    matmul_efficiency: float
    # Per-GPU unidirectional scale-up (NVLink / xGMI / ICI / PCIe) bandwidth, GB/s.
    intra_node_bandwidth_gbps: float
    # Per-GPU unidirectional scale-out (InfiniBand / RoCE / DCN) bandwidth, GB/s.
    inter_node_bandwidth_gbps: float
    default_gpus_per_node: int
    # Devices that reach each other at intra_node_bandwidth_gbps (a server, an NVL72 rack, a slice).
    scale_up_domain: int
    # USD per GPU (chip) hour, public on-demand price.
    price_per_gpu_hour: float
    # Fixed per-process device memory overhead (reservation + CUDA context + NCCL), bytes.
    cuda_context_bytes: int
    tdp_watts: float | None = None
    intra_node_link: str = ""
    inter_node_link: str = ""

    def __post_init__(self) -> None:
        # A read-only view, so the frozen spec cannot be edited through its dict.
        object.__setattr__(self, "peak_tflops", MappingProxyType(dict(self.peak_tflops)))
        problems = list(self._problems())
        if problems:
            raise ValueError(f"GPUSpec {self.key!r}: " + "; ".join(problems))

    def _problems(self) -> Iterator[str]:
        if self.arch not in ARCHES:
            yield f"arch {self.arch!r} is not one of {', '.join(ARCHES)}"
        unknown = sorted(set(self.peak_tflops) - set(PRECISIONS))
        if unknown:
            yield f"peak_tflops has unknown precisions {unknown}"
        if "fp32" not in self.peak_tflops:
            yield "peak_tflops needs an fp32 entry"
        if any(v <= 0 for v in self.peak_tflops.values()):
            yield "peak_tflops values must be positive"
        if self.supports_bf16 != ("bf16" in self.peak_tflops):
            yield "supports_bf16 disagrees with peak_tflops"
        if self.supports_fp8 != ("fp8" in self.peak_tflops):
            yield "supports_fp8 disagrees with peak_tflops"
        if not 0 < self.matmul_efficiency <= 1:
            yield f"matmul_efficiency {self.matmul_efficiency} is not in (0, 1]"
        for name in ("memory_bytes", "memory_bandwidth_gbps", "intra_node_bandwidth_gbps"):
            if getattr(self, name) <= 0:
                yield f"{name} must be positive"
        if self.inter_node_bandwidth_gbps <= 0:
            yield "inter_node_bandwidth_gbps must be positive"
        if self.default_gpus_per_node < 1 or self.scale_up_domain < 1:
            yield "default_gpus_per_node and scale_up_domain must be >= 1"
        if self.price_per_gpu_hour < 0 or self.cuda_context_bytes < 0:
            yield "price_per_gpu_hour and cuda_context_bytes must be >= 0"

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB

    def supports(self, precision: str) -> bool:
        """Whether the device runs matmuls in ``precision`` natively (fp32/tf32/bf16/fp16/fp8)."""
        return precision in self.peak_tflops

    def peak_flops(self, precision: str) -> float:
        """Dense peak in FLOP/s for ``precision``; ValueError when it is not supported natively."""
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; one of {', '.join(PRECISIONS)}")
        if precision not in self.peak_tflops:
            have = ", ".join(p for p in PRECISIONS if p in self.peak_tflops)
            raise ValueError(f"{self.name} has no native {precision} matmuls (it has: {have})")
        return self.peak_tflops[precision] * 1e12

    def achievable_flops(self, precision: str) -> float:
        """``peak_flops(precision) * matmul_efficiency``: the large-GEMM ceiling in FLOP/s.

        The efficiency was measured for bf16; applying it to other precisions is an approximation.
        """
        return self.peak_flops(precision) * self.matmul_efficiency
