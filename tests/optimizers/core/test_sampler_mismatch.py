"""Sampler/trainer mismatch (issue 53): pi_old is the trainer's own forward, the sampler's log-probs only weigh the
advantages by truncated importance sampling (``tis_cap``), and the step logs the mismatch. On the tiny random Llama."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from rolecall.data.synthetic import synthetic_world
from rolecall.errors import ConfigError
from rolecall.lm import LocalLM
from rolecall.optimizers import MAPGRPO, MAPGRPOConfig
from rolecall.optimizers.core import AdapterTrainer, TrainerConfig, TrainingSample
from rolecall.optimizers.mapgrpo_roles import OperaRoleTasks
from rolecall.programs import OPERA
from rolecall.retrievers.bm25 import BM25

QA = [("2+2?", "four"), ("Capital of France?", "Paris"), ("Color of sky?", "blue"), ("Opposite of hot?", "cold")]
SHIFTS = [0.3, -0.5, 1.2, -1.0]
"""log pi_old - log pi_sampler of each sample's tokens: exp gives 1.35, 0.61, 3.32 (capped at 2) and 0.37."""


@pytest.fixture
def lm(tiny_model, smollm_tokenizer):
    return LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=4)


def make_samples(lm: LocalLM, advantages=(1.0, -0.5, 2.0, -1.5)) -> list[TrainingSample]:
    tok = lm.tokenizer
    out = []
    for (question, answer), advantage in zip(QA, advantages, strict=True):
        prompt = lm.backend.encode_messages([{"role": "user", "content": question}])
        completion = tok(f"[[ ## answer ## ]]\n{answer}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        out.append(TrainingSample(role="qa", adapter="plan", prompt_ids=prompt, completion_ids=completion,
                                  advantage=advantage))  # fmt: skip
    return out


def with_sampler(samples: list[TrainingSample], olds: list[list[float]], shifts=SHIFTS) -> list[TrainingSample]:
    """The samples with sampler log-probs ``old - shift`` (so exp(old - sampler) = exp(shift) on every token)."""
    return [dataclasses.replace(s, sampler_logps=[v - d for v in old])
            for s, old, d in zip(samples, olds, shifts, strict=True)]  # fmt: skip


def twin(lm: LocalLM, smollm_tokenizer) -> LocalLM:
    """A second LocalLM on a copy of the model, adapter included (the same starting weights)."""
    lm.for_role("plan")
    return LocalLM(copy.deepcopy(lm.hf_model), tokenizer=smollm_tokenizer)


def grpo(**kw) -> TrainerConfig:
    base = dict(loss="grpo", loss_type="dapo", learning_rate=1e-2, micro_batch_size=4,
                gradient_accumulation_steps=1)  # fmt: skip
    return TrainerConfig(**{**base, **kw})


@pytest.mark.parametrize("loss", ["grpo", "token_advantage"])
def test_tis_weights_each_tokens_advantage_by_the_truncated_ratio(lm, smollm_tokenizer, loss):
    """On-policy (ratio 1) the token-mean loss is -sum_t A_t w_t / N with w_t = min(exp(old - sampler), cap); the
    gradient equals that of the same step with the weighted advantages given as plain token advantages."""
    lm2 = twin(lm, smollm_tokenizer)
    trainer = AdapterTrainer(lm, "plan", grpo(loss=loss, tis_cap=2.0))
    samples = make_samples(lm)
    if loss == "token_advantage":
        samples = [dataclasses.replace(s, advantage=None, token_advantages=[s.advantage] * len(s.completion_ids))
                   for s in samples]  # fmt: skip
    olds = trainer.policy_logps(samples)
    weighted = with_sampler(samples, olds)
    metrics = trainer.step(weighted)

    weights = [min(math.exp(d), 2.0) for d in SHIFTS]
    tokens = [len(s.completion_ids) for s in samples]
    advantages = [s.per_token_advantages()[0] for s in samples]
    expected = -sum(a * w * n for a, w, n in zip(advantages, weights, tokens, strict=True)) / sum(tokens)
    assert metrics["loss/total"] == pytest.approx(expected, rel=1e-5)
    assert metrics["ratio/mean"] == 1.0 and metrics["clip/frac"] == 0.0

    manual = [dataclasses.replace(s, advantage=None, token_advantages=[a * w] * n)
              for s, a, w, n in zip(samples, advantages, weights, tokens, strict=True)]  # fmt: skip
    reference = AdapterTrainer(lm2, "plan", grpo(loss=loss, tis_cap=None)).step(manual)
    assert metrics["loss/total"] == pytest.approx(reference["loss/total"], rel=1e-5)
    assert metrics["grad/norm"] == pytest.approx(reference["grad/norm"], rel=1e-4)
    untruncated = AdapterTrainer(lm2, "plan", grpo(loss=loss, tis_cap=10.0)).step(with_sampler(samples, olds))
    assert untruncated["loss/total"] != pytest.approx(metrics["loss/total"], rel=1e-3)  # the cap made a difference


def test_tis_cap_none_leaves_the_loss_unchanged_and_still_logs_the_mismatch(lm, smollm_tokenizer):
    lm2 = twin(lm, smollm_tokenizer)
    trainer = AdapterTrainer(lm, "plan", grpo(tis_cap=None))
    samples = make_samples(lm)
    metrics = trainer.step(with_sampler(samples, trainer.policy_logps(samples)))
    plain = AdapterTrainer(lm2, "plan", grpo(tis_cap=None)).step(samples)
    assert metrics["loss/total"] == pytest.approx(plain["loss/total"], rel=1e-6)
    assert metrics["grad/norm"] == pytest.approx(plain["grad/norm"], rel=1e-5)
    assert metrics["mismatch/ratio_max"] == pytest.approx(math.exp(1.2), rel=1e-5)
    assert metrics["mismatch/tis_clipped"] == 0.0  # nothing is capped without a cap
    assert not any(k.startswith("mismatch/") for k in plain) and "tokens/sampler" not in plain


def test_mismatch_metrics_are_zero_when_the_sampler_agrees_with_the_trainer(lm):
    trainer = AdapterTrainer(lm, "plan", grpo())
    samples = make_samples(lm)
    olds = trainer.policy_logps(samples)
    agreed = [dataclasses.replace(s, sampler_logps=old) for s, old in zip(samples, olds, strict=True)]
    metrics = trainer.step(agreed)
    assert metrics["mismatch/abs_logp"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["mismatch/ratio_min"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["mismatch/ratio_max"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["mismatch/tis_clipped"] == 0.0
    assert metrics["tokens/sampler"] == sum(s.num_loss_tokens for s in samples)


def test_mismatch_metrics_merge_over_micro_batches_and_optimizer_steps(lm):
    """Two optimizer steps of two micro-batches of one sample: the extremes are over all four samples (not a mean of
    the micro-batches' extremes), the means are token means within a step and averaged over the steps. (A tiny
    learning rate keeps the second step's pi_old where the sampler's values were computed.)"""
    config = grpo(micro_batch_size=1, gradient_accumulation_steps=2, tis_cap=2.0, learning_rate=1e-9)
    trainer = AdapterTrainer(lm, "plan", config)
    samples = make_samples(lm)
    metrics = trainer.step(with_sampler(samples, trainer.policy_logps(samples)))
    assert metrics["train/optimizer_steps"] == 2.0
    assert metrics["mismatch/ratio_min"] == pytest.approx(math.exp(-1.0), rel=1e-5)
    assert metrics["mismatch/ratio_max"] == pytest.approx(math.exp(1.2), rel=1e-5)
    tokens = [len(s.completion_ids) for s in samples]
    steps = [(0, 1), (2, 3)]  # step() keeps the given order when it cuts optimizer steps

    def step_mean(values: list[float]) -> float:
        return sum(sum(values[i] * tokens[i] for i in step) / sum(tokens[i] for i in step) for step in steps) / 2

    assert metrics["mismatch/abs_logp"] == pytest.approx(step_mean([abs(d) for d in SHIFTS]), rel=1e-5)
    assert metrics["mismatch/tis_clipped"] == pytest.approx(step_mean([float(math.exp(d) > 2) for d in SHIFTS]))
    assert metrics["tokens/sampler"] == sum(tokens)
    assert metrics["ratio/min"] == metrics["ratio/max"] == 1.0  # on-policy: the clip ratio is exactly 1


def test_policy_logps_is_pi_old_so_the_first_of_two_iterations_has_ratio_one(lm):
    """MAPGRPO with num_iterations=2 fills old_logps from the trainer's forward once, before the first pass: its
    ratios are exactly 1 although the sampler's log-probs differ; the second pass clips against that pi_old."""
    trainer = AdapterTrainer(lm, "plan", grpo(kl_beta=0.04, tis_cap=2.0))
    results: list[dict[str, float]] = []
    seen: list[list[TrainingSample]] = []
    real_step = trainer.step
    trainer.step = lambda samples: seen.append(list(samples)) or results.append(real_step(samples)) or results[-1]
    samples = [dataclasses.replace(s, sampler_logps=[-5.0] * len(s.completion_ids)) for s in make_samples(lm)]
    optimizer = MAPGRPO(MAPGRPOConfig(stages=("plan",), num_iterations=2, show_progress=False))
    merged = optimizer.update(None, samples, trainer)
    assert len(results) == 2 and merged["train/optimizer_steps"] == 2.0
    first, second = results
    assert first["ratio/mean"] == first["ratio/min"] == first["ratio/max"] == 1.0
    assert first["clip/frac"] == 0.0 and first["mismatch/abs_logp"] > 1.0  # the sampler's -5.0 is far off
    assert second["ratio/max"] > 1.0 or second["ratio/min"] < 1.0  # the adapter moved: the ratio left 1
    assert all(s.old_logps is not None and s.sampler_logps == [-5.0] * len(s.completion_ids) for s in seen[0])
    assert seen[0] == seen[1]  # both passes see the same pi_old


def test_local_lm_sampler_logprobs_agree_with_the_trainers_forward_at_the_sampling_temperature(lm):
    """LocalLM reports log_softmax(logits / T) of the sampled token: at T = 0.7 it matches the trainer's forward with
    temperature 0.7, so the mismatch is float noise and no token is capped."""
    prompt = [{"role": "user", "content": "Capital of France?"}]
    view = lm.for_role("plan")
    completions = view.sample(prompt, n=3, temperature=0.7, max_tokens=6, seed=4, logprobs=True)
    prompt_ids = lm.backend.encode_messages(prompt)
    samples = [TrainingSample(role="qa", adapter="plan", prompt_ids=prompt_ids, completion_ids=c.token_ids,
                              advantage=float(i) - 1.0, sampler_logps=c.logprobs)
               for i, c in enumerate(completions)]  # fmt: skip
    trainer = AdapterTrainer(lm, "plan", grpo(temperature=0.7))
    for s, old in zip(samples, trainer.policy_logps(samples), strict=True):
        torch.testing.assert_close(torch.tensor(s.sampler_logps), torch.tensor(old), atol=1e-4, rtol=0)
    metrics = trainer.step(samples)
    assert metrics["mismatch/abs_logp"] < 1e-4 and metrics["mismatch/tis_clipped"] == 0.0


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=3, n_train=20, n_dev=4, n_test=4)


def test_mapgrpo_records_sampler_logps_and_reports_the_mismatch(
    world, tiny_model, smollm_tokenizer, tmp_path, monkeypatch
):
    """A MAPGRPO step at temperature 0.7 with two iterations: every policy sample carries the sampler's log-probs
    (not as pi_old), the first pass's ratio is exactly 1, and the logged mismatch is float noise."""
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    program = OPERA(BM25(world.corpus), lm=lm, max_steps=1, max_rewrites=0)
    monkeypatch.setattr(
        OperaRoleTasks, "score", lambda self, role, item, outs: [(float(i), {}) for i in range(len(outs))]
    )
    calls: list[tuple[list[TrainingSample], dict[str, float]]] = []
    real_step = AdapterTrainer.step

    def spy(self, samples):
        calls.append((list(samples), real_step(self, samples)))
        return calls[-1][1]

    monkeypatch.setattr(AdapterTrainer, "step", spy)
    config = MAPGRPOConfig(stages=("plan",), steps={"plan": 1}, group_size=3, inputs_per_step=2, collect_questions=2,
                           max_completion_length=8, num_iterations=2, temperature=0.7, show_progress=False,
                           output_dir=tmp_path / "run")  # fmt: skip
    optimizer = MAPGRPO(config)
    program.compile(optimizer=optimizer, trainset=world.train)
    assert len(calls) == 2
    (samples, first), (_, second) = calls
    policy = [s for s in samples if s.advantage is not None]
    assert policy and all(len(s.sampler_logps) == len(s.completion_ids) == len(s.old_logps) for s in policy)
    assert first["ratio/mean"] == first["ratio/min"] == first["ratio/max"] == 1.0 and first["clip/frac"] == 0.0
    assert first["mismatch/abs_logp"] < 1e-4 and first["mismatch/tis_clipped"] == 0.0
    record = optimizer.history[0]
    assert record["mismatch/abs_logp"] < 1e-4
    assert record["tokens/sampler"] == sum(len(s.completion_ids) for s in policy)
    assert second["train/optimizer_steps"] == 1.0


@pytest.mark.parametrize("cap", [0.0, -1.0, math.inf, math.nan])
def test_tis_cap_and_sampler_logps_are_validated(cap):
    with pytest.raises(ConfigError, match=r"tis_cap must be a finite number > 0 .* or None"):
        TrainerConfig(loss="grpo", tis_cap=cap)
    with pytest.raises(ConfigError, match="tis_cap"):
        MAPGRPOConfig(tis_cap=cap)
    with pytest.raises(ValueError, match="sampler_logps has 1 values for 2 completion tokens"):
        TrainingSample(role="qa", adapter="plan", prompt_ids=[1], completion_ids=[2, 3], sampler_logps=[-1.0])
