"""The packing report `llmtrain data prepare` prints for chat data: what a run with each
data.train_on / data.packing / data.overlong setting would keep, at one model.seq_length.
The run logs the same line for its own settings (``launcher.data.packing``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.config.schema.data import OVERLONG
from launcher.errors import UserError

DEFAULT_SEQ_LENGTH = 2048


def packing_reports(folder: Path, seq_length: int | None) -> dict[str, Any]:
    """{"seq_length", "reports": [PackingReport JSON...], "lines": [text...]} for the training
    split under data.train_on=assistant and every packing / over-long combination."""
    from launcher.data.chat.preference_rows import PreferenceRows, is_preference_index
    from launcher.data.megatron_indexed import IndexedDataset
    from launcher.data.packing import ChatRows
    from launcher.data.token_index import PreparedIndex

    length = seq_length or DEFAULT_SEQ_LENGTH
    if length < 1:
        raise UserError(f"--seq-length={seq_length}: must be positive, e.g. --seq-length 2048")
    index = PreparedIndex.load(folder)
    tokens = IndexedDataset.open(folder / index.megatron_prefixes["train"])
    roles = IndexedDataset.open(folder / index.chat["roles_prefixes"]["train"])
    pad = int(index.chat.get("pad_id", 0))
    reports = []
    if is_preference_index(index.chat):  # pairs: never packed, truncated or dropped as a pair
        reports = [PreferenceRows(tokens, roles, length, o, pad).report for o in OVERLONG]
    for packing in (True, False) if not reports else ():
        for overlong in OVERLONG:
            rows = ChatRows(tokens, roles, length, packing, overlong, "assistant", pad)
            reports.append(rows.report)
    return {
        "seq_length": length,
        "reports": [r.to_json() for r in reports],
        "lines": [
            f"model.seq_length={length} data.packing={str(r.packing).lower()} "
            f"data.overlong={r.overlong}: {r.line()}"
            for r in reports
        ],
    }
