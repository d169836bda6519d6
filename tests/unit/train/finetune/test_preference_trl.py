"""llmtrain's DPO loss equals TRL's DPOTrainer loss on one batch (same models, data and beta).
TRL runs fp32 here (bf16=False: its default bf16 would wrap the reference in bf16 autocast).

TRL (the dev extra pins the version checked: 1.16.0) tokenizes and collates the pairs; the same
input ids and completion masks become llmtrain's preference rows (channel 1 = TRL's completion
mask: a flag on each target that carries loss), llmtrain's Transformer and transformers' Llama
hold the same weights (launcher.export.hf_layout), and the reference is a second model with
other weights (TRL's ref_model; llmtrain's precomputed reference pass).
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("datasets", reason="TRL's trainer needs the datasets package")
trl = pytest.importorskip("trl", reason="trl is in the dev extra (pip install -e '.[dev]')")

from launcher.config.schema import LLMTrainConfig, ModelConfig  # noqa: E402
from launcher.data.chat.builtin_chat import write_tokenizer  # noqa: E402
from launcher.export.hf_layout import hf_config, to_hf  # noqa: E402
from launcher.train.finetune.preference import PreferenceObjective  # noqa: E402
from launcher.train.finetune.preference_loss import token_logps  # noqa: E402
from launcher.train.model.init_weights import init_weights  # noqa: E402
from launcher.train.model.transformer import Transformer  # noqa: E402

MODEL = ModelConfig(
    name="trl-check", num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
    num_kv_heads=2, vocab_size=259, seq_length=64, activation="swiglu", norm="rmsnorm",
    position="rope", tie_embeddings=False, linear_bias=False,
)  # fmt: skip
PAIRS = [
    {"prompt": "What is 2 + 3?", "chosen": "2 + 3 = 5.", "rejected": "2 + 3 = 6."},
    {"prompt": "Reverse the word cat.", "chosen": "tac", "rejected": "cat"},
]


def _models(seed: int):  # type: ignore[no-untyped-def]
    import transformers

    ours = Transformer(MODEL)
    init_weights(ours, seed)
    config = transformers.LlamaConfig(**{k: v for k, v in hf_config(MODEL).items()
                                         if k not in ("architectures", "torch_dtype")})  # fmt: skip
    hf = transformers.LlamaForCausalLM(config)
    state = {k: v.detach().clone() for k, v in ours.state_dict().items()}
    hf.load_state_dict(to_hf(state, MODEL), strict=False)
    return ours.eval(), hf.eval()


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_loss_equals_trl(tmp_path: Path, beta: float) -> None:
    import datasets
    import transformers

    tok_file = write_tokenizer(tmp_path / "tok")
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tok_file), eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    policy, hf_policy = _models(0)
    reference, hf_reference = _models(1)
    args = trl.DPOConfig(
        output_dir=str(tmp_path / "trl"), beta=beta, per_device_train_batch_size=len(PAIRS),
        report_to=[], use_cpu=True, max_length=None, loss_type=["sigmoid"], bf16=False,
    )  # fmt: skip
    trainer = trl.DPOTrainer(
        model=hf_policy, ref_model=hf_reference, args=args,
        train_dataset=datasets.Dataset.from_list(PAIRS), processing_class=tokenizer,
    )  # fmt: skip
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        theirs = float(trainer.compute_loss(trainer.model, batch))

    ids, mask = batch["input_ids"].cpu(), batch["completion_mask"].cpu()
    n = ids.shape[0] // 2  # TRL's batch: the chosen sequences, then the rejected ones
    rows = torch.zeros((n, 2, 3, ids.shape[1]), dtype=torch.int64)
    rows[:, :, 0] = ids.view(2, n, -1).transpose(0, 1)
    rows[:, :, 1] = mask.view(2, n, -1).transpose(0, 1)
    cfg = LLMTrainConfig()
    cfg.finetune.objective, cfg.finetune.beta = "dpo", beta  # finetune=full: precomputed
    objective = PreferenceObjective(cfg)
    with torch.no_grad():
        ref = objective.logps(reference, token_logps, rows, n)
        ours = float(objective.micro_loss(policy, policy, token_logps, rows, ref))
    assert abs(ours - theirs) < 1e-5, (ours, theirs)
    assert abs(ours - 0.6931) > 1e-3  # the two models differ: not the trivial ln 2
