"""`llmtrain sample RUN "prompt"`: a short greedy continuation from a run's newest checkpoint.

For a quick look without leaving the tool: the model as the checkpoint holds it (a finetune run's
adapters merged into the base they were trained on, checked by digest: ``lora_export.merged``),
on the CPU (or the first GPU when there is one) in fp32, the prompt encoded with the run's
tokenizer (the prepared data's, or bytes), then `max_new_tokens` greedy steps (argmax, no
sampling: the same text every time), stopping early at the end-of-document token. When the run's
data carries a chat template (fine-tuning data: its tokenizer_config.json), the prompt is one user
message rendered with that template and its generation prompt, as the model was trained to see it,
and the template's end-of-turn token (its eos_token) also stops the reply; `chat=False` continues
the raw text instead. The context is
cut to the model's seq_length (the most recent tokens). No KV cache: each step reruns the window,
fine for the bounded lengths allowed here (MAX_NEW_TOKENS).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.cache_dir import cache_root
from launcher.errors import UserError

MAX_NEW_TOKENS = 512


@dataclass(frozen=True)
class Sample:
    step: int
    prompt: str
    text: str
    tokens: int
    template: str | None = None  # where the chat template came from, when one was applied

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "prompt": self.prompt,
            "text": self.text,
            "tokens": self.tokens,
            "chat_template": self.template,
        }


def _data_folder(cfg: Any) -> Path | None:
    """The prepared data the run trained on (its tokenizer and template), or None for bytes."""
    if cfg.data.path is not None:
        return Path(cfg.data.path).expanduser()
    if cfg.data.builtin == "chat":
        from launcher.data.builtin_chat import builtin_chat_dir

        return builtin_chat_dir(cache_root())
    return None


def _tokenizer(folder: Path | None) -> Any:
    from launcher.data.tokenizer import ByteTokenizer, load_tokenizer

    if folder is None:
        return ByteTokenizer()
    try:
        return load_tokenizer(folder)
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"data.path={folder}: tokenizer unreadable ({exc})") from None


def chat_template(folder: Path | None) -> Any:
    """The data's chat template (launcher.data.chat_template), or None when it has none."""
    from launcher.data.chat_template import ChatTemplate

    config = folder / "tokenizer_config.json" if folder is not None else None
    if config is None or not config.is_file():
        return None
    try:
        return ChatTemplate.from_tokenizer_config(config)
    except UserError:  # no chat_template in it: plain continuation
        return None


def prompt_ids(tok: Any, template: Any, prompt: str) -> tuple[list[int], set[int]]:
    """The prompt's ids and the ids that end the reply (end of document; the template's eos)."""
    stop = {tok.eod_id} if tok.eod_id is not None else set()
    if template is None:
        return [int(i) for i in tok.encode(prompt)], stop
    from launcher.data.chat_template import TemplateRenderError

    try:
        text = template.render([{"role": "user", "content": prompt}], add_generation_prompt=True)
    except TemplateRenderError as exc:
        raise UserError(f"{template.origin}: cannot render the prompt ({exc})") from None
    eos = template.special_tokens.get("eos_token")
    eos_ids = [int(i) for i in tok.encode(eos)] if eos else []
    if len(eos_ids) == 1:
        stop.add(eos_ids[0])
    return [int(i) for i in tok.encode(text)], stop


def sample(
    run_dir: Path,
    prompt: str,
    max_new_tokens: int = 32,
    step: int | None = None,
    chat: bool = True,
) -> Sample:
    import torch

    from launcher.train.checkpoint.consolidate import ConsolidateError, full_state
    from launcher.train.checkpoint.hf_export import pick_checkpoint, run_config
    from launcher.train.checkpoint.init_from import InitFromError, copy_into
    from launcher.train.checkpoint.safe_load import CheckpointFiles, UnsafeCheckpointError
    from launcher.train.model.transformer import build_model

    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise UserError(f"--max-new-tokens={max_new_tokens}: between 1 and {MAX_NEW_TOKENS}")
    if not prompt:
        raise UserError("the prompt is empty: give the text to continue")
    cfg = run_config(run_dir)
    step_done, checkpoint = pick_checkpoint(run_dir, step)
    try:
        files = CheckpointFiles.verified(checkpoint)
        state = full_state(checkpoint / "engine", cfg.model.num_layers, files)
    except (ConsolidateError, UnsafeCheckpointError, KeyError) as exc:
        raise UserError(f"{checkpoint}: cannot be read: {exc}") from None
    if cfg.finetune.name != "full":
        from launcher.train.finetune import lora_export

        state = lora_export.merged(cfg, state, checkpoint / "engine", files)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(cfg.model, "cpu", seed=cfg.train.seed)
    try:
        copy_into(model, state)
    except InitFromError as exc:
        raise UserError(f"{checkpoint}: does not fit the run's model ({exc})") from None
    model = model.to(device).eval()
    folder = _data_folder(cfg)
    tok = _tokenizer(folder)
    template = chat_template(folder) if chat else None
    ids, stop = prompt_ids(tok, template, prompt)
    vocab, window = cfg.model.vocab_size, cfg.model.seq_length
    if not ids or max(ids) >= vocab:
        raise UserError("the prompt encodes to no tokens, or to ids outside the model's vocabulary")
    new: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            context = torch.tensor([(ids + new)[-window:]], device=device)
            logits = model(context)
            nxt = int(logits[0, -1].float().argmax())
            if nxt in stop:
                break
            new.append(nxt)
    origin = template.origin if template is not None else None
    return Sample(step_done, prompt, tok.decode(new), len(new), origin)
