"""The checks that look at every weight handle every kind of tensor the engines hold: QLoRA's
NF4 base, DTensor shards, fp8 weights (torchao's fp8 all-gather wrapper and the float8 dtypes).
The trainer's finite-weights check before a checkpoint and the weights digest used to call
``torch.isfinite`` / ``.view(torch.uint8)`` on them directly: a QLoRA run died at its first save
(``NF4Tensor dispatch: aten.abs.default``)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytest.importorskip("torchao")

from launcher.train.checkpoint.tensor_parts import plain_parts, tensor_bytes  # noqa: E402
from launcher.train.trainer import Trainer  # noqa: E402
from tests.unit.train.engines.test_weights_digest import Fixed  # noqa: E402

pytestmark = pytest.mark.unit


def _finite_in_trainer(tensors: list[Any]) -> bool:
    """Trainer._weights_finite as the trainer calls it before every checkpoint."""
    holder = SimpleNamespace(engine=Fixed(tensors), device=torch.device("cpu"))
    return bool(Trainer._weights_finite(holder))  # type: ignore[arg-type]


def _nf4(values: Any) -> Any:
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    return torch.nn.Parameter(to_nf4(values.to(torch.bfloat16)), requires_grad=False)


def test_nf4_weights_are_checked_and_digested(one_process_group: None) -> None:
    weights = torch.randn(128, 256, generator=torch.Generator().manual_seed(0))
    nf4 = _nf4(weights)
    assert _finite_in_trainer([nf4, torch.ones(3)])
    digest = Fixed([nf4]).weights_digest()
    assert digest == Fixed([_nf4(weights)]).weights_digest()
    other = weights.clone()
    other[0, 0] = 3.0  # another block absmax: other codes and scalers
    assert Fixed([_nf4(other)]).weights_digest() != digest
    # A NaN in the stored float factor is found without dequantizing.
    broken = _nf4(weights)
    broken.quantization_factor[0] = math.nan
    assert not _finite_in_trainer([broken])
    assert {p.dtype for p in plain_parts(nf4)} >= {torch.uint8}
    # One element viewed out of a wider tensor keeps its stride: still digested.
    strided = torch.zeros(4, 256, dtype=torch.bfloat16)[0:1, 0]
    assert tensor_bytes(strided) == bytes(2)


def test_dtensor_shards_are_checked_and_digested(one_process_group: None) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    weights = torch.arange(12.0).reshape(3, 4)
    shard = torch.nn.Parameter(distribute_tensor(weights, mesh, [Shard(0)]))
    assert _finite_in_trainer([shard])
    assert tensor_bytes(shard) == weights.view(torch.uint8).numpy().tobytes()
    weights[1, 1] = math.inf
    assert not _finite_in_trainer([distribute_tensor(weights, mesh, [Shard(0)])])


def test_fp8_weights_are_checked_and_digested(one_process_group: None) -> None:
    from torchao.float8.float8_training_tensor import LinearMMConfig
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    weights = torch.randn(16, 16, generator=torch.Generator().manual_seed(1))
    wrapped = WeightWithDynamicFloat8CastTensor(weights, LinearMMConfig(), torch.float8_e4m3fn)
    stored = weights.to(torch.float8_e4m3fn)
    assert _finite_in_trainer([wrapped, stored])
    assert Fixed([stored]).weights_digest() == Fixed([stored.clone()]).weights_digest()
    bad = stored.clone()
    bad.view(torch.uint8)[3] = 0x7F  # e4m3fn's NaN
    assert not _finite_in_trainer([bad])
    weights[2, 2] = math.nan
    assert not _finite_in_trainer([wrapped])
