"""The runtime's optimizers beyond Adam: Lion (written here) and SGD with momentum (torch's)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from launcher.config.schema import OptimConfig  # noqa: E402
from launcher.train.optim import Lion, build_optimizer, optimizer_class  # noqa: E402

pytestmark = pytest.mark.unit


def test_lion_matches_the_update_rule_by_hand() -> None:
    # p = [1.0, -2.0], g = [0.5, -0.25], m = 0, beta1 = 0.9, beta2 = 0.99, lr = 0.1, wd = 0.5.
    # Step 1: c = 0.1 * g = [0.05, -0.025] -> sign = [1, -1]
    #         p <- p * (1 - 0.1 * 0.5) - 0.1 * sign = [0.95 - 0.1, -1.9 + 0.1] = [0.85, -1.8]
    #         m <- 0.01 * g = [0.005, -0.0025]
    # Step 2 with g = [-0.01, -0.25]: c = 0.9 m + 0.1 g = [0.0045 - 0.001, -0.00225 - 0.025]
    #         = [0.0035, -0.02725] -> sign = [1, -1]
    #         p <- p * 0.95 - 0.1 * sign = [0.8075 - 0.1, -1.71 + 0.1] = [0.7075, -1.61]
    #         m <- 0.99 m + 0.01 g = [0.00495 - 0.0001, -0.002475 - 0.0025] = [0.00485, -0.004975]
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    opt = Lion([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.5)
    for grad, want_p in (([0.5, -0.25], [0.85, -1.8]), ([-0.01, -0.25], [0.7075, -1.61])):
        p.grad = torch.tensor(grad, dtype=torch.float64)
        opt.step()
        assert torch.allclose(p.detach(), torch.tensor(want_p, dtype=torch.float64)), p
    want_m = torch.tensor([0.00485, -0.004975], dtype=torch.float64)
    assert torch.allclose(opt.state[p]["exp_avg"], want_m)


def test_lion_sign_ignores_the_gradient_scale() -> None:
    """Lion's step has the same size whatever the gradient's magnitude (the update is a sign)."""
    a = torch.nn.Parameter(torch.zeros(3))
    b = torch.nn.Parameter(torch.zeros(3))
    for param, scale in ((a, 1e-6), (b, 1e3)):
        param.grad = torch.tensor([1.0, -2.0, 3.0]) * scale
        Lion([param], lr=0.01).step()
    assert torch.equal(a.detach(), b.detach())
    assert torch.equal(a.detach(), torch.tensor([-0.01, 0.01, -0.01]))


def test_optimizer_for_each_name() -> None:
    params = [torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(2))]
    kinds = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}
    kinds["lion"] = Lion
    for name, cls in kinds.items():
        optim = OptimConfig(name=name, betas=[0.8, 0.99])
        built = build_optimizer(params, optim)
        assert type(built) is cls
        # matrices decay, vectors do not (one split for every optimizer)
        assert [g["weight_decay"] for g in built.param_groups] == [optim.weight_decay, 0.0]
    assert optimizer_class(OptimConfig(name="sgd", betas=[0.8, 0.99]))[1]["momentum"] == 0.8
    with pytest.raises(ValueError, match=r"optim\.name='rmsprop'"):
        optimizer_class(OptimConfig(name="rmsprop"))


def test_fused_adam_on_request_only_for_adam() -> None:
    """The DeepSpeed engine asks for torch's fused Adam kernel on CUDA (one pass over ZeRO's
    flat fp32 partition); SGD and Lion have none and ignore the request."""
    params = [torch.nn.Parameter(torch.zeros(4, 4))]
    for name in ("adamw", "adam"):
        assert build_optimizer(params, OptimConfig(name=name), fused=True).defaults["fused"]
        assert not build_optimizer(params, OptimConfig(name=name)).defaults.get("fused")
    for name in ("sgd", "lion"):
        assert not build_optimizer(params, OptimConfig(name=name), fused=True).defaults.get("fused")


def test_weight_decay_reads_the_whole_shape_of_a_zero3_partition() -> None:
    """Under DeepSpeed's zero.Init a parameter is an empty 1-D stand-in and its shape is
    ``ds_shape``: a partitioned matrix still decays (read from param.dim(), every ZeRO-3 weight
    lost its decay: an AutoTP x ZeRO-3 run drifted 6e-4 from one process in 5 steps)."""
    matrix, vector = torch.nn.Parameter(torch.empty(0)), torch.nn.Parameter(torch.empty(0))
    matrix.ds_shape, vector.ds_shape = torch.Size([4, 4]), torch.Size([4])  # type: ignore[attr-defined]
    groups = build_optimizer([matrix, vector], OptimConfig(weight_decay=0.1)).param_groups
    assert [(g["weight_decay"], g["params"]) for g in groups] == [(0.1, [matrix]), (0.0, [vector])]
