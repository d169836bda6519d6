"""Packing chat examples into rows: the loss mask data.train_on picks, the over-long policy, the
report, and configuration errors that name their key (exit 2)."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from launcher.data.packing import SEGMENT, TOKENS, TRAINED, ChatRows
from tests.cli import invoke

pytestmark = pytest.mark.unit


class _Examples:
    """IndexedDataset-like: ``sizes`` and ``sequence(i)``."""

    def __init__(self, sequences: list[list[int]]):
        self.data = [np.asarray(s) for s in sequences]
        self.sizes = np.asarray([len(s) for s in sequences])

    def sequence(self, i: int) -> np.ndarray:
        return self.data[i]


# Three examples: roles 0 prompt, 1 an earlier assistant turn, 2 the last turn.
TOKENS_OF = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11, 12, 13], [14, 15, 16]]
ROLES_OF = [[0, 0, 2, 2, 2], [0, 1, 1, 0, 0, 2, 2, 2], [0, 0, 0]]


def _rows(seq: int, packing: bool = True, overlong: str = "truncate", on: str = "assistant"):
    return ChatRows(_Examples(TOKENS_OF), _Examples(ROLES_OF), seq, packing, overlong, on, pad_id=0)


def test_packed_rows_keep_examples_apart() -> None:
    rows = _rows(seq=13)  # rows of 14: [ex0 ex1] then ex2 dropped (nothing trained)
    assert rows.report.rows == 1 and rows.report.dropped_untrained == 1
    row = rows.batch([0], 13)[0]
    assert row[TOKENS].tolist() == [*TOKENS_OF[0], *TOKENS_OF[1], 0]
    assert row[SEGMENT].tolist() == [1] * 5 + [2] * 8 + [3]
    # Trained: assistant tokens, never an example's first token, never padding.
    assert row[TRAINED].tolist() == [0, 0, 1, 1, 1, 0, 1, 1, 0, 0, 1, 1, 1, 0]
    assert rows.report.trained_tokens == int(row[TRAINED].sum())
    assert rows.report.padding == 1


@pytest.mark.parametrize(
    ("on", "trained"),
    [("completion", [0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 0]),
     ("all", [0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0])],
)  # fmt: skip
def test_train_on_picks_the_mask(on: str, trained: list[int]) -> None:
    row = _rows(seq=13, on=on).batch([0], 13)[0]
    assert row[TRAINED].tolist() == trained


def test_unpacked_rows_are_padded_one_example_each() -> None:
    rows = _rows(seq=9, packing=False)
    assert rows.report.rows == 2
    first = rows.batch([0], 9)[0]
    assert first[TOKENS].tolist() == [*TOKENS_OF[0], 0, 0, 0, 0, 0]
    # No document mask needed: 0 on the example, PADDING (-1) on its padding (trim_to_longest).
    assert first[SEGMENT].tolist() == [0] * 5 + [-1] * 5
    assert rows.report.padding_share == pytest.approx((5 + 2) / 20)


def test_overlong_truncate_or_drop() -> None:
    truncated = _rows(seq=5)  # rows of 6: example 1 (8 tokens) is cut to 6
    assert truncated.report.truncated == 1 and truncated.report.kept == 2
    dropped = _rows(seq=5, overlong="drop")
    assert dropped.report.dropped_overlong == 1 and dropped.report.kept == 1
    assert "1 too long under data.overlong=drop" in dropped.report.line()


def _validate(*overrides: str) -> subprocess.CompletedProcess[str]:
    return invoke("validate", "recipe=tiny-sft", *overrides)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["data.train_on=prompts"], "data.train_on=prompts"),
        (["data.overlong=wrap"], "data.overlong=wrap"),
        (["parallel.pp=2", "model.tie_embeddings=false", "cluster.gpus_per_node=2",
          "train.micro_batch_size=4"], "data.packing=true with parallel.pp=2"),
        (["model.vocab_size=256"], "model.vocab_size=256"),
    ],
)  # fmt: skip
def test_bad_keys_exit_2_naming_the_key(overrides: list[str], key: str) -> None:
    done = _validate(*overrides)
    assert done.returncode == 2, done.stdout + done.stderr
    assert key in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def test_padded_rows_run_with_a_pipeline() -> None:
    done = _validate(
        "parallel.pp=2", "model.tie_embeddings=false", "cluster.gpus_per_node=2",
        "train.micro_batch_size=4", "data.packing=false",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_rule_knows_the_builtin_vocabulary() -> None:
    from launcher.data.chat.builtin_chat import VOCAB_SIZE
    from launcher.validate.chat_rules import BUILTIN_CHAT_VOCAB

    assert BUILTIN_CHAT_VOCAB == VOCAB_SIZE
