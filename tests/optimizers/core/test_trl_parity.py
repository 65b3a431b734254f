"""Parity with TRL 1.16: SFTTrainer's completion-only loss and DPOTrainer's sigmoid loss on identical inputs.

TRL's losses live in trainer methods. They are called unbound on a stand-in carrying only the attributes the method
reads. For SFT the model is a real tiny Llama with TRL's own fused LM head (``add_fused_lm_head``), so the check covers
our per-token log-probs too; for DPO the model is stubbed to return fixed per-token log-probs, as the GRPO parity test
does.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from rolecall.optimizers.core import dpo_loss, nll_loss, per_token_logps
from rolecall.optimizers.core.grpo import build_completion_batch

trl_sft = pytest.importorskip("trl.trainer.sft_trainer")
trl_dpo = pytest.importorskip("trl.trainer.dpo_trainer")
trl_utils = pytest.importorskip("trl.trainer.utils")


def accelerator() -> SimpleNamespace:
    return SimpleNamespace(
        gather=lambda x: x, gather_for_metrics=lambda x: x, parallelism_config=None, num_processes=1, device="cpu"
    )


def test_nll_matches_sft_trainer_completion_only_loss(tiny_model):
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    completions = [[20, 21, 22, 23], [24, 25], [26, 27, 28]]
    loss_masks = [[1, 0, 1, 1], [1, 1], [1, 1, 0]]  # a "passage" token inside two completions
    batch = build_completion_batch(None, prompts, completions, pad_id=0, loss_masks=loss_masks)
    ids, attention, mask = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]

    ours_model = copy.deepcopy(tiny_model).train()
    loss, metrics = nll_loss(per_token_logps(ours_model, ids, attention, mask), mask)
    loss.backward()

    trl_model = copy.deepcopy(tiny_model).train()
    trl_utils.add_fused_lm_head(trl_model, outputs=("log_probs", "entropy", "is_top1"))
    labels = ids.masked_fill(mask == 0, -100)  # what SFTTrainer's collator builds with completion_only_loss
    stand_in = SimpleNamespace(
        model=trl_model, aux_loss_enabled=False, accelerator=accelerator(), compute_loss_func=None,
        label_smoother=None, args=SimpleNamespace(loss_type="nll", average_tokens_across_devices=False),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)}, _total_train_tokens=0, _tp_size=1,
    )  # fmt: skip
    inputs = {"input_ids": ids, "attention_mask": attention, "labels": labels}
    trl_loss = trl_sft.SFTTrainer.compute_loss(stand_in, trl_model, inputs)
    trl_loss.backward()

    torch.testing.assert_close(loss, trl_loss)
    assert metrics["tokens/count"] == float((labels[:, 1:] != -100).sum())
    ours_grads = dict(ours_model.named_parameters())
    for name, p in trl_model.named_parameters():
        torch.testing.assert_close(ours_grads[name].grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def fake_dpo_trainer(per_token_logps: torch.Tensor, beta: float) -> SimpleNamespace:
    def model(**kwargs):
        zeros = torch.zeros_like(per_token_logps)
        return SimpleNamespace(log_probs=per_token_logps, entropy=zeros, mean_logits=zeros,
                               is_top1=torch.zeros(per_token_logps.shape, dtype=torch.bool))  # fmt: skip

    return SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=accelerator(), aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=["sigmoid"], loss_weights=[1.0],
        beta=beta, use_weighting=False, _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _total_train_tokens=0, _tp_size=1, label_smoothing=0.0, _model=model,
    )  # fmt: skip


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_matches_dpo_trainer_sigmoid_loss(beta):
    generator = torch.Generator().manual_seed(0)
    B, T = 4, 6
    completion_mask = (torch.rand(2 * B, T + 1, generator=generator) > 0.3).long()
    completion_mask[:, 0] = 0
    per_token = (-torch.rand(2 * B, T, generator=generator) * 3) * completion_mask[:, 1:]  # 0 off the mask, as TRL's
    sums = per_token.sum(-1)  # references near the policy, so that some pairs win and some lose
    ref_chosen = sums[:B] + torch.randn(B, generator=generator)
    ref_rejected = sums[B:] + torch.randn(B, generator=generator)

    ours_logps = per_token.clone().requires_grad_()
    summed = ours_logps.sum(-1)
    loss, metrics = dpo_loss(summed[:B], summed[B:], ref_chosen, ref_rejected, beta=beta)
    loss.backward()

    trl_logps = per_token.clone().requires_grad_()
    trainer = fake_dpo_trainer(trl_logps, beta)
    inputs = {
        "input_ids": torch.ones(2 * B, T + 1, dtype=torch.long),
        "attention_mask": torch.ones(2 * B, T + 1, dtype=torch.long),
        "completion_mask": completion_mask,
        "ref_chosen_logps": ref_chosen,
        "ref_rejected_logps": ref_rejected,
    }
    trl_loss = trl_dpo.DPOTrainer._compute_loss(trainer, trainer._model, inputs, return_outputs=False)
    trl_loss.backward()

    torch.testing.assert_close(loss, trl_loss)
    torch.testing.assert_close(ours_logps.grad, trl_logps.grad)
    trl_metrics = trainer._metrics["train"]
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
        assert metrics[key] == pytest.approx(trl_metrics[key][0], abs=1e-6), key
    assert 0 < metrics["rewards/accuracies"] < 1  # the inputs exercise both outcomes
