"""The core losses on tiny hand-worked tensors, and the registry."""

from __future__ import annotations

import math

import pytest
import torch

from rolecall.errors import ConfigError
from rolecall.optimizers.core import LOSSES, dpo_loss, get_loss, nll_loss, token_advantage_loss
from rolecall.optimizers.core.grpo import grpo_loss


def test_nll_is_the_mean_over_every_target_token():
    """logps [[-1, -2, -9], [-3, -9, -9]], mask [[1, 1, 0], [1, 0, 0]]: (1 + 2 + 3) / 3 = 2; masked -9s ignored.

    weights [1, 0]: (1 + 2) / 3 = 1. num_tokens=6 (a step of two such micro-batches): 6 / 6 = 1.
    Gradient w.r.t. logps: -w_i * m_it / N, so -1/3 on each masked-in token, 0 elsewhere.
    """
    logps = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, metrics = nll_loss(logps, mask)
    torch.testing.assert_close(loss, torch.tensor(2.0))
    loss.backward()
    torch.testing.assert_close(logps.grad, -mask.float() / 3)
    assert metrics == {"loss/nll": 2.0, "logps/mean": -2.0, "tokens/count": 3.0}
    torch.testing.assert_close(nll_loss(logps, mask, weights=torch.tensor([1.0, 0.0]))[0], torch.tensor(1.0))
    torch.testing.assert_close(nll_loss(logps, mask, num_tokens=6)[0], torch.tensor(1.0))
    torch.testing.assert_close(nll_loss(logps, torch.zeros_like(mask))[0], torch.tensor(0.0))  # no NaN on 0 tokens
    with pytest.raises(ValueError, match="must be"):
        nll_loss(logps, mask[:, :2])


def test_dpo_sigmoid_loss_and_rewards():
    """beta = 0.5. Pair 1: pi(y_w) = -1, pi(y_l) = -3, ref -2 / -2: r_w = 0.5, r_l = -0.5, l = log(1 + e^-1).
    Pair 2: pi -4 / -2, ref -3 / -3: r_w = -0.5, r_l = 0.5, l = log(1 + e^1).
    Loss = mean = (0.31326 + 1.31326) / 2 = 0.81326; rewards/chosen = 0, rejected = 0, margins = 0, accuracy 0.5.
    d l_1 / d pi(y_w) = -beta * sigmoid(-1) / 2 = -0.5 * 0.26894 / 2 = -0.067235.
    """
    t = torch.tensor
    chosen = t([-1.0, -4.0], requires_grad=True)
    loss, metrics = dpo_loss(chosen, t([-3.0, -2.0]), t([-2.0, -3.0]), t([-2.0, -3.0]), beta=0.5)
    expected = (math.log1p(math.exp(-1)) + math.log1p(math.exp(1))) / 2
    torch.testing.assert_close(loss, t(expected))
    loss.backward()
    sigmoid = 1 / (1 + math.exp(1))
    torch.testing.assert_close(chosen.grad, t([-0.5 * sigmoid / 2, -0.5 * (1 - sigmoid) / 2]))
    assert metrics["rewards/chosen"] == pytest.approx(0.0) and metrics["rewards/rejected"] == pytest.approx(0.0)
    assert metrics["rewards/margins"] == pytest.approx(0.0) and metrics["rewards/accuracies"] == 0.5
    assert metrics["logps/chosen"] == pytest.approx(-2.5) and metrics["loss/dpo"] == pytest.approx(expected)
    weighted, _ = dpo_loss(chosen, t([-3.0, -2.0]), t([-2.0, -3.0]), t([-2.0, -3.0]), beta=0.5, weights=t([2.0, 0.0]))
    torch.testing.assert_close(weighted, t(math.log1p(math.exp(-1))))  # (2 * l_1 + 0 * l_2) / 2
    with pytest.raises(ConfigError, match="beta"):
        dpo_loss(chosen, chosen, chosen, chosen, beta=0.0)
    with pytest.raises(ValueError, match="shape"):
        dpo_loss(chosen, t([1.0]), chosen, chosen)


def test_token_advantage_loss_clips_per_token():
    """epsilon 0.2; one row, advantages A = [1, -1, 2], log ratios [0.5, 0, -0.5], mask [1, 1, 0]:
    token 1: ratio e^0.5 = 1.6487 > 1.2 with A > 0: -min(1.6487, 1.2) = -1.2 (clipped, no gradient);
    token 2: ratio 1: -min(-1, -1) = 1; token 3 masked. Loss = (-1.2 + 1) / 2 = -0.1.
    Gradient: token 1 0 (clipped), token 2 -A * ratio / 2 = 0.5, token 3 0.
    """
    old = torch.zeros(1, 3)
    logps = torch.tensor([[0.5, 0.0, -0.5]], requires_grad=True)
    advantages = torch.tensor([[1.0, -1.0, 2.0]])
    loss, metrics = token_advantage_loss(logps, old, advantages, torch.tensor([[1, 1, 0]]), epsilon=0.2)
    torch.testing.assert_close(loss, torch.tensor(-0.1))
    loss.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, 0.5, 0.0]]))
    assert metrics["clip/high_frac"] == 0.5 and metrics["tokens/count"] == 2.0
    # epsilon_high lifts the upper clip: token 1 now -min(1.6487, 1.7) = -1.6487
    loss, _ = token_advantage_loss(logps, old, advantages, torch.tensor([[1, 1, 0]]), epsilon=0.2, epsilon_high=0.7)
    torch.testing.assert_close(loss, torch.tensor((-math.exp(0.5) + 1) / 2))
    with pytest.raises(ValueError, match="token_advantages"):
        token_advantage_loss(logps, old, torch.ones(1), torch.ones(1, 3))


def test_registry():
    assert set(LOSSES) == {"nll", "grpo", "dpo", "token_advantage"}
    assert get_loss("grpo") is grpo_loss  # reused, not duplicated
    with pytest.raises(ConfigError, match=r"'dpo', 'grpo', 'nll', 'token_advantage'"):
        get_loss("ppo")
