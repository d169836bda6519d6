"""Validation splits, the Megatron output format, dataset resolution (data.path / data.blend /
data.valid_path), the pre-launch data checks, the Megatron job's data arguments, and the fixed
evaluation batches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from launcher.config.composition.compose import compose_config
from launcher.data.megatron_indexed import IndexedDataset, IndexedDatasetWriter
from launcher.data.prepare import prepare
from launcher.data.sources import describe, megatron_data
from launcher.data.token_index import PreparedIndex
from launcher.data.token_writer import is_valid_document
from launcher.errors import UserError
from launcher.launch.preflight import data_problems
from launcher.render.megatron_args import megatron_args
from launcher.train.data import TokenShards, training_data, validation_data
from launcher.train.evaluation import Evaluator, eval_due
from launcher.validate.rules import check

pytestmark = pytest.mark.unit


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """200 one-line documents of JSON Lines, each a distinct number so splits are traceable."""
    path = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"text": f"document {i:04d} " + "abc " * (i % 7 + 5)}) for i in range(200)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_valid_documents_are_spread_evenly_and_counted_exactly() -> None:
    chosen = [i for i in range(1000) if is_valid_document(i, 0.01)]
    assert chosen == list(range(99, 1000, 100))
    assert sum(is_valid_document(i, 0.05) for i in range(200)) == 10
    assert not any(is_valid_document(i, 0.0) for i in range(100))


@pytest.mark.parametrize("fmt", ["megatron", "shards"])
def test_split_by_whole_documents_in_both_formats(corpus: Path, tmp_path: Path, fmt: str) -> None:
    out = tmp_path / fmt
    index = prepare([corpus], out, valid_fraction=0.05, fmt=fmt)
    again = prepare([corpus], tmp_path / "again", valid_fraction=0.05, fmt=fmt)
    assert index.valid_documents == 10 and index.source["documents"] == 200
    assert index.layout == fmt and index.valid_tokens > 0
    info = describe(str(out), "data.path")
    assert info.valid_tokens == index.valid_tokens and info.train_tokens == index.total_tokens
    if fmt == "megatron":
        valid = IndexedDataset.open(out / "valid_text_document")
        train = IndexedDataset.open(out / "train_text_document")
        # Byte tokens: document 19 (the first held out) is the first validation sequence, whole.
        assert bytes(valid.sequence(0).astype(np.uint8).tolist()).startswith(b"document 0019 ")
        assert len(valid) == 10 and len(train) == 190
        assert sum(int(v) for v in valid.sizes) == index.valid_tokens
        for name in ("train_text_document.bin", "valid_text_document.idx"):
            assert (out / name).read_bytes() == (tmp_path / "again" / name).read_bytes()
    else:
        stream = TokenShards(out, split="valid").tokens(0, index.valid_tokens)
        assert bytes(stream.astype(np.uint8).tolist()).startswith(b"document 0019 ")
        assert index.valid_shards == again.valid_shards  # same bytes: same sha256


def test_no_valid_split_when_the_fraction_holds_no_document(corpus: Path, tmp_path: Path) -> None:
    notes: list[str] = []
    index = prepare([corpus], tmp_path / "d", valid_fraction=0.001, report=notes.append,
                    fmt="megatron")  # fmt: skip
    assert index.valid_documents == 0 and "valid" not in index.megatron_prefixes
    assert not (tmp_path / "d" / "valid_text_document.bin").exists()
    assert any("holds none" in n for n in notes)


def test_bad_fraction_and_format_are_refused(corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--valid-fraction"):
        prepare([corpus], tmp_path / "x", valid_fraction=1.0)
    with pytest.raises(UserError, match="--format"):
        prepare([corpus], tmp_path / "x", fmt="arrow")


def _megatron_prefix(path: Path, tokens: int, vocab: int = 256, top: int = 255) -> Path:
    writer = IndexedDatasetWriter(path, vocab)
    rng = np.random.default_rng(0)
    for _ in range(tokens // 50):
        writer.add_document(rng.integers(0, top + 1, size=50))
    writer.finish()
    return path


def _problems(*overrides: str) -> list[str]:
    return data_problems(compose_config(list(overrides)).config)


def test_prelaunch_data_checks_name_key_rule_and_fix(corpus: Path, tmp_path: Path) -> None:
    prepared = tmp_path / "prep"
    prepare([corpus], prepared, valid_fraction=0.05, fmt="megatron")
    raw = _megatron_prefix(tmp_path / "raw_text_document", 5000)
    blend = f"data.blend=[0.7,{prepared},0.3,{raw}]"
    assert _problems(blend, "model.seq_length=32", "train.eval_every=5") == []
    (missing,) = _problems(f"data.blend=[1,{prepared},1,{tmp_path / 'nope'}]")
    assert "data.blend[3]=" in missing and "llmtrain data prepare" in missing
    (vocab,) = _problems(f"data.path={prepared}", "model.vocab_size=100", "model.seq_length=32")
    assert "model.vocab_size=100" in vocab and "model.vocab_size=256" in vocab
    too_long = _problems(blend, "model.seq_length=9000")
    assert any("data.blend[1]=" in p and "model.seq_length=" in p for p in too_long)
    # A bare Megatron prefix has no validation split; the prepared one has.
    (no_valid,) = _problems(f"data.path={raw}", "model.seq_length=32", "train.eval_every=5")
    assert "train.eval_every=5" in no_valid and "--valid-fraction" in no_valid
    assert _problems(f"data.path={raw}", "model.seq_length=32", "train.eval_every=5",
                     f"data.valid_path={prepared}") == []  # fmt: skip
    (builtin,) = _problems("train.eval_every=5")
    assert "built-in corpus" in builtin


def test_blend_shape_is_a_validation_error() -> None:
    def errors(*overrides: str) -> list[str]:
        return [v.message for v in check(compose_config(list(overrides)).config) if v.is_error]

    (odd,) = errors("data.blend=[0.5,/a,0.5]")
    assert "data.blend has 3 values" in odd and "data.blend=[0.7," in odd
    (negative,) = errors("data.blend=[-1,/a,1,/b]")
    assert "data.blend[0]=-1" in negative and "> 0" in negative
    (both,) = errors("data.path=/x", "data.blend=[1,/a]")
    assert "data.path=null" in both
    (eval_every,) = errors("train.eval_every=-3")
    assert "train.eval_every=-3" in eval_every


def test_blend_over_both_formats_reads_each_by_weight(corpus: Path, tmp_path: Path) -> None:
    prepared = tmp_path / "prep"
    prepare([corpus], prepared, valid_fraction=0.05, fmt="shards")
    raw = _megatron_prefix(tmp_path / "raw", 20_000, top=3)  # ids 0..3 only
    cfg = compose_config([f"data.blend=[3,{prepared},1,{raw}]", "model.seq_length=15"]).config
    data = training_data(cfg)
    rows = data.batch(list(range(400)), 15)
    from_raw = (rows.max(axis=1) <= 3).sum()
    assert 90 <= from_raw <= 110  # one in four samples, within one sample per prefix
    again = training_data(cfg).batch(list(range(400)), 15)
    assert np.array_equal(rows, again)
    valid = validation_data(cfg, 64)
    assert valid is not None  # the prepared folder's split (the raw prefix has none)
    assert valid.batch([0, 1], 15).shape == (2, 16)


def test_token_ids_beyond_the_model_vocab_are_refused_at_the_batch(tmp_path: Path) -> None:
    raw = _megatron_prefix(tmp_path / "big", 5000, vocab=50_000, top=40_000)
    cfg = compose_config([f"data.path={raw}", "model.seq_length=15"]).config
    with pytest.raises(UserError, match=r"model\.vocab_size="):
        training_data(cfg).batch([0, 1, 2], 15)


def test_evaluation_batches_are_fixed_and_partition_over_ranks() -> None:
    ranks = [Evaluator(None, 2, per_rank_batch=3, dp_rank=r, dp_size=2) for r in range(2)]
    assert ranks[0].indices(0) + ranks[1].indices(0) == list(range(6))
    assert ranks[0].indices(1) + ranks[1].indices(1) == list(range(6, 12))
    assert [s for s in range(1, 11) if eval_due(s, 10, 4)] == [4, 8, 10]
    assert not any(eval_due(s, 10, None) or eval_due(s, 10, 0) for s in range(1, 11))


def test_megatron_job_reads_the_prepared_data_and_tokenizer(corpus: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train([str(corpus)], trainer=trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    prepared = tmp_path / "prep"
    prepare([corpus], prepared, tokenizer=str(tmp_path / "tokenizer.json"),
            valid_fraction=0.05, fmt="megatron")  # fmt: skip
    (tmp_path / "raw").mkdir()
    raw = _megatron_prefix(tmp_path / "raw" / "raw_text_document", 1000)
    # What AutoTokenizer.from_pretrained(prepared) needs besides tokenizer.json.
    config = json.loads((prepared / "tokenizer_config.json").read_text())
    assert config == {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
    overrides = [f"data.blend=[0.25,{raw},0.75,{prepared}]", "train.eval_every=50",
                 "train.eval_steps=7", "recipe=llama3-8b", "backend=megatron"]  # fmt: skip
    cfg = compose_config(overrides).config
    data = megatron_data(cfg.data.path, list(cfg.data.blend), cfg.data.valid_path)
    args = megatron_args(cfg, data, "/runs/r1")
    joined = " ".join(args)
    assert f"--train-data-path 0.25 {raw} 0.75 {prepared}/train_text_document" in joined
    assert f"--valid-data-path {prepared}/valid_text_document" in joined
    assert f"--tokenizer-type HuggingFaceTokenizer --tokenizer-model {prepared}" in joined
    assert "--save /runs/r1/checkpoints --load /runs/r1/checkpoints" in joined
    assert "--eval-interval 50 --eval-iters 7" in joined
    # One prefix, no held-out split, no evaluation: --data-path and a 100,0,0 split.
    single = compose_config([f"data.path={raw}", "recipe=llama3-8b", "backend=megatron"]).config
    data = megatron_data(single.data.path, [], None)
    joined = " ".join(megatron_args(single, data, None))
    assert f"--data-path {raw} --split 100,0,0" in joined and "--eval-iters 0" in joined
    assert "NullTokenizer" in joined


def test_index_written_by_an_older_llmtrain_still_loads(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "old"
    prepare([corpus], out)
    data = json.loads((out / "index.json").read_text())
    for key in ("valid_fraction", "valid_shards", "valid_tokens", "valid_documents", "layout",
                "megatron_prefixes"):  # fmt: skip
        data.pop(key)
    (out / "index.json").write_text(json.dumps(data))
    index = PreparedIndex.load(out)
    assert index.layout == "shards" and index.valid_tokens == 0


def test_a_bad_record_is_reported_through_the_reader_thread(tmp_path: Path) -> None:
    corpus = tmp_path / "bad.jsonl"
    good = [json.dumps({"text": f"doc {i}"}) for i in range(2000)]
    corpus.write_text("\n".join([*good, "{not json", *good]) + "\n")
    with pytest.raises(UserError, match=r"bad\.jsonl"):
        prepare([corpus], tmp_path / "out", fmt="megatron")
    assert not (tmp_path / "out").exists()  # nothing half-written
    assert not list(tmp_path.glob(".out.tmp-*"))


def test_a_prefix_with_dots_in_its_name(tmp_path: Path) -> None:
    prefix = _megatron_prefix(tmp_path / "web.en_text_document", 1000)
    assert (tmp_path / "web.en_text_document.idx").is_file()
    assert IndexedDataset.open(prefix).num_tokens == 1000
    assert describe(str(prefix), "data.path").train_tokens == 1000
