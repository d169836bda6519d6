"""Small tokenizers with the special tokens of real chat models, built here (nothing downloaded),
and the real chat templates of tests/data/chat_templates/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"

# family: (template file, special tokens in id order, tokenizer_config named tokens, metaspace)
FAMILIES: dict[str, tuple[str, list[str], dict[str, str], bool]] = {
    "llama3": (
        "llama-3.1-instruct.jinja",
        [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ],
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        False,
    ),
    "qwen2.5": (
        "qwen2.5-instruct.jinja",
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        False,
    ),
    "mistral": (
        "mistral-7b-instruct-v0.3.jinja",
        ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]"],
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
        True,
    ),
}

# Real templates shipped inside TRL (trl/chat_templates/, TRL 1.16.0, the dev extra), used as
# data: the families tests/unit/data/test_named_templates.py checks the built-in templates against.
TRL_FAMILIES: dict[str, tuple[str, list[str], dict[str, str], bool]] = {
    "phi3": (
        "phi3.jinja",
        ["<unk>", "<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
        {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>"},
        False,
    ),
    "gemma": (
        "gemma.jinja",
        ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"},
        False,
    ),
    "llama3-trl": ("llama3.jinja", *FAMILIES["llama3"][1:]),  # Llama 3 (not 3.1)
}


def trl_templates() -> Path | None:
    """TRL's folder of real chat templates, or None without TRL."""
    import importlib.util

    spec = importlib.util.find_spec("trl")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "chat_templates"
    return folder if folder.is_dir() else None


CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? The capital of France is Paris.",
    "Please add 2 and 3. 2 + 3 = 5. Thanks, that helps!",
    "You are a helpful assistant. Answer briefly and precisely.",
    "Say hi. Hi! Hello there, how are you today?",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12, and words: über café naïve.",
] * 20


def build_tokenizer(family: str, folder: Path, vocab_size: int = 400) -> Path:
    """A byte-level BPE (or Metaspace BPE for mistral) trained on a few sentences, with the
    family's special tokens, its tokenizer_config.json (real chat template) beside it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if family in FAMILIES:
        template_file, specials, named, metaspace = FAMILIES[family]
        template = TEMPLATES / template_file
    else:
        template_file, specials, named, metaspace = TRL_FAMILIES[family]
        template = (trl_templates() or TEMPLATES) / template_file
    tok = Tokenizer(models.BPE(unk_token="<unk>" if metaspace else None))
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        alphabet: list[str] = []
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template.read_text(encoding="utf-8"),
        **named,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return path


def hf_tokenizer(path: Path) -> Any:
    """The same files loaded into transformers (test-only dependency)."""
    from transformers import PreTrainedTokenizerFast

    config = json.loads((path.parent / "tokenizer_config.json").read_text(encoding="utf-8"))
    named = {k: v for k, v in config.items() if k.endswith("_token")}
    tok = PreTrainedTokenizerFast(tokenizer_file=str(path), **named)
    tok.chat_template = config["chat_template"]
    return tok
