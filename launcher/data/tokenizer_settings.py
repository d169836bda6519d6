"""The ``tokenizer_config.json`` settings that change token ids, applied to a ``tokenizer.json`` as
transformers 5 applies them when it loads the model's tokenizer, so that llmtrain's ids are
transformers' ids.

transformers 5 does not take every tokenizer.json as it is: a ``tokenizer_class`` of its own
(``LlamaTokenizer`` among them: Llama 2, Mistral, Phi-3, ...) rebuilds the pipeline from the file's
vocabulary and merges (transformers v5.x ``models/llama/tokenization_llama.py``,
``LlamaTokenizer.__init__``; ``tokenization_utils_base._get_prepend_scheme``):

- no normalizer (a file's legacy ``Prepend("▁")`` + ``Replace(" ", "▁")`` normalizer is dropped);
- the pre-tokenizer ``Metaspace(replacement="▁", split=False)`` with ``prepend_scheme``
  ``"first"`` when ``legacy`` is false (its default) and ``add_prefix_space`` true (its default):
  "▁" only before the start of the text, never after a special token (``<|user|>`` ``T`` ``ell``,
  not ``<|user|>`` ``▁Tell``); ``"always"`` with ``legacy: true``; ``"never"`` with
  ``add_prefix_space: false``;
- a BPE model with ``fuse_unk`` and ``byte_fallback`` on.

``PreTrainedTokenizerFast`` / ``TokenizersBackend`` (and no class) take the file as it is, settings
aside. ``add_bos_token`` / ``add_eos_token`` change only encodings with special tokens added, which
llmtrain never asks for (the chat template writes BOS, as ``apply_chat_template`` does); they are
not refused. Any other class that carries ``legacy`` or ``add_prefix_space`` is refused (exit 2,
naming the setting): llmtrain cannot say it would tokenize as transformers does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher import bounded_read
from launcher.errors import UserError

CONFIG_FILE = "tokenizer_config.json"
_MAX_CONFIG_BYTES = 16 << 20
AS_IS_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")
LLAMA_CLASSES = ("LlamaTokenizer", "LlamaTokenizerFast")
ID_SETTINGS = ("legacy", "add_prefix_space")


def read_config(path: Path) -> dict[str, Any]:
    """The tokenizer_config.json at `path` ({} when there is none)."""
    if not path.is_file():
        return {}
    try:
        config = bounded_read.read_json(path, max_bytes=_MAX_CONFIG_BYTES, follow_symlinks=True)
    except (OSError, ValueError) as exc:  # FileRefused is a ValueError
        raise UserError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise UserError(f"{path}: expected a JSON object")
    return config


def prepend_scheme(config: dict[str, Any]) -> str:
    """transformers' ``_get_prepend_scheme`` for a LlamaTokenizer built from `config`."""
    if config.get("add_prefix_space") is False:
        return "never"
    return "always" if config.get("legacy") is True else "first"


def apply_settings(tok: Any, config_path: Path) -> None:
    """Make the ``tokenizers.Tokenizer`` `tok` encode as transformers loads it with the
    tokenizer_config.json at `config_path` (module docstring); UserError for what cannot be."""
    from tokenizers import models, pre_tokenizers

    config = read_config(config_path)
    cls = config.get("tokenizer_class")
    if cls is None or cls in AS_IS_CLASSES:
        return
    if cls not in LLAMA_CLASSES:
        present = [name for name in ID_SETTINGS if name in config]
        if present:
            setting = present[0]
            raise UserError(
                f"{config_path}: {setting}={config[setting]!r} with tokenizer_class {cls}: "
                f"transformers rebuilds this class's tokenizer and {setting} may change its ids, "
                f"which llmtrain reproduces only for {', '.join(LLAMA_CLASSES)}; save the "
                "tokenizer from transformers (tokenizer.save_pretrained) and give that "
                "tokenizer.json with tokenizer_class PreTrainedTokenizerFast"
            )
        return
    model = tok.model
    if not isinstance(model, models.BPE):
        raise UserError(
            f"{config_path}: tokenizer_class {cls} with a {type(model).__name__} tokenizer.json: "
            "transformers rebuilds it as a BPE, which llmtrain does not reproduce; give a BPE "
            "tokenizer.json or tokenizer_class PreTrainedTokenizerFast"
        )
    model.fuse_unk = True
    model.byte_fallback = True
    model.dropout = None
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme=prepend_scheme(config), split=False
    )
