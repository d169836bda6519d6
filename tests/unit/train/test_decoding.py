"""How `llmtrain sample` picks tokens (launcher/train/decoding.py): greedy by default, seeded
sampling with temperature / top-k / top-p, and the multi-turn prompt options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from launcher.errors import UserError
from launcher.train.decoding import Decoding, next_token, read_messages, turns

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 3.0])


def _draws(decoding: Decoding, n: int = 400) -> list[int]:
    generator = torch.Generator().manual_seed(decoding.seed)
    return [next_token(LOGITS, decoding, generator) for _ in range(n)]


def test_greedy_is_the_default_and_the_argmax() -> None:
    assert set(_draws(Decoding(), 5)) == {5}


def test_a_seed_gives_the_same_draws_and_another_seed_others() -> None:
    sampled = Decoding(temperature=1.0, seed=7)
    assert _draws(sampled) == _draws(sampled)
    assert _draws(sampled) != _draws(Decoding(temperature=1.0, seed=8))
    assert len(set(_draws(sampled))) == 6  # every token can come at temperature 1


def test_top_k_and_top_p_keep_only_the_likeliest() -> None:
    assert set(_draws(Decoding(temperature=1.0, top_k=2))) == {0, 5}
    probs = torch.softmax(LOGITS, dim=-1)  # 5: 0.61, 0: 0.22, 1: 0.08, ...
    # top_p 0.5: token 5 alone reaches it; 0.7: 5 then 0 (0.61 < 0.7, 0.83 >= 0.7).
    assert float(probs[5]) > 0.5
    assert set(_draws(Decoding(temperature=1.0, top_p=0.5))) == {5}
    assert set(_draws(Decoding(temperature=1.0, top_p=0.7))) == {0, 5}
    # A low temperature sharpens: almost always the argmax.
    assert _draws(Decoding(temperature=0.05)).count(5) == 400


@pytest.mark.parametrize(
    ("decoding", "says"),
    [
        (Decoding(temperature=-1.0), "--temperature"),
        (Decoding(top_k=-1, temperature=1.0), "--top-k"),
        (Decoding(top_p=0.0, temperature=1.0), "--top-p"),
        (Decoding(top_k=5), "--temperature 0.7"),
        (Decoding(dtype="fp8"), "--dtype"),
    ],
)
def test_bad_options_are_user_errors(decoding: Decoding, says: str) -> None:
    with pytest.raises(UserError, match=says):
        decoding.check()


def test_multi_turn_messages(tmp_path: Path) -> None:
    assert turns(["a", "c"], ["b"]) == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    with pytest.raises(UserError, match="one more --user"):
        turns(["a"], ["b"])
    path = tmp_path / "chat.json"
    path.write_text(json.dumps({"messages": [{"role": "system", "content": "s"},
                                             {"role": "user", "content": "u"}]}))  # fmt: skip
    assert [m["role"] for m in read_messages(str(path))] == ["system", "user"]
    path.write_text(json.dumps([{"role": "user", "content": "u"},
                                {"role": "assistant", "content": "a"}]))  # fmt: skip
    with pytest.raises(UserError, match="last message is the assistant's"):
        read_messages(str(path))
