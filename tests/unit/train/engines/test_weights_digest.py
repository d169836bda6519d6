"""The weights digest that kill/resume tests compare tells weights one ulp apart."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from launcher.train.engines.base import Engine, StepResult  # noqa: E402

pytestmark = pytest.mark.unit


class Fixed(Engine):
    def __init__(self, tensors: list[torch.Tensor]):
        self.tensors = tensors

    def step(self, rows: torch.Tensor, lr: float) -> StepResult:
        raise NotImplementedError

    def evaluate(self, rows: torch.Tensor) -> float:
        raise NotImplementedError

    def save(self, directory: Path) -> list[Path]:
        raise NotImplementedError

    def load(self, directory: Path) -> None:
        raise NotImplementedError

    def local_tensors(self) -> Iterator[torch.Tensor]:
        yield from self.tensors


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_ulp_changes_the_digest(one_process_group: None, dtype: torch.dtype) -> None:
    weights = torch.linspace(-1, 1, 1000).to(dtype)
    bumped = weights.clone()
    bumped[517] = torch.nextafter(bumped[517:518].float(), torch.tensor([2.0])).to(dtype)
    if dtype == torch.bfloat16:  # nextafter in fp32 may round back: step bf16 bits directly
        bumped = weights.clone()
        bits = bumped.view(torch.int16)
        bits[517] += 1
    assert not torch.equal(weights, bumped)
    assert (weights != bumped).sum() == 1
    same = Fixed([weights.clone()]).weights_digest()
    assert Fixed([weights]).weights_digest() == same
    assert Fixed([bumped]).weights_digest() != same
    # It hashes exactly the bytes: an independent sha256 over them agrees.
    local = hashlib.sha256(weights.view(torch.uint8).numpy().tobytes()).hexdigest()
    assert same == hashlib.sha256(local.encode()).hexdigest()
