"""AdapterTrainer on the tiny random Llama: NLL lowers the loss and moves only its adapter; gradient accumulation
matches one big batch; DPO starts at log 2 against the adapter-disabled reference; GRPO and OPD steps run."""

from __future__ import annotations

import copy
import dataclasses
import math
import threading

import pytest
import torch

from rolecall.errors import ConfigError
from rolecall.lm import LocalLM
from rolecall.optimizers.core import AdapterTrainer, TrainerConfig, TrainingSample


@pytest.fixture
def lm(tiny_model, smollm_tokenizer):
    return LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=4)


def make_samples(lm: LocalLM, adapter: str = "plan", **extra) -> list[TrainingSample]:
    tok = lm.tokenizer
    out = []
    for i, (question, answer) in enumerate([("2+2?", "four"), ("Capital of France?", "Paris"),
                                             ("Color of sky?", "blue"), ("Opposite of hot?", "cold")]):  # fmt: skip
        prompt = lm.backend.encode_messages([{"role": "user", "content": question}])
        completion = tok(f"[[ ## answer ## ]]\n{answer}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        fields = {k: (v(i, completion) if callable(v) else v) for k, v in extra.items()}
        out.append(TrainingSample(role="qa", adapter=adapter, prompt_ids=prompt, completion_ids=completion, **fields))
    return out


def snapshot(lm: LocalLM) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in lm.hf_model.named_parameters()}


def test_nll_steps_lower_the_loss_and_change_only_their_adapter(lm):
    lm.for_role("other")
    trainer = AdapterTrainer(lm.for_role("plan"), "plan", TrainerConfig(learning_rate=1e-2, micro_batch_size=2))
    samples = make_samples(lm)
    before = snapshot(lm)
    losses = [trainer.step(samples)["loss/nll"] for _ in range(4)]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    changed = {n for n, p in lm.hf_model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".plan." in n and "lora_" in n for n in changed), changed  # base and "other" stay equal
    metrics = trainer.step(samples)
    assert metrics["train/optimizer_steps"] == 1.0 and metrics["train/samples"] == 4.0
    assert metrics["tokens/loss"] == sum(s.num_loss_tokens for s in samples)
    assert metrics["grad/norm"] > 0 and metrics["lr"] == 1e-2
    assert trainer.steps == 5 and lm.backend.adapter_versions["plan"] == 5


def test_gradient_accumulation_equals_one_batch_and_clipping_applies(lm, smollm_tokenizer):
    lm.for_role("plan")  # LoRA A starts random: copy the model after the adapter exists
    lm2 = LocalLM(copy.deepcopy(lm.hf_model), tokenizer=smollm_tokenizer)
    samples = make_samples(lm, loss_mask=lambda i, c: [1] * (len(c) - 2) + [0, 1])  # uneven masks
    one = AdapterTrainer(
        lm, "plan", TrainerConfig(learning_rate=0.01, micro_batch_size=4, gradient_accumulation_steps=1)
    )
    acc = AdapterTrainer(
        lm2, "plan", TrainerConfig(learning_rate=0.01, micro_batch_size=1, gradient_accumulation_steps=4)
    )
    m1, m2 = one.step(samples), acc.step(samples)
    assert m1["loss/nll"] == pytest.approx(m2["loss/nll"], rel=1e-5)
    assert m1["grad/norm"] == pytest.approx(m2["grad/norm"], rel=1e-4)
    for p, q in zip(one.params, acc.params, strict=True):  # Adam's g / sqrt(v) magnifies float noise of tiny g
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-4)
    # two optimizer steps when the samples outnumber one step; a tiny max_grad_norm clips
    config = TrainerConfig(micro_batch_size=1, gradient_accumulation_steps=2, max_grad_norm=1e-6)
    clipped = AdapterTrainer(lm, "plan", config)
    metrics = clipped.step(samples)
    assert metrics["train/optimizer_steps"] == 2.0 and metrics["grad/clipped"] == 1.0


def test_dpo_step_uses_the_adapter_disabled_reference(lm):
    tok = lm.tokenizer
    rejected = tok("[[ ## answer ## ]]\nbanana", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    samples = make_samples(lm, rejected_ids=rejected)
    trainer = AdapterTrainer(lm, "plan", TrainerConfig(loss="dpo", beta=0.1, learning_rate=1e-2, micro_batch_size=2))
    first = trainer.step(samples)
    # a fresh adapter is the identity: policy == reference, so every reward is 0 and the loss is log 2
    assert first["loss/dpo"] == pytest.approx(math.log(2), abs=1e-5)
    assert first["rewards/margins"] == pytest.approx(0.0, abs=1e-5)
    later = [trainer.step(samples) for _ in range(3)][-1]
    assert later["rewards/margins"] > 0 and later["loss/dpo"] < math.log(2)
    # recorded reference log-probs are used as given: all-zero references shift the rewards
    recorded = make_samples(lm, rejected_ids=rejected, ref_logps=lambda i, c: [0.0] * len(c),
                            rejected_ref_logps=[0.0] * len(rejected))  # fmt: skip
    assert trainer.step(recorded)["rewards/chosen"] < 0  # beta * (log pi - 0) < 0


def test_length_normalized_dpo_compares_per_token_means(lm):
    """With a zero reference, r = beta * log pi(y): summed over the completion by default, its per-token mean with
    ``dpo_length_normalize``; both adapters are fresh, so the two first steps see the same policy."""
    tok = lm.tokenizer
    rejected = tok("[[ ## answer ## ]]\nbanana split", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    sample = make_samples(lm, rejected_ids=rejected, ref_logps=lambda i, c: [0.0] * len(c),
                          rejected_ref_logps=[0.0] * len(rejected))[0]  # fmt: skip
    one = {"loss": "dpo", "beta": 0.1, "micro_batch_size": 1, "gradient_accumulation_steps": 1}
    summed = AdapterTrainer(lm, "plan", TrainerConfig(**one)).step([sample])
    other = dataclasses.replace(sample, adapter="plan_mean")
    mean = AdapterTrainer(lm, "plan_mean", TrainerConfig(**one, dpo_length_normalize=True)).step([other])
    assert summed["rewards/chosen"] == pytest.approx(mean["rewards/chosen"] * len(sample.completion_ids), rel=1e-4)
    assert summed["rewards/rejected"] == pytest.approx(mean["rewards/rejected"] * len(rejected), rel=1e-4)
    margin = mean["rewards/chosen"] - mean["rewards/rejected"]
    assert mean["loss/dpo"] == pytest.approx(math.log1p(math.exp(-margin)), rel=1e-4)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_grpo_step_follows_the_advantage(lm, loss_type):
    samples = make_samples(lm, advantage=lambda i, c: 1.0 if i % 2 == 0 else -1.0)
    config = TrainerConfig(loss="grpo", loss_type=loss_type, kl_beta=0.04, max_completion_length=8,
                           learning_rate=1e-2)  # fmt: skip
    trainer = AdapterTrainer(lm, "plan", config)
    metrics = trainer.step(samples)
    assert math.isfinite(metrics["loss/total"]) and metrics["kl/mean"] == pytest.approx(0.0, abs=1e-6)
    metrics = trainer.step(samples)
    assert metrics["kl/mean"] > 0  # the adapter moved away from the reference


def test_token_advantage_step_runs_with_recorded_old_logps(lm):
    samples = make_samples(lm, token_advantages=lambda i, c: [0.5] * len(c), old_logps=lambda i, c: [-5.0] * len(c))
    trainer = AdapterTrainer(lm, "plan", TrainerConfig(loss="token_advantage", epsilon=0.2, learning_rate=1e-2))
    metrics = trainer.step(samples)
    assert math.isfinite(metrics["loss/policy"]) and metrics["ratio/mean"] != pytest.approx(1.0)


def test_checks_and_optimizer_state_round_trip(lm):
    trainer = AdapterTrainer(lm, "plan", TrainerConfig(learning_rate=1e-2))
    with pytest.raises(ValueError, match="not 'plan'"):
        trainer.step(make_samples(lm, adapter="other"))
    with pytest.raises(ValueError, match="rejected_ids"):
        AdapterTrainer(lm, "plan", TrainerConfig(loss="dpo")).step(make_samples(lm))
    with pytest.raises(ValueError, match="advantage"):
        AdapterTrainer(lm, "plan", TrainerConfig(loss="grpo")).step(make_samples(lm))
    samples = make_samples(lm)
    trainer.step(samples)
    state = copy.deepcopy(trainer.state_dict())
    weights = [p.detach().clone() for p in trainer.params]
    after_one = [p.detach().clone() for p in (trainer.step(samples) and trainer.params)]
    for p, w in zip(trainer.params, weights, strict=True):
        p.data.copy_(w)
    trainer.load_state_dict(state)
    assert trainer.steps == 1
    trainer.step(samples)
    for p, q in zip(trainer.params, after_one, strict=True):
        torch.testing.assert_close(p, q)  # the same Adam moments give the same second step
    with pytest.raises(ConfigError, match="cannot load"):
        trainer.load_state_dict({**state, "adapter": "other"})
    assert trainer.step([]) == {"train/samples": 0.0, "train/optimizer_steps": 0.0}


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"loss": "ppo"}, "valid losses"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"micro_batch_size": 0}, "micro_batch_size"),
        ({"gradient_accumulation_steps": 1.5}, "gradient_accumulation_steps"),
        ({"max_grad_norm": -1.0}, "max_grad_norm"),
        ({"beta": 0.0}, "beta"),
        ({"kl_beta": -0.1}, "kl_beta"),
        ({"epsilon": 1.0}, "epsilon"),
        ({"epsilon_high": -0.1}, "epsilon_high"),
        ({"weight_decay": -1.0}, "weight_decay"),
        ({"adam_betas": (0.9, 1.0)}, "adam_betas"),
        ({"temperature": 0.0}, "temperature"),
        ({"loss_type": "ppo"}, "loss_type"),
        ({"lr_schedule": "cosine"}, "lr_schedule"),
        ({"loss": "grpo", "loss_type": "dr_grpo"}, "max_completion_length"),
    ],
)
def test_config_validation(fields, message):
    with pytest.raises(ConfigError, match=message):
        TrainerConfig(**fields)


def test_the_order_of_a_steps_samples_does_not_change_its_update(lm, smollm_tokenizer):
    # the trainer groups a step's samples into micro-batches by length; the step must not depend on that grouping
    lm.for_role("plan")
    lm2 = LocalLM(copy.deepcopy(lm.hf_model), tokenizer=smollm_tokenizer)
    samples = make_samples(lm)
    config = TrainerConfig(learning_rate=0.01, micro_batch_size=2, gradient_accumulation_steps=2)
    a, b = AdapterTrainer(lm, "plan", config), AdapterTrainer(lm2, "plan", config)
    ma, mb = a.step(samples), b.step(samples[::-1])
    assert ma["loss/nll"] == pytest.approx(mb["loss/nll"], rel=1e-6)
    for p, q in zip(a.params, b.params, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_steps_run_on_the_generating_thread(lm, monkeypatch):
    """Every forward and backward pass runs on the batcher's thread (one CPU thread pool; see QueueBatcher.call)."""
    threads = []
    original = AdapterTrainer._optimizer_step

    def spy(self, model, samples):
        threads.append(threading.current_thread())
        return original(self, model, samples)

    monkeypatch.setattr(AdapterTrainer, "_optimizer_step", spy)
    config = TrainerConfig(learning_rate=1e-2, micro_batch_size=2, gradient_accumulation_steps=1)
    AdapterTrainer(lm.for_role("plan"), "plan", config).step(make_samples(lm))  # 4 samples: two optimizer steps
    assert threads == [lm.backend.batcher._thread] * 2


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_grpo_accumulation_equals_one_batch(lm, smollm_tokenizer, loss_type):
    """DAPO's token mean divides by the step's tokens once: micro-batches of 1 with accumulation give one batch's
    loss and gradient (an extra chunk/N factor on top of the division would shrink it 4x); per-sequence GRPO too."""
    lm.for_role("plan")
    lm2 = LocalLM(copy.deepcopy(lm.hf_model), tokenizer=smollm_tokenizer)
    samples = make_samples(lm, advantage=lambda i, c: [1.0, -0.5, 2.0, -1.5][i])
    base = dict(loss="grpo", loss_type=loss_type, learning_rate=0.01)
    one = AdapterTrainer(lm, "plan", TrainerConfig(**base, micro_batch_size=4, gradient_accumulation_steps=1))
    acc = AdapterTrainer(lm2, "plan", TrainerConfig(**base, micro_batch_size=1, gradient_accumulation_steps=4))
    m1, m2 = one.step(samples), acc.step(samples)
    assert m1["loss/total"] == pytest.approx(m2["loss/total"], rel=1e-5)
    assert m1["grad/norm"] == pytest.approx(m2["grad/norm"], rel=1e-4)
    # on-policy (no recorded pi_old): the ratio is exactly 1, so the loss is minus the advantage's token mean
    tokens = [len(s.completion_ids) for s in samples]
    advantages = [s.advantage for s in samples]
    if loss_type == "dapo":
        expected = -sum(a * n for a, n in zip(advantages, tokens, strict=True)) / sum(tokens)
    else:
        expected = -sum(advantages) / len(advantages)
    assert m1["loss/total"] == pytest.approx(expected, rel=1e-5)


def test_zero_kl_beta_skips_the_reference_forward(lm, monkeypatch):
    import rolecall.optimizers.core.trainer as trainer_module

    def no_reference(*args, **kwargs):
        raise AssertionError("the reference forward ran with kl_beta=0")

    monkeypatch.setattr(trainer_module, "reference_per_token_logps", no_reference)
    trainer = AdapterTrainer(lm, "plan", TrainerConfig(loss="grpo", kl_beta=0.0, learning_rate=1e-2))
    assert math.isfinite(trainer.step(make_samples(lm, advantage=lambda i, c: float(i) - 1.5))["loss/total"])


def test_a_groups_shared_prompt_is_encoded_once_with_the_same_logps_and_gradients(lm):
    """The G completions of one prompt: encoding the prompt once and repeating its KV cache gives the packed batch's
    log-probs and, through the shared prompt pass, its gradients."""
    from rolecall.optimizers.core.grpo.logprobs import build_completion_batch
    from rolecall.optimizers.core.logprobs import per_token_logps, shared_prefix_per_token_logps

    lm.for_role("plan")
    model = lm.backend.model
    with torch.no_grad():  # a non-identity adapter, so LoRA acts on the prompt's keys and values
        for n, p in model.named_parameters():
            if ".plan." in n and "lora_B" in n:
                p.normal_(0, 0.05)
    model.set_adapter("plan")
    prompt = lm.backend.encode_messages([{"role": "user", "content": "Who directed the film Zopor Orchard?"}])
    completions = [[11, 12, 13], [14, 15], [16, 17, 18, 19, 20]]
    batch = build_completion_batch(lm.tokenizer, [prompt] * 3, completions)
    ids, attention, mask = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
    params = [p for n, p in model.named_parameters() if ".plan." in n and "lora_" in n]
    for p in params:
        p.requires_grad_(True)
    grads = []
    results = []
    for shared in (False, True):
        model.zero_grad(set_to_none=True)
        if shared:
            logps = shared_prefix_per_token_logps(model, ids, attention, mask, len(prompt), temperature=0.7)
        else:
            logps = per_token_logps(model, ids, attention, mask, temperature=0.7)
        (logps * torch.tensor([1.0, -2.0, 0.5])[:, None]).sum().backward()
        results.append(logps.detach())
        grads.append([p.grad.detach().clone() for p in params])
    torch.testing.assert_close(results[0], results[1], rtol=1e-4, atol=1e-5)
    assert bool((results[1] != 0).sum() == mask.sum())
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-6)
    with pytest.raises(ValueError, match="same, unpadded prompt"):
        other = build_completion_batch(lm.tokenizer, [prompt, prompt[:-1] + [5]], [[1, 2], [3]])
        shared_prefix_per_token_logps(model, other["input_ids"], other["attention_mask"], other["completion_mask"],
                                      len(prompt))  # fmt: skip


def test_grpo_step_with_a_shared_prefix_equals_the_packed_step(lm, smollm_tokenizer):
    lm.for_role("plan")
    lm2 = LocalLM(copy.deepcopy(lm.hf_model), tokenizer=smollm_tokenizer)
    prompt = lm.backend.encode_messages([{"role": "user", "content": "Capital of France?"}])
    samples = [TrainingSample(role="qa", adapter="plan", prompt_ids=prompt, completion_ids=c, advantage=a)
               for c, a in (([11, 12, 13], 1.0), ([14, 15], -1.0), ([16, 17, 18, 19], 0.5), ([20], -0.5))]  # fmt: skip
    base = dict(loss="grpo", loss_type="dapo", learning_rate=0.01, micro_batch_size=4, kl_beta=0.04)
    shared = AdapterTrainer(lm, "plan", TrainerConfig(**base))
    packed = AdapterTrainer(lm2, "plan", TrainerConfig(**base, share_prompt_prefix=False))
    for _ in range(2):  # the second step has a moved adapter (non-zero KL, LoRA acting on the prompt)
        m1, m2 = shared.step(samples), packed.step(samples)
        assert m1["loss/total"] == pytest.approx(m2["loss/total"], rel=1e-4, abs=1e-6)
        assert m1["grad/norm"] == pytest.approx(m2["grad/norm"], rel=1e-3)
    for p, q in zip(shared.params, packed.params, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)


def test_a_group_larger_than_the_micro_batch_is_encoded_in_one_micro_batch(lm, smollm_tokenizer, monkeypatch):
    """MAPGRPO's groups (G = 4 plus the expert) exceed its micro-batch of 2: each group still gets one shared-prefix
    forward, the lone prompt goes through the packed one, and the update equals the packed step's."""
    import rolecall.optimizers.core.trainer as trainer_module

    rows: list[int] = []
    original = trainer_module.shared_prefix_per_token_logps

    def spy(model, ids, *args, **kwargs):
        rows.append(int(ids.shape[0]))
        return original(model, ids, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "shared_prefix_per_token_logps", spy)
    lm.for_role("plan")
    lm2 = LocalLM(copy.deepcopy(lm.hf_model), tokenizer=smollm_tokenizer)
    group = lm.backend.encode_messages([{"role": "user", "content": "Capital of France?"}])
    alone = lm.backend.encode_messages([{"role": "user", "content": "Color of the sky?"}])
    samples = [TrainingSample(role="qa", adapter="plan", prompt_ids=p, completion_ids=c, advantage=a)
               for p, c, a in ((group, [11, 12, 13], 1.0), (alone, [21, 22], 0.3), (group, [14, 15], -1.0),
                               (group, [16, 17, 18, 19], 0.5), (group, [20], -0.5))]  # fmt: skip
    base = dict(loss="grpo", loss_type="dapo", learning_rate=0.01, micro_batch_size=2,
                gradient_accumulation_steps=3)  # fmt: skip
    shared = AdapterTrainer(lm, "plan", TrainerConfig(**base))
    packed = AdapterTrainer(lm2, "plan", TrainerConfig(**base, share_prompt_prefix=False))
    m1, m2 = shared.step(samples), packed.step(samples)
    assert rows == [4]  # the group of four in one forward; the lone prompt packed
    assert m1["loss/total"] == pytest.approx(m2["loss/total"], rel=1e-4, abs=1e-6)
    assert m1["grad/norm"] == pytest.approx(m2["grad/norm"], rel=1e-3)
    for p, q in zip(shared.params, packed.params, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4)
