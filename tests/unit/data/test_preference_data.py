"""`data prepare --input-format preference` (strings, message lists, UltraFeedback's shape, an
implicit prompt), the pairs' rows (launcher/data/chat/preference_rows.py) and the built-in pairs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from launcher.data.chat.builtin_chat import write_tokenizer
from launcher.data.chat.builtin_preference import pairs
from launcher.data.chat.chat_checks import open_chat_rows
from launcher.data.sources import describe
from launcher.data.token_index import PreparedIndex
from tests.cli import invoke

Q, RIGHT, WRONG = "What is 2 + 2?", "2 + 2 = 4.", "2 + 2 = 5."
USER = {"role": "user", "content": Q}


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


RECORDS = {
    "strings": {"prompt": Q, "chosen": RIGHT, "rejected": WRONG},
    "messages": {"prompt": [USER], "chosen": _assistant(RIGHT), "rejected": _assistant(WRONG)},
    "ultrafeedback": {
        "prompt": Q,
        "chosen": [USER, *_assistant(RIGHT)],
        "rejected": [USER, *_assistant(WRONG)],
    },
    "implicit prompt": {
        "chosen": [USER, *_assistant(RIGHT)],
        "rejected": [USER, *_assistant(WRONG)],
    },
}


def _prepare(tmp_path: Path, records: list[dict[str, object]], *extra: str):  # type: ignore[no-untyped-def]
    tok = write_tokenizer(tmp_path / "tok")  # bytes + ChatML specials, a ChatML template
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    return invoke(
        "data", "prepare", "--input", str(data), "--tokenizer", str(tok),
        "--output", str(tmp_path / "out"), *extra,
    )  # fmt: skip


def _text(ids: np.ndarray) -> str:
    return bytes(int(i) for i in ids if i < 256).decode()


def _rows(folder: Path, seq: int = 64):  # type: ignore[no-untyped-def]
    from launcher.config.schema import LLMTrainConfig

    cfg = LLMTrainConfig()
    cfg.model.seq_length = seq
    return open_chat_rows(describe(str(folder), "data.path"), "train", cfg)


@pytest.mark.integration  # prepare renders in the template worker, a child process
@pytest.mark.parametrize("shape", list(RECORDS))
def test_every_shape_gives_the_same_pair(tmp_path: Path, shape: str) -> None:
    done = _prepare(tmp_path, [RECORDS[shape]] * 3)  # the format is told from the records
    assert done.returncode == 0, done.stderr
    index = PreparedIndex.load(tmp_path / "out")
    assert index.chat["input_format"] == "preference"
    assert (index.chat["train_pairs"], index.chat["train_examples"]) == (3, 6)
    batch = _rows(tmp_path / "out").batch([0, 2], 64)
    assert batch.shape == (2, 2, 3, 65)  # pairs, (chosen, rejected), channels, seq + 1
    for k, answer in ((0, RIGHT), (1, WRONG)):
        tokens, trained = batch[0, k, 0], batch[0, k, 1]
        assert Q in _text(tokens)
        # The loss is on the response and its end-of-turn token, nothing of the prompt.
        assert _text(tokens[1:][trained[1:] > 0]) == answer
        assert int(tokens[1:][trained[1:] > 0][-1]) == 258  # <|im_end|>


@pytest.mark.integration  # prepare renders in the template worker, a child process
def test_pairs_stay_together_in_the_valid_split(tmp_path: Path) -> None:
    done = _prepare(tmp_path, [RECORDS["strings"]] * 40, "--valid-fraction", "0.1")
    assert done.returncode == 0, done.stderr
    chat = PreparedIndex.load(tmp_path / "out").chat
    assert chat["train_pairs"] + chat["valid_pairs"] == 40 and chat["valid_pairs"] > 0
    assert chat["valid_examples"] == 2 * chat["valid_pairs"]


@pytest.mark.integration  # prepare renders in the template worker, a child process
@pytest.mark.parametrize(
    ("record", "says"),
    [
        ({"prompt": Q, "chosen": RIGHT}, "expected"),
        ({"prompt": Q, "chosen": RIGHT, "rejected": 3}, "'rejected' must be a string"),
        ({"prompt": Q, "chosen": [USER], "rejected": WRONG}, "'chosen' must be one assistant"),
        ({"prompt": Q, "chosen": "  ", "rejected": WRONG}, "empty response"),
        ({"chosen": _assistant(RIGHT), "rejected": _assistant(WRONG)}, 'add "prompt"'),
        ({"prompt": [{"role": "wizard", "content": Q}], "chosen": RIGHT, "rejected": WRONG},
         "unknown role 'wizard'"),
    ],
)  # fmt: skip
def test_bad_pairs_exit_2_naming_the_line(tmp_path: Path, record: dict, says: str) -> None:  # type: ignore[type-arg]
    done = _prepare(tmp_path, [RECORDS["strings"], record], "--input-format", "preference")
    assert done.returncode == 2, done.stderr
    assert "pairs.jsonl:2" in done.stderr and says in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()  # nothing half-written


@pytest.mark.integration  # prepare renders in the template worker, a child process
def test_overlong_pairs_truncate_or_drop_together(tmp_path: Path) -> None:
    long = {"prompt": Q, "chosen": RIGHT + " " + "x" * 200, "rejected": WRONG}
    assert _prepare(tmp_path, [RECORDS["strings"], long]).returncode == 0
    from launcher.data.chat.preference_rows import PreferenceRows

    rows = _rows(tmp_path / "out", 64)
    assert rows.num_sequences(64) == 2 and rows.report.truncated == 1
    dropped = PreferenceRows(rows.tokens, rows.roles, 64, "drop", 256)
    assert dropped.num_sequences(64) == 1  # the whole pair left out, not its chosen half
    assert dropped.report.dropped_overlong == 2


def test_builtin_pairs_are_fixed_and_right_over_wrong() -> None:
    first = pairs(50)
    assert first == pairs(50)  # seeded: the same bytes on every machine
    assert all(r["chosen"] != r["rejected"] for r in first)
    added = [r for r in first if r["prompt"][-1]["content"].startswith("What is") and "+" in
             r["prompt"][-1]["content"]]  # fmt: skip
    for r in added:
        a, b = (int(x) for x in r["prompt"][-1]["content"][8:-1].split(" + "))
        assert r["chosen"][0]["content"] == f"{a} + {b} = {a + b}."
