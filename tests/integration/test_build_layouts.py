"""The build gives the same whole weights whatever the layout: a tiny model built (no training)
under one process, FSDP2 over 4, tensor parallel 2, pipeline parallel 2 and DeepSpeed ZeRO-3
over 2 holds, parameter by parameter, the tensors ``init_weights`` draws for the whole model in
this process; LoRA adapters too. Each rank materialises its shard alone
(``launcher.train.parallel.build``)."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import pytest

from tests.integration.test_torch_engine import B4, LLAMA, TINY, UNTIED, launch

pytestmark = pytest.mark.integration

LORA = ["finetune=lora", "finetune.targets=[all-linear]", "finetune.rank=4"]


def _digest(tensor: Any) -> str:
    import torch

    data = tensor.detach().to("cpu", torch.float32).contiguous().reshape(-1)
    return hashlib.sha256(data.view(torch.uint8).numpy().tobytes()).hexdigest()


def _whole_digests(overrides: list[str], nproc: int, steps: int, opts: dict[str, Any]) -> Any:
    """One rank: build the engine; {name: sha256 of the whole tensor} over every stage."""
    import torch
    import torch.distributed as dist

    from launcher.config.composition.compose import compose_config
    from launcher.train.engines.dist import init_process_group_from_env
    from launcher.train.parallel.build import whole_tensors
    from launcher.train.trainer import build_engine

    torch.set_num_threads(1)
    os.environ["LLMTRAIN_DEVICE"] = "cpu"
    os.environ["DS_ACCELERATOR"] = "cpu"
    cfg = compose_config([*overrides, f"cluster.gpus_per_node={nproc}"]).config
    init_process_group_from_env()
    try:
        engine: Any = build_engine(cfg)
        parts = engine.parts if hasattr(engine, "parts") else [engine.engine.module]
        mine = {}
        for part in parts:
            for name, tensor in whole_tensors(part):
                mine[name.replace("module.", "", 1) if name.startswith("module.") else name] = (
                    _digest(tensor)
                )
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        union: dict[str, str] = {}
        for part in everyone:
            union.update(part)
        return union
    finally:
        dist.destroy_process_group()


def _reference(overrides: list[str]) -> dict[str, str]:
    """The whole model drawn in this process, as one process would hold it."""
    from launcher.config.composition.compose import compose_config
    from launcher.train.finetune.lora import wrap_adapters
    from launcher.train.model.init_weights import clean_name
    from launcher.train.model.transformer import build_model

    cfg = compose_config(overrides).config
    model = build_model(cfg.model, "meta")
    if cfg.finetune.name != "full":
        import torch

        wrap_adapters(model, cfg.model, cfg.finetune, torch.float32)
    from launcher.train.model.init_weights import init_rules

    rules = init_rules(model, cfg.train.seed)
    return {
        clean_name(n): _digest(rules[clean_name(n)].full(tuple(p.shape)))
        for n, p in model.named_parameters()
    }


CASES: dict[str, tuple[int, list[str]]] = {
    "one": (1, []),
    "fsdp2-dp4": (4, ["zero.stage=3", "train.global_batch_size=4"]),
    "tp2": (2, ["parallel.tp=2", *LLAMA]),
    "pp2": (2, ["parallel.pp=2", "zero.stage=0", UNTIED, *B4]),
    "deepspeed-zero3": (2, ["backend=deepspeed", "zero.stage=3", *B4]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_same_whole_weights_in_every_layout(name: str) -> None:
    nproc, layout = CASES[name]
    overrides = [*LORA, *layout]
    [first, *others] = launch(nproc, overrides, 0, _whole_digests)
    assert all(o == first for o in others)
    want = _reference([*TINY, *overrides, f"cluster.gpus_per_node={nproc}"])
    assert first == want


# Run in a fresh interpreter: glibc raises its mmap threshold to the size of a freed mapped block,
# so a 6 MiB tensor made after an 8 MiB one was freed comes from the heap, and its pages stay
# resident when it is freed below the heap's top; pinned at 6 MiB (launcher.train.host_malloc),
# it is mapped and unmapped. Prints the bytes freeing it gave back.
_PINNED_FREE = """
import sys
from pathlib import Path
import torch
from launcher.train import host_malloc

def resident():
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096

if sys.argv[1] == "pin":
    assert host_malloc.pin_mmap_threshold(6 << 20)
first = torch.ones((8 << 20) // 4)  # mapped; freeing it raises a dynamic threshold
del first
held = torch.ones((6 << 20) // 4)  # touched: resident
guard = torch.ones(1024)  # above it in the heap, if it came from the heap
before = resident()
del held
print(before - resident())
"""


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_a_freed_tensor_at_the_pinned_threshold_leaves_the_resident_set() -> None:
    import subprocess
    import sys

    released = {}
    for mode in ("pin", "dynamic"):
        done = subprocess.run(
            [sys.executable, "-c", _PINNED_FREE, mode], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
        released[mode] = int(done.stdout.split()[-1])
    assert released["pin"] >= 5 << 20, released  # given back
    assert released["dynamic"] < 1 << 20, released  # glibc's own threshold keeps it: the cause
