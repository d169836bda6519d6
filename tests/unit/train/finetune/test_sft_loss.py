"""The masked loss and document masking on the real model (launcher/train/model/transformer.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from launcher.config.schema import ModelConfig  # noqa: E402
from launcher.train.finetune.masked_loss import IGNORE_INDEX, loss_divisor, masked_loss, unpack  # noqa: E402
from launcher.train.model.chunked_loss import chunked_cross_entropy  # noqa: E402
from launcher.train.model.transformer import build_model  # noqa: E402

pytestmark = pytest.mark.unit


def _model(position: str = "rope") -> torch.nn.Module:
    cfg = ModelConfig(
        num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4,
        vocab_size=64, seq_length=24, position=position,
    )  # fmt: skip
    return build_model(cfg, seed=0)


def _rows(first: list[int], second: list[int], width: int = 25) -> torch.Tensor:
    """One packed chat row: two examples, the second half of each trained, padding after."""
    rows = torch.zeros(1, 3, width, dtype=torch.int64)
    at = 0
    for number, example in enumerate((first, second), start=1):
        n = len(example)
        rows[0, 0, at : at + n] = torch.tensor(example)
        rows[0, 1, at + n // 2 : at + n] = 1
        rows[0, 2, at : at + n] = number
        at += n
    rows[0, 2, at:] = 3
    return rows


def test_prompt_targets_carry_no_gradient() -> None:
    model = _model()
    rows = _rows(list(range(1, 11)), list(range(20, 30)))
    inputs, targets, segments = unpack(rows)
    masked = targets == IGNORE_INDEX
    assert masked.any() and (~masked).any()

    def grads(t: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad()
        loss = masked_loss(model(inputs, segments=segments), t, 5.0)
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    before = grads(targets)
    # A label the mask hides changes nothing: the loss never reads it.
    changed = targets.clone()
    changed[masked] = 7
    changed_grads = grads(torch.where(masked, IGNORE_INDEX, changed))
    assert all(torch.equal(a, b) for a, b in zip(before, changed_grads, strict=True))
    # Unmasking one prompt target does change the gradient (the test can fail).
    leaked = targets.clone()
    leaked[0, 2] = 5
    assert any(not torch.equal(a, b) for a, b in zip(before, grads(leaked), strict=True))


@pytest.mark.parametrize("position", ["rope", "learned"])
def test_packed_example_is_blind_to_its_neighbour(position: str) -> None:
    model = _model(position).eval()
    first = list(range(1, 13))
    a = _rows(first, list(range(30, 40)))
    b = _rows(first, list(range(40, 50)))
    with torch.no_grad():
        out_a = model(unpack(a)[0], segments=unpack(a)[2])
        out_b = model(unpack(b)[0], segments=unpack(b)[2])
        # The second example, packed after the first, equals that example alone at position 0.
        alone = model(torch.tensor([list(range(30, 40))]))
    n = len(first)
    assert torch.allclose(out_a[0, :n], out_b[0, :n], atol=1e-6)
    assert torch.allclose(out_a[0, n : n + 9], alone[0, :9], atol=1e-5)
    # Without the document mask the neighbour leaks in (so the check above can fail).
    with torch.no_grad():
        leaky = model(unpack(a)[0])
    assert not torch.allclose(leaky[0, n : n + 9], alone[0, :9], atol=1e-5)


def test_chunked_masked_loss_matches_plain() -> None:
    torch.manual_seed(0)
    h = torch.randn(3, 7, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    t = torch.randint(0, 50, (3, 7))
    t[:, :3] = IGNORE_INDEX
    divisor = loss_divisor(12, 1, 1)
    chunked = chunked_cross_entropy(h, w, t, 5, divisor=divisor)
    chunked.backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    plain = masked_loss(h @ w.t(), t, divisor)
    plain.backward()
    assert torch.allclose(chunked, plain, atol=1e-5)
    assert torch.allclose(gh, h.grad, atol=1e-5) and torch.allclose(gw, w.grad, atol=1e-5)


def test_global_token_mean_over_micro_batches() -> None:
    """Two micro-batches with 1 and 3 trained tokens: each token weighs the same (not the mean
    of the two micro-batch means)."""
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 10)
    t = torch.randint(0, 10, (2, 4))
    t[0, 1:] = IGNORE_INDEX
    t[1, 0] = IGNORE_INDEX
    divisor = loss_divisor(4, dp=1, accum=2)
    mean_of_steps = sum(masked_loss(logits[i : i + 1], t[i : i + 1], divisor) for i in range(2)) / 2
    everything = torch.nn.functional.cross_entropy(logits.flatten(0, 1), t.flatten())
    assert torch.allclose(mean_of_steps, everything, atol=1e-6)
