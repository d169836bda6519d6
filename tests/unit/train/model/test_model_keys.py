"""Model and optimizer keys a real Llama/GPT run needs: rope_theta, norm_eps, dropout, WSD schedule;
and that rendered DeepSpeed / Megatron-LM jobs carry them."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from launcher.config.composition.compose import compose_config
from launcher.config.schema import ModelConfig, OptimConfig
from launcher.render.ds_config import ds_config, runtime_ds_config
from launcher.render.megatron_args import megatron_args
from launcher.train.model.init_weights import init_weights
from launcher.train.model.transformer import Transformer, rope_tables, seed_step
from launcher.train.optim import learning_rate
from launcher.validate.rules import check

pytestmark = pytest.mark.unit

LLAMA_TINY = ModelConfig(
    num_layers=2,
    hidden_size=32,
    ffn_hidden_size=64,
    num_attention_heads=4,
    num_kv_heads=2,
    vocab_size=64,
    seq_length=16,
    activation="swiglu",
    norm="rmsnorm",
    position="rope",
    tie_embeddings=False,
)


def _model(cfg: ModelConfig) -> Transformer:
    model = Transformer(cfg)
    init_weights(model, seed=7)
    return model


def test_rope_theta_changes_the_rotation() -> None:
    # Position 1, first frequency pair: angle = 1 / theta^(0/dim) = 1 rad for any theta; the last
    # pair (i = dim/2 - 1 = 3 for dim 8) turns by theta^(-6/8): 10000^-0.75 = 1e-3 rad.
    _, sin = rope_tables(2, 8, torch.device("cpu"), theta=10_000.0)
    assert math.isclose(float(sin[1, 0]), math.sin(1.0), rel_tol=1e-6)
    assert math.isclose(float(sin[1, 3]), math.sin(1e-3), rel_tol=1e-4)
    _, sin_big = rope_tables(2, 8, torch.device("cpu"), theta=500_000.0)
    assert math.isclose(float(sin_big[1, 3]), math.sin(500_000.0**-0.75), rel_tol=1e-4)
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    a = _model(LLAMA_TINY)(tokens)
    b = _model(dataclasses.replace(LLAMA_TINY, rope_theta=500_000.0))(tokens)
    assert not torch.allclose(a, b)


def test_norm_eps_reaches_every_norm() -> None:
    model = _model(dataclasses.replace(LLAMA_TINY, norm_eps=1e-5))
    norms = [m for m in model.modules() if isinstance(m, torch.nn.RMSNorm)]
    assert len(norms) == 5 and all(m.eps == 1e-5 for m in norms)  # 2 per layer + final
    default = _model(LLAMA_TINY)
    assert all(m.eps == 1e-6 for m in default.modules() if isinstance(m, torch.nn.RMSNorm))


def test_dropout_is_reproducible_per_step_and_off_in_eval() -> None:
    model = _model(dataclasses.replace(LLAMA_TINY, attention_dropout=0.1, hidden_dropout=0.1))
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    seed_step(1, 5, 0)
    a = model(tokens)
    seed_step(1, 5, 0)
    b = model(tokens)
    seed_step(1, 6, 0)
    c = model(tokens)
    assert torch.equal(a, b) and not torch.allclose(a, c)
    model.eval()
    assert torch.equal(model(tokens), model(tokens))


@pytest.mark.parametrize(
    ("style", "at_16"),
    # lr 1, min_lr 0.1, 20 steps, decay over the last 0.2 * 20 = 4 steps (16..19). Step 16 is 1/4 of
    # the way: linear leaves 0.75 of the span, 1 - sqrt(0.25) = 0.5, cosine (1 + cos(pi/4)) / 2.
    [
        ("linear", 0.1 + 0.9 * 0.75),
        ("minus_sqrt", 0.1 + 0.9 * 0.5),
        ("cosine", 0.1 + 0.9 * (1 + math.cos(math.pi / 4)) / 2),
    ],
)
def test_warmup_stable_decay(style: str, at_16: float) -> None:
    o = OptimConfig(
        lr=1.0, min_lr=0.1, warmup_steps=2, schedule="wsd", wsd_decay_style=style
    )  # wsd_decay_fraction 0.2 by default
    assert learning_rate(o, 0, 20) == 0.5  # warmup: (0 + 1) / 2
    assert all(learning_rate(o, s, 20) == 1.0 for s in range(2, 16))  # stable
    assert math.isclose(learning_rate(o, 16, 20), at_16)
    assert math.isclose(learning_rate(o, 19, 20), 0.1)  # ends at min_lr


def test_range_errors_name_the_key() -> None:
    cfg = compose_config(
        ["model.hidden_dropout=1.0", "model.rope_theta=0", "optim.wsd_decay_fraction=1.5"]
    ).config
    keys = {k for v in check(cfg) if v.is_error for k in v.keys}
    assert {"model.hidden_dropout", "model.rope_theta", "optim.wsd_decay_fraction"} <= keys


def test_rendered_jobs_carry_the_model_and_schedule() -> None:
    cfg = compose_config(["recipe=llama3-8b", "backend=megatron", "zero.stage=1"]).config
    args = megatron_args(cfg)
    assert args[args.index("--rotary-base") + 1] == "500000"
    assert args[args.index("--norm-epsilon") + 1] == "1e-05"
    # Megatron-LM defaults dropout to 0.1: the job must say 0.
    assert args[args.index("--hidden-dropout") + 1] == "0.0"
    assert args[args.index("--attention-dropout") + 1] == "0.0"
    wsd = compose_config(
        ["recipe=llama3-8b", "backend=megatron", "zero.stage=1", "optim.schedule=wsd"]
    ).config
    wsd_args = megatron_args(wsd)
    assert wsd_args[wsd_args.index("--lr-decay-style") + 1] == "WSD"
    assert "--lr-wsd-decay-iters" in wsd_args


def test_ds_config_has_optimizer_and_scheduler_but_runtime_does_not() -> None:
    cfg = compose_config(["recipe=gpt-7b", "backend=deepspeed"]).config
    full = ds_config(cfg)
    assert full["optimizer"]["type"] == "AdamW"
    assert full["optimizer"]["params"]["torch_adam"] is True
    assert full["scheduler"]["type"] == "WarmupCosineLR"
    assert math.isclose(
        full["scheduler"]["params"]["cos_min_ratio"], cfg.optim.min_lr / cfg.optim.lr
    )
    runtime = runtime_ds_config(cfg)
    assert "optimizer" not in runtime and "scheduler" not in runtime
    assert runtime["zero_optimization"] == full["zero_optimization"]
