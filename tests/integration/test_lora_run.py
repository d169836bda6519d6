"""The tiny fine-tuning flow through the real command line, offline on the CPU: a base
(recipe=tiny-llama), LoRA on it (recipe=tiny-sft-lora, train.init_from), a resume that reads the
base again and the adapter-only checkpoint, `sample`, the merged and the PEFT exports, and a
resume on another base refused by the checkpoint's base digest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli import invoke, llmtrain

pytestmark = pytest.mark.integration

SHORT = ["model.seq_length=32", "train.micro_batch_size=2", "train.global_batch_size=2"]


def test_tiny_lora_flow(tmp_path: Path) -> None:
    base = llmtrain("run", "recipe=tiny-llama", "train.steps=3", *SHORT, cwd=tmp_path)
    assert base.returncode == 0, base.stderr[-3000:]
    tuned = llmtrain("run", "recipe=tiny-sft-lora", "train.steps=3", *SHORT, cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr[-3000:]
    run = tmp_path / "runs" / "tiny-sft-lora"
    log = (run / "logs" / "rank0.log").read_text() if (run / "logs").is_dir() else tuned.stdout
    assert "initialised from runs/tiny-llama" in tuned.stdout + tuned.stderr + log
    (step,) = sorted((run / "checkpoints").glob("step_*"))
    assert (step / "engine" / "base_weights.json").is_file()

    # Resume: the base comes from train.init_from again, the adapters from the checkpoint.
    again = llmtrain(
        "run",
        "recipe=tiny-sft-lora",
        "train.steps=5",
        *SHORT,
        "--allow-config-change",
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from" in again.stdout + again.stderr, again.stdout[-2000:]
    history = (run / "config_history.jsonl").read_text().splitlines()
    assert [json.loads(line)["trajectory_keys"] for line in history] == [["train.steps"]]

    # The run's data (data=chat) carries a ChatML template: the prompt is a user turn in it.
    sample = invoke(
        "sample", "tiny-sft-lora", "What is 2 + 3?", "--max-new-tokens", "5", "--json", cwd=tmp_path
    )
    assert sample.returncode == 0, sample.stderr[-3000:]
    document = json.loads(sample.stdout)
    assert document["step"] == 5 and 0 <= document["tokens"] <= 5
    assert document["chat_template"] is not None
    assert document["loaded"].startswith("loaded onto the CPU: gathered tensor by tensor")
    raw = invoke("sample", "tiny-sft-lora", "def ", "--raw", "--json", cwd=tmp_path)
    assert raw.returncode == 0 and json.loads(raw.stdout)["chat_template"] is None
    # Seeded sampling gives the same text again; a conversation of --user/--assistant turns.
    turns = ["--user", "Hi", "--assistant", "Hello!", "--user", "What is 2 + 3?"]
    options = ["--temperature", "1.0", "--top-p", "0.9", "--seed", "3", "--dtype", "bf16"]
    sampled = [
        invoke(
            "sample",
            "tiny-sft-lora",
            *turns,
            *options,
            "--max-new-tokens",
            "6",
            "--json",
            cwd=tmp_path,
        )
        for _ in range(2)
    ]
    assert sampled[0].returncode == 0, sampled[0].stderr[-3000:]
    assert sampled[0].stdout == sampled[1].stdout
    assert json.loads(sampled[0].stdout)["prompt"] == "What is 2 + 3?"

    merged = invoke("export", "tiny-sft-lora", "--out", "merged", "--json", cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr[-3000:]
    assert json.loads(merged.stdout)["architecture"] == "LlamaForCausalLM"
    # The base (train.init_from, a run) read tensor by tensor, merged and written one at a time.
    assert "weights: gathered tensor by tensor" in merged.stderr, merged.stderr[-2000:]
    adapter = invoke("export", "tiny-sft-lora", "--out", "adapter", "--adapter", cwd=tmp_path)
    assert adapter.returncode == 0, adapter.stderr[-3000:]
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["peft_type"] == "LORA"
    # train.init_from is a run: its export sits beside as adapter/base, named absolutely, and the
    # run's tokenizer is in the folder, so AutoPeftModelForCausalLM loads it as it is.
    assert config["base_model_name_or_path"] == str((tmp_path / "adapter" / "base").resolve())
    assert (tmp_path / "adapter" / "base" / "config.json").is_file()
    assert (tmp_path / "adapter" / "tokenizer.json").is_file()
    import peft

    peft.AutoPeftModelForCausalLM.from_pretrained(str(tmp_path / "adapter"))
    assert set(config["target_modules"]) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    full = invoke("export", "tiny-llama", "--out", "x", "--adapter", cwd=tmp_path)
    assert full.returncode == 2 and "finetune=full" in full.stderr, full.stderr[-2000:]

    # Another base under the same adapters: the checkpoint is refused, naming train.init_from.
    other = llmtrain(
        "run", "recipe=tiny-llama", "run.name=other", "train.seed=7", "train.steps=2", cwd=tmp_path
    )
    assert other.returncode == 0, other.stderr[-3000:]
    moved = llmtrain(
        "run",
        "recipe=tiny-sft-lora",
        "train.init_from=runs/other",
        "train.steps=6",
        *SHORT,
        "--allow-config-change",
        cwd=tmp_path,
    )
    assert moved.returncode != 0
    assert "trained on base weights" in moved.stdout + moved.stderr, moved.stderr[-3000:]
    # The failed resume recorded nothing (issue 42: it used to append an "accepted" line) and
    # left nothing staged.
    assert (run / "config_history.jsonl").read_text().splitlines() == history
    assert not (run / "config_history.next.jsonl").exists()
    assert not (run / "config.next.yaml").exists()
    # `sample` on another base than the adapters': refused, in sample's own words (it used to
    # say "nothing was exported").
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("runs/tiny-llama", "runs/other"))
    refused = invoke("sample", "tiny-sft-lora", "hi", cwd=tmp_path)
    words = " ".join(refused.stderr.split())
    assert refused.returncode == 2, words[-3000:]
    assert "trained on base weights" in words and "nothing was generated" in words, words
    assert "exported" not in words
