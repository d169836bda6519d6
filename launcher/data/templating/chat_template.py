"""A model's chat template, rendered as Hugging Face transformers' ``apply_chat_template`` renders
it, and the character spans of the assistant turns in the result.

Rendering is what transformers 4.4x-5.x do in ``utils/chat_template_utils.py`` (the environment:
``templating.template_sandbox``, which also keeps a template inside its time and size budget,
``launcher.data.limits``; ``data prepare`` renders in a child process besides,
``launcher.data.templating.template_worker``). The template sees ``messages``, ``tools`` (None),
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

What a template says when it refuses a conversation (``raise_exception``), and any error it ends
in, is quoted through ``launcher.excerpt`` (escaped, at most 200 characters), with the template
line where known.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from launcher import bounded_read
from launcher.data.documents import SURROGATE
from launcher.data.limits import DataLimits
from launcher.data.templating import template_sandbox
from launcher.data.templating.template_sandbox import TemplateBudgetError
from launcher.errors import UserError
from launcher.excerpt import message as quoted

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


def _read_text(path: Path, what: str) -> str | None:
    """A template file's text through the bounded reader; None when there is no such file.
    `what` names the file in messages (a FIFO or folder there is refused, never waited on)."""
    try:
        data = bounded_read.read_regular(path, _MAX_FILE_BYTES, follow_symlinks=True)
        return data.decode("utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise UserError(f"{what}: not UTF-8 text (byte {exc.start})") from None
    except bounded_read.FileRefused as exc:
        raise UserError(f"{what}: {exc}") from None
    except OSError as exc:
        raise UserError(f"{what}: cannot read it ({exc.strerror})") from None


def _read_config(path: Path) -> dict[str, Any] | None:
    """tokenizer_config.json as a dict; None when there is no such file."""
    try:  # bounded: a FIFO or /dev/zero in its place is refused, never waited on
        config = bounded_read.read_json(path, max_bytes=_MAX_FILE_BYTES, follow_symlinks=True)
    except FileNotFoundError:
        return None
    except bounded_read.FileRefused as exc:
        raise UserError(f"{path}: {exc}") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror})") from None
    if not isinstance(config, dict):
        raise UserError(f"{path}: expected a JSON object")
    return config


class TemplateRenderError(ValueError):
    """The template raised (raise_exception) or failed while rendering a conversation; the
    message quotes what the template said through launcher.excerpt."""


class TemplateBudgetExceeded(TemplateRenderError):
    """The template went over its time or size budget (launcher.data.limits)."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


def _render_error(exc: BaseException) -> TemplateRenderError:
    """What a template's failure is said as: its own words quoted, the line where known."""
    import jinja2

    line = template_sandbox.template_line(exc)
    if isinstance(exc, TemplateBudgetError) and exc.line is not None:
        line = exc.line  # where the output ran over, found from the generator's frame
    at = f" at line {line}" if line is not None else ""
    if isinstance(exc, TemplateBudgetError):
        return TemplateBudgetExceeded(f"stopped{at}: {exc}", exc.kind)
    if isinstance(exc, MemoryError):
        return TemplateBudgetExceeded(f"stopped{at}: it ran out of memory", "memory")
    if type(exc) is jinja2.exceptions.TemplateError:  # raise_exception(...)
        return TemplateRenderError(f"it says{at}: {quoted(str(exc))}")
    return TemplateRenderError(f"{type(exc).__name__}{at}: {quoted(str(exc))}")


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
        Jinja file that replaces its chat_template (a named "default" one of a list is taken).
        A file that is there but is not a regular file (a FIFO, a folder) is refused as such."""
        config = _read_config(path)
        special = {
            name: text
            for name in SPECIAL_TOKEN_NAMES
            if (text := _token_text((config or {}).get(name))) is not None
        }
        if template_file is not None:
            source = _read_text(template_file, f"--chat-template {template_file}")
            if source is None:
                raise UserError(f"--chat-template {template_file}: no such file (a Jinja template)")
            return cls(source, special, str(template_file))
        raw = (config or {}).get("chat_template")
        if isinstance(raw, list):  # [{"name": "default", "template": ...}, {"name": "tool_use"...}]
            named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
            raw = named.get("default")
        if not isinstance(raw, str) or not raw.strip():
            jinja = path.parent / "chat_template.jinja"  # transformers 4.4x+ save it beside
            text = _read_text(jinja, str(jinja))
            if text is not None:
                return cls(text, special, str(jinja))
            raise UserError(
                f"no chat template: {path} has no chat_template"
                + ("" if config is not None else " (the file does not exist)")
                + "; give one with --chat-template FILE.jinja"
            )
        return cls(raw, special, f"{path} chat_template")

    def check(self) -> None:
        """Compile the template now (UserError naming the line where it does not parse)."""
        _compile(self.source)

    def render(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = False
    ) -> str:
        """The template's text for `messages`, under the default budget unless a conversation's
        is open (``conversation``); TemplateRenderError when it refuses or fails."""
        compiled = _compile(self.source)
        plain = [{k: v for k, v in m.items() if v is not None} for m in messages]
        context = {
            "messages": plain,
            "tools": None,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
            **self.special_tokens,
        }
        try:
            with template_sandbox.watching(DataLimits()):
                text = template_sandbox.stream(compiled, context)
        except Exception as exc:  # jinja2's TemplateError, the guard's, the template's code's
            raise _render_error(exc) from None
        if SURROGATE.search(text) is not None:
            raise TemplateRenderError(
                "it writes a lone surrogate (U+D800-U+DFFF), which is no character: the "
                "tokenizer cannot read it"
            )
        return text

    def conversation(
        self, messages: Sequence[dict[str, Any]], specials: Sequence[str], limits: DataLimits
    ) -> tuple[str, list[tuple[int, int, int]]]:
        """(text, spans extended over the turn ends) of one conversation, every rendering of it
        under one budget (`limits`)."""
        with template_sandbox.watching(limits):
            text = self.render(messages)
            spans = self.assistant_spans(messages, text)
        return text, extend_over_turn_end(text, spans, specials)

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


@cache
def _compile(source: str) -> Any:
    import jinja2

    try:
        return template_sandbox.environment().from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise UserError(
            f"the chat template does not parse: line {exc.lineno}: {quoted(exc.message or '')}"
        ) from None
    except (RecursionError, MemoryError, SyntaxError, ValueError) as exc:  # nested too deeply
        raise UserError(
            f"the chat template cannot be compiled ({type(exc).__name__}: {quoted(str(exc))})"
        ) from None
