"""FSDP2 on the CPU gives freed gathered weights back to the system
(launcher.train.host_malloc)."""

from __future__ import annotations

import platform
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.train import host_malloc

pytestmark = pytest.mark.unit
MIB = 2**20
glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")


def resident() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


def _free_heap_bytes() -> int:
    """Bytes free inside glibc's main arena (mallinfo2's fordblks): a request no larger than a
    free chunk there is served from it whatever the mmap threshold."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost",
        )]  # fmt: skip

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    return int(libc.mallinfo2().fordblks)


@glibc
def test_a_freed_tensor_at_the_pinned_threshold_leaves_the_resident_set() -> None:
    """glibc raises its mmap threshold to the size of a freed mapped block, so a tensor made
    after a larger one was freed comes from the heap, and its pages stay resident when it is
    freed below the heap's top; pinned at its size, it is mapped and unmapped. The tensor is
    made larger than all the free memory of the heap (this test process has run others), which
    would otherwise serve it whatever the threshold."""
    import torch

    size = max(6 * MIB, _free_heap_bytes() + MIB)
    if size > 30 * MIB:  # mallopt takes thresholds up to 32 MiB (HEAP_MAX_SIZE / 2)
        pytest.skip(f"the heap holds {size / MIB:.0f} MiB free: no pinnable size is larger")
    try:
        assert host_malloc.pin_mmap_threshold(size)
        first = torch.ones((size + 2 * MIB) // 4)  # mapped; freed, it raises a dynamic threshold
        del first
        held = torch.ones(size // 4)  # touched: resident
        guard = torch.ones(1024)  # above it in the heap, if it came from the heap
        before = resident()
        del held
        released = before - resident()
        assert released >= size - MIB, f"{released / MIB:.1f} of {size / MIB:.1f} MiB released"
        del guard
    finally:  # glibc's starting threshold again (fixed now) for the tests after this one
        host_malloc.pin_mmap_threshold(host_malloc.GLIBC_INITIAL_MMAP_THRESHOLD)


def test_the_threshold_is_the_smallest_gathered_weight_glibc_maps() -> None:
    h, r, vocab = 1536, 8, 259  # bench/build_peak.py's model: its weights' fp32 bytes
    weights = [4 * r * h, 4 * vocab * h, 4 * h * h, 4 * h * 4 * h]  # adapter, embedding, q, up
    assert host_malloc.gathered_threshold(weights) == 4 * vocab * h
    assert host_malloc.gathered_threshold([4 * 64 * 64, 4 * 128]) is None  # all heap-sized
    assert host_malloc.gathered_threshold([]) is None


@pytest.fixture
def one_process_group() -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("stage", [0, 3])
def test_the_torch_engine_pins_it_under_fsdp_on_the_cpu(
    one_process_group: None, stage: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under FSDP2 (zero.stage=3) on the CPU: pinned at the smallest weight of 128 KiB or more,
    before the shards are materialised; without FSDP nothing is pinned."""
    from launcher.config.composition.compose import compose_config
    from launcher.train.engines.torch_engine import TorchEngine

    pinned: list[int] = []

    def pin(threshold: int) -> bool:
        pinned.append(threshold)
        return True

    monkeypatch.setenv("LLMTRAIN_DEVICE", "cpu")
    monkeypatch.setattr(host_malloc, "pin_mmap_threshold", pin)
    shape = ["model.num_layers=1", "model.hidden_size=256", "model.ffn_hidden_size=512"]
    cfg = compose_config(["recipe=tiny", "backend=torch", f"zero.stage={stage}", *shape]).config
    TorchEngine(cfg, seed=1).close()
    # 256 x 256 fp32 attention projections (256 KiB) are the smallest; the 256-token
    # vocabulary's embedding is 256 KiB too.
    assert pinned == ([4 * 256 * 256] if stage == 3 else [])
