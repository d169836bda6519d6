"""The training model: parameter counts equal the planner's for every recipe; small models train."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, cast

import pytest
import torch

from launcher import resources
from launcher.config.composition.compose import compose_config
from launcher.config.schema import ModelConfig
from launcher.plan.model_shape import ModelShape
from launcher.train.model.init_weights import init_weights
from launcher.train.model.transformer import (
    Attention,
    MLAttention,
    MoE,
    Transformer,
    apply_recompute,
    build_model,
    loss_fn,
    num_params,
)

pytestmark = pytest.mark.unit

TINY_GPT = ModelConfig(
    num_layers=2,
    hidden_size=32,
    ffn_hidden_size=64,
    num_attention_heads=4,
    vocab_size=64,
    seq_length=16,
    activation="gelu",
    norm="layernorm",
    position="learned",
    tie_embeddings=True,
    linear_bias=True,
)
TINY_LLAMA = ModelConfig(
    num_layers=2,
    hidden_size=32,
    ffn_hidden_size=48,
    num_attention_heads=4,
    num_kv_heads=2,
    vocab_size=64,
    seq_length=16,
    activation="swiglu",
    norm="rmsnorm",
    position="rope",
    tie_embeddings=False,
    linear_bias=False,
)
TINY_MOE = dataclasses.replace(
    TINY_LLAMA,
    num_experts=4,
    moe_top_k=2,
    moe_ffn_hidden_size=24,
    moe_shared_experts=1,
    moe_dense_layers=1,
)
TINY_MLA = dataclasses.replace(
    TINY_MOE,
    num_kv_heads=None,
    head_dim=8,
    q_lora_rank=16,
    kv_lora_rank=12,
    qk_rope_head_dim=4,
    v_head_dim=6,
)
TINY = {"gpt": TINY_GPT, "llama": TINY_LLAMA, "moe": TINY_MOE, "mla": TINY_MLA}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """These models are tiny: one intra-op thread is faster, and immune to a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _rows(cfg: ModelConfig, batch: int = 2, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (batch, cfg.seq_length + 1), generator=gen)


def _loss(model: Transformer, rows: torch.Tensor) -> torch.Tensor:
    return loss_fn(model(rows[:, :-1]), rows[:, 1:])


@pytest.mark.parametrize("recipe", resources.recipe_names())
def test_recipe_model_matches_planner_param_count(recipe: str) -> None:
    cfg = compose_config([f"recipe={recipe}"]).config.model
    model = build_model(cfg, device="meta")
    assert num_params(model) == ModelShape(cfg).total_params()
    assert all(p.device.type == "meta" for p in model.parameters())


@pytest.mark.parametrize("name", ["gpt", "llama", "moe", "mla"])
def test_tiny_model_param_count_and_structure(name: str) -> None:
    cfg = TINY[name]
    model = build_model(cfg, seed=0)
    assert num_params(model) == ModelShape(cfg).total_params()
    assert list(model.layers.keys()) == [str(i) for i in range(cfg.num_layers)]
    assert (model.pos_embeddings is not None) == (cfg.position == "learned")
    assert (model.output is None) == cfg.tie_embeddings
    block = model.layers["1"]
    assert isinstance(block.attention, MLAttention if name == "mla" else Attention)
    assert (block.moe is not None) == (name in ("moe", "mla"))
    assert model.layers["0"].moe is None  # moe_dense_layers=1 for the MoE models
    if isinstance(block.attention, Attention):
        kv = ModelShape(cfg).kv_heads * ModelShape(cfg).head_dim
        assert block.attention.wk.weight.shape == (kv, cfg.hidden_size)


@pytest.mark.parametrize("name", ["gpt", "llama", "moe", "mla"])
def test_tiny_model_forward_backward(name: str) -> None:
    cfg = TINY[name]
    model = build_model(cfg, seed=1)
    rows = _rows(cfg)
    logits = model(rows[:, :-1])
    assert logits.shape == (2, cfg.seq_length, cfg.vocab_size)
    loss = loss_fn(logits, rows[:, 1:])
    assert torch.isfinite(loss)
    # Untrained with std-0.02 weights: close to uniform over the vocabulary.
    assert abs(loss.item() - torch.log(torch.tensor(float(cfg.vocab_size))).item()) < 0.5
    loss.backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, pname  # every parameter (every expert too) gets a gradient
        assert torch.isfinite(p.grad).all(), pname


def test_tiny_gpt_learns() -> None:
    cfg = TINY_GPT
    model = build_model(cfg, seed=0)
    rows = _rows(cfg, batch=4)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        loss = _loss(model, rows)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first - 1.0


@pytest.mark.parametrize("name", ["gpt", "llama", "mla"])
@pytest.mark.parametrize("attention", ["flash", "eager"])
def test_causal_masking(name: str, attention: str) -> None:
    cfg = dataclasses.replace(TINY[name], attention=attention)
    model = build_model(cfg, seed=2)
    tokens = _rows(cfg)[:, :-1]
    changed = tokens.clone()
    changed[:, 10] = (changed[:, 10] + 1) % cfg.vocab_size
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_flash_and_eager_agree() -> None:
    flash = build_model(dataclasses.replace(TINY_LLAMA, attention="flash"), seed=3)
    eager = build_model(dataclasses.replace(TINY_LLAMA, attention="eager"), seed=3)
    tokens = _rows(TINY_LLAMA)[:, :-1]
    with torch.no_grad():
        torch.testing.assert_close(flash(tokens), eager(tokens))


@pytest.mark.parametrize("name", ["gpt", "moe", "mla"])
@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recompute_matches_no_recompute(name: str, mode: str) -> None:
    cfg = TINY[name]
    rows = _rows(cfg)
    grads = {}
    losses = {}
    for m in ("none", mode):
        model = apply_recompute(build_model(cfg, seed=4), m)
        loss = _loss(model, rows)
        loss.backward()
        losses[m] = loss.detach()
        grads[m] = {n: p.grad for n, p in model.named_parameters()}
    torch.testing.assert_close(losses[mode], losses["none"])
    for n, g in grads["none"].items():
        torch.testing.assert_close(grads[mode][n], g, msg=n)


def test_recompute_flags_and_bad_mode() -> None:
    model = build_model(TINY_MOE, seed=0)
    apply_recompute(model, "full")
    assert all(block.recompute_full for block in model.layers.values())
    apply_recompute(model, "selective")
    assert not any(block.recompute_full for block in model.layers.values())
    # Layer 0 is dense (moe_dense_layers=1): op-level selective checkpointing of the block.
    # The MoE layers: their attention core and shared experts' activation only.
    dense, moe = model.layers["0"], model.layers["1"]
    assert dense.moe is None and dense.recompute_selective
    assert not dense.attention.recompute_core
    assert moe.moe is not None and not moe.recompute_selective
    assert moe.attention.recompute_core
    assert all(m.recompute_act for m in moe.moe.shared_experts)
    apply_recompute(model, "none")
    assert not any(block.attention.recompute_core for block in model.layers.values())
    assert not any(block.recompute_selective for block in model.layers.values())
    with pytest.raises(ValueError, match=r"train\.recompute"):
        apply_recompute(model, "some")


def test_init_is_deterministic_and_per_parameter() -> None:
    a = build_model(TINY_LLAMA, seed=7)
    b = build_model(TINY_LLAMA, seed=7)
    c = build_model(TINY_LLAMA, seed=8)
    for (n, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, msg=n)
        if pa.numel() > 1 and "norm" not in n:
            assert not torch.equal(pa, pc), n
    # torch.manual_seed(s) then build_model(cfg) is build_model(cfg, seed=s).
    torch.manual_seed(7)
    d = build_model(TINY_LLAMA)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), d.parameters(), strict=True))
    # GPT-2 init: std 0.02, residual projections 0.02/sqrt(2L), norms one, biases zero.
    gpt = build_model(dataclasses.replace(TINY_GPT, hidden_size=256, ffn_hidden_size=512), seed=0)
    assert abs(gpt.layers["0"].attention.wq.weight.std().item() - 0.02) < 0.002
    assert abs(gpt.layers["0"].attention.wo.weight.std().item() - 0.01) < 0.001
    assert torch.equal(gpt.norm.weight, torch.ones(256))
    assert torch.equal(gpt.layers["1"].feed_forward.w1.bias, torch.zeros(512))


def test_meta_then_materialise_equals_direct_build() -> None:
    direct = build_model(TINY_MOE, seed=5)
    meta = build_model(TINY_MOE, device="meta")
    meta.to_empty(device="cpu")
    init_weights(meta, seed=5)
    for (n, p), q in zip(direct.named_parameters(), meta.parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=n)


def test_partial_model_pipeline_stages_compose() -> None:
    """Two stages made by deleting parts (torchtitan style) compute what the whole model does."""
    for cfg in (TINY_GPT, TINY_LLAMA):
        whole = build_model(cfg, seed=6)
        first, last = build_model(cfg, seed=6), build_model(cfg, seed=6)
        del first.layers["1"]
        first.norm = None
        first.output = None
        del last.layers["0"]
        last.pos_embeddings = None
        if not cfg.tie_embeddings:
            last.tok_embeddings = None  # a tied last stage keeps it for its head
        tokens = _rows(cfg)[:, :-1]
        with torch.no_grad():
            hidden = first(tokens)
            assert hidden.shape == (2, cfg.seq_length, cfg.hidden_size)
            torch.testing.assert_close(last(hidden), whole(tokens))


def test_moe_routes_top_k() -> None:
    moe = build_model(TINY_MOE, seed=0).layers["1"].moe
    assert isinstance(moe, MoE)
    assert moe.top_k == 2 and len(moe.experts) == 4 and len(moe.shared_experts) == 1
    x = torch.randn(2, 5, TINY_MOE.hidden_size)
    # Reference: per token, softmax over its top-2 router logits weights those experts' outputs.
    with torch.no_grad():
        out = moe(x)
        ref = torch.zeros_like(x)
        for b in range(2):
            for t in range(5):
                v = x[b, t]
                top, idx = moe.router(v).topk(2)
                gates = top.softmax(-1)
                ref[b, t] = sum(
                    g * moe.experts[str(int(i))](v) for g, i in zip(gates, idx, strict=True)
                )
                ref[b, t] += moe.shared_experts[0](v)
    torch.testing.assert_close(out, ref)


def test_loss_fn_is_fp32_cross_entropy() -> None:
    logits = torch.randn(2, 3, 7, dtype=torch.bfloat16)
    targets = torch.randint(0, 7, (2, 3))
    loss = loss_fn(logits, targets)
    assert loss.dtype == torch.float32
    expected = torch.nn.functional.cross_entropy(logits.float().reshape(6, 7), targets.reshape(6))
    torch.testing.assert_close(loss, expected)


def test_selective_saves_every_other_product_and_the_attention_kernel() -> None:
    # A dense Llama block's forward runs 7 linear products (wq, wk, wv, wo, w1, w3, w2) and one
    # SDPA kernel: the policy keeps products 1, 3, 5, 7 (wq, wv, w1, w2) and the kernel's output,
    # and recomputes the rest (the gradients equal: test_recompute_matches_no_recompute).
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    from launcher.train.model.selective_checkpoint import SAC_KEPT, SAC_MATMULS, selective_policy

    block = build_model(TINY_LLAMA, seed=5).layers["0"]
    decisions: dict[bool, list[tuple[str, bool]]] = {False: [], True: []}

    def recording() -> tuple[Any, Any]:
        inner = selective_policy()

        def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
            choice = inner(ctx, func, *args, **kwargs)
            if func in SAC_MATMULS or func in SAC_KEPT:
                kind = "mm" if func in SAC_MATMULS else "attention"
                decisions[ctx.is_recompute].append((kind, choice == CheckpointPolicy.MUST_SAVE))
            return choice

        return cast(tuple[Any, Any], create_selective_checkpoint_contexts(policy))

    x = torch.randn(2, TINY_LLAMA.seq_length, TINY_LLAMA.hidden_size, requires_grad=True)
    out = torch.utils.checkpoint.checkpoint(
        block._forward, x, use_reentrant=False, context_fn=recording
    )
    out.sum().backward()
    forward = decisions[False]
    mms = [keep for kind, keep in forward if kind == "mm"]
    assert mms == [True, False, True, False, True, False, True]
    assert ("attention", True) in forward
