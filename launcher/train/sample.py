"""`llmtrain sample RUN "prompt"`: a short greedy continuation from a run's newest checkpoint.

For a quick look without leaving the tool: the model as the checkpoint holds it (a finetune run's
adapters merged into the base they were trained on, checked by digest: ``lora_export.merged``),
on the CPU (or the first GPU when there is one) in fp32, the prompt encoded with the run's
tokenizer (the prepared data's, or bytes), then `max_new_tokens` greedy steps (argmax, no
sampling: the same text every time), stopping early at the end-of-document token. The context is
cut to the model's seq_length (the most recent tokens). No KV cache: each step reruns the window,
fine for the bounded lengths allowed here (MAX_NEW_TOKENS).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import UserError

MAX_NEW_TOKENS = 512


@dataclass(frozen=True)
class Sample:
    step: int
    prompt: str
    text: str
    tokens: int

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "prompt": self.prompt, "text": self.text, "tokens": self.tokens}


def _tokenizer(cfg: Any) -> Any:
    from launcher.data.prepare import ByteTokenizer, load_tokenizer

    if cfg.data.path is None:
        return ByteTokenizer()
    try:
        return load_tokenizer(Path(cfg.data.path).expanduser())
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"data.path={cfg.data.path}: tokenizer unreadable ({exc})") from None


def sample(run_dir: Path, prompt: str, max_new_tokens: int = 32, step: int | None = None) -> Sample:
    import torch

    from launcher.train.consolidate import ConsolidateError, full_state
    from launcher.train.hf_export import pick_checkpoint, run_config
    from launcher.train.init_from import InitFromError, copy_into
    from launcher.train.model import build_model
    from launcher.train.safe_load import CheckpointFiles, UnsafeCheckpointError

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
        from launcher.train import lora_export

        state = lora_export.merged(cfg, state, checkpoint / "engine", files)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(cfg.model, "cpu", seed=cfg.train.seed)
    try:
        copy_into(model, state)
    except InitFromError as exc:
        raise UserError(f"{checkpoint}: does not fit the run's model ({exc})") from None
    model = model.to(device).eval()
    tok = _tokenizer(cfg)
    ids = [int(i) for i in tok.encode(prompt)]
    vocab, window = cfg.model.vocab_size, cfg.model.seq_length
    if not ids or max(ids) >= vocab:
        raise UserError("the prompt encodes to no tokens, or to ids outside the model's vocabulary")
    new: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            context = torch.tensor([(ids + new)[-window:]], device=device)
            logits = model(context)
            nxt = int(logits[0, -1].float().argmax())
            if tok.eod_id is not None and nxt == tok.eod_id:
                break
            new.append(nxt)
    return Sample(step=step_done, prompt=prompt, text=tok.decode(new), tokens=len(new))
