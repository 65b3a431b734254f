"""The clipped GRPO loss, the k3 KL and the three aggregations, on hand-worked tensors."""

from __future__ import annotations

import math

import pytest
import torch

from rolecall.errors import ConfigError
from rolecall.optimizers.core.grpo import grpo_loss, per_token_kl_k3, selective_log_softmax

LOSS_TYPES = ("grpo", "dr_grpo", "dapo")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_selective_log_softmax_matches_naive(dtype):
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=dtype)
    index = torch.randint(0, 11, (3, 5))
    naive = torch.gather(logits.log_softmax(-1), dim=-1, index=index.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(selective_log_softmax(logits, index), naive)


def test_k3_by_hand():
    """delta = ref - logp. delta = -1: e^-1 + 1 - 1 = 0.36788. delta = 0: 1 - 0 - 1 = 0. delta = 1: e - 2 = 0.71828."""
    logp = torch.tensor([[0.0, -0.5, -1.0]])
    ref = torch.tensor([[-1.0, -0.5, 0.0]])
    expected = torch.tensor([[math.exp(-1), 0.0, math.e - 2]])
    torch.testing.assert_close(per_token_kl_k3(logp, ref), expected)
    torch.manual_seed(0)
    assert (per_token_kl_k3(torch.randn(4, 6), torch.randn(4, 6)) >= 0).all()


def test_ratio_clipping_by_hand():
    """One sequence of four tokens, old log-probs 0, token advantages A = [1, 1, -1, -1], eps 0.2.

    token 0: ratio 1.5, A > 0: -min(1.5, clip 1.2) = -1.2, clipped high, zero gradient.
    token 1: ratio 0.5, A > 0: -min(0.5, 0.8) = -0.5, unclipped, d/dlogp = -ratio * A = -0.5.
    token 2: ratio 0.5, A < 0: -min(-0.5, -0.8) = 0.8, clipped low, zero gradient.
    token 3: ratio 1.5, A < 0: -min(-1.5, -1.2) = 1.5, unclipped, d/dlogp = -ratio * A = 1.5.
    grpo mean over 4 tokens: (-1.2 - 0.5 + 0.8 + 1.5) / 4 = 0.15; gradients / 4 = [0, -0.125, 0, 0.375].
    """
    logps = torch.log(torch.tensor([[1.5, 0.5, 0.5, 1.5]])).requires_grad_()
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, metrics = grpo_loss(logps, torch.zeros(1, 4), advantages, torch.ones(1, 4))
    torch.testing.assert_close(loss, torch.tensor(0.15))
    loss.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, -0.125, 0.0, 0.375]]))
    assert metrics["clip/high_frac"] == pytest.approx(0.25)
    assert metrics["clip/low_frac"] == pytest.approx(0.25)
    assert metrics["clip/frac"] == pytest.approx(0.5)
    assert metrics["ratio/mean"] == pytest.approx(1.0)
    assert metrics["ratio/max"] == pytest.approx(1.5)


def test_sequence_advantage_clip_example():
    """A = 2 > 0 and ratio 1.5: clipped to 1.2, so the loss is -1.2 * 2 = -2.4."""
    logps = torch.log(torch.tensor([[1.5]]))
    loss, _ = grpo_loss(logps, torch.zeros(1, 1), torch.tensor([2.0]), torch.ones(1, 1))
    torch.testing.assert_close(loss, torch.tensor(-2.4))


def test_decoupled_clip_high():
    """epsilon_high 0.28 (DAPO): ratio 1.5 with A = 1 is clipped to 1.28 instead of 1.2."""
    logps = torch.log(torch.tensor([[1.5]]))
    loss, _ = grpo_loss(logps, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), epsilon_high=0.28)
    torch.testing.assert_close(loss, torch.tensor(-1.28))


def test_aggregations_by_hand_2x3():
    """ratio 1 everywhere (logp = old), A = [1, -2], mask [[1, 1, 0], [1, 1, 1]].

    Per-token losses -A: row 0 [-1, -1, masked], row 1 [2, 2, 2]; masked sum -2 + 6 = 4, 5 tokens.
    grpo:    mean(-2/2, 6/3) = mean(-1, 2) = 0.5
    dr_grpo: 4 / (B * max_completion_length) = 4 / (2 * 3) = 0.66667
    dapo:    4 / 5 = 0.8
    """
    logps = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    advantages = torch.tensor([1.0, -2.0])
    expected = {"grpo": 0.5, "dr_grpo": 4 / 6, "dapo": 0.8}
    for loss_type, value in expected.items():
        loss, metrics = grpo_loss(logps, logps, advantages, mask, loss_type=loss_type, max_completion_length=3)
        torch.testing.assert_close(loss, torch.tensor(value))
        assert metrics["loss/policy"] == pytest.approx(value)
    loss, _ = grpo_loss(logps, logps, advantages, mask, loss_type="dapo", num_tokens=8)
    torch.testing.assert_close(loss, torch.tensor(0.5))  # 4 / 8 across accumulated micro-batches


def test_kl_term_by_hand():
    """logp 0, ref -1 on 2 tokens: k3 = e^-1 + 1 - 1 = 0.36788 each. A = 0 so the policy term is 0.

    loss = beta * mean k3 = 0.1 * 0.36788 = 0.036788.
    """
    logps = torch.zeros(1, 2, requires_grad=True)
    loss, metrics = grpo_loss(
        logps, logps.detach(), torch.zeros(1), torch.ones(1, 2), ref_per_token_logps=torch.full((1, 2), -1.0), beta=0.1
    )
    torch.testing.assert_close(loss, torch.tensor(0.1 * math.exp(-1)))
    assert metrics["kl/mean"] == pytest.approx(math.exp(-1), rel=1e-5)
    assert metrics["loss/kl"] == pytest.approx(0.1 * math.exp(-1), rel=1e-5)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_masked_tokens_change_nothing_and_get_no_gradient(loss_type):
    torch.manual_seed(0)
    B, T = 3, 6
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 0, 1, 0, 1, 1], [0, 1, 1, 1, 1, 1]])
    logps = -torch.rand(B, T) * 3
    old = logps + 0.3 * torch.randn(B, T)
    ref = logps + 0.3 * torch.randn(B, T)
    advantages = torch.randn(B)
    kwargs = dict(beta=0.05, loss_type=loss_type, max_completion_length=T)

    first = logps.clone().requires_grad_()
    loss, _ = grpo_loss(first, old, advantages, mask, ref_per_token_logps=ref, **kwargs)
    loss.backward()
    assert (first.grad[mask == 0] == 0).all()
    assert (first.grad[mask == 1] != 0).any()

    # garbage (including -inf and NaN) on masked positions: same loss, still zero and finite gradient there
    noisy = logps.clone()
    noisy[mask == 0] = torch.randn(int((mask == 0).sum())) * 50
    noisy[0, 0], noisy[1, 0] = -math.inf, math.nan
    old_noisy, ref_noisy = old.clone(), ref.clone()
    old_noisy[mask == 0] = 7.0
    ref_noisy[mask == 0] = -math.inf
    second = noisy.requires_grad_()
    loss2, metrics = grpo_loss(second, old_noisy, advantages, mask, ref_per_token_logps=ref_noisy, **kwargs)
    loss2.backward()
    torch.testing.assert_close(loss2, loss)
    torch.testing.assert_close(second.grad, first.grad)
    assert all(math.isfinite(v) for v in metrics.values())


def test_no_gradient_when_all_tokens_clipped_and_metrics_keys():
    logps = torch.log(torch.full((2, 2), 2.0)).requires_grad_()
    loss, metrics = grpo_loss(logps, torch.zeros(2, 2), torch.tensor([1.0, 3.0]), torch.ones(2, 2))
    loss.backward()
    assert (logps.grad == 0).all()
    assert metrics["clip/frac"] == 1.0
    expected_keys = {"loss/policy", "loss/kl", "loss/total", "kl/mean", "kl/approx", "clip/low_frac",
                     "clip/high_frac", "clip/frac", "ratio/mean", "ratio/min", "ratio/max", "tokens/count"}  # fmt: skip
    assert set(metrics) == expected_keys


def test_errors_name_value_and_options():
    x = torch.zeros(1, 2)
    with pytest.raises(ConfigError, match=r"\['grpo', 'dr_grpo', 'dapo'\]"):
        grpo_loss(x, x, torch.zeros(1), x, loss_type="ppo")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ref_per_token_logps"):
        grpo_loss(x, x, torch.zeros(1), x, beta=0.1)
    with pytest.raises(ConfigError, match="max_completion_length"):
        grpo_loss(x, x, torch.zeros(1), x, loss_type="dr_grpo")
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(x, x, torch.zeros(3), x)
    with pytest.raises(ValueError, match="completion_mask"):
        grpo_loss(x, x, torch.zeros(1), torch.zeros(1, 3))
