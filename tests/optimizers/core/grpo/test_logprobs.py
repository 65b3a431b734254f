"""Per-token log-probs on a tiny random Llama, reference log-probs through a disabled LoRA, and a GRPO smoke test."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rolecall.errors import ConfigError
from rolecall.optimizers.core.grpo import (
    build_completion_batch,
    group_advantages,
    grpo_loss,
    ref_logprobs,
    sequence_logprobs,
)

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")


def tiny_llama(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


def toy_batch() -> dict[str, torch.Tensor]:
    """Three sequences of different prompt and completion lengths; row 2 has a 'tool output' token masked."""
    prompts = [[1, 5, 9], [1, 7], [1, 3, 4, 6]]
    completions = [[10, 11, 12], [20, 21, 22, 23], [30, 31, 32]]
    loss_masks = [[1, 1, 1], [1, 1, 1, 1], [1, 0, 1]]
    return build_completion_batch(None, prompts, completions, pad_id=0, loss_masks=loss_masks)


def manual_logprobs(model, batch, temperature: float = 1.0) -> torch.Tensor:
    """The naive loop: one unpadded forward pass per scored token."""
    out = torch.zeros(batch["input_ids"].shape)
    for b, t in batch["completion_mask"].nonzero().tolist():
        prefix = batch["input_ids"][b : b + 1, :t]
        with torch.no_grad():
            logits = model(input_ids=prefix).logits[0, -1] / temperature
        out[b, t] = logits.log_softmax(-1)[batch["input_ids"][b, t]]
    return out


def test_build_completion_batch_by_hand():
    tokenizer = SimpleNamespace(pad_token_id=None, eos_token_id=2)
    batch = build_completion_batch(tokenizer, [[5, 6], [7]], [[8], [9, 10, 11]], loss_masks=[[1], [1, 0, 1]])
    assert batch["input_ids"].tolist() == [[5, 6, 8, 2], [7, 9, 10, 11]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert batch["completion_mask"].tolist() == [[0, 0, 1, 0], [0, 1, 0, 1]]


def test_build_completion_batch_rejects_bad_input():
    with pytest.raises(ValueError, match="empty"):
        build_completion_batch(None, [[]], [[1]], pad_id=0)
    with pytest.raises(ValueError, match="loss_masks"):
        build_completion_batch(None, [[1]], [[2, 3]], pad_id=0, loss_masks=[[1]])
    with pytest.raises(ConfigError, match="pad"):
        build_completion_batch(None, [[1]], [[2]])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sequence_logprobs_match_manual_loop(temperature):
    model = tiny_llama()
    batch = toy_batch()
    logps = sequence_logprobs(model, **batch, temperature=temperature)
    torch.testing.assert_close(logps, manual_logprobs(model, batch, temperature), atol=1e-5, rtol=1e-5)
    assert (logps[batch["completion_mask"] == 0] == 0).all()
    assert (logps[batch["completion_mask"] == 1] < 0).all()


def test_sequence_logprobs_carry_gradient():
    model = tiny_llama()
    logps = sequence_logprobs(model, **toy_batch())
    logps.sum().backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0


def test_sequence_logprobs_rejects_position_zero():
    batch = toy_batch()
    batch["completion_mask"][0, 0] = 1
    with pytest.raises(ValueError, match="position 0"):
        sequence_logprobs(tiny_llama(), **batch)


def test_ref_logprobs_need_a_peft_model():
    with pytest.raises(TypeError, match="PEFT"):
        ref_logprobs(tiny_llama(), **toy_batch())


def lora(model: torch.nn.Module) -> torch.nn.Module:
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    return peft.get_peft_model(model, config)


def test_grpo_smoke_lora_trains_and_reference_stays_base():
    """Four GRPO updates (mu = 4 on one rollout batch) of a LoRA on the tiny Llama with AdamW (lr 1e-2).

    The LoRA weights change, every loss is finite, the adapted policy moves away from the base model, and
    ref_logprobs with the adapter disabled still equal the base model's log-probs.
    """
    base = tiny_llama()
    batch = toy_batch()
    with torch.no_grad():
        base_logps = sequence_logprobs(base, **batch)
    model = lora(base)  # wraps `base` in place
    model.train()
    lora_params = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert lora_params and all("lora_" in n for n in lora_params)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)

    rewards = torch.tensor([[1.0, 0.0, 0.5]])  # one group of G = 3
    advantages = group_advantages(rewards, scale="std").flatten()  # (B,)
    with torch.no_grad():
        old_logps = sequence_logprobs(model, **batch)
    ref = ref_logprobs(model, **batch)
    for _ in range(4):
        logps = sequence_logprobs(model, **batch)
        loss, metrics = grpo_loss(
            logps, old_logps, advantages, batch["completion_mask"], ref_per_token_logps=ref, beta=0.04,
            loss_type="dr_grpo", max_completion_length=4,
        )  # fmt: skip
        assert math.isfinite(loss.item()) and all(math.isfinite(v) for v in metrics.values())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    for name, param in model.named_parameters():
        if name in lora_params and "lora_B" in name:
            assert not torch.equal(param, lora_params[name]), f"Parameter {name} has not changed."
    torch.testing.assert_close(ref_logprobs(model, **batch), base_logps)
    with torch.no_grad():
        trained = sequence_logprobs(model, **batch)
    assert not torch.allclose(trained, base_logps)  # the adapter is active again after the context
    # the update moves probability toward the best completion (row 0, the highest reward)
    assert (trained[0] - base_logps[0]).sum() > 0


def test_ref_logprobs_with_named_adapter_restores_state():
    model = lora(tiny_llama())
    model.add_adapter("teacher", peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    model.set_adapter("default")
    before = {n: p.requires_grad for n, p in model.named_parameters()}
    batch = toy_batch()
    teacher = ref_logprobs(model, **batch, adapter="teacher")
    assert model.active_adapter == "default"
    assert {n: p.requires_grad for n, p in model.named_parameters()} == before
    with torch.no_grad():
        policy = sequence_logprobs(model, **batch)
    assert not torch.allclose(teacher, policy)  # the teacher adapter (random B) scored the tokens
    with pytest.raises(ConfigError, match="teacher"):
        ref_logprobs(model, **batch, adapter="missing")
