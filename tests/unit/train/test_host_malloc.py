"""FSDP2 on the CPU gives freed gathered weights back to the system
(launcher.train.host_malloc). That a pinned threshold returns a freed tensor's pages is checked
in a fresh process (tests/integration/test_build_layouts.py): a test process that has run others
holds free heap chunks that serve a request whatever the threshold."""

from __future__ import annotations

import pytest

from launcher.train import host_malloc

pytestmark = pytest.mark.unit
MIB = 2**20


def test_the_threshold_is_the_smallest_gathered_weight_glibc_maps() -> None:
    h, r, vocab = 1536, 8, 259  # bench/build_peak.py's model: its weights' fp32 bytes
    weights = [4 * r * h, 4 * vocab * h, 4 * h * h, 4 * h * 4 * h]  # adapter, embedding, q, up
    assert host_malloc.gathered_threshold(weights) == 4 * vocab * h
    assert host_malloc.gathered_threshold([4 * 64 * 64, 4 * 128]) is None  # all heap-sized
    assert host_malloc.gathered_threshold([]) is None


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
