"""docs/configuration.md's key reference is generated from the schema
(launcher/config/schema/reference_doc.py): the committed page matches what the schema says now,
every key has a docstring and a row, and `--check` / a rewrite keep the hand-written part of the
page as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.config.schema import key_info, reference_doc
from launcher.config.schema.allowed import Allowed
from launcher.config.schema.keys import all_schema_keys

pytestmark = pytest.mark.unit

PAGE = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_the_committed_key_reference_matches_the_schema() -> None:
    page = PAGE.read_text("utf-8")
    assert page == reference_doc.regenerate(page), (
        f"docs/configuration.md's key reference is out of date: run `{reference_doc.COMMAND}`"
    )


def test_every_key_has_a_docstring_and_a_row() -> None:
    docs = key_info.docstrings()
    page = PAGE.read_text("utf-8")
    missing = [key for key in all_schema_keys() if not docs.get(key)]
    assert missing == [], "give each schema field a docstring below it"
    assert [key for key in all_schema_keys() if f"| `{key}` |" not in page] == []
    sections = {key.split(".")[0] for key in all_schema_keys() if "." in key}
    # A dataclass without a docstring gets one made of its signature: ModelConfig(name: str ...
    assert [s for s in sections if not docs[s] or "Config(" in docs[s]] == []


def test_rows_show_type_default_allowed_values_and_meaning() -> None:
    page = PAGE.read_text("utf-8")
    assert (
        "| `zero.stage` | int | `0` | [0, 3] | ZeRO stage: 0 none, 1 optimizer states, 2 and "
        "gradients, 3 and parameters sharded. |"
    ) in page
    assert "| `model.activation` | str | `gelu` | `gelu`, `swiglu` |" in page
    assert "| `model.num_kv_heads` | int or null | `null` | >= 1 |" in page
    assert "| `optim.min_lr` | float | `3e-05` | [0, optim.lr] |" in page
    assert "| `optim.betas` | list[float] | `[0.9, 0.95]` | 2 values, each in [0, 1) |" in page
    # The group options of conf/ beside their section.
    assert "Group `zero=`: `stage0`, `stage1`, `stage2`, `stage3`, `stage3-offload`." in page
    # A '|' in a docstring does not split the table's cell.
    assert '("Et\\|(tt\\|)*30L": E embedding' in page


def test_the_reference_reads_the_fields_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    declared = key_info.allowed

    def changed(key: str) -> Allowed | None:
        return (
            Allowed(choices=("none", "cpu", "nvme"))
            if key == "zero.offload_params"
            else declared(key)
        )

    monkeypatch.setattr(key_info, "allowed", changed)
    assert "| `zero.offload_params` | str | `none` | `none`, `cpu`, `nvme` |" in (
        reference_doc.reference()
    )


def test_check_reports_drift_and_a_rewrite_keeps_the_hand_written_part(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "configuration.md"
    text = PAGE.read_text("utf-8")
    head = text[: text.index(reference_doc.REFERENCE_HEADING)]
    page.write_text(text.replace("| Tensor parallel degree. |", "| stale |"), "utf-8")

    assert reference_doc.main([str(page), "--check"]) == 1
    assert reference_doc.COMMAND in capsys.readouterr().err
    assert "| stale |" in page.read_text("utf-8")  # --check writes nothing

    assert reference_doc.main([str(page)]) == 0
    assert page.read_text("utf-8") == text
    assert reference_doc.main([str(page), "--check"]) == 0

    # A page without the section gets it appended after its own text.
    page.write_text(head.rstrip("\n") + "\n", "utf-8")
    assert reference_doc.main([str(page)]) == 0
    assert page.read_text("utf-8") == text
