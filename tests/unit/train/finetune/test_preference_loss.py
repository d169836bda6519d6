"""The preference losses (train/finetune/preference_loss.py) against values derived by hand."""

from __future__ import annotations

import math

import pytest
import torch

from launcher.train.finetune.masked_loss import IGNORE_INDEX
from launcher.train.finetune.preference_loss import (
    Settings,
    pair_losses,
    reward_metrics,
    reward_sums,
    sequence_logps,
    token_logps,
)


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def dpo(**settings: float | str) -> Settings:
    return Settings("dpo", **settings)  # type: ignore[arg-type]


def test_sequence_log_prob_sums_the_response_tokens_only() -> None:
    # Two tokens of vocabulary 2, logits [0, ln 3]: p = [1/4, 3/4]. Targets 1 then 0, the first
    # ignored (a prompt token): only log(1/4) counts.
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    targets = torch.tensor([[IGNORE_INDEX, 0]])
    total, count = sequence_logps(token_logps(logits, targets), targets)
    assert total.item() == pytest.approx(math.log(0.25))
    assert count.item() == 1


def test_dpo_sigmoid() -> None:
    # r_c = -10 - (-11) = 1, r_r = -12 - (-11) = -1, m = 2, beta m = 0.2:
    # loss = -log sigmoid(0.2) = log(1 + e^-0.2) = log(1.8187307531) = 0.5981388693.
    out = pair_losses(dpo(beta=0.1), t(-10), t(-12), (t(4), t(2)), (t(-11), t(-11)))
    assert out.loss.item() == pytest.approx(0.5981388693, abs=1e-9)
    assert out.chosen_reward.item() == pytest.approx(0.1)  # beta r_c
    assert out.rejected_reward.item() == pytest.approx(-0.1)


def test_dpo_label_smoothing_is_conservative_dpo() -> None:
    # eps = 0.1: 0.9 * log(1 + e^-0.2) + 0.1 * log(1 + e^0.2)
    #          = 0.9 * 0.5981388693 + 0.1 * 0.7981388693 = 0.6181388693.
    s = dpo(beta=0.1, label_smoothing=0.1)
    out = pair_losses(s, t(-10), t(-12), (t(4), t(2)), (t(-11), t(-11)))
    assert out.loss.item() == pytest.approx(0.6181388693, abs=1e-9)


def test_ipo_uses_per_token_log_ratios() -> None:
    # h = r_c / |y_c| - r_r / |y_r| = 1/4 - (-1)/2 = 0.75; 1 / (2 beta) = 5: (0.75 - 5)^2 = 18.0625.
    s = dpo(beta=0.1, loss_type="ipo")
    out = pair_losses(s, t(-10), t(-12), (t(4), t(2)), (t(-11), t(-11)))
    assert out.loss.item() == pytest.approx(18.0625)


def test_simpo_is_length_normalised_with_a_margin() -> None:
    # a_c = -4 / 4 = -1, a_r = -6 / 2 = -3; h = 2 (-1) - 2 (-3) - 0.5 = 3.5:
    # loss = log(1 + e^-3.5) = log(1.0301973834) = 0.0297504183. Rewards beta a: -2 and -6.
    s = Settings("simpo", beta=2.0, simpo_gamma=0.5)
    out = pair_losses(s, t(-4), t(-6), (t(4), t(2)))
    assert out.loss.item() == pytest.approx(0.0297504183, abs=1e-9)
    assert (out.chosen_reward.item(), out.rejected_reward.item()) == pytest.approx((-2.0, -6.0))


def test_orpo_adds_the_odds_ratio_term_to_the_sft_loss() -> None:
    # Chosen: 2 tokens of p = 1/2 (a_c = ln 1/2), odds 1, log odds 0; rejected: 1 token of
    # p = 1/4, odds 1/3, log odds -ln 3. -log sigmoid(ln 3) = log(1 + 1/3) = 0.2876820725.
    # loss = -a_c + 0.1 * 0.2876820725 = 0.6931471806 + 0.0287682072 = 0.7219153878.
    s = Settings("orpo", beta=0.1)
    out = pair_losses(s, t(2 * math.log(0.5)), t(math.log(0.25)), (t(2), t(1)))
    assert out.loss.item() == pytest.approx(0.7219153878, abs=1e-9)


def test_dpo_without_a_reference_refuses() -> None:
    with pytest.raises(ValueError, match="reference"):
        pair_losses(dpo(), t(-1), t(-2), (t(1), t(1)))


def test_reward_metrics_over_pairs() -> None:
    # Pairs with rewards (0.3, 0.1) and (0.0, 0.2): accuracy 1/2, margin (0.2 - 0.2) / 2 = 0.
    out = pair_losses(dpo(beta=0.1), t(3, 0), t(1, 2), (t(1, 1), t(1, 1)), (t(0, 0), t(0, 0)))
    metrics = reward_metrics(reward_sums(out))
    assert metrics["rewards/accuracy"] == 0.5
    assert metrics["rewards/chosen"] == pytest.approx(0.15)
    assert metrics["rewards/rejected"] == pytest.approx(0.15)
    assert metrics["rewards/margin"] == pytest.approx(0.0)


def test_the_policy_at_the_reference_gives_ln2() -> None:
    # Step 1 of DPO: policy = reference, m = 0, loss = -log sigmoid(0) = ln 2, accuracy 0.
    out = pair_losses(dpo(), t(-5, -7), t(-6, -3), (t(2, 2), t(3, 3)), (t(-5, -7), t(-6, -3)))
    assert out.loss.tolist() == pytest.approx([math.log(2)] * 2)
    assert reward_metrics(reward_sums(out))["rewards/accuracy"] == 0.0
