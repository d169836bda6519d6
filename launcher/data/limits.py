"""What one record, document or conversation may cost `data prepare`, in one place.

A user's data can hold anything; every budget that keeps one bad record from hanging the command
or exhausting the machine's memory is here, with the option that raises it:

- ``record_bytes`` (``--max-record-mib``, default 16 MiB): one line of a JSON Lines file, and one
  whole document handed to the `tokenizers` library (a text file tokenized by a BPE or a
  tokenizer.json). The library holds about 160 bytes per character while it encodes (measured
  here: 25 MiB of text took 4.1 GB and 32 s), so a 200 MB line would need some 32 GB and ends the
  process inside Rust (SIGABRT), where no error can be caught: the reader refuses the line before
  it is parsed. 16 MiB is some 4 million tokens, 30 times a 128k-token context.
- ``template_seconds`` (30 s, fixed): rendering one conversation with its chat template, every
  rendering of it together (``templating.chat_template``: one for the text, one per assistant
  message). Real templates take milliseconds.
- ``output_chars`` (twice ``record_bytes``): the text one rendering may produce.
- ``render_memory_bytes`` (2 GiB, or 64 times ``record_bytes`` when that is more): what the
  process that renders templates may allocate beyond its start (``templating.template_worker``
  sets it as its address-space limit).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_RECORD_MIB = 16
RECORD_OPTION = "--max-record-mib"
TEMPLATE_SECONDS = 30.0
RENDER_MEMORY_FLOOR = 2 << 30


@dataclass(frozen=True)
class DataLimits:
    record_bytes: int = MAX_RECORD_MIB << 20
    template_seconds: float = TEMPLATE_SECONDS

    @property
    def output_chars(self) -> int:
        return 2 * self.record_bytes

    @property
    def render_memory_bytes(self) -> int:
        return max(RENDER_MEMORY_FLOOR, 64 * self.record_bytes)

    def raise_hint(self) -> str:
        """How to raise the size budgets, for a message."""
        mib = -(-self.record_bytes // (1 << 20))
        return f"raise it with {RECORD_OPTION} (now {mib})"

    @classmethod
    def from_mib(cls, mib: int) -> DataLimits:
        from launcher.errors import UserError

        if not 1 <= mib <= 4096:
            raise UserError(
                f"{RECORD_OPTION}={mib}: between 1 and 4096 (MiB a record may hold), e.g. "
                f"{RECORD_OPTION} {MAX_RECORD_MIB * 4}"
            )
        return cls(record_bytes=mib << 20)
