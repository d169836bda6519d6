"""LoRA out of llmtrain, checked by the real consumers: transformers' Llama built from our exported
base folder, with ``peft`` loading our exported adapter folder, gives llmtrain's logits (adapters
applied); the merged weights are base + (alpha / r) B @ A and give the same logits as a plain
model. Also the adapter layers themselves (zero update at start, frozen base, NF4 on the CPU).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from launcher.config.schema import FinetuneConfig, ModelConfig
from launcher.export.hf_files import write_hf_folder
from launcher.export.hf_layout import hf_config, to_hf
from launcher.train.finetune import lora
from launcher.train.finetune.lora_export import peft_tensors, write_adapter_folder
from launcher.train.model.init_weights import init_weights
from launcher.train.model.transformer import Transformer

pytestmark = pytest.mark.unit

LLAMA = ModelConfig(
    num_layers=2,
    hidden_size=32,
    ffn_hidden_size=48,
    num_attention_heads=4,
    num_kv_heads=2,
    vocab_size=50,
    seq_length=12,
    activation="swiglu",
    norm="rmsnorm",
    position="rope",
    tie_embeddings=False,
    rope_theta=500_000.0,
    norm_eps=1e-5,
)
FT = FinetuneConfig(name="lora", rank=4, alpha=8.0, dropout=0.0, targets=["all-linear"])


def _adapted(seed: int = 3) -> tuple[Transformer, dict[str, torch.Tensor]]:
    """A Llama-shaped model with adapters on every projection, B moved off zero (as if trained);
    also the base state before the adapters."""
    model = Transformer(LLAMA)
    init_weights(model, seed=seed)
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert lora.apply_lora(model, LLAMA, FT, seed, torch.float32) == 2 * 7
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("lora_b.weight"):
                g = torch.Generator().manual_seed(len(name))
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval(), base


def test_adapters_start_at_zero_and_only_they_train() -> None:
    model = Transformer(LLAMA)
    init_weights(model, seed=1)
    tokens = torch.randint(0, LLAMA.vocab_size, (2, LLAMA.seq_length))
    with torch.no_grad():
        before = model(tokens)
    lora.apply_lora(model, LLAMA, FT, 1, torch.float32)
    with torch.no_grad():
        assert torch.equal(model(tokens), before)  # B = 0: the base model exactly
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(lora.is_adapter(n) for n in trainable)
    assert len(trainable) == 2 * 7 * 2


def test_peft_loads_the_adapter_onto_transformers_llama_and_matches(tmp_path: Path) -> None:
    import peft  # dev dependencies: a missing one fails here rather than skipping the check
    import transformers

    model, base = _adapted()
    tokens = torch.randint(0, LLAMA.vocab_size, (1, LLAMA.seq_length))
    with torch.no_grad():
        ours = model(tokens)[0]
    base_dir, adapter_dir = tmp_path / "base", tmp_path / "adapter"
    write_hf_folder(base_dir, to_hf(base, LLAMA), hf_config(LLAMA))
    adapters = {k: v.detach() for k, v in model.state_dict().items() if lora.is_adapter(k)}
    cfg = dataclasses.replace(
        _cfg(), finetune=FT, train=dataclasses.replace(_cfg().train, init_from=str(base_dir))
    )
    write_adapter_folder(adapter_dir, cfg, adapters)
    hf = transformers.LlamaForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        plain = hf(tokens).logits[0]
    tuned = peft.PeftModel.from_pretrained(hf, adapter_dir).eval()
    with torch.no_grad():
        theirs = tuned(tokens).logits[0]
    assert (theirs - plain).abs().max() > 1e-3  # the adapters were applied
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-4)
    # Every adapter tensor was loaded under PEFT's name (none left at its init).
    loaded = {k for k, _ in tuned.named_parameters() if "lora_" in k}
    assert len(loaded) == len(peft_tensors(adapters)) == 2 * 7 * 2


def test_auto_peft_loads_the_folder_from_a_relative_init_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """train.init_from given relative (as recipes write it): the folder names the base by its
    absolute path and holds the tokenizer files, so AutoPeftModelForCausalLM loads it from any
    working directory (it failed on the relative "runs/..." before)."""
    import peft

    model, base = _adapted()
    tokens = torch.randint(0, LLAMA.vocab_size, (1, LLAMA.seq_length))
    with torch.no_grad():
        ours = model(tokens)[0]
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    write_hf_folder(Path("runs/base"), to_hf(base, LLAMA), hf_config(LLAMA))
    adapters = {k: v.detach() for k, v in model.state_dict().items() if lora.is_adapter(k)}
    cfg = dataclasses.replace(
        _cfg(), finetune=FT, train=dataclasses.replace(_cfg().train, init_from="runs/base")
    )
    from tokenizers import Tokenizer, models

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(LLAMA.vocab_size)}, "w0"))
    config = b'{"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "w0"}'
    tokenizer = {"tokenizer.json": words.to_str().encode(), "tokenizer_config.json": config}
    write_adapter_folder(tmp_path / "adapter", cfg, adapters, extra_files=tokenizer)
    monkeypatch.chdir(tmp_path)
    named = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert named["base_model_name_or_path"] == str(tmp_path / "work" / "runs" / "base")
    assert (tmp_path / "adapter" / "tokenizer.json").read_bytes() == tokenizer["tokenizer.json"]
    tuned = peft.AutoPeftModelForCausalLM.from_pretrained(str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        theirs = tuned(tokens).logits[0]
    torch.testing.assert_close(theirs.float(), ours, rtol=1e-4, atol=1e-4)


def test_merged_weights_are_base_plus_scaled_ba_and_give_the_same_logits() -> None:
    model, base = _adapted()
    merged = lora.merged_state(model)
    scale = FT.alpha / FT.rank
    a = model.get_submodule("layers.1.feed_forward.w2.lora_a").weight.detach()
    b = model.get_submodule("layers.1.feed_forward.w2.lora_b").weight.detach()
    want = base["layers.1.feed_forward.w2.weight"] + scale * (b @ a)
    torch.testing.assert_close(merged["layers.1.feed_forward.w2.weight"], want, rtol=0, atol=0)
    assert set(merged) == set(base)
    adapters = {k: v for k, v in model.state_dict().items() if lora.is_adapter(k)}
    assert lora.merge_adapters(base, adapters, scale).keys() == merged.keys()
    plain = Transformer(LLAMA).eval()
    plain.load_state_dict(merged, strict=True)
    tokens = torch.randint(0, LLAMA.vocab_size, (1, LLAMA.seq_length))
    with torch.no_grad():
        torch.testing.assert_close(plain(tokens), model(tokens), rtol=1e-5, atol=1e-5)


def test_qlora_runs_nf4_on_the_cpu_close_to_the_bf16_base() -> None:
    m = dataclasses.replace(LLAMA, hidden_size=128, ffn_hidden_size=128, num_kv_heads=4)
    model = Transformer(m)
    init_weights(model, seed=2)
    tokens = torch.randint(0, m.vocab_size, (1, m.seq_length))
    with torch.no_grad():
        before = model(tokens)
    ft = dataclasses.replace(FT, name="qlora", targets=["q", "o", "gate", "up", "down"])
    lora.apply_lora(model, m, ft, 2, torch.float32)
    wq = model.get_submodule("layers.0.attention.wq")
    assert isinstance(wq, lora.LoRALinear) and lora.nf4_param(wq.base.weight)
    logits = model(tokens)
    logits.float().sum().backward()
    assert model.get_submodule("layers.0.attention.wq.lora_b").weight.grad is not None
    # 4-bit weights: close to, not equal to, the original model.
    assert 0 < (logits.detach() - before).abs().max() < 0.5


def test_base_digest_names_a_different_base() -> None:
    _, base = _adapted(seed=3)
    other, _ = _adapted(seed=4)
    ours = lora.combined_digest(lora.base_digest(base))
    record = lora.base_record(FT, ours, "runs/base")
    assert lora.base_problem(record, ours) is None
    theirs = lora.combined_digest(lora.base_digest({k: v for k, v in other.state_dict().items()}))
    assert "trained on base weights" in str(lora.base_problem(record, theirs))
    assert lora.base_problem({"x": 1}, ours) is not None


def _cfg():  # type: ignore[no-untyped-def]
    from launcher.config.schema import LLMTrainConfig

    return LLMTrainConfig()
