"""RoleTrainer: a GRPO step changes only its own adapter and moves probability toward positive advantages."""

from __future__ import annotations

import torch

from rolecall.lm import LocalLM
from rolecall.optimizers.grpo import GRPOConfig
from rolecall.optimizers.grpo.update import PolicySample, RoleTrainer

MSG = [{"role": "user", "content": "Say something."}]


def _logp(lm, prompt, completion):
    model = lm.hf_model
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(completion)[:, None]).sum().item()


def test_step_updates_only_its_adapter_and_follows_advantage(tiny_model, smollm_tokenizer, tmp_path):
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=6)
    plan, other = lm.for_role("plan"), lm.for_role("other")
    trainer = RoleTrainer(plan, GRPOConfig(learning_rate=5e-2, beta=0.04, group_size=2, max_completion_length=6))
    comps = plan.sample(MSG, n=2, temperature=1.0, seed=0, logprobs=True)
    prompt = lm.backend.encode_messages(MSG)
    good, bad = comps[0].token_ids, comps[1].token_ids
    before = {n: p.detach().clone() for n, p in lm.hf_model.named_parameters()}
    model = lm.hf_model
    model.set_adapter("plan")
    good_before = _logp(lm, prompt, good)
    samples = [
        PolicySample(prompt, good, advantage=1.0, old_logps=comps[0].logprobs),
        PolicySample(prompt, bad, advantage=-1.0, old_logps=comps[1].logprobs),
    ]
    for _ in range(3):
        metrics = trainer.step(samples)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    changed = {n for n, p in lm.hf_model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".plan." in n for n in changed), changed  # only the plan adapter moved
    model.set_adapter("plan")
    assert _logp(lm, prompt, good) > good_before  # probability moved toward the positive-advantage completion
    assert lm.backend.adapter_versions["plan"] == 3
    # checkpoint round trip restores weights and optimizer state
    trainer.save(tmp_path / "ckpt")
    snapshot = {n: p.detach().clone() for n, p in lm.hf_model.named_parameters() if ".plan." in n}
    trainer.step(samples)
    trainer.load(tmp_path / "ckpt")
    for n, p in lm.hf_model.named_parameters():
        if ".plan." in n:
            torch.testing.assert_close(p, snapshot[n])
    assert trainer.steps == 3
    assert other.adapter == "other"
