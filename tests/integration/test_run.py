"""`llmtrain run` end to end: real torchrun, real gloo process groups, real DeepSpeed engines.

Each test runs the CLI in a child process from its own temporary folder (so `runs/` lands there)
and reads what a user would read: the exit code, stderr, and the run directory's files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.cli import invoke, llmtrain

pytestmark = pytest.mark.integration

# The tiny recipe, shortened: 12 steps of 8 sequences of 64 tokens train in seconds. Micro-batches
# of 4: one process accumulates 2 of them per step, two processes take one each.
SHORT = [
    "train.steps=12",
    "model.seq_length=64",
    "train.micro_batch_size=4",
    "optim.warmup_steps=2",
    "train.log_every=4",
]


def only_run_dir(cwd: Path) -> Path:
    (run_dir,) = (cwd / "runs").iterdir()
    return run_dir


def losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def assert_dry_run_wrote_the_same(cwd: Path, run_dir: Path, *args: str) -> None:
    """`run --dry-run` shows, byte for byte, the files the real `run` wrote (same folder)."""
    dry = llmtrain("run", "--dry-run", "--json", *args, cwd=cwd, timeout=120)
    assert dry.returncode == 0, dry.stderr[-3000:]
    document = json.loads(dry.stdout)
    assert document["run_dir"] == str(run_dir)
    files = document["files"]
    assert {"config.yaml", "plan.json", "launch.sh"} <= set(files)
    for name, text in files.items():
        assert (run_dir / name).read_text() == text, name


def test_default_recipe_trains_and_fills_the_run_directory(tmp_path: Path) -> None:
    done = llmtrain("run", *SHORT, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    for name in ("config.yaml", "plan.json", "launch.sh", "metrics.jsonl", "summary.json"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "logs" / "rank0.log").is_file()
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert (run_dir / "checkpoints" / "step_00000012" / "manifest.json").is_file()
    seen = losses(run_dir)
    assert len(seen) == 12 and seen[-1] < seen[0] - 0.5, seen
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["predicted_step_s"] > 0 and summary["measured_step_s"] > 0
    assert "done: 12 steps" in done.stdout
    # Running the same command again finds the finished run and trains nothing; a summary.json
    # the first run could not write (a disk that filled after the last checkpoint, seen on a
    # 20 MiB tmpfs) is written then, so the run is "done", not "interrupted" for ever.
    (run_dir / "summary.json").unlink()
    again = llmtrain("run", *SHORT, cwd=tmp_path)
    assert again.returncode == 0 and "run already complete: 12/12" in again.stdout
    assert json.loads((run_dir / "summary.json").read_text())["resumed_at"] == 12
    status = invoke("status", str(run_dir), "--json")
    assert json.loads(status.stdout)["status"] == "done", status.stdout
    assert_dry_run_wrote_the_same(tmp_path, run_dir, *SHORT)


def resume_matches(tmp_path: Path, overrides: list[str]) -> Path:
    """Train 12 steps checkpointing every 4; then cut the run back to its step-8 checkpoint and
    resume: steps 9-12 must reproduce the uninterrupted losses exactly (CPU is deterministic)."""
    args = ["run", *SHORT, "checkpoint.every_steps=4", "checkpoint.keep_last=5", *overrides]
    full = llmtrain(*args, cwd=tmp_path)
    assert full.returncode == 0, full.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    uninterrupted = losses(run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "step_00000012")
    metrics = (run_dir / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text("\n".join(metrics[:8]) + "\n")
    resumed = llmtrain(*args, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "(step 8)" in resumed.stdout
    assert losses(run_dir) == uninterrupted
    return run_dir


def test_resume_reproduces_losses_torch_cp2_zero1_fp16(tmp_path: Path) -> None:
    """Ring attention, ZeRO-1 optimizer shards and the loss scaler through the real loop."""
    resume_matches(
        tmp_path,
        ["cluster.gpus_per_node=2", "parallel.cp=2", "zero.stage=1", "precision=fp16"],
    )


def test_resume_reproduces_losses_deepspeed_zero2(tmp_path: Path) -> None:
    """Also ZeRO stage 2's case of the stages test below: its run is this one's first."""
    run_dir = resume_matches(
        tmp_path, ["backend=deepspeed", "zero.stage=2", "cluster.gpus_per_node=2"]
    )
    assert_deepspeed_trained(run_dir, 2)


def assert_deepspeed_trained(run_dir: Path, stage: int) -> None:
    ds = json.loads((run_dir / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == stage
    # global 8 = micro 4 x dp 2 x accum 1
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"]) == (8, 4)
    assert ds["gradient_accumulation_steps"] == 1
    seen = losses(run_dir)
    assert seen[-1] < seen[0] - 0.5, seen
    # DeepSpeed's deprecated collectives no longer flood the rank logs with FutureWarnings
    # (issue 33: ~400 per run of the docs' example before the engine silenced those two).
    for log in sorted((run_dir / "logs").glob("*.log")):
        assert "FutureWarning" not in log.read_text(errors="replace"), log


# Stage 2 is checked by test_resume_reproduces_losses_deepspeed_zero2 (same run, plus checkpoints);
# stage 1 runs with its optimizer offloaded to the host (ZeRO-Offload: DeepSpeed's CPU Adam).
@pytest.mark.parametrize("stage", [0, 1, 3])
def test_deepspeed_zero_stages_train_on_two_processes(tmp_path: Path, stage: int) -> None:
    args = (*SHORT, "backend=deepspeed", f"zero.stage={stage}", "cluster.gpus_per_node=2")
    offload = ("zero.offload_optimizer=cpu",) if stage == 1 else ()
    done = llmtrain("run", *args, *offload, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    assert_deepspeed_trained(run_dir, stage)
    if offload:
        ds = json.loads((run_dir / "ds_config.json").read_text())
        assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu", ds
    if stage == 3:  # ds_config.json too
        assert_dry_run_wrote_the_same(tmp_path, run_dir, *args)


def test_a_crashing_rank_tears_the_run_down(tmp_path: Path) -> None:
    done = llmtrain(
        "run",
        *SHORT,
        "cluster.gpus_per_node=2",
        cwd=tmp_path,
        env={"LLMTRAIN_FAIL_AT_STEP": "3", "LLMTRAIN_FAIL_RANK": "1"},
        timeout=300,
    )
    assert done.returncode == 1
    assert "rank 1 failed first: RuntimeError: injected failure at step 3" in done.stderr
    assert "Traceback" not in done.stderr
    run_dir = only_run_dir(tmp_path)
    assert (run_dir / "logs" / "rank1.error.json").is_file()
    assert not (run_dir / "checkpoints").exists() or not list(
        (run_dir / "checkpoints").glob("step_*")
    )


def test_a_hung_rank_is_detected_and_the_run_stopped(tmp_path: Path) -> None:
    # Rank 1 stops making progress before step 3; rank 0 waits in the next collective. Both
    # watchdogs fire after 8 s of no progress; torchrun stops the run.
    done = llmtrain(
        "run",
        *SHORT,
        "cluster.gpus_per_node=2",
        "train.hang_timeout_s=8",
        cwd=tmp_path,
        env={"LLMTRAIN_FAIL_AT_STEP": "3", "LLMTRAIN_FAIL_RANK": "1", "LLMTRAIN_FAIL_MODE": "hang"},
        timeout=300,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "HangDetected: no training progress for" in done.stderr
    assert "after step 2" in done.stderr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["parallel.tp=3"], "parallel.tp=3 does not divide model.num_attention_heads=4"),
        (["backend=megatron"], "backend=megatron"),
        (
            ["zero.stage=1", "parallel.tp=2", "cluster.gpus_per_node=2"],
            "shards optimizer states over plain data parallel only",
        ),
        (["recipe=gpt-7b", "cluster=cpu", "cluster.gpus_per_node=1"], "does not fit"),
        (["cluster=h100-80gb", "train.global_batch_size=64"], "needs 8 CUDA GPUs"),
        (["data.path=/nonexistent/data"], "no dataset there"),
    ],
)
def test_bad_configs_are_refused_before_any_process(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    done = llmtrain("run", *overrides, cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()


def test_data_prepare_then_train_on_it(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(3000))
    (corpus / "a.txt").write_text(text)
    prepared = invoke("data", "prepare", "--input", str(corpus), "--output", "data", cwd=tmp_path)
    assert prepared.returncode == 0, prepared.stderr
    assert (tmp_path / "data" / "index.json").is_file()
    done = llmtrain("run", *SHORT, f"data.path={tmp_path / 'data'}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = losses(only_run_dir(tmp_path))
    assert seen[-1] < seen[0] - 1.0


def test_run_json_prints_one_document_and_progress_on_stderr(tmp_path: Path) -> None:
    done = llmtrain("run", *SHORT, "--json", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)  # stdout holds the document and nothing else
    assert doc["exit_code"] == 0 and Path(doc["run_dir"]) == only_run_dir(tmp_path).resolve()
    assert (
        doc["summary"]["steps"] == 12 and doc["summary"]["last_loss"] < doc["summary"]["first_loss"]
    )
    assert "step" in done.stderr  # rank 0's progress went to stderr
    failed = llmtrain(
        "run",
        *SHORT,
        "--fresh",
        "--json",
        cwd=tmp_path,
        env={"LLMTRAIN_FAIL_AT_STEP": "2", "LLMTRAIN_FAIL_RANK": "0"},
        timeout=300,
    )
    assert failed.returncode == 1
    error = json.loads(failed.stdout)
    assert error["exit_code"] == 1 and "injected failure" in error["error"]


def test_jsonl_corpus_with_a_users_tokenizer_json_prepares(tmp_path: Path) -> None:
    """Bring your own data and tokenizer: JSON Lines records + a Hugging Face tokenizer.json."""
    from launcher.data.tokenizer import BPETokenizer

    records = [
        {"id": i, "text": f"record {i}: the quick brown fox jumps over the lazy dog {i % 7}."}
        for i in range(2500)
    ]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
    # The user's tokenizer, made elsewhere (here: a small byte-level BPE with Llama 3's EOD name).
    texts = [r["text"] for r in records]
    BPETokenizer.train(texts, 320, eod_token="<|end_of_text|>").save(tmp_path / "tokenizer.json")
    prepared = invoke(
        "data",
        "prepare",
        "--input",
        str(corpus),
        "--output",
        "data",
        "--tokenizer",
        str(tmp_path / "tokenizer.json"),
        "--json",
        cwd=tmp_path,
    )
    assert prepared.returncode == 0, prepared.stderr
    index = json.loads(prepared.stdout)
    assert index["tokenizer"] == "hf" and index["eod_id"] == 0
    assert index["source"]["documents"] == 2500 and index["valid_documents"] == 25
    from launcher.data.megatron_indexed import IndexedDataset
    from launcher.data.tokenizer import load_tokenizer

    stream = IndexedDataset.open(tmp_path / "data" / "train_text_document").tokens
    valid = IndexedDataset.open(tmp_path / "data" / "valid_text_document").tokens
    # One end-of-document token per record; 1% of the records (--valid-fraction) held out.
    assert int((stream == 0).sum()) == 2475 and int((valid == 0).sum()) == 25
    first = load_tokenizer(tmp_path / "data").decode(stream[: int(np.argmax(stream == 0))])
    assert first == records[0]["text"]  # the text field only: no braces, no "id"
    # Training on such a folder (JSON Lines + the user's tokenizer.json, with evaluation) is
    # tests/integration/test_data_eval.py's run.
