"""The losses of preference training (finetune.objective=dpo|simpo|orpo), on log-probabilities.

Conventions, stated once (``launcher.train.finetune.masked_loss`` states SFT's):

- A response's log-probability log pi(y|x) is the SUM of its tokens' log-probabilities over the
  response tokens alone (the targets a preference row marks trained, ``launcher.data
  .preference_rows``: never the prompt, the template's markup before the response, nor padding),
  computed in fp32 from the logits. |y| is that token count. TRL 1.16.0's DPOTrainer sums the same
  way (``trl/trainer/dpo_trainer.py`` ``_compute_loss``: per-token log-probs of the completion,
  ``sum(dim=1)``); its completion also holds the template's text after the end-of-turn token
  (ChatML's newline), which llmtrain's responses end before.
- Log-ratios: r_c = log pi(y_c|x) - log pi_ref(y_c|x), r_r likewise for the rejected response;
  the margin m = r_c - r_r.
- dpo, loss_type=sigmoid (Rafailov et al. 2023, arXiv:2305.18290, eq. 7), with label smoothing
  eps (conservative DPO: Mitchell 2023, "A note on DPO with noisy preferences"; TRL 0.x's sigmoid
  loss, TRL 1.16's "robust" family):  -(1 - eps) log sigmoid(beta m) - eps log sigmoid(-beta m).
  eps = 0 is DPO.
- dpo, loss_type=ipo (Azar et al. 2023, arXiv:2310.12036, eq. 17): (h - 1/(2 beta))^2 with
  h = r_c / |y_c| - r_r / |y_r|, the log-ratios averaged over tokens as TRL 1.16 does (its
  comment: the normalised form is what the IPO paper's results used).
- simpo (Meng et al. 2024, arXiv:2405.14734, eq. 6), no reference: h = beta log pi(y_c|x) / |y_c|
  - beta log pi(y_r|x) / |y_r| - gamma; loss -(1 - eps) log sigmoid(h) - eps log sigmoid(-h).
- orpo (Hong et al. 2024, arXiv:2403.07691, eqs. 6-7), no reference: with the mean token
  log-probability a = log pi(y|x) / |y| and odds(y) = exp(a) / (1 - exp(a)),
  loss = -a_c + lambda * -log sigmoid(log odds(y_c) - log odds(y_r)), lambda = finetune.beta; the
  SFT term -a_c is the chosen response's mean token loss.
- Rewards (what the metrics report): dpo beta r_c and beta r_r (TRL's rewards/chosen, rejected);
  simpo and orpo beta a_c and beta a_r. Accuracy: the share of pairs whose chosen reward is
  above the rejected one's (strictly: 0 at step 1 of dpo, where the policy is the reference);
  margin: the mean of the chosen minus the rejected reward.
- The loss of a step is the mean over the pairs of the global batch. Every micro-batch holds the
  same number of pairs, so each returns the mean over its own pairs and the engines' averaging
  over micro-batches and data-parallel ranks gives the global mean (the divisor of a
  micro-batch is its pair count, stated in ``pair_mean``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from launcher.train.finetune.masked_loss import IGNORE_INDEX

OBJECTIVES = ("dpo", "simpo", "orpo")
NEEDS_REFERENCE = ("dpo",)


@dataclass(frozen=True)
class Settings:
    """The finetune.* keys the losses read."""

    objective: str
    beta: float = 0.1
    loss_type: str = "sigmoid"
    label_smoothing: float = 0.0
    simpo_gamma: float = 0.5


@dataclass(frozen=True)
class PairLosses:
    """Per pair (each [n]): the loss, the chosen and rejected rewards."""

    loss: torch.Tensor
    chosen_reward: torch.Tensor
    rejected_reward: torch.Tensor


def token_logps(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) of each position [b, s] in fp32, 0 where the target is IGNORE_INDEX."""
    flat = F.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    )
    local = getattr(flat, "to_local", None)  # a DTensor under torch's loss_parallel (tp)
    return -(local() if callable(local) else flat).view(targets.shape)


def sequence_logps(
    per_token: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the trained tokens' log-probs [b], their count [b]) of each sequence."""
    keep = targets != IGNORE_INDEX
    return (per_token * keep).sum(-1), keep.sum(-1).to(per_token.dtype)


def _smoothed_sigmoid(x: torch.Tensor, eps: float) -> torch.Tensor:
    loss = -F.logsigmoid(x)
    return loss if eps == 0 else (1 - eps) * loss + eps * -F.logsigmoid(-x)


def pair_losses(
    s: Settings,
    chosen: torch.Tensor,
    rejected: torch.Tensor,
    counts: tuple[torch.Tensor, torch.Tensor],
    reference: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> PairLosses:
    """The loss and rewards of each pair from the policy's summed log-probs `chosen` and
    `rejected` [n], their response token counts, and (dpo) the reference's summed log-probs."""
    n_c, n_r = (c.clamp(min=1) for c in counts)
    if s.objective == "dpo":
        if reference is None:
            raise ValueError("dpo needs the reference's log-probabilities")
        r_c, r_r = chosen - reference[0], rejected - reference[1]
        if s.loss_type == "ipo":
            loss = (r_c / n_c - r_r / n_r - 1 / (2 * s.beta)) ** 2
        else:
            loss = _smoothed_sigmoid(s.beta * (r_c - r_r), s.label_smoothing)
        return PairLosses(loss, s.beta * r_c.detach(), s.beta * r_r.detach())
    a_c, a_r = chosen / n_c, rejected / n_r
    if s.objective == "simpo":
        loss = _smoothed_sigmoid(s.beta * (a_c - a_r) - s.simpo_gamma, s.label_smoothing)
    elif s.objective == "orpo":
        log_odds = (a_c - torch.log1p(-torch.exp(a_c))) - (a_r - torch.log1p(-torch.exp(a_r)))
        loss = -a_c + s.beta * -F.logsigmoid(log_odds)
    else:
        raise ValueError(f"finetune.objective={s.objective}: not a preference objective")
    return PairLosses(loss, s.beta * a_c.detach(), s.beta * a_r.detach())


def pair_mean(losses: PairLosses) -> torch.Tensor:
    """A micro-batch's loss: the mean over its pairs (module docstring: the divisor)."""
    return losses.loss.mean()


def reward_sums(losses: PairLosses) -> torch.Tensor:
    """[pairs, chosen reward, rejected reward, correct, loss] summed over the pairs, to add
    over micro-batches and ranks before ``reward_metrics``."""
    c, r = losses.chosen_reward.float(), losses.rejected_reward.float()
    n = torch.tensor(float(c.numel()), device=c.device)
    right = (c > r).float().sum()
    return torch.stack([n, c.sum(), r.sum(), right, losses.loss.detach().float().sum()])


def reward_metrics(sums: torch.Tensor) -> dict[str, float]:
    """rewards/chosen, rewards/rejected (means), rewards/accuracy, rewards/margin."""
    n, c, r, right, _ = (float(x) for x in sums)
    n = max(n, 1.0)
    return {
        "rewards/chosen": c / n,
        "rewards/rejected": r / n,
        "rewards/accuracy": right / n,
        "rewards/margin": (c - r) / n,
    }
