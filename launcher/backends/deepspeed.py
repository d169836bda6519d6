"""``backend=deepspeed``: what llmtrain's DeepSpeed engine (launcher/train/engines/
deepspeed_engine.py) runs: data parallel with ZeRO stages 0-3 and CPU offload, configured by the
generated ds_config.json (launcher/render/ds_config.py). No tensor, pipeline, context or expert
parallel; no fp8 (the engine would train in bf16)."""

from __future__ import annotations

from launcher.backends.common import Backend

_DP_ONLY = "llmtrain's DeepSpeed engine is data parallel with ZeRO only"

BACKEND = Backend(
    name="deepspeed",
    summary="DeepSpeed: data parallel with ZeRO 0-3 and CPU offload (ds_config.json)",
    launchable=True,
    not_launchable="",
    needs="",
    devices=("cpu", "cuda"),
    degrees=frozenset(),
    degree_notes={key: _DP_ONLY for key in ("tp", "pp", "cp", "ep")},
    zero_stages=(0, 1, 2, 3),
    zero_notes={
        0: "plain data parallel",
        1: "optimizer states sharded",
        2: "optimizer states and gradients sharded",
        3: "everything sharded",
    },
    precisions=("bf16", "fp16", "fp32"),
    optimizers=("adamw", "adam"),
    # DeepSpeed docs: ZeRO-Offload of optimizer states with stage 1-3, parameters with stage 3.
    offload_optimizer_stages=(1, 2, 3),
    offload_params_stages=(3,),
    schedules=(),
    features=frozenset({"moe", "mla"}),
)
