"""A model's chat template, rendered as Hugging Face transformers' ``apply_chat_template`` renders
it, and the character spans of the assistant turns in the result.

Rendering (what transformers 4.4x-5.x do in ``utils/chat_template_utils.py``, re-stated here so that
llmtrain never imports transformers): a Jinja2 ``ImmutableSandboxedEnvironment`` with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension and a ``{% generation %}``
block tag (rendered as its body); the ``tojson`` filter is ``json.dumps`` without ASCII escaping
(keyword arguments ``indent``, ``separators``, ``sort_keys``); the globals ``raise_exception``
(a template error), ``strftime_now`` (the local time formatted), ``dict`` and ``namespace``
(which refuses underscore-prefixed names). The template sees ``messages``, ``tools`` (None),
``documents`` (None), ``add_generation_prompt`` and the tokenizer's named special tokens
(``bos_token``, ``eos_token``, ``unk_token``, ``sep_token``, ``pad_token``, ``cls_token``,
``mask_token``: those tokenizer_config.json names) as strings; keys of a message whose value is
null are dropped first. The text is then tokenized without adding special tokens (the template
writes BOS itself when the model wants one), special tokens inside it becoming their ids.

Which characters are assistant text (``assistant_spans``), by differential rendering: for each
assistant message k, the conversation is rendered again with message k's content replaced by a
sentinel string (private-use characters no template trims or escapes). Whatever precedes the
sentinel is what precedes the content in the real rendering, whatever follows it is what follows
the content, so the content occupies [len(prefix), len(real) - len(suffix)) of the real text,
trimmed or not. Both halves are checked (a template that transforms the content in other ways
is refused with the message index, never guessed at). The span then extends over the special token
that closes the turn when the text right after the content starts with one (``<|eot_id|>``,
``<|im_end|>``, ``</s>``): the model must learn to stop. This is exact for any template that
inserts an assistant's content once, as is, or trimmed (Llama 3, ChatML / Qwen2.5 and Mistral
among them), wherever the template puts system messages. Tokens are then marked when their
character offsets overlap a span (the rule transformers' ``return_assistant_tokens_mask`` uses).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

from launcher import bounded_read
from launcher.errors import UserError

# tokenizer_config.json's named special tokens (transformers' SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
CONFIG_FILE = "tokenizer_config.json"
_SENTINEL = "\ue000llmtrain-assistant-{}\ue001"


# Tokenizer configs and templates are small; a larger file is not one (HF caches link to blobs).
_MAX_FILE_BYTES = 16 << 20


def _read_text(path: Path) -> str:
    """A template file's text through the bounded reader (UnicodeDecodeError is a ValueError)."""
    return bounded_read.read_regular(path, _MAX_FILE_BYTES, follow_symlinks=True).decode("utf-8")


class TemplateRenderError(ValueError):
    """The template raised (raise_exception) or failed while rendering a conversation."""


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken object."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template with the special tokens it is rendered with."""

    source: str
    special_tokens: dict[str, str]
    origin: str  # where it came from, for messages

    @classmethod
    def from_tokenizer_config(cls, path: Path, template_file: Path | None = None) -> ChatTemplate:
        """The chat_template (and special tokens) of a tokenizer_config.json; `template_file`: a
        Jinja file that replaces its chat_template (a named "default" one of a list is taken)."""
        config: dict[str, Any] = {}
        if path.is_file():
            try:  # bounded: a FIFO or /dev/zero in its place is refused, never waited on
                config = bounded_read.read_json(
                    path, max_bytes=_MAX_FILE_BYTES, follow_symlinks=True
                )
            except (OSError, ValueError) as exc:  # FileRefused is a ValueError
                raise UserError(f"{path}: not valid JSON ({exc})") from None
            if not isinstance(config, dict):
                raise UserError(f"{path}: expected a JSON object")
        special = {
            name: text
            for name in SPECIAL_TOKEN_NAMES
            if (text := _token_text(config.get(name))) is not None
        }
        if template_file is not None:
            try:
                source = _read_text(template_file)
            except (OSError, ValueError) as exc:
                raise UserError(
                    f"--chat-template {template_file}: cannot read it ({exc})"
                ) from None
            return cls(source, special, str(template_file))
        raw = config.get("chat_template")
        if isinstance(raw, list):  # [{"name": "default", "template": ...}, {"name": "tool_use"...}]
            named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
            raw = named.get("default")
        if not isinstance(raw, str) or not raw.strip():
            jinja = path.parent / "chat_template.jinja"  # transformers 4.4x+ save it beside
            if jinja.is_file():
                try:
                    text = _read_text(jinja)
                except (OSError, ValueError) as exc:
                    raise UserError(f"{jinja}: cannot read it ({exc})") from None
                return cls(text, special, str(jinja))
            raise UserError(
                f"no chat template: {path} has no chat_template"
                + ("" if path.is_file() else " (the file does not exist)")
                + "; give one with --chat-template FILE.jinja"
            )
        return cls(raw, special, f"{path} chat_template")

    def render(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = False
    ) -> str:
        compiled = _compile(self.source)
        plain = [{k: v for k, v in m.items() if v is not None} for m in messages]
        try:
            return str(
                compiled.render(
                    messages=plain,
                    tools=None,
                    documents=None,
                    add_generation_prompt=add_generation_prompt,
                    **self.special_tokens,
                )
            )
        except Exception as exc:  # jinja2's TemplateError, and whatever the template's code raises
            raise TemplateRenderError(f"{type(exc).__name__}: {exc}") from None

    def assistant_spans(
        self, messages: Sequence[dict[str, Any]], rendered: str
    ) -> list[tuple[int, int, int]]:
        """(message index, start, end) of each assistant message's content in `rendered` (the
        template's rendering of `messages`), see the module docstring. Assistant messages whose
        content is not a non-empty string (a tool call alone) have no span."""
        spans = []
        for k, message in enumerate(messages):
            content = message.get("content")
            if message.get("role") != "assistant" or not isinstance(content, str) or not content:
                continue
            sentinel = _SENTINEL.format(k)
            changed = [dict(m) for m in messages]
            changed[k]["content"] = sentinel
            probe = self.render(changed)
            at = probe.find(sentinel)
            if at < 0 or probe.find(sentinel, at + 1) >= 0:
                raise TemplateRenderError(
                    f"message {k}: the template does not insert an assistant message's content "
                    "once, as it is: llmtrain cannot tell its tokens apart"
                )
            suffix = len(probe) - at - len(sentinel)
            end = len(rendered) - suffix
            if not (
                rendered[:at] == probe[:at]
                and rendered[end:] == probe[at + len(sentinel) :]
                and end >= at
            ):
                raise TemplateRenderError(
                    f"message {k}: the template renders the text around an assistant message "
                    "differently depending on its content: llmtrain cannot tell its tokens apart"
                )
            spans.append((k, at, end))
        return spans


def extend_over_turn_end(
    rendered: str, spans: list[tuple[int, int, int]], special: Sequence[str]
) -> list[tuple[int, int, int]]:
    """Each span extended over the special token right after it (the end of the turn), when one
    follows (longest match first)."""
    ordered = sorted((s for s in special if s), key=len, reverse=True)
    out = []
    for k, start, end in spans:
        for token in ordered:
            if rendered.startswith(token, end):
                end += len(token)
                break
        out.append((k, start, end))
    return out


def token_mask(
    offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int, int]]
) -> list[int]:
    """Per token: the index + 1 of the span its characters overlap (0: none). Offsets and spans
    are both in order."""
    out = [0] * len(offsets)
    ordered = sorted(spans, key=lambda s: s[1])
    i = 0
    for t, (lo, hi) in enumerate(offsets):
        while i < len(ordered) and lo >= ordered[i][2]:
            i += 1
        if i == len(ordered):
            break
        if hi > ordered[i][1] and hi > lo:
            out[t] = i + 1
    return out


# --- the Jinja environment -----------------------------------------------------------------------
def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@cache
def _environment() -> Any:
    try:
        import jinja2
        import jinja2.ext
        import jinja2.nodes
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise UserError(
            "chat templates need jinja2: pip install 'llmtrain[train]' (or pip install jinja2)"
        ) from None

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: rendered as its body."""

        tags = {"generation"}  # noqa: RUF012 (jinja2's Extension declares a set)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    class Namespace(jinja2.utils.Namespace):
        """jinja's namespace, refusing underscore-prefixed attribute names."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                Namespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"a chat template cannot set the underscore-prefixed attribute {name!r}"
                )

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = Namespace
    return env


@cache
def _compile(source: str) -> Any:
    import jinja2

    try:
        return _environment().from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise UserError(f"the chat template does not parse: line {exc.lineno}: {exc}") from None
