"""Issue 42, data side: a user's records and tokenizer files, however hostile, end `data prepare`
with exit 2 naming the file (and line, and field), at once, with no traceback and nothing left.

A lone surrogate in a record (``"\\ud800"``: the tokenizer's "TextInputSequence must be str"
traceback before), a 200 MB line (read whole and aborted inside the Rust tokenizer before, exit
134), a FIFO as tokenizer_config.json (called "does not exist" before) or as any other file the
tokenizer side reads, and a record's text quoted at length in a message.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.chat_fixtures import build_tokenizer
from tests.cli import invoke, said

# Unit tests (tests/conftest.py marks them); the one that renders in the worker is integration.

TIMEOUT_S = 20  # every command here ends in a few seconds; one that blocks fails instead
ESC = "\x1b[2J"
GOOD = {
    "messages": [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi"}]
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer("qwen2.5", tmp_path_factory.mktemp("tok"))


def prepare(*args: str) -> tuple[int, str]:
    return said(invoke("data", "prepare", *args, timeout=TIMEOUT_S))


def clean(code: int, output: str, root: Path) -> None:
    """Exit 2, one message, no traceback, no escape from the file, nothing written."""
    assert code == 2, output
    assert "Traceback" not in output and ESC not in output, output[-2000:]
    assert len(output) < 2000, output[:2000]
    assert not any(p.name.startswith((".out", "out")) for p in root.iterdir()), list(root.iterdir())


# --- lone surrogates ------------------------------------------------------------------------------
def test_a_lone_surrogate_in_a_chat_record_names_file_line_and_field(
    tmp_path: Path, tokenizer: Path
) -> None:
    data = tmp_path / "chat.jsonl"
    bad = {"messages": [{"role": "user", "content": "hi \ud800 there"}, GOOD["messages"][1]]}
    data.write_text(json.dumps(bad) + "\n")  # json writes the escape "\ud800"
    code, output = prepare("--input", str(data), "--tokenizer", str(tokenizer), "--output",
                           str(tmp_path / "out"))  # fmt: skip
    clean(code, output, tmp_path)
    words = " ".join(output.split())
    assert f"{data}:1: messages[0].content holds a lone surrogate" in words, words
    assert "\\ud800" in words  # shown escaped


def test_a_lone_surrogate_in_a_text_record_or_json_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    data = tmp_path / "in" / "docs.jsonl"
    data.write_text('{"text": "fine"}\n{"text": "bad \\udc00 half", "id": 3}\n')
    code, output = prepare("--input", str(data), "--output", str(tmp_path / "out"))
    clean(code, output, tmp_path)
    assert f"{data}:2: text holds a lone surrogate" in " ".join(output.split())
    whole = tmp_path / "in" / "docs.json"
    whole.write_text('[{"text": "fine"}, {"meta": {"\\ud801": 1}, "text": "x"}]')
    data.unlink()
    code, output = prepare("--input", str(whole), "--output", str(tmp_path / "out"))
    clean(code, output, tmp_path)
    assert "[1].meta (a key) holds a lone surrogate" in " ".join(output.split())


def test_a_surrogate_pair_is_one_character_and_prepares(tmp_path: Path) -> None:
    data = tmp_path / "docs.jsonl"
    data.write_text('{"text": "smile \\ud83d\\ude00 ok"}\n')
    code, output = prepare("--input", str(data), "--output", str(tmp_path / "out"), "--json")
    assert code == 0, output


# --- over-long lines and documents ----------------------------------------------------------------
def _sparse_line(path: Path, head: bytes, size: int) -> None:
    """A file whose first line is `head` followed by zero bytes up to `size` (sparse: nothing is
    held in memory or written to disk)."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)


@pytest.mark.parametrize("kind", ["chat", "text"])
def test_a_200_mb_line_is_refused_before_it_is_parsed_or_tokenized(
    tmp_path: Path, tokenizer: Path, kind: str
) -> None:
    """The real default bound (16 MiB): the reader stops 16 MiB into the line."""
    data = tmp_path / "big.jsonl"
    head = b'{"messages": [{"role": "user", "content": "' if kind == "chat" else b'{"text": "'
    _sparse_line(data, head, 200_000_000)
    code, output = prepare("--input", str(data), "--tokenizer", str(tokenizer), "--output",
                           str(tmp_path / "out"))  # fmt: skip
    clean(code, output, tmp_path)
    words = " ".join(output.split())
    assert f"{data}:1: longer than 16,777,216 bytes" in words, words
    assert "--max-record-mib (now 16)" in words


def test_a_long_valid_record_never_reaches_the_tokenizer_and_the_bound_is_an_option(
    tmp_path: Path, tokenizer: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from launcher.data.hf_tokenizer import HFTokenizerFile

    data = tmp_path / "docs.jsonl"
    data.write_text(json.dumps({"text": "a " * (3 << 19)}) + "\n" + '{"text": "b"}\n')
    args = ["--input", str(data), "--output", str(tmp_path / "out")]

    def never(*args: object) -> None:
        raise AssertionError("the over-long record reached the tokenizer")

    with monkeypatch.context() as patch:
        patch.setattr(HFTokenizerFile, "encode_batch", never)
        code, output = prepare(*args, "--tokenizer", str(tokenizer), "--max-record-mib", "2")
    clean(code, output, tmp_path)
    assert f"{data}:1: longer than 2,097,152 bytes" in " ".join(output.split()), output
    code, output = prepare(*args, "--max-record-mib", "4")  # bytes: 3 MiB tokenize at once
    assert code == 0, output
    code, output = prepare(*args, "--max-record-mib", "0")
    assert code == 2 and "--max-record-mib=0: between 1 and 4096" in output


def test_a_whole_text_file_over_the_bound_never_reaches_the_tokenizers_library(
    tmp_path: Path, tokenizer: Path
) -> None:
    """A .txt file is one document: the byte tokenizer takes any size, a tokenizer.json (Rust)
    only up to the record bound."""
    (tmp_path / "in").mkdir()
    text = tmp_path / "in" / "book.txt"
    text.write_text("word " * 300_000)  # 1.5 MB
    args = ["--input", str(text), "--max-record-mib", "1"]
    code, output = prepare(*args, "--tokenizer", str(tokenizer), "--output", str(tmp_path / "out"))
    clean(code, output, tmp_path)
    assert f"{text}: longer than 1,048,576 bytes" in " ".join(output.split())
    code, output = prepare(*args, "--output", str(tmp_path / "out"))
    assert code == 0, output


# --- FIFOs and other non-files where the tokenizer side reads a file ------------------------------
def test_a_fifo_tokenizer_config_is_not_a_regular_file_not_missing(
    tmp_path: Path, tokenizer: Path
) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(tokenizer.read_bytes())
    os.mkfifo(folder / "tokenizer_config.json")
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps(GOOD) + "\n")
    args = ["--input", str(data), "--output", str(tmp_path / "out")]
    code, output = prepare(*args, "--tokenizer", str(folder / "tokenizer.json"))
    clean(code, output, tmp_path)
    words = " ".join(output.split())
    assert "tokenizer_config.json: is a FIFO (named pipe), not a regular file" in words, words
    assert "does not exist" not in words


@pytest.mark.parametrize("which", ["tokenizer.json", "template", "chat_template.jinja", "folder"])
def test_every_tokenizer_side_file_refuses_a_fifo_or_folder(
    tmp_path: Path, tokenizer: Path, which: str
) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tokenizer.parent / name).read_bytes())
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps(GOOD) + "\n")
    args = ["--input", str(data), "--output", str(tmp_path / "out")]
    tok = folder / "tokenizer.json"
    if which == "tokenizer.json":
        tok.unlink()
        os.mkfifo(tok)
        bad = tok
    elif which == "template":
        bad = tmp_path / "t.jinja"
        os.mkfifo(bad)
        args += ["--chat-template", str(bad)]
    elif which == "chat_template.jinja":
        (folder / "tokenizer_config.json").write_text("{}")
        bad = folder / "chat_template.jinja"
        os.mkfifo(bad)
    else:
        (folder / "tokenizer_config.json").unlink()
        bad = folder / "tokenizer_config.json"
        bad.mkdir()
    code, output = prepare(*args, "--tokenizer", str(tok))
    clean(code, output, tmp_path)
    words = " ".join(output.split())
    assert f"{bad}: is a " in words and "not a regular file" in words, words


# --- what a record or tokenizer file holds is quoted short and escaped ---------------------------
def test_record_texts_are_quoted_through_the_excerpt_helper(
    tmp_path: Path, tokenizer: Path
) -> None:
    data = tmp_path / "chat.jsonl"
    args = ["--input", str(data), "--tokenizer", str(tokenizer), "--output", str(tmp_path / "out")]
    role = {"messages": [{"role": ESC + "R" * 20_000, "content": "x"}]}
    data.write_text(json.dumps(role) + "\n")
    code, output = prepare(*args, "--input-format", "chat")
    clean(code, output, tmp_path)
    assert "unknown role '\\x1b[2J" in output
    data.write_text(json.dumps({ESC + "K" * 20_000: 1}) + "\n")
    code, output = prepare(*args, "--input-format", "chat")
    clean(code, output, tmp_path)
    assert "the record has keys: '\\x1b[2J" in " ".join(output.split())


def test_a_malformed_tokenizer_json_is_quoted_short(tmp_path: Path) -> None:
    tok = tmp_path / "tokenizer.json"
    tok.write_text(json.dumps({"model": {"type": ESC + "M" * 20_000}}))
    data = tmp_path / "docs.jsonl"
    data.write_text('{"text": "x"}\n')
    code, output = prepare("--input", str(data), "--tokenizer", str(tok), "--output",
                           str(tmp_path / "out"))  # fmt: skip
    clean(code, output, tmp_path)
    assert "not a tokenizer.json the library reads" in " ".join(output.split())


@pytest.mark.parametrize("which", ["index.json", "train_text_document.bin", "prefix.bin"])
def test_a_fifo_in_prepared_data_is_not_a_regular_file_not_missing(
    tmp_path: Path, which: str
) -> None:
    """data.path= read back (`validate`, which says what `run` would refuse): a FIFO for the
    index, a listed file or a Megatron prefix's .bin is said as what it is, never "missing" or
    "no dataset there", and never opened."""
    text = tmp_path / "a.txt"
    text.write_text("some words to tokenize " * 50)
    out = tmp_path / "data"
    assert said(invoke("data", "prepare", "--input", str(text), "--output", str(out)))[0] == 0
    spec = out
    if which == "prefix.bin":
        (out / "index.json").unlink()
        spec = out / "train_text_document"
        target = out / "train_text_document.bin"
    else:
        target = out / which
    target.unlink()
    os.mkfifo(target)
    code, output = said(invoke("validate", "recipe=tiny", f"data.path={spec}", timeout=TIMEOUT_S))
    assert code in (0, 2) and "Traceback" not in output, output
    words = " ".join(output.split())
    assert "would refuse" in words or code == 2, words
    assert f"{target} is a FIFO (named pipe), not a regular file" in words, words
    assert "missing" not in words and "no dataset there" not in words


def test_a_fifo_bpe_tokenizer_is_refused_not_waited_on(tmp_path: Path) -> None:
    from launcher.data.tokenizer import BPETokenizer
    from launcher.errors import UserError

    os.mkfifo(tmp_path / "tokenizer.json")
    with pytest.raises(UserError, match="is a FIFO"):
        BPETokenizer.from_file(tmp_path / "tokenizer.json")


def test_a_fifo_input_is_not_a_regular_file_not_missing(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "in.jsonl")
    code, output = prepare("--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out"))
    clean(code, output, tmp_path)
    assert "in.jsonl: is a FIFO (named pipe), not a regular file" in " ".join(output.split())


def test_column_names_and_saved_dataset_files_are_quoted_short(tmp_path: Path) -> None:
    """A parquet column named with escapes and 20,000 characters, and a saved dataset whose
    state.json is no object: exit 2, bounded and escaped, no traceback."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    (tmp_path / "in").mkdir()
    table = pa.table({ESC + "C" * 20_000: ["x"]})
    pq.write_table(table, tmp_path / "in" / "d.parquet")
    code, output = prepare("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"))
    clean(code, output, tmp_path)
    assert "no 'text' column (it has: '\\x1b[2JCCC" in " ".join(output.split())
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "state.json").write_text("[1, 2]")
    (saved / "dataset_info.json").write_text("{}")
    code, output = prepare("--input", str(saved), "--output", str(tmp_path / "out"))
    clean(code, output, tmp_path)
    assert "state.json: expected a JSON object" in output
