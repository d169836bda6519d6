"""The key reference of docs/configuration.md, generated from the schema: every key with its type,
default, allowed values and docstring, a table per section, with the group options of conf/.

    python -m launcher.config.schema.reference_doc           # rewrite the page's generated section
    python -m launcher.config.schema.reference_doc --check   # exit 1 when it is out of date

The page's text above ``REFERENCE_HEADING`` is written by hand and kept as it is; everything from
that heading on is generated (tests/unit/config/test_reference_doc.py fails when it drifts). Pure
but for ``main``; imports neither Hydra nor torch.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from launcher import fsio, resources
from launcher.config import schema
from launcher.config.schema import key_info
from launcher.config.schema.keys import dataclass_of

# The heading the generated section starts at (the page's last section), the command that writes
# it, and the page it is written into (in the source checkout: a developer's tool).
REFERENCE_HEADING = "## Key reference"
COMMAND = "python -m launcher.config.schema.reference_doc"
PAGE = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def type_words(tp: Any) -> str:
    """A field's type as a reader writes it: int, float or null, list[str]."""
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        words = [type_words(a) for a in args if a is not type(None)]
        return " or ".join(words + (["null"] if type(None) in args else []))
    if origin in (list, dict):
        inner = [type_words(a) for a in args if a is not Any]
        return f"{origin.__name__}[{', '.join(inner)}]" if inner else origin.__name__
    return str(getattr(tp, "__name__", tp))


def default_words(value: Any) -> str:
    """A default as it is written in an override (null, true, [0.9, 0.95])."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return f"[{', '.join(default_words(v) for v in value)}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {default_words(v)}" for k, v in value.items()) + "}"
    return repr(value) if isinstance(value, float) else str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _rows(cls: type, prefix: str) -> list[str]:
    docs = key_info.docstrings()
    defaults = cls()
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if dataclass_of(hints[f.name]) is not None:
            continue
        key = f"{prefix}{f.name}"
        spec = key_info.allowed(key)
        cells = (
            f"`{key}`",
            _cell(type_words(hints[f.name])),
            f"`{_cell(default_words(getattr(defaults, f.name)))}`",
            _cell(spec.describe()) if spec is not None else "",
            _cell(docs.get(key, "")),
        )
        rows.append(f"| {' | '.join(cells)} |")
    return rows


def reference() -> str:
    """The generated section, from its heading to the end of the page."""
    docs = key_info.docstrings()
    groups = {p.name for p in resources.conf_dir().iterdir() if p.is_dir()}
    header = "| key | type | default | allowed | meaning |\n|---|---|---|---|---|"
    parts = [
        REFERENCE_HEADING,
        "",
        f"<!-- Generated from launcher/config/schema/ by `{COMMAND}`: edit the schema's "
        "docstrings and metadata, not this section. -->",
        "",
        "Every key of the schema (`launcher/config/schema/`): its type, its default, the values "
        "it allows (validate and composition refuse the others, exit 2 naming the key) and what "
        "it means. A group selects a file of `conf/GROUP/` (`model=llama3-8b`); a key is set "
        "with `key=value`.",
        "",
        "### top level",
        "",
        header,
        *_rows(schema.LLMTrainConfig, ""),
    ]
    for f in dataclasses.fields(schema.LLMTrainConfig):
        sub = dataclass_of(typing.get_type_hints(schema.LLMTrainConfig)[f.name])
        if sub is None:
            continue
        parts += ["", f"### `{f.name}`", "", docs[f.name]]
        if f.name in groups:
            options = ", ".join(f"`{o}`" for o in resources.group_options(f.name))
            parts[-1] += f" Group `{f.name}=`: {options}."
        parts += ["", header, *_rows(sub, f"{f.name}.")]
    return "\n".join(parts) + "\n"


def regenerate(page: str) -> str:
    """The page with its generated section replaced (appended when it has none)."""
    head, found, _ = page.partition(f"\n{REFERENCE_HEADING}\n")
    head = head if found else page.rstrip("\n") + "\n"
    return f"{head}\n{reference()}"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    rest = [a for a in args if a != "--check"]
    page = Path(rest[0]) if rest else PAGE
    current = page.read_text("utf-8")
    wanted = regenerate(current)
    if current == wanted:
        return 0
    if check:
        print(f"{page}: the key reference is out of date; run `{COMMAND}`", file=sys.stderr)
        return 1
    fsio.write_text_atomic(page, wanted)
    print(f"{page}: key reference regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
