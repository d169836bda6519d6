"""Where each engine keeps the gradients when it offloads to the CPU (memory.stage_states asks).

- DeepSpeed, zero.offload_optimizer=cpu: the fp32 gradient partitions live on the host with the
  optimizer. ZeRO-3: deepspeed/runtime/zero/stage3.py (0.19.8) sets the optimizer's device to the
  CPU when the optimizer is offloaded and allocates ``grad_partitions_flat_buffer`` (dtype
  ``gradient_accumulation_dtype``, fp32 by default) there; ZeRO-1/2: stage_1_and_2.py pins each
  fp32 partition's ``.grad`` in host memory. With ZeRO-2/3 nothing of the gradients stays on the
  GPU between reductions (the reduce buckets are counted as buffers); ZeRO-1 keeps its unsharded
  low-precision gradients on the GPU and adds the fp32 partition on the host. DeepSpeed's own
  estimator agrees: ``estimate_zero3_model_states_mem_needs`` (stage3.py) counts 18 bytes per
  parameter on the host with parameter offload (2 weights + 4 gradients + 12 Adam states) and 16
  without, times an ``additional_buffer_factor`` of 1.5 it adds as a margin.
- torch FSDP2, zero.offload_params=cpu: ``CPUOffloadPolicy`` keeps the sharded parameters, their
  gradients and the optimizer states on the CPU (torch/distributed/fsdp/_fully_shard/
  _fsdp_api.py: the optimizer step runs on the CPU), so the sharded gradients are host memory.
- Megatron's --optimizer-cpu-offload and every other case: the gradients stay where they were.

optim.offload=cpu (backend=torch, launcher/train/optim_offload.py) is another design: Adam's
moments (m and v, block-quantized for adamw8bit / adamw4bit) live in pinned host memory and are
copied to the GPU one parameter at a time for an update that runs there, then copied back; the
weights (and under mixed precision the fp32 parameters, which are the master) and the gradients
stay on the GPU. bitsandbytes' paged optimizers (docs: "Paged optimizers", CUDA unified memory
paging the states out when the GPU runs short; torchtune's single-device full recipes run
PagedAdamW8bit with optimizer_in_bwd) keep the same bytes on the host under pressure; torchao's
CPUOffloadOptimizer (torchao/optim/cpu_offload.py, 0.18) and ZeRO-Offload (Ren et al. 2021)
move the fp32 master and the step to the host too. Priced here, one formula each:
- device: the states of the largest trainable tensor (memory_savers.largest_trainable_tensor),
  the only ones on the GPU at a time; host: every parameter's states.
- time: every state byte crosses the host link twice a step (down before its update, up after
  it), at timing.estimate.PCIE_GBPS (pinned cudaMemcpy over PCIe 4.0 x16, cited there),
  serialised with the update (the engine copies on the compute stream: nothing hides it).
  On the CPU (cluster=cpu) the host is the device: nothing saved, nothing priced.
"""

from __future__ import annotations

from launcher.backends.common import backend_of
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.plan.memory.memory_savers import largest_trainable_tensor

# DeepSpeed's estimate_zero3_model_states_mem_needs: host bytes x this margin (stage3.py).
DEEPSPEED_HOST_BUFFER_FACTOR = 1.5


def gradient_placement(
    cfg: LLMTrainConfig, gradients: float, fp32_partition: float
) -> tuple[float, float]:
    """(GPU, host) bytes of one GPU's gradients. `gradients`: what the GPU holds without
    offload (sharded by the ZeRO stage); `fp32_partition`: its fp32 gradient partition's bytes."""
    z, backend = cfg.zero, cfg.backend.name
    if backend == "deepspeed" and z.offload_optimizer == "cpu" and z.stage >= 1:
        return (0.0 if z.stage >= 2 else gradients), fp32_partition
    if backend == "torch" and z.offload_params == "cpu" and z.stage >= 2:
        return 0.0, gradients
    return gradients, 0.0


def offload_assumption(cfg: LLMTrainConfig) -> str:
    """The plan's assumption line on offload: what stays on the GPU, what the host holds."""
    z, backend = cfg.zero, cfg.backend.name
    if backend == "deepspeed":
        return (
            "CPU offload (DeepSpeed): optimizer states and fp32 gradient partitions on the host"
            + (", with the sharded weights" if z.offload_params == "cpu" else "")
            + "; host per node = those bytes x GPUs per node (DeepSpeed's "
            f"estimate_zero3_model_states_mem_needs asks {DEEPSPEED_HOST_BUFFER_FACTOR:g}x that "
            "as a margin)."
        )
    if backend == "torch":
        return (
            "CPU offload (FSDP2 CPUOffloadPolicy): sharded weights, gradients and optimizer "
            "states on the host; host per node = per GPU x GPUs per node."
        )
    return (
        "CPU offload (Megatron --optimizer-cpu-offload): the distributed optimizer's states on "
        "the host; gradients stay on the GPU."
    )


def pages_states(cfg: LLMTrainConfig) -> bool:
    """Whether optim.offload=cpu moves the optimizer states off the GPU (torch, not the CPU)."""
    return (
        cfg.optim.offload == "cpu" and backend_of(cfg).name == "torch" and cfg.cluster.gpu != "cpu"
    )


def state_placement(
    cfg: LLMTrainConfig, layout: Layout, optimizer: float, params: float, moment_bytes: float
) -> tuple[float, float]:
    """(GPU, host) bytes of the optimizer bucket under optim.offload=cpu (module docstring):
    `optimizer` the bucket without it, `params` the trainable parameters whose states move,
    `moment_bytes` their states' bytes per parameter (the master, if any, stays)."""
    if not pages_states(cfg):
        return optimizer, 0.0
    host = moment_bytes * params
    one = moment_bytes * largest_trainable_tensor(cfg, layout)
    return optimizer - host + one, host


def paged_states_s(host_state_bytes: float, pcie_gbps: float) -> float:
    """Seconds a step spends copying optim.offload's states down and back (module docstring)."""
    return 2.0 * host_state_bytes / (pcie_gbps * 1e9)


def paged_states_note(cfg: LLMTrainConfig, host_state_bytes: float, pcie_gbps: float) -> str:
    """The plan's saver line for optim.offload."""
    if not pages_states(cfg):
        return "optimizer states offload: runs on the CPU with nothing to move (no saving)"
    gib = host_state_bytes / 2**30
    return (
        f"optimizer states on the host (optim.offload=cpu): {gib:.2f} GiB, one parameter's on "
        f"the GPU at a time; {2 * gib:.2f} GiB over PCIe a step "
        f"(+{paged_states_s(host_state_bytes, pcie_gbps):.2f} s at {pcie_gbps:g} GB/s)"
    )
