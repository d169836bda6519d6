"""Batches as they are (issue #40): data.packing=false cuts each micro-batch to its longest
example (launcher.train.finetune.masked_loss.trim_to_longest), `data prepare` writes the length
histogram (launcher.data.length_histogram) and `plan` prices the expected longest of a micro-batch
(launcher.plan.padded_length). Expected figures are derived by hand in the comments."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from launcher.config.composition.compose import compose_config
from launcher.config.layout import derive_layout
from launcher.data.length_histogram import length_histogram, padded_inputs, read_histogram
from launcher.data.packing import ChatRows
from launcher.plan.padded_length import capped, expected_longest, priced_length
from launcher.plan.planner import make_plan
from launcher.train.finetune.masked_loss import micro_batches, trim_to_longest, unpack
from tests.unit.data.test_chat_packing import _Examples

pytestmark = pytest.mark.unit


def test_histogram_counts_padded_inputs() -> None:
    # n tokens are n - 1 inputs, rounded up to 8: 1 -> 8 (at least a bucket), 2 -> 1 -> 8,
    # 9 -> 8 -> 8, 10 -> 9 -> 16, 17 -> 16 -> 16, 18 -> 17 -> 24.
    assert [padded_inputs(n) for n in (1, 2, 9, 10, 17, 18)] == [8, 8, 8, 16, 16, 24]
    assert length_histogram([1, 2, 9, 10, 17, 18]) == {"8": 3, "16": 2, "24": 1}


def test_expected_longest_by_hand() -> None:
    hist = {8: 2, 16: 1, 32: 1}  # N = 4: F = 2/4, 3/4, 4/4
    # k = 1: the mean, (8 + 8 + 16 + 32) / 4 = 16.
    assert expected_longest(hist, 1) == pytest.approx(16.0)
    # k = 2: F^2 = 1/4, 9/16, 1; E = 8 x 1/4 + 16 x (9/16 - 1/4) + 32 x (1 - 9/16)
    #          = 2 + 5 + 14 = 21.
    assert expected_longest(hist, 2) == pytest.approx(21.0)
    # k = 3: F^3 = 1/8, 27/64, 1; E = 8/8 + 16 x 19/64 + 32 x 37/64 = 1 + 4.75 + 18.5 = 24.25.
    assert expected_longest(hist, 3) == pytest.approx(24.25)
    # Many draws: the longest example.
    assert expected_longest(hist, 10_000) == pytest.approx(32.0)


def test_capped_truncates_or_drops_at_seq_length() -> None:
    hist = {8: 2, 16: 1, 32: 1}
    assert capped(hist, 16, "truncate") == {8: 2, 16: 2}
    assert capped(hist, 16, "drop") == {8: 2, 16: 1}


# Two examples of 5 and 12 tokens (roles: the last three tokens trained), seq_length 64.
TOKENS_OF = [[1, 2, 3, 4, 5], list(range(10, 22))]
ROLES_OF = [[0, 0, 2, 2, 2], [0] * 9 + [2, 2, 2]]


def _rows(packing: bool) -> ChatRows:
    return ChatRows(_Examples(TOKENS_OF), _Examples(ROLES_OF), 64, packing, "drop", "all", 0)


def test_reader_pads_a_micro_batch_to_its_longest_example() -> None:
    rows = torch.from_numpy(_rows(packing=False).batch([0, 1], 64))
    assert tuple(rows.shape) == (2, 3, 65)
    # Longest 12 tokens: 11 inputs, rounded up to 16; the row is 16 + 1 wide.
    cut = trim_to_longest(rows)
    assert tuple(cut.shape) == (2, 3, 17)
    # One micro-batch per example (mbs 1): each cut to its own length.
    shapes = [tuple(i.shape) for i, _, _ in micro_batches(rows, 1)]
    assert shapes == [(1, 8), (1, 16)]  # 5 tokens: 4 inputs -> 8; 12 tokens: 11 -> 16
    # The columns cut hold padding only: the same trained targets, the same tokens before.
    full_in, full_t, _ = unpack(rows)
    in_, t, seg = unpack(cut)
    assert seg is None
    assert torch.equal(in_, full_in[:, :16]) and torch.equal(t, full_t[:, :16])
    assert int((full_t != -100).sum()) == int((t != -100).sum()) == 4 + 11


def test_packed_and_pretraining_rows_stay_whole() -> None:
    packed = torch.from_numpy(_rows(packing=True).batch([0], 64))
    assert trim_to_longest(packed).shape == packed.shape
    windows = torch.zeros(2, 65, dtype=torch.int64)
    assert trim_to_longest(windows).shape == windows.shape


def _folder(tmp_path: Path, hist: dict[str, int] | None, layout: str = "chat") -> Path:
    chat = {} if hist is None else {"length_histogram": hist}
    (tmp_path / "index.json").write_text(json.dumps({"layout": layout, "chat": chat}))
    return tmp_path


PLAN = [
    "model=llama2-7b",
    "finetune=lora",
    "cluster=a100-80gb",
    "cluster.gpus_per_node=1",
    "model.seq_length=2048",
    "train.micro_batch_size=2",
    "train.global_batch_size=2",
    "data.packing=false",
]


def test_plan_prices_the_expected_longest(tmp_path: Path) -> None:
    # 3 examples of 256 inputs, 1 of 1,024: F = 3/4, 1; k = 2:
    # E = 256 x 9/16 + 1024 x 7/16 = 144 + 448 = 592 tokens.
    folder = _folder(tmp_path, {"256": 3, "1024": 1})
    assert read_histogram(folder) == {256: 3, 1024: 1}
    cfg = compose_config([*PLAN, f"data.path={folder}"]).config
    priced = priced_length(cfg, derive_layout(cfg))
    assert priced is not None and priced.tokens == 592
    assert "priced at 592 tokens (expected longest of 2 examples, from data.path's histogram" in (
        priced.note
    )
    plan = make_plan(cfg, with_fixes=False)
    whole = make_plan(cfg, with_fixes=False, padded_batches=False)
    assert plan.priced_length == priced.note and plan.config.model.seq_length == 2048
    # Activations and compute shrink with the length; the weights do not.
    assert plan.memory.heaviest.activations < whole.memory.heaviest.activations
    assert plan.time.step_s < whole.time.step_s
    assert plan.memory.heaviest.weights == whole.memory.heaviest.weights


def test_plan_without_histogram_prices_seq_length_and_says_so(tmp_path: Path) -> None:
    cfg = compose_config([*PLAN, f"data.path={_folder(tmp_path, None)}"]).config
    priced = priced_length(cfg, derive_layout(cfg))
    assert priced is not None and priced.tokens == 2048
    assert "priced at 2,048 tokens (model.seq_length" in priced.note
    assert "no length histogram" in priced.note


def test_plan_of_whole_rows_has_no_note(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"256": 3})
    packed = compose_config([*PLAN[:-1], f"data.path={folder}"]).config
    assert priced_length(packed, derive_layout(packed)) is None
    tokens = _folder(tmp_path, None, layout="shards")  # pre-training windows
    cfg = compose_config([*PLAN, f"data.path={tokens}"]).config
    assert priced_length(cfg, derive_layout(cfg)) is None


def test_histogram_sums_to_examples() -> None:
    lengths = np.random.default_rng(0).integers(2, 3000, size=500)
    hist = length_histogram(lengths.tolist())
    assert sum(hist.values()) == 500
    assert all(int(k) % 8 == 0 for k in hist)
