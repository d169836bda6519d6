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
"""

from __future__ import annotations

from launcher.config.schema import LLMTrainConfig

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
