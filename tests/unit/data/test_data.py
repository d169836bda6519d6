"""Token data preparation, memory-mapped shards, the built-in corpus, and the sharded sampler."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import numpy as np
import pytest

from launcher.data import builtin_corpus, token_index, tokenizer
from launcher.data.builtin_corpus import builtin_corpus_dir
from launcher.data.prepare import prepare
from launcher.data.token_index import PreparedIndex, check_vocab
from launcher.data.tokenizer import ByteTokenizer, load_tokenizer
from launcher.errors import UserError
from launcher.train.data import TokenShards
from launcher.train.sampler import ShardedSampler

# Unit tests (tests/conftest.py marks them); those that start a process are marked integration.

TEXTS = {
    "a.txt": "The quick brown fox jumps over the lazy dog.\n" * 20,
    "sub/b.md": "# Heading\n\nSome *markdown* text, with unicode: héllo wörld ✓.\n" * 10,
    "sub/deeper/c.py": "def f(x):\n    return x * 2\n\n\nprint(f(21))\n" * 15,
    "sub/ignored.bin": "not text by suffix",
}


@pytest.fixture
def text_dir(tmp_path: Path) -> Path:
    root = tmp_path / "text"
    for name, body in TEXTS.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")
    return root


def _expected_bytes() -> bytes:
    # Sorted path order; *.bin is not a text suffix.
    return b"".join(TEXTS[n].encode() for n in ("a.txt", "sub/b.md", "sub/deeper/c.py"))


# --- prepare + read back -------------------------------------------------------------------------
def test_prepare_byte_round_trip(text_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "data"
    index = prepare([text_dir], out, tokenizer="byte", shard_tokens=1000)
    expected = _expected_bytes()
    assert index.dtype == "uint8" and index.vocab_size == 256 and index.tokenizer == "byte"
    assert index.total_tokens == len(expected) and index.source_files == 3
    assert [s.file for s in index.shards] == [
        f"shard_{i:05d}.bin" for i in range(-(-len(expected) // 1000))
    ]
    assert all(s.tokens == 1000 for s in index.shards[:-1])
    # index.json on disk says the same, and reloads equal.
    on_disk = json.loads((out / "index.json").read_text())
    assert (
        on_disk["total_tokens"] == len(expected) and on_disk["format"] == token_index.INDEX_FORMAT
    )
    assert PreparedIndex.load(out) == index
    # Shards hold the bytes, concatenated across shard boundaries; nothing left behind.
    shards = TokenShards(out, verify=True)
    assert len(shards) == len(expected)
    assert bytes(shards.tokens(0, len(shards)).astype(np.uint8).tolist()) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "text"]
    assert load_tokenizer(out).decode(shards.tokens(0, 44)) == TEXTS["a.txt"][:44]


def test_windows_are_non_overlapping_and_span_shards(text_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "data"
    prepare([text_dir], out, shard_tokens=100)
    shards = TokenShards(out)
    stream = np.frombuffer(_expected_bytes(), dtype=np.uint8).astype(np.int64)
    seq_len = 63
    n = shards.num_sequences(seq_len)
    assert n == len(stream) // 64
    for i in (0, 1, n // 2, n - 1):  # window 1 covers tokens 64..127, across shards 0 and 1
        window = shards.sequence(i, seq_len)
        assert window.dtype == np.int64 and window.shape == (64,)
        np.testing.assert_array_equal(window, stream[i * 64 : (i + 1) * 64])
    with pytest.raises(IndexError):
        shards.sequence(n, seq_len)  # the tail is skipped
    rows = shards.batch([2, 0], seq_len)
    assert rows.shape == (2, 64)
    np.testing.assert_array_equal(rows[1], stream[:64])


def test_prepare_bpe(text_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bpe"
    index = prepare([text_dir], out, tokenizer="bpe", vocab_size=300)
    assert index.tokenizer == "bpe" and index.dtype == "uint16"
    assert 258 <= index.vocab_size <= 300
    assert (out / "tokenizer.json").is_file() and index.tokenizer_file == "tokenizer.json"
    assert index.eod_id == 0
    shards = TokenShards(out)
    ids = shards.tokens(0, len(shards))
    assert len(ids) < len(_expected_bytes())  # merges compress the text
    assert ids.max() < index.vocab_size
    assert (ids == index.eod_id).sum() == 3  # one end-of-document token per file
    tok = load_tokenizer(out)
    first_doc = ids[: int(np.argmax(ids == index.eod_id))]
    assert tok.decode(first_doc) == TEXTS["a.txt"]
    # The same inputs train the same tokenizer: prepare is deterministic.
    again = prepare([text_dir], tmp_path / "bpe2", tokenizer="bpe", vocab_size=300)
    assert [s.sha256 for s in again.shards] == [s.sha256 for s in index.shards]


def test_dtype_by_vocab() -> None:
    assert tokenizer.token_dtype(256) == "uint8"
    assert tokenizer.token_dtype(257) == "uint16"
    assert tokenizer.token_dtype(65536) == "uint16"
    assert tokenizer.token_dtype(128256) == "uint32"


def test_overwrite_refused_then_allowed(text_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "data"
    prepare([text_dir / "a.txt"], out)
    with pytest.raises(UserError, match="already exists and is not empty"):
        prepare([text_dir], out)
    assert PreparedIndex.load(out).source_files == 1  # untouched
    index = prepare([text_dir], out, overwrite=True)
    assert index.source_files == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "text"]
    empty = tmp_path / "empty"
    empty.mkdir()
    prepare([text_dir], empty)  # an existing empty directory is fine


def test_overwrite_replaces_only_a_prepared_dataset_never_its_input(
    text_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unrelated = tmp_path / "notes"
    unrelated.mkdir()
    (unrelated / "keep.txt").write_text("precious")
    with pytest.raises(UserError, match="not a prepared dataset"):
        prepare([text_dir], unrelated, overwrite=True)
    assert (unrelated / "keep.txt").read_text() == "precious"
    with pytest.raises(UserError, match="overlaps the input"):
        prepare([text_dir], text_dir, overwrite=True)
    with pytest.raises(UserError, match="overlaps the input"):
        prepare([text_dir], text_dir / "sub", overwrite=True)
    assert (text_dir / "a.txt").is_file() and (text_dir / "sub" / "b.md").is_file()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="current"):
        prepare([text_dir], Path("."), overwrite=True)


def test_binary_input_refused_unless_allowed(tmp_path: Path) -> None:
    blob = tmp_path / "model.bin"
    blob.write_bytes(bytes(range(256)) * 10)
    with pytest.raises(UserError, match="--allow-binary"):
        prepare([blob], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 cr\xe8me".encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):
        prepare([latin], tmp_path / "out")
    index = prepare([blob], tmp_path / "out", allow_binary=True)
    assert index.total_tokens > 2560  # undecodable bytes became U+FFFD (3 bytes each)


def test_bad_inputs_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(UserError, match=r"nope\.txt: no such file"):
        prepare([missing], tmp_path / "out")
    no_text = tmp_path / "binaries"
    no_text.mkdir()
    (no_text / "x.bin").write_bytes(b"\0\1")
    with pytest.raises(UserError, match="binaries: no text files or records"):
        prepare([no_text], tmp_path / "out")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(UserError, match="empty"):
        prepare([empty], tmp_path / "out")
    with pytest.raises(UserError, match="not a prepared data directory"):
        TokenShards(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_truncated_shard_is_reported(text_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "data"
    prepare([text_dir], out)
    shard = out / "shard_00000.bin"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(UserError, match=r"shard_00000\.bin: .* prepare the data again"):
        TokenShards(out)


def test_check_vocab(text_dir: Path, tmp_path: Path) -> None:
    index = prepare([text_dir], tmp_path / "bpe", tokenizer="bpe", vocab_size=300)
    check_vocab(index, 300)
    with pytest.raises(UserError, match=rf"data vocab {index.vocab_size} .*> model.vocab_size=256"):
        check_vocab(index, 256)


def test_byte_tokenizer() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("héllo")
    assert ids.dtype == np.uint8 and len(ids) == 6
    assert tok.decode(ids) == "héllo"


# --- the built-in corpus -------------------------------------------------------------------------
@pytest.fixture
def small_stdlib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builtin_corpus, "_STDLIB_MAX_BYTES", 64_000)


def test_stdlib_selection_is_deterministic_and_capped(small_stdlib: None) -> None:
    files = builtin_corpus.stdlib_source_files()
    assert files and files == builtin_corpus.stdlib_source_files()
    assert sum(f.stat().st_size for f in files) <= 64_000
    assert all(f.suffix == ".py" and "site-packages" not in f.parts for f in files)


def test_builtin_corpus_prepared_once(small_stdlib: None, tmp_path: Path) -> None:
    path = builtin_corpus_dir(tmp_path)
    assert path == tmp_path / builtin_corpus.BUILTIN_CORPUS
    index = PreparedIndex.load(path)
    assert index.tokenizer == "byte" and index.source["kind"] == "python-stdlib"
    mtime = (path / "index.json").stat().st_mtime_ns
    assert builtin_corpus_dir(tmp_path) == path
    assert (path / "index.json").stat().st_mtime_ns == mtime  # cached, not prepared again


def _corpus_worker(root: str, cap: int, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    builtin_corpus._STDLIB_MAX_BYTES = cap
    path = builtin_corpus_dir(Path(root))
    queue.put(PreparedIndex.load(path).shards[0].sha256)


@pytest.mark.integration
def test_builtin_corpus_concurrent_first_use(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_corpus_worker, args=(str(tmp_path), 64_000, queue)) for _ in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    digests = {queue.get(timeout=5) for _ in procs}
    assert len(digests) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        builtin_corpus.BUILTIN_CORPUS,
        f"{builtin_corpus.BUILTIN_CORPUS}.lock",
    ]


# --- the sampler ---------------------------------------------------------------------------------
def _steps(sampler: ShardedSampler, n: int) -> list[list[int]]:
    return [sampler.next_batch_indices() for _ in range(n)]


def test_sampler_ranks_partition_the_global_batch() -> None:
    dp, per_rank, n = 4, 3, 50  # global batch 12: 4 steps per epoch, 2 sequences skipped
    samplers = [ShardedSampler(n, r, dp, per_rank, seed=9) for r in range(dp)]
    reference = ShardedSampler(n, 0, 1, per_rank * dp, seed=9)
    seen_in_epoch: set[int] = set()
    for step in range(10):
        parts = [s.next_batch_indices() for s in samplers]
        union = [i for part in parts for i in part]
        assert all(len(p) == per_rank for p in parts)
        assert len(set(union)) == dp * per_rank  # disjoint
        # Rank r's part is the r-th contiguous slice of the step's global batch.
        assert union == reference.next_batch_indices()
        if step % 4 == 0:
            seen_in_epoch = set()
        assert not seen_in_epoch & set(union)  # no repeats within an epoch
        seen_in_epoch |= set(union)
        assert all(0 <= i < n for i in union)
    assert samplers[0].epoch == 2 and samplers[0].position == 2


def test_sampler_determinism_by_seed() -> None:
    a = _steps(ShardedSampler(100, 1, 2, 4, seed=1), 20)
    b = _steps(ShardedSampler(100, 1, 2, 4, seed=1), 20)
    c = _steps(ShardedSampler(100, 1, 2, 4, seed=2), 20)
    assert a == b and a != c
    # Epochs differ in order.
    s = ShardedSampler(100, 0, 1, 10, seed=1)
    assert not np.array_equal(s.permutation(0), s.permutation(1))


def test_sampler_resume_equals_uninterrupted() -> None:
    uninterrupted = _steps(ShardedSampler(37, 1, 2, 4, seed=3), 25)
    first = ShardedSampler(37, 1, 2, 4, seed=3)
    head = _steps(first, 11)
    state = json.loads(json.dumps(first.state_dict()))  # survives a JSON checkpoint
    resumed = ShardedSampler(37, 1, 2, 4, seed=3)
    resumed.load_state_dict(state)
    assert head + _steps(resumed, 14) == uninterrupted
    # Another dp split with the same global batch continues the same global data.
    whole = ShardedSampler(37, 0, 1, 8, seed=3)
    whole.load_state_dict(state)
    ref = ShardedSampler(37, 0, 1, 8, seed=3)
    _steps(ref, 11)
    assert _steps(whole, 5) == _steps(ref, 5)


def test_sampler_refusals() -> None:
    with pytest.raises(UserError, match="fewer than one global batch of 16"):
        ShardedSampler(10, 0, 2, 8, seed=0)
    with pytest.raises(ValueError, match="dp_rank"):
        ShardedSampler(100, 2, 2, 8, seed=0)
    sampler = ShardedSampler(100, 0, 2, 8, seed=0)
    with pytest.raises(UserError, match="global_batch=32"):
        sampler.load_state_dict(ShardedSampler(100, 0, 4, 8, seed=0).state_dict())


def test_prelaunch_checks_vocabulary_and_size(text_dir: Path, tmp_path: Path) -> None:
    from launcher.config.composition.compose import compose_config
    from launcher.launch.preflight import data_problems

    out = tmp_path / "tok"
    prepare([text_dir / "a.txt"], out)  # 900 byte tokens

    def problems(*overrides: str) -> list[str]:
        return data_problems(compose_config([f"data.path={out}", *overrides]).config)

    assert problems("model.seq_length=16", "train.global_batch_size=8") == []
    (vocab,) = problems("model.vocab_size=128", "model.seq_length=16")
    assert "model.vocab_size=128" in vocab and "model.vocab_size=256" in vocab
    (size,) = problems("model.seq_length=256")
    assert "fewer than one global batch" in size and "model.seq_length" in size
    (out / "shard_00000.bin").unlink()
    assert any("missing" in p for p in problems("model.seq_length=16"))


def test_a_bpe_smaller_than_asked_says_why(text_dir: Path, tmp_path: Path) -> None:
    notes: list[str] = []
    index = prepare(
        [text_dir], tmp_path / "bpe", tokenizer="bpe", vocab_size=60_000, report=notes.append
    )
    assert index.vocab_size < 60_000
    (note,) = [n for n in notes if n.startswith("note:")]
    assert f"stopped at {index.vocab_size} tokens" in note and "--vocab-size=60000" in note
