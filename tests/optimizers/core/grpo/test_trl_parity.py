"""Parity with TRL's GRPO: the loss, its gradient and the clip / KL metrics on identical random inputs.

TRL's loss lives in the method ``GRPOTrainer._compute_loss``; it is called unbound on a lightweight stand-in that
carries only the attributes the method reads, with the log-prob computation stubbed to return our tensor.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from rolecall.optimizers.core.grpo import group_advantages, grpo_loss, selective_log_softmax

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
trl_utils = pytest.importorskip("trl.trainer.utils")

B, T_PROMPT, T = 6, 3, 7


def fake_trainer(per_token_logps: torch.Tensor, *, loss_type: str, beta: float, epsilon_high: float) -> SimpleNamespace:
    def logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        return per_token_logps, torch.zeros_like(per_token_logps), None

    accelerator = SimpleNamespace(
        gather=lambda x: x, gather_for_metrics=lambda x: x, reduce=lambda x, reduction="sum": x,
        num_processes=1, sync_gradients=True,
    )  # fmt: skip
    return SimpleNamespace(
        _get_per_token_logps_and_entropies=logps_and_entropies,
        accelerator=accelerator,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        model=SimpleNamespace(training=True),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        loss_type=loss_type,
        epsilon_low=0.2,
        epsilon_high=epsilon_high,
        beta=beta,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=1,
        max_completion_length=T,
    )


def random_inputs(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logps = -torch.rand(B, T, generator=generator) * 4
    lengths = torch.randint(1, T + 1, (B,), generator=generator)
    return {
        "logps": logps,
        "old": logps + 0.4 * torch.randn(B, T, generator=generator),  # ratios well outside [0.8, 1.28]
        "ref": logps + 0.4 * torch.randn(B, T, generator=generator),
        "advantages": torch.randn(B, generator=generator),
        "mask": (torch.arange(T)[None, :] < lengths[:, None]).long(),  # right-padded completions
    }


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("epsilon_high", [0.2, 0.28])
def test_loss_and_gradient_match_trl(loss_type, beta, epsilon_high):
    x = random_inputs(seed=0)

    ours_logps = x["logps"].clone().requires_grad_()
    loss, metrics = grpo_loss(
        ours_logps, x["old"], x["advantages"], x["mask"], ref_per_token_logps=x["ref"], beta=beta,
        epsilon_high=epsilon_high, loss_type=loss_type, max_completion_length=T,
    )  # fmt: skip
    loss.backward()

    trl_logps = x["logps"].clone().requires_grad_()
    trainer = fake_trainer(trl_logps, loss_type=loss_type, beta=beta, epsilon_high=epsilon_high)
    inputs = {
        "prompt_ids": torch.ones(B, T_PROMPT, dtype=torch.long),
        "prompt_mask": torch.ones(B, T_PROMPT, dtype=torch.long),
        "completion_ids": torch.ones(B, T, dtype=torch.long),
        "completion_mask": x["mask"],
        "advantages": x["advantages"],
        "old_per_token_logps": x["old"],
        "ref_per_token_logps": x["ref"],
        "num_items_in_batch": x["mask"].sum().float(),
    }
    trl_loss = trl_grpo.GRPOTrainer._compute_loss(trainer, None, inputs)
    trl_loss.backward()

    torch.testing.assert_close(loss, trl_loss)
    torch.testing.assert_close(ours_logps.grad, trl_logps.grad)
    trl_metrics = trainer._metrics["train"]
    assert metrics["clip/low_frac"] == pytest.approx(trl_metrics["clip_ratio/low_mean"][0], abs=1e-6)
    assert metrics["clip/high_frac"] == pytest.approx(trl_metrics["clip_ratio/high_mean"][0], abs=1e-6)
    assert metrics["clip/frac"] == pytest.approx(trl_metrics["clip_ratio/region_mean"][0], abs=1e-6)
    assert metrics["clip/frac"] > 0  # the inputs do exercise the clip
    if beta:
        assert metrics["kl/mean"] == pytest.approx(trl_metrics["kl"][0], rel=1e-5)


@pytest.mark.parametrize("scale", ["none", "std"])
def test_group_advantages_match_trl_formula(scale):
    """TRL: A = r - mean_group(r), divided by (nanstd_group(r) + 1e-4) unless scale_rewards == 'none'."""
    torch.manual_seed(0)
    G = 8
    rewards = torch.rand(5 * G)
    grouped = rewards.view(-1, G)
    expected = rewards - grouped.mean(dim=1).repeat_interleave(G)
    if scale == "std":
        expected = expected / (trl_utils.nanstd(grouped, dim=1).repeat_interleave(G) + 1e-4)
    torch.testing.assert_close(group_advantages(grouped, scale=scale).flatten(), expected)


def test_selective_log_softmax_matches_trl():
    torch.manual_seed(0)
    logits = torch.randn(4, 9, 50)
    index = torch.randint(0, 50, (4, 9))
    torch.testing.assert_close(selective_log_softmax(logits, index), trl_utils.selective_log_softmax(logits, index))
