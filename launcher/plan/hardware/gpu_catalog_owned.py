"""The GPU catalog's cards that people own or rent by the card: GeForce RTX 3090 / 4090 / 5090,
the RTX A6000 workstation card and the cloud inference cards L40S, L4 and A10G. Data only, in
``GPUSpec`` (launcher/plan/hardware/gpu_spec.py states units and conventions);
launcher/plan/hardware/gpu_catalog.py joins them to the data-centre parts.

Compute: the dense bf16 figure is the tensor-core rate **with fp32 accumulate** (what bf16
training runs: PyTorch's bf16 GEMMs accumulate in fp32), never the sparse one. GeForce cards run
fp16/bf16 with fp32 accumulate at half their fp16-accumulate rate; workstation and data-centre
cards at the full rate. fp8 likewise with fp32 accumulate (Ada and Blackwell only).

Sources (tags used below)
-------------------------
[NV-GA102]  NVIDIA Ampere GA102 GPU Architecture whitepaper (v2.1), Appendix A: RTX 3090 35.6
            fp32, 35.6 tf32, 71 fp16/bf16 tensor with fp32 accumulate (142 sparse), 936 GB/s
            GDDR6X, 24 GB, 350 W; RTX A6000 38.7 fp32, 154.8 bf16 dense (309.7 sparse).
[NV-A6000]  NVIDIA RTX A6000 datasheet: 48 GB GDDR6, 768 GB/s, NVLink bridge 112.5 GB/s
            bidirectional (pairs), PCIe Gen4 x16, 300 W.
[NV-ADA]    NVIDIA Ada Lovelace GPU Architecture whitepaper (v1.01), Appendix A: RTX 4090 82.6
            fp32, 82.6 tf32, 165.2 fp16/bf16 tensor with fp32 accumulate (330.4 sparse), 330.3 fp8
            with fp32 accumulate, 1008 GB/s GDDR6X, 24 GB, 450 W, PCIe Gen4 x16, no NVLink.
[NV-RTXBW]  NVIDIA RTX Blackwell GPU Architecture whitepaper, Appendix: RTX 5090 104.8 fp32,
            209.5 fp16/bf16 with fp32 accumulate (419 sparse), 419 fp8 with fp32 accumulate,
            32 GB GDDR7, 1792 GB/s, 575 W, PCIe Gen5 x16.
[NV-L40S]   NVIDIA L40S datasheet: 48 GB GDDR6 ECC, 864 GB/s, 91.6 fp32, 366 tf32*, 733 bf16*,
            1466 fp8* (*sparse; the sheet prints 362.05 dense bf16 beside 733 sparse: the sparse
            figures halved are used for all three), 350 W, PCIe Gen4 x16 64 GB/s bidirectional.
[NV-L4]     NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s, 30.3 fp32, 120 tf32*, 242 bf16*, 485 fp8*
            (*sparse), 72 W, PCIe Gen4 x16 64 GB/s bidirectional.
[A10G]      baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference: the A10G (AWS G5) shares
            the A10's 24 GB GDDR6 and 600 GB/s; 35 fp32, 35 tf32, 70 bf16/fp16 tensor TFLOP/s
            (the A10: 125), 300 W.
[PCIE]      PCI-SIG: PCIe 4.0 x16 moves 16 GT/s x 16 lanes x 128/130 = 31.5 GB/s per direction,
            PCIe 5.0 x16 63 GB/s. GeForce cards have peer-to-peer disabled: NCCL between two of
            them stages through host memory over the same links.
[SMI]       Public nvidia-smi logs: "NVIDIA GeForce RTX 3090, 24576 MiB", "NVIDIA GeForce RTX
            4090, 24564 MiB", "NVIDIA GeForce RTX 5090, 32607 MiB", "NVIDIA RTX A6000, 49140
            MiB", "NVIDIA L40S, 46068 MiB", "NVIDIA L4, 23034 MiB", "NVIDIA A10G, 23028 MiB".
[PRICE-RUNPOD] deploybase.ai/articles/runpod-gpu-pricing (RunPod on-demand, March 2026): RTX
            3090 $0.39, RTX 4090 $0.60, L4 $0.78, RTX 5090 $1.22, L40S $1.40 per GPU-hour;
            docs.runpod.io/serverless/pricing: A6000 $0.00034 per second ($1.22 an hour).
[PRICE-AWS] aws.amazon.com/ec2/instance-types/g5 (us-east-1 on-demand): g5.xlarge, one A10G,
            $1.006 an hour.
[MAMF-EST]  No MAMF row exists for these cards; the A100 PCIe's 81.1% ([MAMF] in
            gpu_catalog.py, a power-limited PCIe card like all of these) is assumed.
"""

from __future__ import annotations

from launcher.plan.hardware.gpu_spec import GiB, GPUSpec, MiB

# Same fixed per-process overhead as the data-centre parts (gpu_catalog._GPU_FIXED_OVERHEAD):
# 0.5 GiB driver reservation + 0.5 GiB CUDA context + 1.5 GiB NCCL ([MLE-MEM] there).
_OVERHEAD = int(2.5 * GiB)
_MAMF_EST = 0.81  # [MAMF-EST]
_GEN4, _GEN5 = 31.5, 63.0  # [PCIE] per direction
# Estimate: a workstation or a rented single-card box reaches others over 10 GbE.
_TEN_GBE = 1.25


def _card(**kw: object) -> GPUSpec:
    base: dict[str, object] = {
        "vendor": "nvidia",
        "supports_bf16": True,
        "matmul_efficiency": _MAMF_EST,
        "inter_node_bandwidth_gbps": _TEN_GBE,
        "default_gpus_per_node": 1,
        "scale_up_domain": 8,
        "cuda_context_bytes": _OVERHEAD,
        "inter_node_link": "10 GbE (estimate)",
    }
    base.update(kw)
    return GPUSpec(**base)  # type: ignore[arg-type]


OWNED_SPECS: tuple[GPUSpec, ...] = (
    _card(
        key="rtx3090",
        name="NVIDIA GeForce RTX 3090 24GB",
        arch="ampere",
        memory_bytes=24576 * MiB,  # [SMI]
        memory_bandwidth_gbps=936.0,  # [NV-GA102]
        peak_tflops={"fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0},  # [NV-GA102]
        supports_fp8=False,
        intra_node_bandwidth_gbps=_GEN4,  # [PCIE] (the optional 2-card NVLink bridge aside)
        price_per_gpu_hour=0.39,  # [PRICE-RUNPOD]
        tdp_watts=350.0,  # [NV-GA102]
        intra_node_link="PCIe Gen4 x16, no peer-to-peer",
    ),
    _card(
        key="rtx4090",
        name="NVIDIA GeForce RTX 4090 24GB",
        arch="ada",
        memory_bytes=24564 * MiB,  # [SMI]
        memory_bandwidth_gbps=1008.0,  # [NV-ADA]
        peak_tflops={"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3},
        supports_fp8=True,
        intra_node_bandwidth_gbps=_GEN4,  # [NV-ADA] no NVLink; [PCIE]
        price_per_gpu_hour=0.60,  # [PRICE-RUNPOD]
        tdp_watts=450.0,  # [NV-ADA]
        intra_node_link="PCIe Gen4 x16, no peer-to-peer",
    ),
    _card(
        key="rtx5090",
        name="NVIDIA GeForce RTX 5090 32GB",
        arch="blackwell",
        memory_bytes=32607 * MiB,  # [SMI]
        memory_bandwidth_gbps=1792.0,  # [NV-RTXBW]
        peak_tflops={"fp32": 104.8, "tf32": 104.8, "bf16": 209.5, "fp16": 209.5, "fp8": 419.0},
        supports_fp8=True,
        intra_node_bandwidth_gbps=_GEN5,  # [NV-RTXBW] PCIe Gen5, no NVLink; [PCIE]
        price_per_gpu_hour=1.22,  # [PRICE-RUNPOD]
        tdp_watts=575.0,  # [NV-RTXBW]
        intra_node_link="PCIe Gen5 x16, no peer-to-peer",
    ),
    _card(
        key="a6000",
        name="NVIDIA RTX A6000 48GB",
        arch="ampere",
        memory_bytes=49140 * MiB,  # [SMI]
        memory_bandwidth_gbps=768.0,  # [NV-A6000]
        # [NV-GA102] 154.8 bf16 dense; tf32 at half of it.
        peak_tflops={"fp32": 38.7, "tf32": 77.4, "bf16": 154.8, "fp16": 154.8},
        supports_fp8=False,
        intra_node_bandwidth_gbps=_GEN4,  # [PCIE]; the NVLink bridge joins pairs only
        price_per_gpu_hour=1.22,  # [PRICE-RUNPOD] serverless A6000
        tdp_watts=300.0,  # [NV-A6000]
        intra_node_link="PCIe Gen4 x16 (NVLink bridge for pairs)",
    ),
    _card(
        key="l40s",
        name="NVIDIA L40S 48GB",
        arch="ada",
        memory_bytes=46068 * MiB,  # [SMI]
        memory_bandwidth_gbps=864.0,  # [NV-L40S]
        peak_tflops={"fp32": 91.6, "tf32": 183.0, "bf16": 366.5, "fp16": 366.5, "fp8": 733.0},
        supports_fp8=True,
        intra_node_bandwidth_gbps=_GEN4,  # [NV-L40S] 64 GB/s bidirectional
        price_per_gpu_hour=1.40,  # [PRICE-RUNPOD]
        tdp_watts=350.0,  # [NV-L40S]
        intra_node_link="PCIe Gen4 x16",
    ),
    _card(
        key="l4",
        name="NVIDIA L4 24GB",
        arch="ada",
        memory_bytes=23034 * MiB,  # [SMI]
        memory_bandwidth_gbps=300.0,  # [NV-L4]
        peak_tflops={"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5},
        supports_fp8=True,
        intra_node_bandwidth_gbps=_GEN4,  # [NV-L4]
        price_per_gpu_hour=0.78,  # [PRICE-RUNPOD]
        tdp_watts=72.0,  # [NV-L4]
        intra_node_link="PCIe Gen4 x16",
    ),
    _card(
        key="a10g",
        name="NVIDIA A10G 24GB (AWS G5)",
        arch="ampere",
        memory_bytes=23028 * MiB,  # [SMI]
        memory_bandwidth_gbps=600.0,  # [A10G]
        peak_tflops={"fp32": 35.0, "tf32": 35.0, "bf16": 70.0, "fp16": 70.0},  # [A10G]
        supports_fp8=False,
        intra_node_bandwidth_gbps=_GEN4,  # [PCIE]
        price_per_gpu_hour=1.006,  # [PRICE-AWS]
        tdp_watts=300.0,  # [A10G]
        intra_node_link="PCIe Gen4 x16",
    ),
)
