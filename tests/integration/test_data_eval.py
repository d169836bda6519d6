"""Bring your own data, end to end through the CLI: a JSON Lines corpus and a tokenizer.json made
here -> `llmtrain data prepare` (Megatron .bin/.idx with a validation split) -> `llmtrain run`
with evaluation; and a blend of an llmtrain-prepared folder with a Megatron-LM prefix that trains
and resumes bit for bit."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.cli import invoke, llmtrain

pytestmark = pytest.mark.integration

# A small model and short sequences: a couple of hundred steps of CPU work stay well under a minute.
SMALL = [
    "model.num_layers=2",
    "model.hidden_size=64",
    "model.ffn_hidden_size=128",
    "model.num_attention_heads=4",
    "model.seq_length=32",
    "train.micro_batch_size=8",
    "train.global_batch_size=8",
    "optim.lr=3e-3",
    "optim.warmup_steps=5",
]
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "cats",
         "sit", "on", "warm", "mats", "by", "the", "river"]  # fmt: skip


def metrics(run_dir: Path) -> list[dict[str, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def make_corpus(tmp_path: Path, documents: int) -> tuple[Path, Path]:
    """corpus.jsonl of word-salad documents and a byte-level BPE tokenizer.json trained on it."""
    from launcher.data.tokenizer import BPETokenizer

    rng = random.Random(0)
    texts = [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 40))) for _ in range(documents)
    ]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    BPETokenizer.train(texts, 300).save(tmp_path / "tokenizer.json")
    return corpus, tmp_path / "tokenizer.json"


def test_jsonl_and_tokenizer_json_to_training_with_falling_val_loss(tmp_path: Path) -> None:
    corpus, tokenizer = make_corpus(tmp_path, 2000)
    prepared = invoke(
        "data",
        "prepare",
        "--input",
        str(corpus),
        "--output",
        "data",
        "--tokenizer",
        str(tokenizer),
        "--valid-fraction",
        "0.05",
        "--json",
        cwd=tmp_path,
    )
    assert prepared.returncode == 0, prepared.stderr
    index = json.loads(prepared.stdout)
    assert index["layout"] == "megatron" and index["valid_documents"] == 100
    assert index["eod_id"] == 0 and (tmp_path / "data" / "tokenizer.json").is_file()
    done = llmtrain(
        "run",
        *SMALL,
        "train.steps=80",
        "train.log_every=40",
        f"data.path={tmp_path / 'data'}",
        f"model.vocab_size={index['vocab_size']}",
        "train.eval_every=20",
        "train.eval_steps=2",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    evals = [m for m in metrics(run_dir) if "val_loss" in m]
    assert [m["step"] for m in evals] == [20, 40, 60, 80]
    val = [m["val_loss"] for m in evals]
    assert val[-1] < val[0] - 0.2, val
    assert all(abs(m["val_ppl"] - np.exp(m["val_loss"])) < 1e-6 * m["val_ppl"] for m in evals)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["last_val_loss"] == val[-1]
    assert "val_loss" in done.stdout and "last val_loss" in done.stdout
    # ... and out to a Hugging Face folder carrying the user's own tokenizer, byte for byte.
    exported = invoke(
        "export", str(run_dir), "--format", "hf", "--out", "hf", "--json", cwd=tmp_path
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    hf = tmp_path / "hf"
    config = json.loads((hf / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["vocab_size"] == index["vocab_size"]
    assert (hf / "tokenizer.json").read_bytes() == tokenizer.read_bytes()
    from launcher.export.hf_files import read_hf_folder

    weights, _ = read_hf_folder(hf)
    assert weights["transformer.wte.weight"].shape == (index["vocab_size"], 64)
    # The end-of-document token is the model's bos/eos/pad, in config.json, generation_config.json
    # and the tokenizer's own config (without them transformers falls back to GPT-2's 50256,
    # outside this 300-token vocabulary, and warns).
    assert {
        k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
    } == dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id"), 0)
    generation = json.loads((hf / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}
    tokenizer_config = json.loads((hf / "tokenizer_config.json").read_text())
    assert tokenizer_config["eos_token"] == "<|endoftext|>"
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    generate_without_warnings(hf)


GENERATE = """
import sys, warnings
warnings.simplefilter("error")  # any Python warning fails
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
transformers.logging.set_verbosity_warning()
messages = []
class Keep:
    def write(self, text): messages.append(text)
    def flush(self): pass
import logging
logging.getLogger("transformers").addHandler(logging.StreamHandler(Keep()))
tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
ids = tok("Once upon a time", return_tensors="pt")
out = model.generate(**ids, max_new_tokens=8, do_sample=False)
assert out.shape[1] > ids["input_ids"].shape[1]
print(repr(tok.decode(out[0])))
print("TRANSFORMERS-WARNINGS:", [m for m in messages if m.strip()])
"""


def generate_without_warnings(folder: Path) -> None:
    """transformers (when installed) loads the export and its tokenizer and generates, with no
    warning from transformers' loggers or Python's warnings."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return  # the files' contents are checked above
    done = subprocess.run(
        [sys.executable, "-c", GENERATE, str(folder)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TRANSFORMERS-WARNINGS: []" in done.stdout, done.stdout + done.stderr[-2000:]


def test_blend_of_prepared_folder_and_megatron_prefix_resumes_bitwise(tmp_path: Path) -> None:
    from launcher.data.megatron_indexed import IndexedDatasetWriter

    corpus, _ = make_corpus(tmp_path, 600)
    # Dataset A: llmtrain's own shard format, byte tokens, with a validation split.
    prepared = invoke(
        "data",
        "prepare",
        "--input",
        str(corpus),
        "--output",
        "a",
        "--format",
        "shards",
        "--valid-fraction",
        "0.05",
        cwd=tmp_path,
    )
    assert prepared.returncode == 0, prepared.stderr
    # Dataset B: a Megatron-LM prefix as its own tools/preprocess_data.py writes one.
    (tmp_path / "b").mkdir()
    writer = IndexedDatasetWriter(tmp_path / "b" / "code_text_document", 256)
    rng = np.random.default_rng(0)
    for _ in range(300):
        writer.add_document(rng.integers(32, 127, size=int(rng.integers(20, 80))))
    writer.finish()
    args = [
        "run", *SMALL, "train.steps=12", "checkpoint.every_steps=4", "checkpoint.keep_last=5",
        f"data.blend=[0.6,{tmp_path / 'a'},0.4,{tmp_path / 'b' / 'code_text_document'}]",
        "train.eval_every=4", "train.eval_steps=2", "model.hidden_dropout=0.1",
    ]  # fmt: skip
    full = llmtrain(*args, cwd=tmp_path)
    assert full.returncode == 0, full.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    uninterrupted = metrics(run_dir)
    digest = json.loads((run_dir / "summary.json").read_text())["weights_sha256"]
    # Back to the step-8 checkpoint, then resume: steps 9-12 must be the same, bit for bit.
    shutil.rmtree(run_dir / "checkpoints" / "step_00000012")
    (run_dir / "summary.json").unlink()
    kept = (run_dir / "metrics.jsonl").read_text().splitlines()[:8]
    (run_dir / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    resumed = llmtrain(*args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "(step 8)" in resumed.stdout
    again = metrics(run_dir)
    for key in ("loss", "grad_norm", "val_loss"):
        assert [m.get(key) for m in again] == [m.get(key) for m in uninterrupted], key
    assert json.loads((run_dir / "summary.json").read_text())["weights_sha256"] == digest
