"""The budget of a fine-tune: train.epochs over the prepared data, the finetune groups' own
schedule, and `plan` pricing the fine-tune rather than a pre-training recipe's tokens (pure; no
torch). Expected numbers are worked by hand in the comments."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.epoch_rows import epoch_rows, epoch_steps
from launcher.config.layout import derive_layout
from tests.cli import invoke

pytestmark = pytest.mark.unit

SEVENTY_B_LORA = ["recipe=llama3-70b", "finetune=lora"]


def _index(folder: Path, **fields: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "index.json").write_text(json.dumps(fields), encoding="utf-8")
    return folder


def _chat(folder: Path, hist: dict[str, int]) -> Path:
    return _index(folder, layout="chat", total_tokens=1, chat={"length_histogram": hist})


def test_epoch_steps_round_the_last_partial_batch_up() -> None:
    assert epoch_steps(1, 51_942, 16) == 3_247  # alpaca-cleaned: 51,942 / 16 = 3,246.4 -> 3,247
    assert epoch_steps(2.5, 10, 4) == 7  # 25 rows / 4 = 6.25 -> 7
    assert epoch_steps(1, 64, 16) == 4  # exactly 4 batches, no fifth
    assert epoch_steps(0.01, 10, 4) == 1  # at least one step


def test_epoch_rows_from_the_index(tmp_path: Path) -> None:
    base = compose_config(["train.epochs=1"]).config

    def rows(path: Path, seq: int = 32, packing: bool = True, overlong: str = "truncate"):  # type: ignore[no-untyped-def]
        data = dataclasses.replace(base.data, path=str(path), packing=packing, overlong=overlong)
        model = dataclasses.replace(base.model, seq_length=seq)
        found = epoch_rows(dataclasses.replace(base, data=data, model=model))
        return None if found is None else found.rows

    # Pre-training tokens: 10,000 // (32 + 1) = 303 whole windows.
    assert rows(_index(tmp_path / "tok", layout="shards", total_tokens=10_000)) == 303
    chat = _chat(tmp_path / "chat", {"8": 3, "16": 2, "40": 1})
    # One example a row: 6; under drop the 40-token input (> seq 32) leaves: 5.
    assert rows(chat, packing=False) == 6
    assert rows(chat, packing=False, overlong="drop") == 5
    # Packed into rows of 17 tokens (seq 16): examples of 8 + 1 = 9 tokens, one a row (9 + 9 >
    # 17), so 4 examples make 4 rows; at seq 17 (rows of 18) two fit a row: 2 rows.
    packed = _chat(tmp_path / "packed", {"8": 4})
    assert rows(packed, seq=16) == 4
    assert rows(packed, seq=17) == 2
    # Unknown: no data.path, a Megatron folder, an older chat index without a histogram.
    assert epoch_rows(base) is None
    assert rows(_index(tmp_path / "mg", layout="megatron", total_tokens=10_000)) is None
    assert rows(_index(tmp_path / "old", layout="chat", chat={})) is None


def test_epochs_set_the_steps_from_the_data(tmp_path: Path) -> None:
    chat = _chat(tmp_path / "chat", {"64": 100, "128": 60})
    cfg = compose_config(
        ["finetune=lora", f"data.path={chat}", "data.packing=false", "train.epochs=3"]
    ).config
    # 160 examples, 3 epochs, 16 a step (conf/finetune/lora.yaml): 480 / 16 = 30 steps.
    assert derive_layout(cfg).steps == 30


def test_a_finetune_group_sets_its_own_schedule_over_a_pretraining_recipe() -> None:
    cfg = compose_config(SEVENTY_B_LORA).config
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.warmup_steps) == (3e-4, 0.0, 100)
    assert (cfg.train.epochs, cfg.train.steps, cfg.train.tokens) == (1, 1000, None)
    assert (cfg.cluster.num_nodes, cfg.train.global_batch_size) == (1, 16)
    qlora = compose_config(["recipe=llama3-70b", "finetune=qlora"]).config.optim
    assert (qlora.lr, qlora.schedule, qlora.grad_clip, qlora.weight_decay) == (
        2e-4,
        "constant",
        0.3,
        0.0,
    )
    full = compose_config(["recipe=llama3-70b", "finetune=full"]).config
    assert (full.optim.lr, full.optim.weight_decay, full.train.tokens) == (2e-5, 0.01, None)
    # The recipe alone keeps its pre-training budget and schedule.
    pre = compose_config(["recipe=llama3-70b"]).config
    assert (pre.train.tokens, pre.train.epochs, pre.optim.weight_decay) == (15e12, None, 0.1)


def test_plan_prices_the_finetune_not_fifteen_trillion_tokens() -> None:
    out = invoke("plan", *SEVENTY_B_LORA)
    # 1,000 steps (the group's price of an unknown data size), not the recipe's 1,788,140.
    assert "training 1,000 steps in" in out.stdout, out.stdout
    assert "1,788,140" not in out.stdout
    assert "train.epochs=1: the data's size is unknown" in out.stdout
    assert "from train.steps=1000" in out.stdout


def test_a_step_count_on_the_command_line_replaces_the_epochs() -> None:
    cfg = compose_config([*SEVENTY_B_LORA, "train.steps=20"]).config
    assert (cfg.train.epochs, cfg.train.steps) == (None, 20)
    assert derive_layout(cfg).steps == 20


def test_epochs_and_steps_both_on_the_command_line_are_refused() -> None:
    out = invoke("validate", *SEVENTY_B_LORA, "train.epochs=2", "train.steps=20")
    assert out.returncode == 2
    said = out.stdout + out.stderr
    assert "train.epochs and train.steps" in said and "train.epochs=2" in said, said
    assert "Traceback" not in said
