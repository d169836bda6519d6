"""The JSON contract and the Rich report."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from launcher.config.schema import ClusterConfig, LLMTrainConfig, ParallelConfig, TrainConfig
from launcher.plan.planner import make_plan
from launcher.plan.schedule import timeline
from launcher.views.plan import plan_to_json, render_plan

pytestmark = pytest.mark.unit

CONTRACT = {
    "memory": [
        "weights_bytes",
        "gradients_bytes",
        "optimizer_bytes",
        "activations_bytes",
        "buffers_bytes",
        "overhead_bytes",
        "allocated_bytes",
        "reserved_bytes",
        "capacity_bytes",
        "fits",
        "heaviest_stage",
    ],
    "time": [
        "step_s",
        "tokens_per_s",
        "tokens_per_s_per_gpu",
        "tflops_per_gpu",
        "mfu",
        "bubble_fraction",
    ],
    "flops": ["per_token_model", "per_token_hardware"],
    "totals": ["train_s", "gpu_hours", "cost_usd"],
    "checkpoint": ["size_bytes", "interval_s"],
}


def _plan():  # type: ignore[no-untyped-def]
    cfg = LLMTrainConfig(
        parallel=ParallelConfig(pp=2),
        train=TrainConfig(micro_batch_size=1, global_batch_size=16),
        cluster=ClusterConfig(gpu="a100-80gb", num_nodes=1, gpus_per_node=4),
    )
    return make_plan(cfg)


def test_json_has_the_public_keys() -> None:
    doc = plan_to_json(_plan())
    for section, keys in CONTRACT.items():
        for key in keys:
            assert key in doc[section], f"{section}.{key}"
    assert isinstance(doc["assumptions"], list) and doc["assumptions"]
    json.dumps(doc)  # serialisable
    assert doc["memory"]["allocated_bytes"] <= doc["memory"]["reserved_bytes"]


def test_render_draws_bar_timeline_and_tables() -> None:
    buf = io.StringIO()
    render_plan(_plan(), Console(file=buf, width=140, force_terminal=False), detail=True)
    out = buf.getvalue()
    for needle in ("memory", "Pipeline schedule", "Time per step", "Totals", "MFU", "stage  1"):
        assert needle in out


def test_timeline_1f1b_has_the_bubble() -> None:
    # p = 4, m = 8, F = 1, B = 2: ideal 8 * 3 = 24 per stage; 1F1B takes 24 + 3 * 3 = 33.
    slots = timeline("1f1b", 4, 8)
    assert max(s.end for s in slots) == pytest.approx(33)
    assert len(slots) == 2 * 4 * 8
