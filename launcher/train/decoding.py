"""How `llmtrain sample` picks each next token: greedy (the default, the same text every time), or
sampled with a temperature, top-k and top-p (nucleus, Holtzman et al. 2020, "The Curious Case of
Neural Text Degeneration", arXiv:1904.09751) from a seeded generator, so a seed gives the same
text again. The order is the one transformers' generation applies its logits warpers in
(temperature, then top-k, then top-p: ``GenerationMixin._get_logits_processor``), and top-p keeps
the smallest set of most likely tokens whose probabilities reach p (always at least one).

Also the messages of a multi-turn prompt (``--messages FILE.json``: a JSON list of role/content
messages, the last a user or tool message, or repeated ``--user`` / ``--assistant`` options).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.errors import UserError

DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class Decoding:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0
    seed: int = 0
    dtype: str = "fp32"

    def check(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise UserError(
                f"--temperature={self.temperature}: between 0 (greedy) and 100, e.g. 0.7"
            )
        if self.top_k < 0:
            raise UserError(f"--top-k={self.top_k}: 0 (no limit) or more, e.g. 50")
        if not 0.0 < self.top_p <= 1.0:
            raise UserError(f"--top-p={self.top_p}: in (0, 1], e.g. 0.9")
        if self.dtype not in DTYPES:
            raise UserError(f"--dtype={self.dtype}: one of {', '.join(DTYPES)}")
        if self.temperature == 0.0 and (self.top_k or self.top_p < 1.0):
            raise UserError(
                "--top-k / --top-p: they shape sampling, which --temperature 0 (greedy) does not "
                "do; add --temperature 0.7 (or another value above 0)"
            )


def next_token(logits: Any, decoding: Decoding, generator: Any) -> int:
    """The next token id from one position's logits ([vocab]) under `decoding`."""
    import torch

    logits = logits.float()
    if decoding.temperature == 0.0:
        return int(logits.argmax())
    logits = logits / decoding.temperature
    if decoding.top_k and decoding.top_k < logits.numel():
        kth = torch.topk(logits, decoding.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if decoding.top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        # Drop a token when the ones before it already reach top_p (the first is always kept).
        drop = (cumulative - torch.softmax(ordered, dim=-1)) >= decoding.top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def read_messages(path: str) -> list[dict[str, str]]:
    """`--messages FILE.json`: a JSON list of {"role", "content"} messages (or an object with a
    "messages" list), ending with the turn the model answers (not an assistant message)."""
    from launcher import bounded_read

    try:
        raw = bounded_read.read_json(Path(path).expanduser(), max_bytes=16 << 20)
    except (OSError, ValueError) as exc:
        raise UserError(f"--messages {path}: not a readable JSON file ({exc})") from None
    if isinstance(raw, dict):
        raw = raw.get("messages")
    return check_messages(raw, f"--messages {path}")


def check_messages(raw: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise UserError(f"{where}: expected a non-empty list of role/content messages")
    out = []
    for i, item in enumerate(raw):
        ok = isinstance(item, dict) and isinstance(item.get("content"), str)
        if not ok or item.get("role") not in ("system", "user", "assistant", "tool"):
            raise UserError(
                f"{where}: message {i} must be {{'role': system|user|assistant|tool, "
                "'content': '...'}}"
            )
        out.append({"role": item["role"], "content": item["content"]})
    if out[-1]["role"] == "assistant":
        raise UserError(f"{where}: the last message is the assistant's; end with the user's turn")
    return out


def turns(users: list[str], assistants: list[str]) -> list[dict[str, str]]:
    """Repeated --user / --assistant options as alternating messages (user first, one more user
    than assistant turns)."""
    if len(users) != len(assistants) + 1:
        raise UserError(
            f"--user x{len(users)}, --assistant x{len(assistants)}: give one more --user than "
            "--assistant (they alternate, user first, and the model answers the last user turn)"
        )
    messages: list[dict[str, str]] = []
    for i, text in enumerate(users):
        messages.append({"role": "user", "content": text})
        if i < len(assistants):
            messages.append({"role": "assistant", "content": assistants[i]})
    return messages
