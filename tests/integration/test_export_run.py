"""`llmtrain export` on real checkpoints of every layout, read back by an independent reference.

Each layout trains the same Llama-shaped model with the same seed for 3 steps on CPU processes:
one process (torch), tensor parallel 2 and FSDP ZeRO-3 (torch, DCP shards), DeepSpeed ZeRO-3
(fp32 partitions in its optimizer files) and DeepSpeed pipeline parallel 2 (one file per layer).
Every run is exported with the CLI and the exported folder is run through the numpy reference
forward of tests/unit/export/test_export_hf.py (transformers' documented semantics, HF names and
config.json only). The layouts compute the same training to float rounding, so their exported
logits must agree: a shard put back in the wrong place, a missing tensor or a wrong name would
not (measured: <= 6e-7 apart for logits of magnitude ~0.8; the bar is 1e-4).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from launcher.export.hf_files import read_hf_folder
from tests.cli import invoke, llmtrain
from tests.integration.test_run import only_run_dir
from tests.unit.export.test_export_hf import reference_gpt2, reference_llama

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
    "train.log_every=1",  # every step: the single-process run's first loss is a fresh start's
    "checkpoint.keep_last=1",
]
LAYOUTS = {
    "tp2": ["cluster.gpus_per_node=2", "parallel.tp=2"],
    "fsdp-zero3": ["cluster.gpus_per_node=2", "zero.stage=3"],
    "deepspeed-zero3": ["backend=deepspeed", "cluster.gpus_per_node=2", "zero.stage=3"],
    "deepspeed-pp2": ["backend=deepspeed", "cluster.gpus_per_node=2", "parallel.pp=2"],
}
TOKENS = np.random.default_rng(0).integers(0, 256, (32,))


def train_and_export(where: Path, *overrides: str) -> Path:
    where.mkdir()
    done = llmtrain("run", *SHORT, *overrides, cwd=where)
    assert done.returncode == 0, done.stderr[-3000:]
    # In a child process: a DeepSpeed checkpoint's export imports deepspeed, which must not
    # leave its state (accelerator, loggers) in the test process.
    exported = llmtrain("export", str(only_run_dir(where)), "--out", "hf", "--json", cwd=where)
    assert exported.returncode == 0, exported.stderr[-3000:]
    # What was held at once (issue #39): one tensor at a time, DCP and DeepSpeed alike.
    assert "weights: gathered tensor by tensor" in exported.stderr, exported.stderr[-3000:]
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
        ".llmtrain-output.json",  # the marker: what `export --overwrite` may replace
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    from tokenizers import Tokenizer

    from tests.integration.test_data_eval import generate_without_warnings

    generate_without_warnings(single)  # a Llama with the byte tokenizer: loads and generates

    tok = Tokenizer.from_file(str(single / "tokenizer.json"))
    text = "héllo, wörld\n"
    assert tok.encode(text).ids == list(text.encode("utf-8"))  # the byte tokenizer, as HF


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_sharded_layouts_export_the_same_model(single: Path, layout: str, tmp_path: Path) -> None:
    folder = train_and_export(tmp_path / layout, *LLAMA, *LAYOUTS[layout])
    ours, reference = logits(folder), logits(single)
    assert np.abs(reference).max() > 0.1
    assert np.abs(ours - reference).max() < 1e-4
    if layout == "deepspeed-zero3":
        same_as_deepspeeds_merge(only_run_dir(tmp_path / layout) / "checkpoints" / "step_00000003")


def same_as_deepspeeds_merge(checkpoint: Path) -> None:
    """A real ZeRO-3 checkpoint (2 ranks, 2 flat groups) read tensor by tensor is, to the bit,
    what DeepSpeed's own ``zero_to_fp32`` merges from its files read whole."""
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from launcher.train.checkpoint.deepspeed_tensors import DeepSpeedTensors
    from launcher.train.checkpoint.safe_load import CheckpointFiles

    reference = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint / "engine"), tag="engine")
    tensors = DeepSpeedTensors(checkpoint / "engine", 4, CheckpointFiles.verified(checkpoint))
    assert list(tensors.entries) == list(reference) and len(reference) > 10
    for name, want in reference.items():
        got = tensors.tensor(name)
        assert got.dtype == want.dtype, name
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), name


def test_docs_commands_that_need_a_trained_run(single: Path) -> None:
    """The commands README.md and docs/ show that read a trained run's checkpoints (`export`, and
    `train.init_from`/`model.from_hf` of what it exported), run as tests/unit/test_docs_commands.py
    runs the others, in the folder of this real run (named as `llmtrain run` names it): each page
    as a reader who trained one run and has exported nothing yet."""
    import shutil

    from tests.unit.test_docs_commands import (
        ALL,
        as_executed,
        check,
        fabricate_run,
        needs_trained_run,
    )

    where = single.parent
    # A second, newer tiny run that holds no checkpoint (as the docs' DeepSpeed example leaves
    # one that has not checkpointed yet): `export tiny` takes the newest run with a checkpoint.
    fabricate_run(where, "tiny-00000000", "tiny")
    pages = [(page, [c for c in page.commands if needs_trained_run(c)]) for page in ALL]
    assert sum(len(commands) for _, commands in pages) >= 3
    failures = []
    for _, commands in pages:
        shutil.rmtree(where / "exported", ignore_errors=True)
        for shown in commands:
            try:
                check(shown, invoke(*as_executed(shown), cwd=where))
            except AssertionError as exc:
                failures.append(str(exc))
    shutil.rmtree(where / "runs" / "tiny-00000000")
    assert not failures, "\n\n".join(failures)


def test_default_recipe_exports_as_gpt2_and_bad_requests_are_refused(tmp_path: Path) -> None:
    overrides = [o for o in SHORT if not o.startswith("checkpoint.")]
    done = llmtrain(
        "run", *overrides, "checkpoint.keep_last=2", "checkpoint.every_steps=2", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = str(only_run_dir(tmp_path))
    exported = invoke("export", run_dir, "--out", "hf", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "GPT2LMHeadModel" in exported.stdout
    assert np.isfinite(logits(tmp_path / "hf")).all()

    again = invoke("export", run_dir, "--out", "hf", cwd=tmp_path)
    assert again.returncode == 2 and "--overwrite" in again.stderr
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    linked = invoke("export", run_dir, "--out", "link", "--overwrite", cwd=tmp_path)
    assert linked.returncode == 2 and "symbolic link" in linked.stderr
    assert not (tmp_path / "elsewhere").exists()

    older = invoke("export", run_dir, "--out", "hf", "--step", "2", "--overwrite", cwd=tmp_path)
    assert older.returncode == 0, older.stderr[-3000:]
    assert "step 2" in older.stdout
    step2 = Path(run_dir) / "checkpoints" / "step_00000002"
    unsigned = invoke(
        "export",
        run_dir,
        "--out",
        "x",
        "--step",
        "2",
        cwd=tmp_path,
        env={"LLMTRAIN_CHECKPOINT_KEY": "k"},
    )
    assert unsigned.returncode == 2 and "not signed" in unsigned.stderr
    (step2 / "trainer_state.json").write_text("{}")
    damaged = invoke("export", run_dir, "--out", "x", "--step", "2", cwd=tmp_path)
    assert damaged.returncode == 2 and "refused" in damaged.stderr
    assert not (tmp_path / "x").exists()
    missing = invoke("export", run_dir, "--out", "x", "--step", "7", cwd=tmp_path)
    assert missing.returncode == 2 and "no checkpoint" in missing.stderr


# --- train.init_from ----------------------------------------------------------------------------
def logged_losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def first_losses(
    where: Path, *overrides: str, model: tuple[str, ...] = tuple(LLAMA)
) -> tuple[list[float], str]:
    done = llmtrain("run", *SHORT, *model, *overrides, cwd=where)
    assert done.returncode == 0, done.stderr[-3000:]
    return logged_losses(where / "runs" / "b"), done.stdout + done.stderr


def reference_loss(folder: Path, run_dir: Path) -> float:
    """Mean next-token loss of the exported weights (numpy reference) on the first batch the
    trainer draws in `run_dir` (its own data, sampler and seed)."""
    import yaml

    from launcher.config.composition.compose import config_from_values
    from launcher.config.layout import derive_layout
    from launcher.train.data import training_data
    from launcher.train.sampler import ShardedSampler

    cfg = config_from_values(yaml.safe_load((run_dir / "config.yaml").read_text()))
    lay = derive_layout(cfg)
    shards = training_data(cfg)  # what the trainer reads
    seq = cfg.model.seq_length
    sampler = ShardedSampler(
        shards.num_sequences(seq), 0, 1, lay.micro_batch_size * lay.grad_accum, cfg.train.seed
    )
    rows = shards.batch(sampler.next_batch_indices(), seq)
    tensors, config = read_hf_folder(folder)
    arrays = {k: v.numpy() for k, v in tensors.items()}
    total = []
    for row in rows:
        out = reference_llama(arrays, config, row[:-1]).astype(np.float64)
        out -= out.max(-1, keepdims=True)
        logp = out - np.log(np.exp(out).sum(-1, keepdims=True))
        total.append(-logp[np.arange(seq), row[1:]])
    return float(np.mean(total))


def test_init_from_an_export_or_a_run_starts_from_those_weights(
    single: Path, tmp_path: Path
) -> None:
    (tmp_path / "hf").mkdir()
    # The model's shape from the export's config.json (model.from_hf), its weights by init_from.
    losses, log = first_losses(
        tmp_path / "hf",
        f"train.init_from={single}",
        "run.name=b",
        model=(f"model.from_hf={single}",),
    )
    assert "initialised from" in log
    expected = reference_loss(single, tmp_path / "hf" / "runs" / "b")
    assert abs(losses[0] - expected) < 1e-4, (losses[0], expected)

    # The exporting run's own directory (its DCP checkpoint) gives the same start.
    (tmp_path / "run").mkdir()
    from_run, _ = first_losses(
        tmp_path / "run", f"train.init_from={only_run_dir(single.parent)}", "run.name=b"
    )
    assert abs(from_run[0] - losses[0]) < 1e-5

    # A fresh run's first loss is far from it: the weights were really used. The exporting run
    # is that fresh run (the same model, data and seed, from a random start).
    fresh = logged_losses(only_run_dir(single.parent))
    assert len(fresh) == 3
    assert abs(fresh[0] - losses[0]) > 1e-2

    # The same run again, longer: it resumes from its own checkpoint, init_from is ignored.
    more = llmtrain(
        "run",
        *SHORT[1:],
        *LLAMA,
        "train.steps=4",
        "--allow-config-change",
        f"train.init_from={single}",
        "run.name=b",
        cwd=tmp_path / "hf",
    )
    assert more.returncode == 0, more.stderr[-3000:]
    assert "ignored: resuming" in more.stdout + more.stderr
    steps = [
        json.loads(x)["step"]
        for x in (tmp_path / "hf/runs/b/metrics.jsonl").read_text().splitlines()
    ]
    assert steps[-1] == 4


def test_init_from_with_another_shape_is_refused_before_any_process(
    single: Path, tmp_path: Path
) -> None:
    done = llmtrain(
        "run", *SHORT, *LLAMA, "model.hidden_size=64", f"train.init_from={single}", cwd=tmp_path
    )
    assert done.returncode == 2
    assert "layers.0.attention.wq.weight: weights [128, 128], model [64, 64]" in done.stderr
    assert not (tmp_path / "runs").exists()
    missing = llmtrain("run", *SHORT, *LLAMA, f"train.init_from={tmp_path}/nowhere", cwd=tmp_path)
    assert missing.returncode == 2 and "no such folder" in missing.stderr
