"""The data group (`data.*`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from launcher.config.schema.allowed import a_path, one_of
from launcher.config.schema.common import AT_LEAST_0, AT_LEAST_1

# Chat data's choices, read here by composition and validate and by launcher/data/packing.py.
TRAIN_ON = ("assistant", "completion", "all")
OVERLONG = ("truncate", "drop")


@dataclass
class DataConfig:
    """Training and validation data, tokenizer and chat-data handling."""

    path: str | None = field(default=None, metadata=a_path())
    """None: the built-in offline corpus (prepared on first use, never downloaded). Else a folder
    `llmtrain data prepare` wrote, or a Megatron-LM PREFIX of PREFIX.bin/PREFIX.idx."""
    blend: list[Any] = field(default_factory=list)
    """Several datasets with weights, Megatron-LM's --data-path convention:
    [0.7, /data/web_text_document, 0.3, /data/code] (weights normalised); instead of path."""
    valid_path: str | None = field(default=None, metadata=a_path())
    """Validation data: a prepared folder (its valid split, else all of it) or a Megatron prefix.
    None: the valid splits of the training datasets (with the blend's weights)."""
    tokenizer: str = field(default="byte", metadata=one_of("byte", "bpe"))
    """Tokenizer of the built-in corpus: bytes, or a BPE trained on it."""
    bpe_vocab_size: int = field(default=4096, metadata=AT_LEAST_1)
    """Vocabulary of the BPE tokenizer (data.tokenizer=bpe)."""
    num_workers: int = field(default=0, metadata=AT_LEAST_0)
    """Data loader worker processes per rank; 0: load in the training process."""
    builtin: str = field(default="corpus", metadata=one_of("corpus", "chat", "preference"))
    """Without data.path / data.blend: corpus (the built-in text corpus, pre-training), chat
    (the built-in chat dataset, a few hundred generated conversations with a byte-level ChatML
    tokenizer, for fine-tuning; data/chat/builtin_chat.py) or preference (generated pairs of
    a right and a wrong answer to the same questions, the same tokenizer, for
    finetune.objective=dpo|simpo|orpo; launcher/data/chat/builtin_preference.py)."""
    train_on: str = field(default="assistant", metadata=one_of(*TRAIN_ON))
    """Chat data (`llmtrain data prepare --input-format chat|instruct`, docs/finetuning.md):
    which tokens carry loss: assistant (every assistant turn), completion (the last assistant
    turn only) or all (every token of the conversation)."""
    packing: bool = True
    """Several examples per row of model.seq_length + 1 tokens, attention kept within each
    (true), or one example a row, padded (false)."""
    overlong: str = field(default="truncate", metadata=one_of(*OVERLONG))
    """An example longer than a row: truncate (keep its first seq_length + 1 tokens) or drop."""
