"""The GPU catalog's data: one ``GPUSpec`` (launcher/plan/hardware/gpu_spec.py, which states the
units and conventions) per accelerator, each figure with its source tag. Only data: the lookup by
the name a user types is launcher/plan/hardware/lookup.py.

Sources (tags used in the comments below)
-----------------------------------------
[NV-V100]   NVIDIA, "Programming Tensor Cores in CUDA 9" (developer.nvidia.com): V100 125 tensor
            TFLOP/s; Tesla V100 datasheet: 15.7 fp32 TFLOP/s, 900 GB/s HBM2, NVLink2 6 links /
            300 GB/s total.
[NV-A100]   NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), tabulated
            at glennklockwood.com/garden/processors/A100: 19.5 fp32, 156 tf32, 312 bf16/fp16 dense;
            1.555 TB/s (40GB), 2.039 TB/s (80GB); NVLink3 300+300 GB/s; 400 W.
[NV-H100]   NVIDIA H100 datasheet / Hopper whitepaper, tabulated at
            glennklockwood.com/garden/processors/h100 and in stas00/ml-engineering
            compute/accelerator/README.md ("TFLOPS comparison table"): SXM 66.9 fp32, 494.7 tf32,
            989.4 bf16/fp16, 1978.9 fp8 dense, 3.35 TB/s, 900 GB/s NVLink4, 700 W; PCIe 51 fp32,
            378 tf32, 756 bf16, 1513 fp8, 2 TB/s, PCIe Gen5 128 GB/s bidirectional, 350 W.
[NV-H100NVL] NVIDIA H100 NVL product brief: 60 fp32, 835 tf32*, 1671 bf16*, 3341 fp8*
            (*sparse); torchtitan uses 835e12 as the NVL bf16 dense peak.
[NV-H200]   nvidia.com/en-us/data-center/h200: 141 GB HBM3e, 4.8 TB/s, H100 compute, 700 W.
[NV-BW]     NVIDIA GB200 NVL72 and HGX B200 technical-specification table (per-GPU rows, sparse
            figures), transcribed at
            zdszero.github.io/Computer/Artificial_Intelligence/Hardware.html:
            GB200 10 PF fp8*, 5 PF bf16*, 2.5 PF tf32*, 80 TF fp32, 186 GB, 8 TB/s, up to 1200 W;
            HGX B200 9 PF fp8*, 4.5 PF bf16*, 2.2 PF tf32*, 75 TF fp32, 180 GB, 7.7 TB/s, 1000 W;
            5th-gen NVLink 1.8 TB/s per GPU.
[AMD-MI300X] amd.com MI300X specifications (via the ml-engineering TFLOPS table): 163.4 fp32,
            653.7 tf32, 1307.4 bf16/fp16, 2614.9 fp8 dense; 192 GB HBM3, 5.3 TB/s, 750 W;
            Infinity Fabric 128 GB/s bidirectional per link, 7 links to the other 7 OAMs.
[GCP-TPU]   docs.cloud.google.com/tpu/docs/v4 (275 TFLOP/s bf16, 32 GiB HBM2, 1200 GB/s, measured
            max power 192 W, 4096-chip pod) and /tpu/docs/v5p (459 TFLOP/s bf16, 95 GiB HBM2e,
            2765 GB/s, 1200 GB/s bidirectional ICI per chip, 50 Gb/s DCN per chip, largest slice
            6144 chips). Neither chip has native fp16 or fp8 matmuls.
[SCALING]   jax-ml/scaling-book tpus.md: TPU v4p ICI 4.5e10 B/s one-way per link (3D torus, 6
            links); DCN about 2.5e10 B/s per host; 4 chips per v4/v5p host.
[JAX-PREC]  docs.jax.dev "Matmul precision": full-fp32 matmuls on TPU are emulated with several
            bfloat16 passes (the BF16_BF16_F32_X6 / "bfloat16_6x" algorithm uses 6).
[MAMF]      stas00/ml-engineering compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS
            comparison table" (BF16, torch matmul, best of a shape sweep): A100 SXM 271.2/312
            (86.9%), A100 PCIe 81.1%, H100 SXM 794.5/989 (80.3%, "H200 is the same"), B200
            1745/2250 (77.6%), GB200 1822/2500 (72.9%), MI300X 668.4/1300 (51.4%, ROCm 6.3).
[MARKIDIS]  Markidis et al., "NVIDIA Tensor Core Programmability, Performance & Precision",
            IPDPSW 2018: cuBLAS reaches up to 83 TFLOP/s mixed precision on a V100 (peak 125).
[JAX-PALLAS] docs.jax.dev pallas/tpu/matmul: large bf16 matmuls reach 80-90% of the TPU v5e peak,
            XLA's own matmul slightly more.
[MLE-MEM]   stas00/ml-engineering training/performance/README.md, "Additional GPU memory usage":
            on an 80 GB GPU the CUDA-visible total is 79.15 GiB; the CUDA context + kernels take
            0.47 GiB (lazy loading) to 0.92 GiB (eager); torch.distributed (NCCL) initialisation
            takes a further ~1.45 GiB (0.55 -> 2.00 GiB with 2 ranks, more with more GPUs).
[SMI]       Public nvidia-smi / rocm-smi logs on GitHub: "Tesla V100-SXM2-32GB, 32510 MiB",
            "NVIDIA A100-SXM4-40GB, 40960 MiB", "NVIDIA A100 80GB PCIe, 81920 MiB",
            "NVIDIA H100 80GB HBM3, 81559 MiB", "NVIDIA H100 PCIe, 81559 MiB",
            "NVIDIA H800, 81559 MiB", "NVIDIA H200, 143771 MiB", "NVIDIA B200, 183359 MiB",
            "NVIDIA GB200, 189471 MiB", MI300X "VRAM Total Memory (B): 205822885888", and
            97871 MiB for the 96 GB Hopper parts (GH200 96GB, H20).
[TT]        pytorch/torchtitan docs/performance.md (Grand Teton): H100 with 96GB HBM2e, 2.4 TB/s,
            8 per host over NVLink, 400 Gb/s RDMA per GPU, default 500 W power limit; torchtitan's
            async-TP post: "non-standard ... HBM2e ... lower TDP. The actual peak TFLOPs should be
            between SXM and NVL".
[H800]      philisun.com "NVIDIA H800 vs H100": same die and AI compute as H100 SXM, NVLink cut to
            400 GB/s bidirectional, FP64 cut to 1 TFLOP/s. DeepSeek-V3 report (arXiv 2412.19437,
            section 3.2.2) measures 160 GB/s NVLink and 50 GB/s IB per GPU on its H800 cluster.
[DGX]       docs.nvidia.com DGX BasePOD reference architecture: DGX H100/H200 and DGX B200 have
            eight single-port ConnectX-7, up to 400 Gb/s each (one per GPU); DGX A100 datasheet:
            eight 200 Gb/s HDR ConnectX-6; DGX-1 (V100) datasheet: four 100 Gb/s EDR ports.
[AZ-MI300X] learn.microsoft.com ND MI300X v5-series: 8 MI300X, InfiniBand 8x400 Gb/s NDR.
[PRICE-CW]  coreweave.com/pricing, on-demand, read 2026-09-20 (transcribed in
            api-evangelist/coreweave plans/coreweave-plans-pricing.yml): HGX A100 $21.60/h,
            HGX H100 $49.24/h, HGX H200 $50.44/h, HGX B200 $68.80/h (8 GPUs each),
            GB200 NVL72 $42.00/h per 4-GPU tray.
[PRICE-LAMBDA] lambda.ai/instances, on-demand, read 2026-09-20 (api-evangelist/lambda-labs):
            8x A100 SXM 40GB $1.99, 1x H100 PCIe $3.29, 8x Tesla V100 $0.79 per GPU-hour.
[PRICE-CRUSOE] crusoe.ai/cloud/pricing, read 2026-09-20 (api-evangelist/crusoe): MI300X $3.45.
[PRICE-GCP] cloud.google.com/tpu/pricing, on-demand per chip-hour: v4 $3.22, v5p $4.20.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from launcher.plan.hardware.gpu_spec import GiB, GPUSpec, MiB

# Fixed per-process overhead on a CUDA/ROCm GPU, from [MLE-MEM] on an 80 GB GPU: 0.5 GiB between
# the nvidia-smi total and the CUDA-visible total + 0.5 GiB CUDA context/kernels (lazy loading)
# + 1.5 GiB NCCL communicators = 2.5 GiB. Measured on Hopper/Ampere; used for every CUDA/ROCm
# device here (RCCL on MI300X assumed similar).
_GPU_FIXED_OVERHEAD = int(2.5 * GiB)


SPECS: tuple[GPUSpec, ...] = (
    GPUSpec(
        key="cpu",
        name="CPU (local)",
        vendor="generic",
        arch="cpu",
        # Planning assumption for the tiny local runs: 16 GiB of host RAM given to the run.
        memory_bytes=16 * GiB,
        # Dual-channel DDR4-3200: 2 x 25.6 GB/s (estimate for a typical workstation).
        memory_bandwidth_gbps=50.0,
        # Estimate for a small workstation / CI runner: 4 cores x 2 AVX2 FMA units x 8 fp32 lanes
        # x 2 FLOP x 2.5 GHz = 0.32 TFLOP/s. bf16 runs (PyTorch CPU autocast) but is assumed no
        # faster than fp32.
        peak_tflops={"fp32": 0.32, "bf16": 0.32},
        supports_bf16=True,
        supports_fp8=False,
        # Estimate: PyTorch CPU GEMMs on small local models reach roughly half of peak.
        matmul_efficiency=0.5,
        # Estimates: one device per node (gloo over shared memory / 10 GbE between hosts).
        intra_node_bandwidth_gbps=10.0,
        inter_node_bandwidth_gbps=1.25,
        default_gpus_per_node=1,
        scale_up_domain=1,
        price_per_gpu_hour=0.0,
        # Estimate: resident size of a Python process with torch imported.
        cuda_context_bytes=int(0.5 * GiB),
        tdp_watts=None,
        intra_node_link="shared memory",
        inter_node_link="10 GbE (estimate)",
    ),
    GPUSpec(
        key="v100-32gb",
        name="NVIDIA V100 SXM2 32GB",
        vendor="nvidia",
        arch="volta",
        memory_bytes=32510 * MiB,  # [SMI] "Tesla V100-SXM2-32GB, 32510 MiB"
        memory_bandwidth_gbps=900.0,  # [NV-V100]
        # [NV-V100] 15.7 fp32 (CUDA cores), 125 fp16 tensor cores; no tf32/bf16/fp8 hardware.
        peak_tflops={"fp32": 15.7, "fp16": 125.0},
        supports_bf16=False,
        supports_fp8=False,
        # [MARKIDIS] cuBLAS up to 83 of 125 TFLOP/s = 0.66 (measured for fp16, the V100's
        # tensor-core precision, since it has no bf16).
        matmul_efficiency=0.66,
        intra_node_bandwidth_gbps=150.0,  # [NV-V100] NVLink2 300 GB/s total = 150 per direction
        inter_node_bandwidth_gbps=6.25,  # [DGX] DGX-1: 4 x 100 Gb/s EDR for 8 GPUs
        default_gpus_per_node=8,
        scale_up_domain=8,
        # [PRICE-LAMBDA] $0.79 for Lambda's 8x Tesla V100 (the 16 GB SXM2 part: the only public
        # on-demand V100 price found; a 32 GB node costs more).
        price_per_gpu_hour=0.79,
        cuda_context_bytes=_GPU_FIXED_OVERHEAD,  # [MLE-MEM]
        tdp_watts=300.0,  # [NV-V100] SXM2
        intra_node_link="NVLink2 (hybrid cube-mesh)",
        inter_node_link="InfiniBand EDR 100 Gb/s per 2 GPUs",
    ),
    GPUSpec(
        key="a100-40gb",
        name="NVIDIA A100 SXM4 40GB",
        vendor="nvidia",
        arch="ampere",
        memory_bytes=40960 * MiB,  # [SMI] "NVIDIA A100-SXM4-40GB, 40960 MiB"
        memory_bandwidth_gbps=1555.0,  # [NV-A100]
        peak_tflops={"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},  # [NV-A100]
        supports_bf16=True,
        supports_fp8=False,
        matmul_efficiency=0.87,  # [MAMF] A100 SXM 271.2 / 312 = 86.9%
        intra_node_bandwidth_gbps=300.0,  # [NV-A100] NVLink3 300+300 GB/s
        inter_node_bandwidth_gbps=25.0,  # [DGX] DGX A100: one 200 Gb/s HDR NIC per GPU
        default_gpus_per_node=8,
        scale_up_domain=8,
        price_per_gpu_hour=1.99,  # [PRICE-LAMBDA] 8x A100 SXM 40 GB, 2026-09-20
        cuda_context_bytes=_GPU_FIXED_OVERHEAD,  # [MLE-MEM]
        tdp_watts=400.0,  # [NV-A100]
        intra_node_link="NVLink3 + NVSwitch",
        inter_node_link="InfiniBand HDR 200 Gb/s per GPU",
    ),
    GPUSpec(
        key="a100-80gb",
        name="NVIDIA A100 SXM4 80GB",
        vendor="nvidia",
        arch="ampere",
        memory_bytes=81920 * MiB,  # [SMI] "NVIDIA A100 80GB ..., 81920 MiB"
        memory_bandwidth_gbps=2039.0,  # [NV-A100]
        peak_tflops={"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},  # [NV-A100]
        supports_bf16=True,
        supports_fp8=False,
        matmul_efficiency=0.87,  # [MAMF] A100 SXM 271.2 / 312 = 86.9%
        intra_node_bandwidth_gbps=300.0,  # [NV-A100]
        inter_node_bandwidth_gbps=25.0,  # [DGX] DGX A100: one 200 Gb/s HDR NIC per GPU
        default_gpus_per_node=8,
        scale_up_domain=8,
        price_per_gpu_hour=2.70,  # [PRICE-CW] HGX A100 $21.60/h / 8, 2026-09-20
        cuda_context_bytes=_GPU_FIXED_OVERHEAD,  # [MLE-MEM]
        tdp_watts=400.0,  # [NV-A100]
        intra_node_link="NVLink3 + NVSwitch",
        inter_node_link="InfiniBand HDR 200 Gb/s per GPU",
    ),
    GPUSpec(
        key="h100-sxm",
        name="NVIDIA H100 SXM5 80GB",
        vendor="nvidia",
        arch="hopper",
        memory_bytes=81559 * MiB,  # [SMI] "NVIDIA H100 80GB HBM3, 81559 MiB"
        memory_bandwidth_gbps=3350.0,  # [NV-H100]
        # [NV-H100] dense; the datasheet's 1979 bf16 / 3958 fp8 are with sparsity.
        peak_tflops={"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
        supports_bf16=True,
        supports_fp8=True,
        matmul_efficiency=0.80,  # [MAMF] H100 SXM 794.5 / 989 = 80.3%
        intra_node_bandwidth_gbps=450.0,  # [NV-H100] NVLink4 900 GB/s bidirectional
        inter_node_bandwidth_gbps=50.0,  # [DGX] DGX H100: one 400 Gb/s NDR ConnectX-7 per GPU
        default_gpus_per_node=8,
        scale_up_domain=8,
        price_per_gpu_hour=6.16,  # [PRICE-CW] HGX H100 $49.24/h / 8 = 6.155, 2026-09-20
        cuda_context_bytes=_GPU_FIXED_OVERHEAD,  # [MLE-MEM]
        tdp_watts=700.0,  # [NV-H100]
        intra_node_link="NVLink4 + NVSwitch",
        inter_node_link="InfiniBand NDR 400 Gb/s per GPU",
    ),
    GPUSpec(
        key="h100-pcie",
        name="NVIDIA H100 PCIe 80GB",
        vendor="nvidia",
        arch="hopper",
        memory_bytes=81559 * MiB,  # [SMI] "NVIDIA H100 PCIe, 81559 MiB"
        memory_bandwidth_gbps=2000.0,  # [NV-H100] HBM2e 2 TB/s
        # [NV-H100] dense (datasheet sparse figures halved).
        peak_tflops={"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0},
        supports_bf16=True,
        supports_fp8=True,
        # Estimate, no MAMF row for H100 PCIe: the H100 SXM 80.3% scaled by the A100 PCIe/SXM
        # MAMF ratio 81.1/86.9 (power-limited card) = 0.75.
        matmul_efficiency=0.75,
        # [NV-H100] PCIe Gen5 x16 128 GB/s bidirectional = 64 per direction (no NVSwitch; the
        # optional NVLink bridge joins pairs only).
        intra_node_bandwidth_gbps=64.0,
        # Estimate: PCIe servers are usually built with one 200 Gb/s NIC per GPU or less.
        inter_node_bandwidth_gbps=25.0,
        default_gpus_per_node=8,
        scale_up_domain=8,
        price_per_gpu_hour=3.29,  # [PRICE-LAMBDA] 1x H100 PCIe, 2026-09-20
        cuda_context_bytes=_GPU_FIXED_OVERHEAD,  # [MLE-MEM]
        tdp_watts=350.0,  # [NV-H100]
        intra_node_link="PCIe Gen5 x16",
        inter_node_link="200 Gb/s per GPU (estimate)",
    ),
    GPUSpec(
        key="h100-96gb",
        name="NVIDIA H100 SXM5 96GB HBM2e (500 W)",
        vendor="nvidia",
        arch="hopper",
        # No public nvidia-smi log of this SKU found; 97871 MiB is what the other 96 GB Hopper
        # parts (GH200 96GB, H20) report [SMI].
        memory_bytes=97871 * MiB,
        memory_bandwidth_gbps=2400.0,  # [TT] 2.4 TB/s HBM2e
        # [TT] the peak lies "between SXM and NVL"; planned at the (lower) H100 NVL dense figures
        # [NV-H100NVL]: 60 fp32, 417.5 tf32, 835.5 bf16/fp16, 1670.5 fp8.
        peak_tflops={"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
        supports_bf16=True,
        supports_fp8=True,
        matmul_efficiency=0.80,  # [MAMF] H100 silicon (80.3%), applied to the lower peak above
        intra_node_bandwidth_gbps=450.0,  # [TT] 8 per host fully connected over NVLink4
        inter_node_bandwidth_gbps=50.0,  # [TT] 400 Gb/s RDMA per GPU
        default_gpus_per_node=8,
        scale_up_domain=8,
        # Not sold by any public cloud (a Meta Grand Teton part); priced as an H100 SXM [PRICE-CW].
        price_per_gpu_hour=6.16,
        cuda_context_bytes=_GPU_FIXED_OVERHEAD,  # [MLE-MEM]
        tdp_watts=500.0,  # [TT] default 500 W power limit
        intra_node_link="NVLink4 + NVSwitch",
        inter_node_link="RoCE 400 Gb/s per GPU",
    ),
    GPUSpec(
        key="h800",
        name="NVIDIA H800 SXM5 80GB",
        vendor="nvidia",
        arch="hopper",
        memory_bytes=81559 * MiB,  # [SMI] "NVIDIA H800, 81559 MiB"
        memory_bandwidth_gbps=3350.0,  # [H800] same HBM3 as H100 SXM
        # [H800] AI compute identical to H100 SXM [NV-H100] (only FP64 and NVLink are cut).
        peak_tflops={"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
        supports_bf16=True,
        supports_fp8=True,
        matmul_efficiency=0.80,  # [MAMF] H100 SXM silicon, 80.3%
        # [H800] NVLink 400 GB/s bidirectional = 200 per direction (DeepSeek measures 160 GB/s).
        intra_node_bandwidth_gbps=200.0,
        inter_node_bandwidth_gbps=50.0,  # [H800] DeepSeek-V3: IB 50 GB/s per GPU
        default_gpus_per_node=8,
        scale_up_domain=8,
        # Only sold into China, no public on-demand list price found; priced as an H100 SXM.
        price_per_gpu_hour=6.16,
        cuda_context_bytes=_GPU_FIXED_OVERHEAD,  # [MLE-MEM]
        tdp_watts=700.0,  # same SXM5 board as H100 [NV-H100]
        intra_node_link="NVLink4 (reduced to 8 links) + NVSwitch",
        inter_node_link="InfiniBand NDR 400 Gb/s per GPU",
    ),
    GPUSpec(
        key="h200",
        name="NVIDIA H200 SXM 141GB",
        vendor="nvidia",
        arch="hopper",
        memory_bytes=143771 * MiB,  # [SMI] "NVIDIA H200, 143771 MiB"
        memory_bandwidth_gbps=4800.0,  # [NV-H200]
        # [NV-H200] same compute as H100 SXM [NV-H100], dense.
        peak_tflops={"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
        supports_bf16=True,
        supports_fp8=True,
        matmul_efficiency=0.80,  # [MAMF] "H200 is the same" as H100 SXM, 80.3%
        intra_node_bandwidth_gbps=450.0,  # NVLink4 900 GB/s bidirectional [NV-H200]
        inter_node_bandwidth_gbps=50.0,  # [DGX] DGX H200: one 400 Gb/s ConnectX-7 per GPU
        default_gpus_per_node=8,
        scale_up_domain=8,
        price_per_gpu_hour=6.31,  # [PRICE-CW] HGX H200 $50.44/h / 8 = 6.305, 2026-09-20
        cuda_context_bytes=_GPU_FIXED_OVERHEAD,  # [MLE-MEM]
        tdp_watts=700.0,  # [NV-H200]
        intra_node_link="NVLink4 + NVSwitch",
        inter_node_link="InfiniBand NDR 400 Gb/s per GPU",
    ),
    GPUSpec(
        key="b200",
        name="NVIDIA B200 (HGX, 1000 W)",
        vendor="nvidia",
        arch="blackwell",
        memory_bytes=183359 * MiB,  # [SMI] "NVIDIA B200, 183359 MiB"
        memory_bandwidth_gbps=7700.0,  # [NV-BW] HGX B200 7.7 TB/s per GPU
        # [NV-BW] HGX B200 per-GPU sparse figures halved: 9 PF fp8, 4.5 PF bf16, 2.2 PF tf32.
        peak_tflops={"fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
        supports_bf16=True,
        supports_fp8=True,
        matmul_efficiency=0.78,  # [MAMF] B200 1745 / 2250 = 77.6%
        intra_node_bandwidth_gbps=900.0,  # [NV-BW] NVLink5 1.8 TB/s bidirectional
        inter_node_bandwidth_gbps=50.0,  # [DGX] DGX B200: one 400 Gb/s ConnectX-7 per GPU
        default_gpus_per_node=8,
        scale_up_domain=8,
        price_per_gpu_hour=8.60,  # [PRICE-CW] HGX B200 $68.80/h / 8, 2026-09-20
        cuda_context_bytes=_GPU_FIXED_OVERHEAD,  # [MLE-MEM]
        tdp_watts=1000.0,  # [NV-BW]
        intra_node_link="NVLink5 + NVSwitch",
        inter_node_link="InfiniBand NDR 400 Gb/s per GPU",
    ),
    GPUSpec(
        key="gb200",
        name="NVIDIA GB200 NVL72 (per Blackwell GPU)",
        vendor="nvidia",
        arch="blackwell",
        memory_bytes=189471 * MiB,  # [SMI] "NVIDIA GB200, 189471 MiB" (marketed 186 GB)
        memory_bandwidth_gbps=8000.0,  # [NV-BW] 8 TB/s per GPU
        # [NV-BW] GB200 per-GPU sparse figures halved: 10 PF fp8, 5 PF bf16, 2.5 PF tf32.
        peak_tflops={"fp32": 80.0, "tf32": 1250.0, "bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0},
        supports_bf16=True,
        supports_fp8=True,
        matmul_efficiency=0.73,  # [MAMF] GB200 1822 / 2500 = 72.9%
        # [NV-BW] NVLink5 1.8 TB/s bidirectional, across all 72 GPUs of the rack.
        intra_node_bandwidth_gbps=900.0,
        # One 400 Gb/s ConnectX-7 per GPU for the scale-out fabric beyond the rack
        # (GB300 moves to 800 Gb/s ConnectX-8).
        inter_node_bandwidth_gbps=50.0,
        default_gpus_per_node=4,  # a compute tray: 2 Grace CPUs + 4 Blackwell GPUs
        scale_up_domain=72,
        price_per_gpu_hour=10.50,  # [PRICE-CW] GB200 NVL72 $42.00/h per 4-GPU tray, 2026-09-20
        cuda_context_bytes=_GPU_FIXED_OVERHEAD,  # [MLE-MEM]
        tdp_watts=1200.0,  # [NV-BW] configurable up to 1200 W
        intra_node_link="NVLink5, 72-GPU NVLink Switch domain",
        inter_node_link="InfiniBand NDR 400 Gb/s per GPU",
    ),
    GPUSpec(
        key="mi300x",
        name="AMD Instinct MI300X 192GB",
        vendor="amd",
        arch="cdna3",
        memory_bytes=205822885888,  # [SMI] rocm-smi "VRAM Total Memory (B): 205822885888"
        memory_bandwidth_gbps=5300.0,  # [AMD-MI300X]
        # [AMD-MI300X] dense; fp32 uses the matrix cores (163.4), as a fp32 GEMM does.
        peak_tflops={
            "fp32": 163.4,
            "tf32": 653.7,
            "bf16": 1307.4,
            "fp16": 1307.4,
            "fp8": 2614.9,
        },
        supports_bf16=True,
        supports_fp8=True,
        # [MAMF] MI300X 668.4 / 1300 = 51.4% (ROCm 6.3, TunableOp); an earlier ROCm 6.2 sweep
        # recorded 781.9 (60.1%).
        matmul_efficiency=0.51,
        # [AMD-MI300X] 7 Infinity Fabric links x 64 GB/s per direction (128 GB/s bidirectional).
        intra_node_bandwidth_gbps=448.0,
        inter_node_bandwidth_gbps=50.0,  # [AZ-MI300X] 8 x 400 Gb/s NDR per 8 GPUs
        default_gpus_per_node=8,
        scale_up_domain=8,
        price_per_gpu_hour=3.45,  # [PRICE-CRUSOE] MI300X on-demand, 2026-09-20
        cuda_context_bytes=_GPU_FIXED_OVERHEAD,  # [MLE-MEM], RCCL assumed like NCCL
        tdp_watts=750.0,  # [AMD-MI300X]
        intra_node_link="Infinity Fabric (xGMI), fully connected",
        inter_node_link="InfiniBand NDR 400 Gb/s per GPU",
    ),
    GPUSpec(
        key="tpu-v4",
        name="Google TPU v4",
        vendor="google",
        arch="tpu",
        memory_bytes=32 * GiB,  # [GCP-TPU] 32 GiB HBM2
        memory_bandwidth_gbps=1200.0,  # [GCP-TPU]
        # [GCP-TPU] 275 bf16; fp32 = bf16 / 6 passes [JAX-PREC]; no native fp16/fp8.
        peak_tflops={"fp32": 275.0 / 6, "bf16": 275.0},
        supports_bf16=True,
        supports_fp8=False,
        # [JAX-PALLAS] 80-90% of peak for large bf16 matmuls (measured on v5e; assumed for v4).
        matmul_efficiency=0.85,
        # [SCALING] 6 ICI links x 4.5e10 B/s one-way = 270 GB/s per chip.
        intra_node_bandwidth_gbps=270.0,
        # [SCALING] DCN ~2.5e10 B/s per host / 4 chips; only used between slices.
        inter_node_bandwidth_gbps=6.25,
        default_gpus_per_node=4,  # 4 chips per TPU VM host
        scale_up_domain=4096,  # [GCP-TPU] ICI spans the 4096-chip pod
        price_per_gpu_hour=3.22,  # [PRICE-GCP] on-demand per chip-hour
        cuda_context_bytes=1 * GiB,  # Estimate: TPU runtime / XLA reservation (no public figure)
        tdp_watts=192.0,  # [GCP-TPU] measured max power per chip
        intra_node_link="ICI 3D torus",
        inter_node_link="data-center network (DCN)",
    ),
    GPUSpec(
        key="tpu-v5p",
        name="Google TPU v5p",
        vendor="google",
        arch="tpu",
        memory_bytes=95 * GiB,  # [GCP-TPU] "HBM capacity per chip (GiB) 95"
        memory_bandwidth_gbps=2765.0,  # [GCP-TPU]
        # [GCP-TPU] 459 bf16; fp32 = bf16 / 6 passes [JAX-PREC]; fp8 runs at the bf16 rate
        # (no fp8 speed-up), so it is not listed.
        peak_tflops={"fp32": 459.0 / 6, "bf16": 459.0},
        supports_bf16=True,
        supports_fp8=False,
        matmul_efficiency=0.85,  # [JAX-PALLAS] 80-90% (measured on v5e; assumed for v5p)
        intra_node_bandwidth_gbps=600.0,  # [GCP-TPU] 1200 GB/s bidirectional ICI per chip
        inter_node_bandwidth_gbps=6.25,  # [GCP-TPU] DCN 50 Gb/s per chip, between slices
        default_gpus_per_node=4,  # [SCALING] 2x2x1 chips per host
        scale_up_domain=6144,  # [GCP-TPU] largest single slice: 96 cubes, 6144 chips
        price_per_gpu_hour=4.20,  # [PRICE-GCP] on-demand per chip-hour
        cuda_context_bytes=1 * GiB,  # Estimate: TPU runtime / XLA reservation (no public figure)
        tdp_watts=None,  # not published
        intra_node_link="ICI 3D torus",
        inter_node_link="data-center network (DCN)",
    ),
)

CATALOG: Mapping[str, GPUSpec] = MappingProxyType({s.key: s for s in SPECS})
