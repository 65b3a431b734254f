"""Search-R1 with plain GRPO: rollout groups, per-rollout advantages, masking, the loop on a tiny random Llama."""

from __future__ import annotations

import json
import math
import zlib

import pytest
import torch
from dspy.utils.dummies import DummyLM

from rolecall.data.synthetic import synthetic_world
from rolecall.errors import ConfigError
from rolecall.lm import LocalLM
from rolecall.optimizers import SearchR1GRPO, SearchR1GRPOConfig
from rolecall.optimizers.core.checkpoint import latest_checkpoint
from rolecall.optimizers.core.stage import Stage, StepContext
from rolecall.optimizers.core.trainer import AdapterTrainer
from rolecall.optimizers.mapgrpo_roles import as_gold_record
from rolecall.optimizers.search_r1_grpo import AgentRollouts, agent_calls, group_samples, rollout_samples
from rolecall.programs import OPERA
from rolecall.programs.baselines import SearchR1Agent
from rolecall.programs.core.calls import COMPLETED_MARKER
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.retrievers.bm25 import BM25


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=0, n_train=4, n_dev=1, n_test=1)


def _program(world, tiny_model, tokenizer):
    """A short search_r1 run: one search turn plus the forced answer, no demos, 8 tokens a call."""
    lm = LocalLM(tiny_model, tokenizer=tokenizer)
    lm_kwargs = {"*": {"stop": [COMPLETED_MARKER]}, "agent": {"max_tokens": 8}}
    return SearchR1Agent(BM25(world.corpus), lm=lm, max_turns=1, demo_policy="never", lm_kwargs=lm_kwargs), lm


def _config(tmp_path, **kw):
    base = dict(group_size=3, questions_per_step=2, steps=2, learning_rate=1e-2, num_threads=6,
                output_dir=tmp_path / "run", show_progress=False)  # fmt: skip
    return SearchR1GRPOConfig(**{**base, **kw})


class VariedReward(SearchR1GRPO):
    """A random model never answers right, so every real group scores alike and is skipped; a reward that varies with
    what each rollout wrote stands in for EM so the update runs. It keeps the step's samples for inspection."""

    def reward(self, trajectory, record):
        text = "".join(s.completion or "" for s in trajectory.role_steps("agent"))
        return {"reward/total": zlib.crc32(text.encode()) % 1000 / 1000}

    def score(self, ctx, generated):
        samples, metrics = super().score(ctx, generated)
        self.last = (generated, samples)
        return samples, metrics


def _agent_weights(lm):
    return {n: p.detach().clone() for n, p in lm.hf_model.named_parameters() if ".agent." in n}


def _turn(action, content, *, valid=True, interaction="(no searches yet)", error=None):
    """One recorded agent call as SearchR1Agent writes it."""
    user = f"[[ ## question ## ]]\nWhere?\n\n[[ ## interaction ## ]]\n{interaction}"
    messages = [{"role": "system", "content": "Answer with <search> or <answer>."}, {"role": "user", "content": user}]
    tag = f"<{action}>{content}</{action}>" if action != "invalid" else content
    meta = {"action": action, "valid_action": valid, action: content}
    completion = f"[[ ## reasoning ## ]]\nThink.\n\n[[ ## action ## ]]\n{tag}"
    return Step(kind="role", role="agent", messages=messages, completion=completion, meta=meta, error=error)


def _rollout(*steps):
    return Trajectory(question="Where?", steps=list(steps))


def test_group_advantages_carry_em_and_the_format_penalty(smollm_tokenizer):
    """Four rollouts of one question, gold "Paris", λ_f = 0.2:

        y_1: search, then <answer>Paris</answer>, all well formed        r = 1 - 0   = 1.0
        y_2: <answer>Paris</answer>, flagged malformed                   r = 1 - 0.2 = 0.8
        y_3: <answer>Rome</answer>, well formed                          r = 0
        y_4: a malformed turn (parse error), then <answer>Rome</answer>  r = 0 - 0.2 = -0.2

    mean = 0.4, std = sqrt((0.6² + 0.4² + 0.4² + 0.6²) / 3) = sqrt(1.04 / 3), A_i = (r_i - 0.4) / (std + 1e-4).
    Every agent call of y_i carries A_i, malformed calls included.
    """
    passages = "<search>Varn</search>\n<information>[1] Varn | Varn is in Paris.</information>"
    y1 = _rollout(_turn("search", "Varn"), _turn("answer", "Paris", interaction=passages))
    y2 = _rollout(_turn("answer", "Paris", valid=False))
    y3 = _rollout(_turn("answer", "Rome"))
    y4 = _rollout(_turn("invalid", "gibberish", valid=False, error="parse error: no fields"), _turn("answer", "Rome"))
    optimizer = SearchR1GRPO(group_size=4, show_progress=False)
    optimizer.view = smollm_tokenizer  # the scoring path needs only the tokenizer
    ctx = StepContext(stage=Stage(name="agent", adapter="agent", steps=1), step=0, global_step=0, position=0, rng=None)
    record = as_gold_record({"question": "Where?", "answers": ["Paris"]})
    samples, metrics = optimizer.score(ctx, AgentRollouts(batch=[record], trajectories=[[y1, y2, y3, y4]]))

    std = math.sqrt(1.04 / 3)
    expected = [0.6 / (std + 1e-4)] * 2 + [0.4 / (std + 1e-4)] + [-0.4 / (std + 1e-4)] + [-0.6 / (std + 1e-4)] * 2
    torch.testing.assert_close(torch.tensor([s.advantage for s in samples]), torch.tensor(expected))
    assert metrics["reward/mean"] == pytest.approx(0.4) and metrics["reward/max"] == 1.0
    assert metrics["reward/answer"] == 0.5 and metrics["reward/format"] == 0.5
    assert metrics["groups/skipped"] == 0.0 and metrics["rollouts/count"] == 4.0
    # each sample is exactly its call: the prompt its messages with the chat template, the completion what it wrote
    calls = [s for y in (y1, y2, y3, y4) for s in y.role_steps("agent")]
    for sample, step in zip(samples, calls, strict=True):
        encoded = smollm_tokenizer.apply_chat_template(step.messages, add_generation_prompt=True, return_dict=True)
        assert sample.prompt_ids == list(encoded["input_ids"])
        text = smollm_tokenizer.decode(sample.completion_ids)
        assert text.startswith(step.completion) and text.endswith(f"{COMPLETED_MARKER}<|im_end|>")
        assert sample.adapter == "agent" and sample.loss_mask == [1] * len(sample.completion_ids)

    # no penalty: y_2 and y_4 then score like y_1 and y_3
    optimizer = SearchR1GRPO(group_size=4, format_penalty=0.0, show_progress=False)
    optimizer.view = smollm_tokenizer
    samples, metrics = optimizer.score(ctx, AgentRollouts(batch=[record], trajectories=[[y1, y2, y3, y4]]))
    assert metrics["reward/mean"] == pytest.approx(0.5)
    assert [round(s.advantage, 3) for s in samples] == [0.866, 0.866, 0.866, -0.866, -0.866, -0.866]


def test_all_equal_groups_are_skipped(smollm_tokenizer):
    same = [_rollout(_turn("answer", "Rome")) for _ in range(3)]
    assert group_samples(same, [0.0, 0.0, 0.0], smollm_tokenizer, adapter="agent") is None
    optimizer = SearchR1GRPO(group_size=3, show_progress=False)
    optimizer.view = smollm_tokenizer
    ctx = StepContext(stage=Stage(name="agent", adapter="agent", steps=1), step=0, global_step=0, position=0, rng=None)
    record = as_gold_record({"question": "Where?", "answers": ["Paris"]})
    samples, metrics = optimizer.score(ctx, AgentRollouts(batch=[record, record], trajectories=[same, same]))
    assert samples == [] and metrics["groups/skipped"] == 2.0 and metrics["groups/total"] == 2.0


def test_advantage_scale_none_keeps_a_shaping_only_difference_small(smollm_tokenizer):
    """Rewards [0.1, 0, 0] differ by a shaping term only: std normalisation makes it unit-size (the same as a
    right-versus-wrong split), ``advantage_scale="none"`` keeps A = r - mean."""
    runs = [_rollout(_turn("answer", "Rome")) for _ in range(3)]
    std = group_samples(runs, [0.1, 0.0, 0.0], smollm_tokenizer, adapter="agent")
    plain = group_samples(runs, [0.1, 0.0, 0.0], smollm_tokenizer, adapter="agent", scale="none")
    assert std[0].advantage == pytest.approx((0.1 - 0.1 / 3) / (math.sqrt(1 / 300) + 1e-4))  # unit-size
    assert [s.advantage for s in plain] == pytest.approx([0.1 - 0.1 / 3, -0.1 / 3, -0.1 / 3])
    assert SearchR1GRPOConfig(advantage_scale="none").advantage_scale == "none"
    with pytest.raises(ConfigError, match="advantage_scale"):
        SearchR1GRPOConfig(advantage_scale="minmax")


def test_retrieved_passages_are_prompt_tokens_never_completion_tokens(world, smollm_tokenizer):
    """Each Search-R1 turn is its own role call: the passages a search returned reach the next call through its
    ``interaction`` input (the prompt), and a completion holds only what the model wrote, so nothing needs masking."""
    example = world.train[0]
    lm = DummyLM([{"reasoning": "Look it up.", "action": f"<search>{example.question}</search>"},
                  {"reasoning": "Found it.", "action": f"<answer>{example.answers[0]}</answer>"}])  # fmt: skip
    trajectory = SearchR1Agent(BM25(world.corpus), lm=lm, demo_policy="never")(question=example.question).trajectory
    retrieved = next(s for s in trajectory.steps if s.kind == "retrieval")
    title = retrieved.outputs["titles"][0]
    search, answer = rollout_samples(trajectory, smollm_tokenizer, adapter="agent", advantage=1.0)
    prompt, completion = smollm_tokenizer.decode(answer.prompt_ids), smollm_tokenizer.decode(answer.completion_ids)
    assert "<information>" in prompt and title in prompt  # the passages: prompt tokens, no loss
    assert "<information>" not in completion and title not in completion
    assert completion.startswith("[[ ## reasoning ## ]]\nFound it.")
    assert all(s.loss_mask == [1] * len(s.completion_ids) and s.advantage == 1.0 for s in (search, answer))
    # were passages spliced into a completion (recorded as masked_spans), those tokens would carry no loss
    step = trajectory.role_steps("agent")[1]
    start = step.completion.index("Found")
    step.meta["masked_spans"] = [(start, start + len("Found it."))]
    masked = rollout_samples(trajectory, smollm_tokenizer, adapter="agent", advantage=1.0)[1]
    assert 0 < masked.num_loss_tokens < len(masked.completion_ids)


def test_a_json_fallback_turn_trains_both_of_its_calls():
    """A turn whose ChatAdapter output failed to parse also made DSPy's JSON fallback call: both are policy calls."""
    step = _turn("invalid", "x", valid=False, error="parse error")
    first = {"messages": [{"role": "user", "content": "chat"}], "completions": ["garbled"]}
    second = {"messages": step.messages, "completions": [step.completion]}
    step.meta["attempts"] = [first, second]
    calls = agent_calls(_rollout(step))
    assert [(c.messages, c.completion) for c in calls] == [(first["messages"], "garbled"),
                                                           (step.messages, step.completion)]  # fmt: skip


def test_compile_trains_the_agent_on_its_own_calls_and_logs(world, tiny_model, smollm_tokenizer, tmp_path):
    program, lm = _program(world, tiny_model, smollm_tokenizer)
    before = _agent_weights(lm)
    assert before
    optimizer = VariedReward(_config(tmp_path, group_size=2))
    assert program.compile(optimizer=optimizer, trainset=world.train) is program
    after = _agent_weights(lm)
    assert any(not torch.equal(after[n], before[n]) for n in after), "the agent adapter did not change"
    assert program.lm_kwargs["agent"] == {"max_tokens": 8}  # the sampling settings were put back
    log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["step"]) for r in log] == [("agent", 1), ("agent", 2)]
    for record in log:
        for key in ("reward/mean", "reward/std", "groups/skipped", "groups/total", "loss/policy", "grad/norm"):
            assert key in record and math.isfinite(record[key]), key
        assert record["rollouts/count"] == 4.0 and record["train/optimizer_steps"] == 1.0
    assert (tmp_path / "run" / "adapters" / "agent" / "adapter_config.json").is_file()
    # the last step's samples: every agent LM call of every rollout, its exact prompt, its rollout's advantage
    generated, samples = optimizer.last
    expected = []
    for group in generated.trajectories:
        rewards = torch.tensor([optimizer.reward(t, None)["reward/total"] for t in group])
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
        expected += [(lm.backend.encode_messages(c.messages), float(a))
                     for t, a in zip(group, advantages, strict=True) for c in agent_calls(t)]  # fmt: skip
    assert [s.prompt_ids for s in samples] == [p for p, _ in expected]
    torch.testing.assert_close(torch.tensor([s.advantage for s in samples]), torch.tensor([a for _, a in expected]))


def test_real_rewards_of_a_random_model_skip_every_group(world, tiny_model, smollm_tokenizer, tmp_path):
    """A random model writes no valid action and no right answer: all rollouts score -λ_f, no group has a signal."""
    program, lm = _program(world, tiny_model, smollm_tokenizer)
    before = _agent_weights(lm)
    optimizer = SearchR1GRPO(_config(tmp_path, steps=1, group_size=2))
    program.compile(optimizer=optimizer, trainset=world.train)
    (record,) = optimizer.history
    assert record["groups/skipped"] == 2.0 and record["reward/mean"] == pytest.approx(-0.2)
    assert record["reward/format"] == 0.0 and record["train/samples"] == 0.0
    assert all(torch.equal(p, before[n]) for n, p in _agent_weights(lm).items())


def test_killed_run_resumes_from_checkpoint(world, tiny_model, smollm_tokenizer, tmp_path, monkeypatch):
    program, _ = _program(world, tiny_model, smollm_tokenizer)
    real_step = AdapterTrainer.step
    calls = {"n": 0}

    def dying_step(self, samples):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed")  # the process dies during the second optimizer step
        return real_step(self, samples)

    monkeypatch.setattr(AdapterTrainer, "step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        program.compile(optimizer=VariedReward(_config(tmp_path, group_size=2)), trainset=world.train)
    state = json.loads((latest_checkpoint(tmp_path / "run" / "checkpoints") / "state.json").read_text())
    assert state["global_step"] == 1 and state["steps"] == {"agent": 1}
    monkeypatch.setattr(AdapterTrainer, "step", real_step)
    resumed = VariedReward(_config(tmp_path, group_size=2, resume=True))
    program.compile(optimizer=resumed, trainset=world.train)
    log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2] and [r["step"] for r in resumed.history] == [2]


def test_chained_after_a_warm_start_with_kl_toward_it(world, tiny_model, smollm_tokenizer, tmp_path):
    """``compile(optimizer=[warm start, SearchR1GRPO(kl_beta > 0)])``: pi_ref is a frozen copy of the warm adapter."""
    program, lm = _program(world, tiny_model, smollm_tokenizer)
    warm = VariedReward(_config(tmp_path, steps=1, group_size=2, questions_per_step=1))
    rl = VariedReward(_config(tmp_path, steps=1, group_size=2, questions_per_step=1, kl_beta=0.1,
                              output_dir=tmp_path / "rl"))  # fmt: skip
    program.compile(optimizer=[warm, rl], trainset=world.train)
    assert "agent_ref" in lm.hf_model.peft_config
    (record,) = rl.history
    assert "kl/mean" in record and math.isfinite(record["kl/mean"])


def test_config_and_program_errors(world):
    with pytest.raises(ConfigError, match="group_size"):
        SearchR1GRPOConfig(group_size=1)
    with pytest.raises(ConfigError, match="temperature"):
        SearchR1GRPOConfig(temperature=0.0)
    with pytest.raises(ConfigError, match="format_penalty"):
        SearchR1GRPO(format_penalty=-1.0)
    with pytest.raises(ConfigError, match="loss_type"):
        SearchR1GRPOConfig(loss_type="ppo")
    with pytest.raises(ConfigError, match="output_dir"):
        SearchR1GRPOConfig(resume=True)
    opera = OPERA(BM25(world.corpus), lm=DummyLM([]))
    with pytest.raises(ConfigError, match="'agent' role of the search_r1 program"):
        SearchR1GRPO(show_progress=False).compile(opera, trainset=world.train)
    with pytest.raises(ConfigError, match="non-empty trainset"):
        SearchR1GRPO(show_progress=False).compile(opera, trainset=[])
