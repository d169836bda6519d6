"""docs/backends.md's "What each backend runs" table (linked from README) is the one generated from
launcher/backends/."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.backends.table import END, START, markdown_table

pytestmark = pytest.mark.unit

PAGE = Path(__file__).resolve().parents[3] / "docs" / "backends.md"


def test_docs_table_is_generated_from_the_backend_tables() -> None:
    text = PAGE.read_text()
    assert START in text and END in text
    shown = text[text.index(START) : text.index(END) + len(END)]
    assert shown == markdown_table(), (
        "run `python -m launcher.backends.table` and paste it into docs/backends.md"
    )


def test_table_has_a_column_per_backend_and_the_launch_row() -> None:
    table = markdown_table()
    assert "`backend=torch`" in table and "`backend=megatron`" in table
    assert (
        "yes, with a Megatron-LM checkout: `backend.megatron_path` or `MEGATRON_LM_PATH`" in table
    )
