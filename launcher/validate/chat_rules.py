"""The validation rule of fine-tuning data keys (``chat-data`` in ``launcher.validate.rules``).

What can be told from the configuration alone: the built-in chat dataset (data.builtin=chat) with
a layout or backend that cannot train it. A chat dataset named by data.path is checked against
the same conditions before launch, from its files (``launcher.data.chat.chat_checks``)."""

from __future__ import annotations

from launcher.backends.common import backend_of
from launcher.config.layout import Layout
from launcher.config.schema import LLMTrainConfig
from launcher.data.chat.chat_checks import layout_problems

# The built-in chat dataset's vocabulary (chat.builtin_chat.VOCAB_SIZE, which a unit test
# compares; a literal here so validation does not import the tokenizers library).
BUILTIN_CHAT_VOCAB = 259


def chat_problems(cfg: LLMTrainConfig, layout: Layout) -> list[tuple[tuple[str, ...], str]]:
    """(keys, message) of each problem."""
    d = cfg.data
    if d.builtin != "chat" or d.path is not None or d.blend:
        return []
    out: list[tuple[tuple[str, ...], str]] = []
    if backend_of(cfg).name == "megatron":
        out.append(
            (
                ("data.builtin", "backend.name"),
                "data.builtin=chat with backend=megatron: Megatron-LM's GPTDataset reads no "
                "per-token loss masks; fine-tune with backend=torch or backend=deepspeed",
            )
        )
    for message in layout_problems(layout.pp, layout.cp, d.packing):
        out.append((("data.packing",), message))
    if cfg.model.vocab_size < BUILTIN_CHAT_VOCAB:
        out.append(
            (
                ("model.vocab_size",),
                f"model.vocab_size={cfg.model.vocab_size}: the built-in chat dataset's tokenizer "
                f"has {BUILTIN_CHAT_VOCAB} tokens (bytes and 3 ChatML tokens); set "
                f"model.vocab_size={BUILTIN_CHAT_VOCAB} or more",
            )
        )
    return out
