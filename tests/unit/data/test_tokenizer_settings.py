"""llmtrain tokenizes a sentencepiece-style tokenizer folder (Metaspace BPE with byte fallback,
special tokens added, tokenizer_class LlamaTokenizer as Phi-3, Mistral and Llama 2 ship it) to the
ids transformers 5 gives when it loads the folder: `legacy` and `add_prefix_space` honoured
(launcher/data/tokenizer_settings.py), what cannot be reproduced refused with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.data.chat.chat_prepare import load_chat_tokenizer
from launcher.data.chat.chat_records import Conversation
from launcher.data.hf_tokenizer import HFTokenizerFile
from launcher.errors import UserError

transformers = pytest.importorskip("transformers")

SPECIALS = ["<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
CORPUS = [
    "Tell me a story about the sea.",
    "What is the capital of France? The capital of France is Paris.",
    "Hello there, how are you today? I am fine, thank you.",
] * 10
TEXTS = [
    "<|user|>Tell me a story<|end|><|assistant|> Hello there<|end|>",
    "<|system|>\nYou are kind.<|end|>\n<|user|>\nWhat is the capital?<|end|>\n<|assistant|>\n"
    "Paris.<|end|>\n",
    "Tell  me,\tdouble  spaces ü<|end|> and after",
]
PHI3 = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + "
    "'<|end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}"
    "{% else %}{{ eos_token }}{% endif %}"
)


def _folder(tmp_path: Path, style: str, **settings: object) -> Path:
    """tokenizer.json in the `style` of sentencepiece conversions ("metaspace": a Metaspace
    pre-tokenizer as current conversions write; "normalizer": Llama 2's Prepend + Replace
    normalizer), and a tokenizer_config.json with `settings`."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    if style == "metaspace":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always", split=False)
    else:
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
        )
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])  # fmt: skip
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    specials = ["<unk>", "<s>", "</s>", *byte_tokens]
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False, special_tokens=specials)
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    folder = tmp_path / f"{style}-{'-'.join(f'{k}={v}' for k, v in settings.items())}"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "chat_template": PHI3, **settings}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


CASES = [
    {"tokenizer_class": "LlamaTokenizer", "legacy": False},  # Phi-3's folder
    {"tokenizer_class": "LlamaTokenizer"},  # legacy defaults to false in transformers 5
    {"tokenizer_class": "LlamaTokenizer", "legacy": True},
    {"tokenizer_class": "LlamaTokenizerFast", "legacy": False, "add_prefix_space": False},
    {"tokenizer_class": "PreTrainedTokenizerFast", "legacy": False},  # taken as it is
]


@pytest.mark.parametrize("style", ["metaspace", "normalizer"])
@pytest.mark.parametrize("settings", CASES, ids=lambda s: "-".join(map(str, s.values())))
def test_ids_equal_transformers(tmp_path: Path, style: str, settings: dict[str, object]) -> None:
    folder = _folder(tmp_path, style, **settings)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    ours = HFTokenizerFile(folder / "tokenizer.json")
    for text in TEXTS:
        expected = hf.encode(text, add_special_tokens=False)
        assert ours.encode(text).tolist() == expected, (text, hf.convert_ids_to_tokens(expected))
    # The chat path: a conversation rendered by the template, as apply_chat_template gives it.
    messages = [{"role": "user", "content": "Tell me a story"},
                {"role": "assistant", "content": "Hello there, Paris."}]  # fmt: skip
    example = load_chat_tokenizer(str(folder / "tokenizer.json"), None, None, "chat").encode(
        Conversation("x.jsonl:1", tuple(messages))
    )
    reference = hf.apply_chat_template(messages, tokenize=True)
    if not isinstance(reference, list):
        reference = reference["input_ids"]
    assert example.ids.tolist() == list(reference)


def test_phi3_folder_has_no_prefix_after_special_tokens(tmp_path: Path) -> None:
    """The observed bug: `<|user|>` `▁Tell` (the file as it is) where transformers gives
    `<|user|>` `T` `ell`-like pieces without "▁"."""
    folder = _folder(tmp_path, "metaspace", tokenizer_class="LlamaTokenizer", legacy=False)
    ours = HFTokenizerFile(folder / "tokenizer.json")
    pieces = [ours._tok.id_to_token(int(i)) for i in ours.encode("<|user|>Tell me")]
    assert pieces[0] == "<|user|>" and not pieces[1].startswith("▁"), pieces
    first = ours._tok.id_to_token(int(ours.encode("Tell me")[0]))
    assert first.startswith("▁"), first  # at the start of the text it is (prepend_scheme first)


@pytest.mark.parametrize("setting", ["legacy", "add_prefix_space"])
def test_a_setting_of_another_class_is_refused(tmp_path: Path, setting: str) -> None:
    folder = _folder(tmp_path, "metaspace", tokenizer_class="T5Tokenizer", **{setting: False})
    with pytest.raises(UserError, match=f"{setting}=False with tokenizer_class T5Tokenizer"):
        HFTokenizerFile(folder / "tokenizer.json")
