"""`llmtrain export` on real checkpoints of every layout, read back by an independent reference.

Each layout trains the same Llama-shaped model with the same seed for 3 steps on CPU processes:
one process (torch), tensor parallel 2 and FSDP ZeRO-3 (torch, DCP shards), and DeepSpeed ZeRO-3
(fp32 partitions in its optimizer files). Every run is exported with the CLI and the exported
folder is run through the numpy reference forward of tests/unit/test_export_hf.py (transformers'
documented semantics, HF names and config.json only). The layouts compute the same training to
float rounding, so their exported logits must agree: a shard put back in the wrong place, a
missing tensor or a wrong name would not (measured: <= 6e-7 apart for logits of magnitude ~0.8;
the bar is 1e-4).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from launcher.export.hf_files import read_hf_folder

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.integration.test_run import llmtrain, only_run_dir  # noqa: E402
from tests.unit.test_export_hf import reference_gpt2, reference_llama  # noqa: E402

pytestmark = pytest.mark.integration

LLAMA = [
    "model.activation=swiglu",
    "model.norm=rmsnorm",
    "model.position=rope",
    "model.tie_embeddings=false",
    "model.linear_bias=false",
    "model.num_kv_heads=2",
]
SHORT = [
    "train.steps=3",
    "model.seq_length=32",
    "train.micro_batch_size=2",
    "train.log_every=3",
    "checkpoint.keep_last=1",
]
LAYOUTS = {
    "tp2": ["cluster.gpus_per_node=2", "parallel.tp=2"],
    "fsdp-zero3": ["cluster.gpus_per_node=2", "zero.stage=3"],
    "deepspeed-zero3": ["backend=deepspeed", "cluster.gpus_per_node=2", "zero.stage=3"],
}
TOKENS = np.random.default_rng(0).integers(0, 256, (32,))


def train_and_export(where: Path, *overrides: str) -> Path:
    where.mkdir()
    done = llmtrain(where, "run", *SHORT, *overrides)
    assert done.returncode == 0, done.stderr[-3000:]
    exported = llmtrain(where, "export", str(only_run_dir(where)), "--out", "hf", "--json")
    assert exported.returncode == 0, exported.stderr[-3000:]
    document = json.loads(exported.stdout)
    assert document["step"] == 3 and document["architecture"] == "LlamaForCausalLM"
    return where / "hf"


def logits(folder: Path) -> np.ndarray:
    tensors, config = read_hf_folder(folder)
    arrays = {k: v.numpy() for k, v in tensors.items()}
    if config["model_type"] == "gpt2":
        return reference_gpt2(arrays, config, TOKENS)
    return reference_llama(arrays, config, TOKENS)


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_and_export(tmp_path_factory.mktemp("export") / "single", *LLAMA)


def test_single_process_export_is_a_complete_hf_folder(single: Path) -> None:
    names = sorted(p.name for p in single.iterdir())
    assert names == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(single / "tokenizer.json"))
    text = "héllo, wörld\n"
    assert tok.encode(text).ids == list(text.encode("utf-8"))  # the byte tokenizer, as HF


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_sharded_layouts_export_the_same_model(single: Path, layout: str, tmp_path: Path) -> None:
    folder = train_and_export(tmp_path / layout, *LLAMA, *LAYOUTS[layout])
    ours, reference = logits(folder), logits(single)
    assert np.abs(reference).max() > 0.1
    assert np.abs(ours - reference).max() < 1e-4


def test_gpt2_shaped_default_recipe_exports_as_gpt2(tmp_path: Path) -> None:
    folder = train_and_export_gpt2(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["GPT2LMHeadModel"]
    assert np.isfinite(logits(folder)).all()


def train_and_export_gpt2(tmp_path: Path) -> Path:
    done = llmtrain(tmp_path, "run", *SHORT)
    assert done.returncode == 0, done.stderr[-3000:]
    exported = llmtrain(tmp_path, "export", str(only_run_dir(tmp_path)), "--out", "hf")
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "GPT2LMHeadModel" in exported.stdout
    return tmp_path / "hf"
