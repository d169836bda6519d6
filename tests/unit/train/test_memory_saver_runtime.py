"""The savers' runtime pieces on the CPU, in-process: activation offload changes nothing there
(same gradients bit for bit), the in-backward optimizer equals the plain step, and torchao's
small-state Adam steps eagerly off CUDA."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch
from torch import nn

from launcher.train.model.activation_offload import ActivationOffload
from launcher.train.optim_in_backward import InBackwardOptimizer

pytestmark = pytest.mark.unit


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


def test_activation_offload_hooks_run_and_change_nothing_on_the_cpu() -> None:
    x = torch.randn(8, 16)
    plain, hooked = _model(), _model()
    plain(x).square().sum().backward()
    offload = ActivationOffload()
    with offload.hooks():
        loss = hooked(x).square().sum()
    loss.backward()
    assert offload.stats.saved > 0 and offload.stats.moved == 0  # nowhere to move them
    for a, b in zip(plain.parameters(), hooked.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


def test_activation_offload_moves_activations_not_autocasts_weight_copies() -> None:
    # Under bf16 autocast a linear saves its input's bf16 copy (8 x 256 x 2 = 4,096 bytes: an
    # activation, moved on a GPU) and its weight's bf16 copy, transposed (256 x 256 x 2 =
    # 131,072 bytes: a weight, kept on the device with the parameter as the plan prices it).
    linear = nn.Linear(256, 256, bias=False)
    x = torch.randn(8, 256, requires_grad=True)
    offload = ActivationOffload()
    with offload.hooks(), torch.autocast("cpu", dtype=torch.bfloat16):
        y = linear(x)
    y.float().sum().backward()
    assert offload.stats.saved_bytes == 4_096 + 131_072
    assert offload.stats.movable_bytes == 4_096
    assert offload.stats.moved_bytes == 0  # the CPU: nowhere to move it


def test_activation_offload_keeps_what_follows_the_last_block_on_the_device() -> None:
    # fp32, 8 tokens of 256: l1 saves its input x (8 x 256 x 4 = 8,192 bytes; its weight is a
    # parameter), the ReLU its output (8,192), the head its input (the same 8,192-byte storage,
    # saved again) and its weight. After the last block (the ReLU here) nothing moves: the head
    # and the loss use what they save at once, in the first steps of the backward (the plan
    # prices them on the device; the chunked loss saves the output layer's fp32 weight gradient).
    model = nn.Sequential(
        nn.Linear(256, 256, bias=False), nn.ReLU(), nn.Linear(256, 256, bias=False)
    )
    x = torch.randn(8, 256)
    offload = ActivationOffload()
    offload.keep_after(model[1])
    for _ in range(2):  # every forward starts offloading again
        with offload.hooks():
            loss = model(x).square().sum()
        loss.backward()
        assert offload.stats.movable_bytes == 8_192 + 8_192


def test_in_backward_steps_equal_the_plain_step_and_free_the_gradients() -> None:
    x = torch.randn(8, 16)
    plain, fused = _model(), _model()
    optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-2, foreach=False)
    in_bwd = InBackwardOptimizer(
        list(fused.parameters()),
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False),
    )
    for _ in range(3):
        plain(x).square().sum().backward()
        norm = torch.nn.utils.clip_grad_norm_(plain.parameters(), float("inf"))
        optimizer.step()
        optimizer.zero_grad()
        fused(x).square().sum().backward()
        assert all(p.grad is None for p in fused.parameters())  # freed in the hooks
        assert in_bwd.take_grad_norm() == pytest.approx(float(norm), rel=1e-5)
    for a, b in zip(plain.parameters(), fused.parameters(), strict=True):
        assert torch.equal(a, b)
    assert len(list(in_bwd)) == 4  # one optimizer a parameter: DCP checkpoints them as a list


def test_in_backward_optimizer_does_not_keep_its_model_alive() -> None:
    # The hooks live on the parameters (C++ autograd metadata, which the garbage collector does
    # not traverse): a hook holding its optimizer (which holds the parameter) strongly made a
    # cycle no collection breaks, so a dropped engine kept its weights and states for good (the
    # savers bench measured 180 MiB of a previous engine under the next saver's peak).
    model = _model()
    in_bwd = InBackwardOptimizer(
        list(model.parameters()), lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False)
    )
    model(torch.randn(8, 16)).square().sum().backward()  # the states exist
    weights = [weakref.ref(p) for p in model.parameters()]
    del model, in_bwd
    gc.collect()
    assert all(w() is None for w in weights)


@pytest.mark.parametrize("name", ["adamw8bit", "adamw4bit", "adamw"])
def test_small_state_adam_steps_on_the_cpu(name: str) -> None:
    from launcher.config.schema import OptimConfig
    from launcher.train.optim import build_optimizer

    weight = nn.Parameter(torch.randn(64, 64))  # 4096 values: quantized states
    optim = OptimConfig(name=name, state_dtype="bf16" if name == "adamw" else "fp32", lr=1e-2)
    optimizer = build_optimizer([weight], optim)
    before = weight.detach().clone()
    for _ in range(2):
        weight.square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    assert weight.square().sum() < before.square().sum()
    state = optimizer.state[weight]["exp_avg"]
    kind = {"adamw8bit": "OptimState8bit", "adamw4bit": "OptimState4bit"}
    if name in kind:
        assert type(state).__name__ == kind[name]
    else:
        assert state.dtype == torch.bfloat16


def test_bf16_states_stay_bf16_through_load_state_dict() -> None:
    """torch's load_state_dict casts floating states to the parameter's dtype: bf16 moments came
    back fp32 (twice the bytes, and the resumed steps rounded differently)."""
    from launcher.config.schema import OptimConfig
    from launcher.train.optim import build_optimizer

    optim = OptimConfig(name="adamw", state_dtype="bf16", lr=1e-2)
    weights = [nn.Parameter(torch.randn(64, 64)) for _ in range(2)]
    weights[1].data.copy_(weights[0].data)
    first = build_optimizer([weights[0]], optim)
    weights[0].square().sum().backward()
    first.step()
    weights[1].data.copy_(weights[0].data)
    second = build_optimizer([weights[1]], optim)
    second.load_state_dict(copy.deepcopy(first.state_dict()))  # not the step tensor itself
    for _ in range(2):  # the same steps from the same state: the same bits
        for weight, optimizer in zip(weights, (first, second), strict=True):
            optimizer.zero_grad()
            weight.square().sum().backward()
            optimizer.step()
    assert torch.equal(weights[0], weights[1])
    mine, loaded = first.state[weights[0]]["exp_avg"], second.state[weights[1]]["exp_avg"]
    assert loaded.dtype == mine.dtype == torch.bfloat16


def _offloaded_pair(name: str, state_dtype: str = "fp32"):  # type: ignore[no-untyped-def]
    """Two equal weights: one stepped by the plain optimizer, one by optim.offload's."""
    from launcher.config.schema import OptimConfig
    from launcher.train.optim import build_optimizer
    from launcher.train.optim_offload import StepInTurn, offloaded

    optim = OptimConfig(name=name, state_dtype=state_dtype, lr=1e-2)
    torch.manual_seed(0)
    weights = [nn.Parameter(torch.randn(64, 64)) for _ in range(2)]
    weights[1].data.copy_(weights[0].data)
    plain = build_optimizer([weights[0]], optim)
    paged = StepInTurn([weights[1]], lambda ps: offloaded(build_optimizer(ps, optim)))
    return weights, plain, paged


@pytest.mark.parametrize(("name", "dtype"), [("adamw", "fp32"), ("adamw", "bf16")])
def test_offloaded_states_step_on_a_device_copy_and_equal_the_plain_step(
    name: str, dtype: str
) -> None:
    weights, plain, paged = _offloaded_pair(name, dtype)
    (inner,) = list(paged)
    seen: list[bool] = []

    def spy(optimizer: torch.optim.Optimizer, *_: object) -> None:  # runs after the move down
        for key in ("exp_avg", "exp_avg_sq"):
            state = optimizer.state[weights[1]].get(key)
            if state is not None:
                seen.append(state.data_ptr() != held[key].data_ptr())

    inner.register_step_pre_hook(spy)
    held: dict[str, torch.Tensor] = {}
    for _ in range(3):
        for weight, optimizer in zip(weights, (plain, paged), strict=True):
            optimizer.zero_grad()
            weight.square().sum().backward()
            optimizer.step()
        state = inner.state[weights[1]]
        if held:  # the same host buffers, written back into, step after step
            assert all(state[k] is held[k] for k in held)
        held = {k: state[k] for k in ("exp_avg", "exp_avg_sq")}
    assert seen == [True] * 4  # steps 2 and 3 updated copies, not the host buffers
    assert torch.equal(weights[0], weights[1])
    assert held["exp_avg"].dtype == (torch.bfloat16 if dtype == "bf16" else torch.float32)


@pytest.mark.parametrize(("name", "dtype"), [("adamw", "bf16"), ("adamw8bit", "fp32")])
def test_offloaded_states_come_back_to_the_host_from_a_checkpoint(name: str, dtype: str) -> None:
    weights, plain, paged = _offloaded_pair(name, dtype)
    (inner,) = list(paged)
    for weight, optimizer in zip(weights, (plain, paged), strict=True):
        weight.square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    saved = inner.state_dict()  # torchao's 8-bit state has no clone: the step tensor alone
    saved["state"] = {
        i: {k: v.clone() if k == "step" else v for k, v in entry.items()}
        for i, entry in saved["state"].items()
    }
    kind = type(inner.state[weights[1]]["exp_avg"])
    _, _, resumed = _offloaded_pair(name, dtype)  # a fresh engine's optimizer, same weight
    (fresh,) = list(resumed)
    fresh.param_groups[0]["params"] = [weights[1]]
    fresh.load_state_dict(saved)
    state = fresh.state[weights[1]]
    assert type(state["exp_avg"]) is kind  # 8-bit codes stay codes; bf16 stays bf16
    if dtype == "bf16":
        assert state["exp_avg"].dtype == torch.bfloat16
    for _ in range(3):  # the resumed steps take the same bits
        for weight, optimizer in zip(weights, (plain, resumed), strict=True):
            optimizer.zero_grad()
            weight.square().sum().backward()
            optimizer.step()
    assert torch.equal(weights[0], weights[1])
    # ... and the host keeps the states' own form after them (a bf16 moment copied into an
    # fp32 buffer made by the load came back fp32: twice the bytes, other roundings).
    state = fresh.state[weights[1]]
    assert type(state["exp_avg"]) is kind
    assert state["exp_avg"].dtype == plain.state[weights[0]]["exp_avg"].dtype
