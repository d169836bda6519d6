"""`--chat-template NAME`: the built-in templates (launcher/data/templates/, written for llmtrain
from each format's public description) render token for token as transformers'
`apply_chat_template` does with the models' real templates, read offline: Llama 3, Phi-3 and
Gemma from the copies TRL 1.16.0 ships (trl/chat_templates/), ChatML from Qwen2.5's and Mistral
from Mistral-7B-Instruct-v0.3's (tests/data/chat_templates/).

Where the real template differs on purpose, the test says so: Qwen2.5 adds its own default system
message (ChatML has none; compared on conversations with one), and Mistral v0.3's template drops
the system message unless the conversation ends with a user message, where llmtrain (as
mistral-common does) puts it before the last user message always (compared where they agree)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.data.chat.chat_prepare import NAMED_TEMPLATES, load_chat_tokenizer
from launcher.data.chat.chat_records import Conversation
from tests.chat_fixtures import build_tokenizer, hf_tokenizer, trl_templates
from tests.cli import invoke

pytest.importorskip("transformers")

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
TURNS = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": " The capital of France is Paris. "},
    {"role": "user", "content": "Please add 2 and 3."},
    {"role": "assistant", "content": "2 + 3 = 5, über café."},
]
# name: (the real template's family in tests/chat_fixtures.py, which conversations are compared:
# "all", "system" (only those with a system message: Qwen2.5 adds its own otherwise) or
# "no system" (Gemma has no system role; Mistral v0.3, see above))
REAL = {
    "chatml": ("qwen2.5", "system"),
    "llama3": ("llama3-trl", "all"),
    "mistral": ("mistral", "no system"),
    "phi3": ("phi3", "all"),
    "gemma": ("gemma", "no system"),
}


def _conversations(which: str) -> list[tuple[list[dict[str, str]], bool]]:
    """(messages, add_generation_prompt) pairs to compare."""
    plain = [(TURNS[:2], False), (TURNS, False), (TURNS[:3], True)]
    system = [([SYSTEM, *TURNS], False), ([SYSTEM, *TURNS[:3]], True)]
    return {"all": plain + system, "system": system, "no system": plain}[which]


@pytest.mark.parametrize("name", NAMED_TEMPLATES)
def test_named_template_equals_transformers_on_the_real_one(name: str, tmp_path: Path) -> None:
    family, which = REAL[name]
    if family in ("phi3", "gemma", "llama3-trl") and trl_templates() is None:
        pytest.skip("the real template ships with trl (the dev extra)")
    path = build_tokenizer(family, tmp_path, vocab_size=300)
    hf = hf_tokenizer(path)  # the real template
    ours = load_chat_tokenizer(str(path), name, None, "chat")
    assert ours.template is not None and ours.template.origin == f"{name} (built in)"
    conversations = _conversations(which)
    if name == "mistral":  # v0.3 keeps a system message only before a final user message
        conversations.append(([SYSTEM, *TURNS[:3]], True))
    for messages, generation in conversations:
        reference = hf.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=generation
        )
        if not isinstance(reference, list):
            reference = reference["input_ids"]
        text = ours.template.render(messages, add_generation_prompt=generation)
        ids = ours.tokenizer._tok.encode(text, add_special_tokens=False).ids
        assert ids == list(reference), (name, messages, text)
        if messages[-1]["role"] == "assistant":  # the training path: ids and loss roles
            example = ours.encode(Conversation("x.jsonl:1", tuple(messages)))
            assert example.ids.tolist() == list(reference)
            trained = hf.decode([t for t, r in zip(example.ids, example.roles, strict=True) if r])
            assert "Paris" in trained and "capital of France?" not in trained


def test_mistral_keeps_the_system_message_in_training_data(tmp_path: Path) -> None:
    """Where Mistral v0.3's own template drops it (no final user message), llmtrain's puts it
    before the last user message, as mistral-common does."""
    path = build_tokenizer("mistral", tmp_path, vocab_size=300)
    ours = load_chat_tokenizer(str(path), "mistral", None, "chat")
    assert ours.template is not None
    text = ours.template.render([SYSTEM, *TURNS])
    assert text.startswith("<s>[INST] What is the capital of France?[/INST] The capital")
    assert "[INST] You are a helpful assistant.\n\nPlease add 2 and 3.[/INST]" in text


@pytest.mark.integration  # prepare renders in the template worker, a child process
def test_an_unknown_name_lists_the_built_in_templates(tmp_path: Path) -> None:
    path = build_tokenizer("qwen2.5", tmp_path, vocab_size=300)
    data = tmp_path / "chat.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, '
                    '{"role": "assistant", "content": "yo"}]}\n')  # fmt: skip
    done = invoke("data", "prepare", "--input", str(data), "--tokenizer", str(path),
                  "--output", str(tmp_path / "out"), "--chat-template", "chatmel")  # fmt: skip
    assert done.returncode == 2
    assert "--chat-template chatmel" in done.stderr and "chatml, gemma, llama3" in done.stderr
    done = invoke("data", "prepare", "--input", str(data), "--tokenizer", str(path),
                  "--output", str(tmp_path / "out"), "--chat-template", "chatml")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "template chatml (built in)" in done.stdout
    # one line, however long the path (stdout into a pipe must not wrap it at 80 columns)
    assert done.stdout.splitlines()[0].endswith(f"data.path={tmp_path / 'out'}")
