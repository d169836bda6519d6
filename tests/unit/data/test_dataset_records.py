"""`data prepare` reads chat and preference records where users keep them: parquet files,
`datasets.save_to_disk` folders and dataset ids in the local HF datasets cache, through the
`datasets` library, offline, with --split and --columns (launcher/data/dataset_records.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from launcher.data.chat.builtin_chat import write_tokenizer
from tests.cli import invoke

datasets = pytest.importorskip("datasets")

CONVERSATIONS = [
    [
        {"role": "user", "content": f"What is {i} + {i}?"},
        {"role": "assistant", "content": f"{i} + {i} = {2 * i}."},
    ]
    for i in range(6)
]
PAIRS = [
    {"prompt": f"What is {i} + 1?", "chosen": f"{i + 1}.", "rejected": f"{i + 2}."}
    for i in range(4)
]


def _prepare(tmp_path: Path, name: str, *args: str):  # type: ignore[no-untyped-def]
    tok = tmp_path / "tok" / "tokenizer.json"
    if not tok.is_file():
        write_tokenizer(tok.parent)
    return invoke(
        "data", "prepare", "--tokenizer", str(tok), "--output", str(tmp_path / name),
        "--valid-fraction", "0.2", *args,
    )  # fmt: skip


def _written(folder: Path) -> dict[str, bytes]:
    """The token and role files of a prepared chat folder."""
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*_chat_*"))}


def _jsonl(tmp_path: Path, records: list[dict[str, object]]) -> Path:
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.integration  # prepare renders in the template worker, a child process
def test_parquet_and_saved_folder_prepare_to_the_jsonl_tokens(tmp_path: Path) -> None:
    jsonl = _jsonl(tmp_path, [{"messages": m} for m in CONVERSATIONS])
    assert _prepare(tmp_path, "from-jsonl", "--input", str(jsonl)).returncode == 0
    expected = _written(tmp_path / "from-jsonl")
    assert len(expected) == 8  # train and valid, tokens and roles, .bin and .idx

    table = datasets.Dataset.from_list([{"conversation": m, "id": i} for i, m in
                                        enumerate(CONVERSATIONS)])  # fmt: skip
    table.to_parquet(str(tmp_path / "chat.parquet"))
    done = _prepare(
        tmp_path, "from-parquet", "--input", str(tmp_path / "chat.parquet"),
        "--input-format", "chat", "--columns", "messages=conversation",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _written(tmp_path / "from-parquet") == expected

    datasets.DatasetDict({"sft": table, "other": table.select([0])}).save_to_disk(
        str(tmp_path / "saved")
    )
    done = _prepare(
        tmp_path, "from-saved", "--input", str(tmp_path / "saved"), "--split", "sft",
        "--columns", "messages=conversation",  # the format told from the renamed records
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _written(tmp_path / "from-saved") == expected

    wrong = _prepare(tmp_path, "bad-split", "--input", str(tmp_path / "saved"), "--split",
                     "test", "--input-format", "chat")  # fmt: skip
    assert wrong.returncode == 2
    assert "--split test" in wrong.stderr and "sft" in wrong.stderr

    missing = _prepare(tmp_path, "bad-column", "--input", str(tmp_path / "chat.parquet"),
                       "--input-format", "chat", "--columns", "messages=dialog")  # fmt: skip
    assert missing.returncode == 2
    assert "no column 'dialog'" in missing.stderr and "conversation" in missing.stderr


@pytest.mark.integration  # prepare renders in the template worker, a child process
def test_preference_pairs_from_a_saved_dataset(tmp_path: Path) -> None:
    jsonl = _jsonl(tmp_path, PAIRS)
    done = _prepare(tmp_path, "from-jsonl", "--input", str(jsonl))
    assert done.returncode == 0, done.stderr
    datasets.Dataset.from_list(PAIRS).save_to_disk(str(tmp_path / "pairs"))
    done = _prepare(tmp_path, "from-saved", "--input", str(tmp_path / "pairs"),
                    "--input-format", "preference")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _written(tmp_path / "from-saved") == _written(tmp_path / "from-jsonl")


def _cache_entry(tmp_path: Path, dataset_id: str, records: list[dict[str, object]]) -> Path:
    """A local HF datasets cache holding `dataset_id` as `load_dataset` leaves a hub dataset:
    <cache>/<owner>___<name>/<config>/<version>/<hash>/<name>-train.arrow (built here from a JSON
    Lines file with the json builder, then moved under the id's folder)."""
    from datasets.packaged_modules.json.json import Json

    owner, name = dataset_id.split("/")
    cache = tmp_path / "hf-cache"
    source = _jsonl(tmp_path, records)
    builder = Json(cache_dir=str(cache), dataset_name=name, config_id="default",
                   data_files={"train": str(source)}, hash="0")  # fmt: skip
    builder.download_and_prepare()
    (cache / name).rename(cache / f"{owner}___{name}")
    return cache


@pytest.mark.integration  # prepare renders in the template worker, a child process
def test_a_dataset_id_is_read_from_the_local_cache_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jsonl = _jsonl(tmp_path, [{"messages": m} for m in CONVERSATIONS])
    assert _prepare(tmp_path, "from-jsonl", "--input", str(jsonl)).returncode == 0
    cache = _cache_entry(tmp_path, "someone/tiny_chat", [{"dialog": m} for m in CONVERSATIONS])
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    done = _prepare(tmp_path, "from-id", "--input", "someone/tiny_chat", "--input-format",
                    "chat", "--columns", "messages=dialog")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _written(tmp_path / "from-id") == _written(tmp_path / "from-jsonl")

    absent = _prepare(tmp_path, "absent", "--input", "someone/not_here", "--input-format", "chat")
    assert absent.returncode == 2
    assert "someone/not_here" in absent.stderr and str(cache) in absent.stderr
    assert "Traceback" not in absent.stderr
    import os

    assert "HF_HUB_OFFLINE" not in os.environ  # the hub switched off only while reading


def test_without_the_datasets_library_exit_2_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    datasets.Dataset.from_list([{"messages": m} for m in CONVERSATIONS]).to_parquet(
        str(tmp_path / "chat.parquet")
    )
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets raises ImportError
    done = _prepare(tmp_path, "out", "--input", str(tmp_path / "chat.parquet"),
                    "--input-format", "chat")  # fmt: skip
    assert done.returncode == 2
    assert "llmtrain[datasets]" in done.stderr and "Traceback" not in done.stderr
