"""llmtrain's chat template rendering equals transformers' apply_chat_template token for token on
three real templates (tests/data/chat_templates), the assistant tokens are exactly the assistant
turns and their end token, and bad data exits 2 naming FILE:LINE."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from launcher.data.chat.chat_prepare import load_chat_tokenizer
from launcher.data.chat.chat_records import Conversation
from tests.chat_fixtures import FAMILIES, build_tokenizer, hf_tokenizer
from tests.cli import invoke

pytest.importorskip("transformers")
# unit tests (tests/conftest.py marks them); those rendering in the template worker: integration

CONVERSATIONS = [
    [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": " The capital of France is Paris. "},
        {"role": "user", "content": "Please add 2 and 3."},
        {"role": "assistant", "content": "2 + 3 = 5, über café."},
    ],
    [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hi"},  # the same text as the prompt
    ],
]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    path = build_tokenizer(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, path, hf_tokenizer(path)


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_tokens_equal_transformers(family: tuple, messages: list[dict]) -> None:
    name, path, hf = family
    ours = load_chat_tokenizer(str(path), None, None, "chat")
    example = ours.encode(Conversation("x.jsonl:1", tuple(messages)))
    reference = hf.apply_chat_template(messages, tokenize=True)
    if not isinstance(reference, list):
        reference = reference["input_ids"]
    assert example.ids.tolist() == list(reference), name
    # The trained text is each assistant turn (trimmed as the template trims it) and the special
    # token that closes it, nothing of the prompt.
    eos = {"llama3": "<|eot_id|>", "qwen2.5": "<|im_end|>", "mistral": "</s>"}[name]
    trained = hf.decode([t for t, r in zip(example.ids, example.roles, strict=True) if r])
    answers = [m["content"] for m in messages if m["role"] == "assistant"]
    for answer in answers:
        assert answer.strip() in trained
    assert trained.count(eos) == len(answers)
    assert "capital of France?" not in trained and "Say hi" not in trained
    assert (example.roles == 2).sum() > 0  # the last turn is marked final


def test_mask_equals_transformers_generation_mask(tmp_path: Path) -> None:
    """A ChatML template with {% generation %}: transformers' assistant mask equals ours."""
    path = build_tokenizer("qwen2.5", tmp_path)
    template = (
        "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' }}"
        "{%- if message['role'] == 'assistant' %}{% generation %}{{- message['content'] + "
        "'<|im_end|>' }}{% endgeneration %}{{- '\\n' }}{%- else %}{{- message['content'] + "
        "'<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    )
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    hf = hf_tokenizer(path)
    ours = load_chat_tokenizer(str(path), None, None, "chat")
    for messages in CONVERSATIONS:
        out = hf.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        example = ours.encode(Conversation("x:1", tuple(messages)))
        assert example.ids.tolist() == list(out["input_ids"])
        assert (example.roles > 0).astype(int).tolist() == list(out["assistant_masks"])


def _prepare(tmp_path: Path, lines: list[str], *extra: str) -> subprocess.CompletedProcess[str]:
    tok = build_tokenizer("qwen2.5", tmp_path / "tok")
    data = tmp_path / "data.jsonl"
    data.write_text("".join(line + "\n" for line in lines))
    return invoke(
        "data", "prepare", "--input", str(data), "--tokenizer", str(tok),
        "--output", str(tmp_path / "out"), *extra,
    )  # fmt: skip


GOOD = json.dumps({"messages": CONVERSATIONS[0]})


@pytest.mark.integration  # the good record renders in the template worker, a child process
@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("{not json", "data.jsonl:2: invalid JSON"),
        (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}), "unknown role 'wizard'"),
        (
            json.dumps({"messages": [{"role": "user", "content": "x"},
                                     {"role": "assistant", "content": "  "}]}),
            "data.jsonl:2: messages[1]: an assistant message with empty content",
        ),
        (json.dumps({"messages": [{"role": "user", "content": "x"}]}), "no assistant message"),
        (json.dumps({"text": "plain"}), "data.jsonl:2: expected"),
    ],
)  # fmt: skip
def test_bad_records_exit_2_naming_the_line(tmp_path: Path, bad: str, says: str) -> None:
    result = _prepare(tmp_path, [GOOD, bad], "--input-format", "chat")
    assert result.returncode == 2, result.stderr
    assert says in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_no_template_is_refused(tmp_path: Path) -> None:
    tok = build_tokenizer("qwen2.5", tmp_path / "tok")
    (tmp_path / "tok" / "tokenizer_config.json").write_text("{}")
    data = tmp_path / "data.jsonl"
    data.write_text(GOOD + "\n")
    result = invoke(
        "data", "prepare", "--input", str(data), "--tokenizer", str(tok),
        "--output", str(tmp_path / "out"),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "no chat template" in result.stderr and "--chat-template" in result.stderr


@pytest.mark.integration  # the template worker is a child process
def test_prepare_detects_chat_and_reports_packing(tmp_path: Path) -> None:
    result = _prepare(tmp_path, [GOOD] * 20, "--seq-length", "100", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["layout"] == "chat" and document["chat"]["input_format"] == "chat"
    report = document["packing"]["reports"][0]
    assert report["seq_length"] == 100 and report["kept"] == report["examples"]
    assert 0 < report["padding_share"] < 1
    # The length histogram plan prices padded batches from: 20 equal examples, one bucket of
    # their inputs (tokens - 1) rounded up to 8.
    chat = document["chat"]
    tokens = document["total_tokens"] // chat["train_examples"]
    assert chat["length_histogram"] == {str(-(-(tokens - 1) // 8) * 8): chat["train_examples"]}


def test_environment_matches_transformers_on_whitespace_and_filters(tmp_path: Path) -> None:
    """Plain block tags (trim_blocks / lstrip_blocks), tojson without ASCII escapes, namespace
    and loop controls render as transformers renders them."""
    path = build_tokenizer("qwen2.5", tmp_path)
    template = (
        "{% set ns = namespace(n=0) %}\n"
        "{% for message in messages %}\n"
        "    {% if message['role'] == 'system' %}{% continue %}{% endif %}\n"
        "    {% set ns.n = ns.n + 1 %}\n"
        "<|im_start|>{{ message['role'] }} {{ ns.n }}\n"
        "{{ message['content'] }} {{ {'k': message['content']} | tojson }}<|im_end|>\n"
        "{% endfor %}\n"
    )
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    hf = hf_tokenizer(path)
    ours = load_chat_tokenizer(str(path), None, None, "chat")
    for messages in CONVERSATIONS:
        assert ours.template is not None
        assert ours.template.render(messages) == hf.apply_chat_template(messages, tokenize=False)
