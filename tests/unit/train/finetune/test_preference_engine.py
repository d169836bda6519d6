"""The torch engine on preference pairs, in this process (one gloo rank): the LoRA reference is
the model with its adapters off, the full fine-tuning one is precomputed into the run directory;
both start at loss ln 2 and learn the pairs; simpo and orpo step without a reference."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from launcher.config.composition.compose import compose_config  # noqa: E402
from launcher.config.schema import LLMTrainConfig  # noqa: E402
from launcher.errors import UserError  # noqa: E402
from launcher.train.engines.torch_engine import TorchEngine  # noqa: E402
from launcher.train.finetune.preference_reference import (  # noqa: E402
    REFERENCE_FILE,
    reference_table,
    resume_problem,
)
from launcher.train.trainer import base_needed_on_resume  # noqa: E402

SEQ, PAIRS = 24, 4
SMALL = [
    "recipe=tiny-dpo-lora", "train.init_from=null", f"model.seq_length={SEQ}",
    "train.micro_batch_size=2", "train.global_batch_size=4", "optim.warmup_steps=0",
    "optim.lr=1e-2", "optim.min_lr=1e-2",
]  # fmt: skip


def config(*overrides: str) -> LLMTrainConfig:
    return compose_config([*SMALL, *overrides]).config


class Pairs:
    """Synthetic preference rows [n, 2, 3, SEQ + 1]: a shared prompt, two different responses."""

    def __init__(self, n: int = PAIRS):
        gen = torch.Generator().manual_seed(0)
        rows = torch.zeros((n, 2, 3, SEQ + 1), dtype=torch.int64)
        prompt = torch.randint(0, 256, (n, 10), generator=gen)
        for k in (0, 1):
            rows[:, k, 0, :10] = prompt
            rows[:, k, 0, 10:20] = torch.randint(0, 256, (n, 10), generator=gen)
            rows[:, k, 0, 20:] = 256  # padding
            rows[:, k, 1, 10:20] = 1  # the response carries the loss
        self.rows = rows

    def num_sequences(self, seq_len: int) -> int:
        return self.rows.shape[0]

    def batch(self, indices: list[int], seq_len: int) -> np.ndarray:
        return self.rows[list(indices)].numpy()


def train(engine: TorchEngine, rows: torch.Tensor, steps: int, table=None):  # type: ignore[no-untyped-def]
    results = []
    for _ in range(steps):
        ref = None if table is None else table.lookup(list(range(rows.shape[0])))
        results.append(engine.step(rows, 1e-2, ref))
    return results


def test_lora_reference_is_the_model_with_adapters_off(one_process_group: None) -> None:
    engine = TorchEngine(config(), seed=0)
    assert engine.objective is not None and engine.objective.mode == "adapters-off"
    results = train(engine, Pairs().rows, 8)
    first, last = results[0], results[-1]
    # Step 1: B = 0, the policy is the reference: margin 0, loss ln 2, no pair right yet.
    assert first.loss == pytest.approx(math.log(2), abs=1e-6)
    assert first.preference is not None and first.preference["rewards/accuracy"] == 0.0
    assert abs(first.preference["rewards/margin"]) < 1e-6
    assert last.loss < 0.6 and last.preference["rewards/accuracy"] == 1.0
    assert last.preference["rewards/margin"] > 0
    assert first.trained_tokens == 2 * PAIRS * 10  # the response targets of both sequences


def test_full_finetuning_precomputes_the_reference(one_process_group: None, tmp_path: Path) -> None:
    cfg = config("finetune=full")
    data = Pairs()
    engine = TorchEngine(cfg, seed=0)
    lines: list[str] = []
    table = reference_table(cfg, tmp_path, engine, data, False, lines.append)
    assert table is not None and np.isfinite(table.values).all()
    saved = json.loads((tmp_path / REFERENCE_FILE).read_text())
    assert saved["weights_sha256"] == engine.weights_digest() and "computed" in lines[0]
    results = train(engine, data.rows, 4, table)
    assert results[0].loss == pytest.approx(math.log(2), abs=1e-6)
    assert results[-1].loss < results[0].loss
    # A resume reads the stored table; one with another train.init_from is refused by key.
    again = reference_table(cfg, tmp_path, engine, data, True, lines.append)
    assert again is not None and np.array_equal(again.values, table.values)
    other = config("finetune=full", "train.init_from=/elsewhere")
    problem = resume_problem(saved, other, PAIRS, tmp_path / REFERENCE_FILE)
    assert problem is not None and problem.startswith("train.init_from=/elsewhere")
    (tmp_path / REFERENCE_FILE).unlink()
    with pytest.raises(UserError, match="--fresh"):
        reference_table(cfg, tmp_path, engine, data, True, lines.append)


@pytest.mark.parametrize("objective", ["simpo", "orpo"])
def test_reference_free_objectives_step(one_process_group: None, objective: str) -> None:
    engine = TorchEngine(config(f"finetune.objective={objective}"), seed=0)
    assert engine.objective is not None and engine.objective.mode is None
    results = train(engine, Pairs().rows, 3)
    assert all(math.isfinite(r.loss) for r in results)
    assert results[-1].loss < results[0].loss


def test_the_reference_copy_equals_the_precomputed_reference(
    one_process_group: None, tmp_path: Path
) -> None:
    """finetune.reference=copy: a second model, frozen (no gradients, not optimized, eval mode),
    holding the policy's weights before step 1, so its steps are the precomputed reference's."""
    cfg = config("finetune=full", "finetune.reference=copy")
    engine = TorchEngine(cfg, seed=0)
    copy = engine.reference_copy
    assert copy is not None and not copy.training
    assert not any(p.requires_grad for p in copy.parameters())
    optimized = {id(p) for group in engine.optimizer.param_groups for p in group["params"]}
    assert not optimized & {id(p) for p in copy.parameters()}
    data = Pairs()
    got = train(engine, data.rows, 3)
    pre_cfg = config("finetune=full")
    pre = TorchEngine(pre_cfg, seed=0)
    assert pre.reference_copy is None
    table = reference_table(pre_cfg, tmp_path, pre, data, False, lambda _: None)
    want = train(pre, data.rows, 3, table)
    assert [r.loss for r in got] == [r.loss for r in want]
    assert [r.preference for r in got] == [r.preference for r in want]
    assert got[-1].loss != got[0].loss  # the policy moved; the copy did not


def test_a_resume_rebuilds_the_reference_copy_from_train_init_from() -> None:
    """The copy is the base, never the checkpoint: a resumed full run with reference=copy still
    reads train.init_from (precomputed reads its stored table instead)."""
    assert base_needed_on_resume(config("finetune=full", "finetune.reference=copy"))
    assert not base_needed_on_resume(config("finetune=full"))
    assert base_needed_on_resume(config())  # lora: the checkpoints hold the adapters alone
