"""Group advantages (OPERA Eq. 2, MultiAgent-OPD Eq. 1 and 5), checked on hand-worked tensors."""

from __future__ import annotations

import math

import pytest
import torch

from rolecall.errors import ConfigError
from rolecall.optimizers.core.grpo import (
    gradient_mask,
    group_advantages,
    role_normalized_advantages,
    teacher_token_advantages,
)


def test_mean_centred_advantages_match_opera_eq2():
    """rewards [[1, 0, 0, 1]]: mean 0.5, so A = r - 0.5 = [0.5, -0.5, -0.5, 0.5].

    Second group [[3, 1, 2, 2]]: mean 2, so A = [1, -1, 0, 0].
    """
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]])
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0]])
    torch.testing.assert_close(group_advantages(rewards), expected)


def test_std_advantages_match_opd_eq1():
    """rewards [[1, 0, 0, 1]]: mu 0.5; sample variance (4 * 0.25) / (4 - 1) = 1/3, sigma = 0.57735.

    A = (r - 0.5) / (0.57735 + 1e-4) = +-0.86588.
    """
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    expected = torch.tensor([[a, -a, -a, a]])
    torch.testing.assert_close(group_advantages(rewards, scale="std"), expected)


def test_constant_group_has_zero_advantage_without_nan():
    """rewards [[2, 2, 2]]: mean 2, sigma 0, so A = 0 / (0 + eps) = 0 for both scales."""
    rewards = torch.full((1, 3), 2.0)
    for scale in ("none", "std"):
        torch.testing.assert_close(group_advantages(rewards, scale=scale), torch.zeros(1, 3))


def test_expert_enters_baseline_by_default_mapgrpo_eq11():
    """rewards [[0, 0, 0, 1]] where member 3 is c_best.

    Default: baseline mean (0 + 0 + 0 + 1) / 4 = 0.25, A = [-0.25, -0.25, -0.25, 0.75].
    baseline_mask excluding c_best: mean 0, A = [0, 0, 0, 1].
    """
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    torch.testing.assert_close(group_advantages(rewards), torch.tensor([[-0.25, -0.25, -0.25, 0.75]]))
    only_policy = torch.tensor([[True, True, True, False]])
    torch.testing.assert_close(group_advantages(rewards, baseline_mask=only_policy), torch.tensor([[0.0, 0, 0, 1]]))


def test_std_scale_takes_the_whole_groups_spread_when_the_baseline_leaves_c_best_out():
    """rewards [[0, 0, 1]], c_best last and outside the baseline: mean 0, sigma of all three sqrt(1/3) = 0.57735,
    so A = [0, 0, 1.7320]; the baseline members' own sigma (0) would give c_best 1 / 1e-4."""
    only_policy = torch.tensor([[True, True, False]])
    adv = group_advantages(torch.tensor([[0.0, 0.0, 1.0]]), scale="std", baseline_mask=only_policy)
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.0, 1.0 / (3**-0.5 + 1e-4)]]))


def test_gradient_mask_excludes_expert():
    is_expert = torch.tensor([[False, False, False, True], [False, False, False, False]])
    expected = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    torch.testing.assert_close(gradient_mask(is_expert), expected)


def test_advantages_are_detached():
    rewards = torch.tensor([[1.0, 0.0]], requires_grad=True)
    assert not group_advantages(rewards).requires_grad


def test_group_advantages_rejects_bad_input():
    with pytest.raises(ConfigError, match=r"\['none', 'std'\]"):
        group_advantages(torch.zeros(1, 2), scale="zscore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shape"):
        group_advantages(torch.zeros(4))
    with pytest.raises(ValueError, match="no member"):
        group_advantages(torch.zeros(1, 2), baseline_mask=torch.zeros(1, 2, dtype=torch.bool))


def test_role_normalized_with_tuple_keys():
    """Leader rewards of question q: [1, 0] (mean 0.5, sample sigma sqrt(0.5) = 0.70711);
    Answerer rewards of question q: [3, 5, 4] (mean 4, sample sigma 1). Interleaved in one flat tensor.

    Leader: +-0.5 / (0.70711 + 1e-4); Answerer: [-1, 1, 0] / (1 + 1e-4).
    """
    rewards = torch.tensor([1.0, 3.0, 0.0, 5.0, 4.0])
    keys = [("q", "leader"), ("q", "answerer"), ("q", "leader"), ("q", "answerer"), ("q", "answerer")]
    lead = 0.5 / (math.sqrt(0.5) + 1e-4)
    ans = 1.0 / (1.0 + 1e-4)
    expected = torch.tensor([lead, -ans, -lead, ans, 0.0])
    torch.testing.assert_close(role_normalized_advantages(rewards, keys), expected)


def test_role_normalized_integer_ids_match_group_advantages():
    torch.manual_seed(0)
    rewards = torch.rand(3, 5)
    ids = torch.arange(3).repeat_interleave(5) * 7  # sparse ids are fine
    for scale in ("none", "std"):
        flat = role_normalized_advantages(rewards.flatten(), ids, scale=scale)
        torch.testing.assert_close(flat.view(3, 5), group_advantages(rewards, scale=scale))


def test_role_normalized_singleton_group_is_zero():
    out = role_normalized_advantages(torch.tensor([3.0, 1.0, 2.0]), torch.tensor([0, 1, 1]))
    assert out[0].item() == 0.0
    assert torch.isfinite(out).all()


def test_role_normalized_rejects_length_mismatch():
    with pytest.raises(ValueError, match="keys"):
        role_normalized_advantages(torch.zeros(3), ["a", "b"])


def test_teacher_token_advantages_match_opd_eq5():
    """beta 0.01, M = [1, 1, 0]: log pi_T - log pi_old = [-1 - (-2), -3 - (-1), anything] = [1, -2, .].

    A_t = 0.01 * [1, -2, 0] = [0.01, -0.02, 0]; the masked token's -inf teacher score stays 0, not NaN.
    """
    teacher = torch.tensor([[-1.0, -3.0, -math.inf]])
    old = torch.tensor([[-2.0, -1.0, -0.5]])
    mask = torch.tensor([[1, 1, 0]])
    torch.testing.assert_close(teacher_token_advantages(teacher, old, mask), torch.tensor([[0.01, -0.02, 0.0]]))
