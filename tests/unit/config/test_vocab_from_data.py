"""model.vocab_size comes from the prepared data's tokenizer when the user did not set it
(issue 33, item 8): a BPE data.path of 331 tokens no longer needs model.vocab_size by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.composition.compose import compose_config
from launcher.config.composition.provenance import value_sources
from launcher.data.prepare import prepare
from launcher.verdict import assess

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def bpe_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bpe")
    text = root / "corpus.txt"
    lines = [f"document {i}: the quick brown fox jumps over the lazy dog {i}" for i in range(400)]
    text.write_text("\n\n".join(lines))
    out = root / "prepared"
    index = prepare([text], out, tokenizer="bpe", vocab_size=331, valid_fraction=0.0)
    assert index.vocab_size == 331
    return out


def test_the_datas_vocabulary_is_the_models(bpe_data: Path) -> None:
    composed = compose_config([f"data.path={bpe_data}"])  # tiny recipe: vocab_size 256
    assert composed.config.model.vocab_size == 331
    assert composed.values["model"]["vocab_size"] == 331
    assert any("model.vocab_size=331 from data.path=" in note for note in composed.notes)
    assert value_sources(composed)["model.vocab_size"] == (
        f"data.path={bpe_data} (bpe tokenizer, vocabulary 331)"
    )
    verdict = assess([f"data.path={bpe_data}", "train.global_batch_size=1",
                      "train.micro_batch_size=1", "model.seq_length=64"])  # fmt: skip
    assert verdict.valid
    assert not any("vocab" in p for p in verdict.refusals["run"]), verdict.refusals["run"]


def test_a_vocab_size_the_user_gives_wins(bpe_data: Path) -> None:
    composed = compose_config([f"data.path={bpe_data}", "model.vocab_size=512"])
    assert composed.config.model.vocab_size == 512 and composed.notes == ()
    # too small, and given: run refuses it as before, naming the data's vocabulary
    verdict = assess([f"data.path={bpe_data}", "model.vocab_size=256",
                      "train.global_batch_size=1", "train.micro_batch_size=1",
                      "model.seq_length=64"])  # fmt: skip
    assert any("set model.vocab_size=331 or more" in p for p in verdict.refusals["run"])


def test_no_prepared_data_leaves_the_recipe_alone(tmp_path: Path) -> None:
    assert compose_config([]).config.model.vocab_size == 256
    (tmp_path / "index.json").write_text("{not json")
    assert compose_config([f"data.path={tmp_path}"]).config.model.vocab_size == 256
