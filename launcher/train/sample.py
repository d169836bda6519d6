"""`llmtrain sample RUN "prompt"`: a short continuation from a run's newest checkpoint.

For a quick look without leaving the tool: the model as the checkpoint holds it (a finetune run's
adapters merged into the base they were trained on, checked by digest: ``gather.merged``), on the
CPU (or the first GPU when there is one) in fp32, built on meta and filled tensor by tensor
(``launcher.train.checkpoint.gather``: beside the model, the host holds one tensor at a time; on
the CPU the model itself is whole, as decoding needs it, and the note says so), the prompt encoded
with the run's tokenizer (the prepared data's, or bytes), then `max_new_tokens` greedy steps
(argmax, no sampling: the same text every time), stopping early at the end-of-document token. When
the run's data carries a chat template (fine-tuning data: its tokenizer_config.json), the prompt is
one user message rendered with that template and its generation prompt, as the model was trained to
see it, and the template's end-of-turn token (its eos_token) also stops the reply; `chat=False`
continues the raw text instead; `messages` (a multi-turn conversation, ``launcher.train.decoding``)
are rendered the same way. `decoding`: greedy by default, or sampled (temperature, top-k, top-p, a
seed) in fp32 or bf16 (``launcher.train.decoding``). The context is cut to the model's seq_length
(the most recent tokens). A KV cache (``launcher.train.kv_cache``, the same logits as the full
forward) runs each new token once while the context fits seq_length; past it, or for a model the
cache does not cover, each step reruns the newest window.
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
    loaded: str = ""  # how the weights were read (launcher.train.checkpoint.gather)

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "prompt": self.prompt,
            "text": self.text,
            "tokens": self.tokens,
            "chat_template": self.template,
            "loaded": self.loaded,
        }


def _data_folder(cfg: Any) -> Path | None:
    """The prepared data the run trained on (its tokenizer and template), or None for bytes."""
    if cfg.data.path is not None:
        return Path(cfg.data.path).expanduser()
    if cfg.data.builtin == "chat":
        from launcher.data.chat.builtin_chat import builtin_chat_dir

        return builtin_chat_dir(cache_root())
    if cfg.data.builtin == "preference":
        from launcher.data.chat.builtin_preference import builtin_preference_dir

        return builtin_preference_dir(cache_root())
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
    """The data's chat template (templating.chat_template), or None when it has none."""
    from launcher.data.templating.chat_template import ChatTemplate

    config = folder / "tokenizer_config.json" if folder is not None else None
    if config is None or not config.is_file():
        return None
    try:
        return ChatTemplate.from_tokenizer_config(config)
    except UserError:  # no chat_template in it: plain continuation
        return None


def prompt_ids(
    tok: Any, template: Any, prompt: str, messages: list[dict[str, str]] | None = None
) -> tuple[list[int], set[int]]:
    """The prompt's ids and the ids that end the reply (end of document; the template's eos)."""
    stop = {tok.eod_id} if tok.eod_id is not None else set()
    if template is None:
        if messages is not None:
            raise UserError(
                "--messages / --user / --assistant: a conversation needs the run data's chat "
                "template (this run's data has none, or --raw was given); give one PROMPT"
            )
        return [int(i) for i in tok.encode(prompt)], stop
    from launcher.data.templating.chat_template import TemplateRenderError

    try:
        messages = messages or [{"role": "user", "content": prompt}]
        text = template.render(messages, add_generation_prompt=True)
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
    messages: list[dict[str, str]] | None = None,
    decoding: Any = None,
) -> Sample:
    import torch

    from launcher.train.checkpoint.hf_export import pick_checkpoint, run_config
    from launcher.train.decoding import Decoding, next_token

    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise UserError(f"--max-new-tokens={max_new_tokens}: between 1 and {MAX_NEW_TOKENS}")
    decoding = decoding or Decoding()
    decoding.check()
    if messages:
        prompt = messages[-1]["content"]
    if not prompt:
        raise UserError("the prompt is empty: give the text to continue")
    try:  # bytes that are not UTF-8 reach Python's argv as lone surrogates
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UserError(
            f"the prompt is not UTF-8 text (character {exc.start + 1} stands for a byte that is "
            "not UTF-8); give the prompt as UTF-8 text"
        ) from None
    cfg = run_config(run_dir)
    step_done, checkpoint = pick_checkpoint(run_dir, step)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if decoding.dtype == "bf16" else torch.float32
    model, loaded = _load(cfg, checkpoint, device, dtype)
    folder = _data_folder(cfg)
    tok = _tokenizer(folder)
    template = chat_template(folder) if chat else None
    ids, stop = prompt_ids(tok, template, prompt, messages or None)
    vocab, window = cfg.model.vocab_size, cfg.model.seq_length
    if not ids or max(ids) >= vocab:
        raise UserError("the prompt encodes to no tokens, or to ids outside the model's vocabulary")
    new: list[int] = []
    generator = torch.Generator(device=device).manual_seed(decoding.seed)
    from launcher.train.kv_cache import KVCache, supports

    cache = KVCache(model) if supports(model) and len(ids) < window else None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            if cache is not None and len(ids) + len(new) <= window:
                fresh = (ids + new)[cache.length :]  # the prompt first, then one token a step
                logits = cache.forward(torch.tensor([fresh], device=device))
            else:  # past seq_length: the newest window, as the model was trained
                context = torch.tensor([(ids + new)[-window:]], device=device)
                logits = model(context)
            nxt = next_token(logits[0, -1], decoding, generator)
            if nxt in stop:
                break
            new.append(nxt)
    origin = template.origin if template is not None else None
    return Sample(step_done, prompt, tok.decode(new), len(new), origin, loaded)


def _load(cfg: Any, checkpoint: Path, device: Any, dtype: Any) -> tuple[Any, str]:
    """The run's model on `device` in `dtype`, built on meta and filled tensor by tensor from the
    checkpoint (``gather``: the host holds one tensor at a time beside the model; a finetune
    run's adapters merged, its base checked by digest), and the line saying what was held."""
    import torch

    from launcher.train.checkpoint import gather
    from launcher.train.checkpoint.consolidate import ConsolidateError
    from launcher.train.checkpoint.init_from import mismatches
    from launcher.train.checkpoint.safe_load import CheckpointFiles, UnsafeCheckpointError
    from launcher.train.model.transformer import build_model

    model = build_model(cfg.model, "meta").to(dtype=dtype).to_empty(device=device)
    try:
        files = CheckpointFiles.verified(checkpoint)
        tensors = gather.open_checkpoint(checkpoint / "engine", cfg.model.num_layers, files)
        if cfg.finetune.name != "full":
            tensors = gather.merged(
                cfg, tensors, checkpoint / "engine", files, outcome="nothing was generated"
            )
        params = dict(model.named_parameters())
        have = {k: shape for k, (shape, _) in tensors.specs.items()}
        found = mismatches(have, {k: tuple(v.shape) for k, v in params.items()})
        if found:
            raise UserError(f"{checkpoint}: does not fit the run's model ({'; '.join(found[:5])})")
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(tensors.tensor(name))
        tensors.check()
    except (ConsolidateError, UnsafeCheckpointError, KeyError) as exc:
        raise UserError(f"{checkpoint}: cannot be read: {exc}") from None
    where = "the GPU" if device.type == "cuda" else "the CPU"
    held = tensors.how()
    if device.type == "cpu":
        held += f"; the whole model is on the CPU to decode ({gather.mib(tensors.total)} as read)"
    return model.eval(), f"loaded onto {where}: {held}"
