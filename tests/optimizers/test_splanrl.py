"""SPlanRL (D2Plan, arXiv 2601.08282): the cold-start filter, hand-checked groups, masking, the R_p switch, and a
few GRPO steps on a tiny random Llama that move the Reasoner adapter and leave the Purifier's alone."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import dspy
import pytest
import torch

import rolecall.optimizers.splanrl as splanrl_module
from rolecall.data.synthetic import synthetic_world
from rolecall.data.types import Example
from rolecall.errors import ConfigError
from rolecall.lm import LocalLM
from rolecall.optimizers import SFT, SPlanRL, SPlanRLConfig
from rolecall.optimizers.core.stage import Stage, StepContext
from rolecall.optimizers.core.trainer import AdapterTrainer
from rolecall.optimizers.splanrl import (
    ReasonerRollouts,
    cold_start_keep,
    cold_start_metric,
    max_reasoner_calls,
    reasoner_group_samples,
)
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.programs.d2plan.program import REASONER_ROLES, D2Plan
from rolecall.retrievers.bm25 import BM25

QUESTION = "Where was the director of Film X born?"
NOTE = "Film X was directed by Ada Quell (relevant)"


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=0, n_train=4, n_dev=1, n_test=1)


def _run(answer: str = "Varn", *, plan: tuple[str, ...] = ("Who directed Film X?", "Where was #A1 born?"),
         searched: bool = True, tag: str = "") -> Trajectory:  # fmt: skip
    """A D2Plan-shaped run: plan, one search purified into a note, a step that answers, the final answer; every role
    step carries the messages it saw and its raw completion."""
    t = Trajectory(question=QUESTION)

    def role(name: str, user: str, completion: str, **outputs) -> None:
        t.add(Step("role", name, inputs={"question": QUESTION}, outputs=outputs,
                   messages=[{"role": "system", "content": f"You are the {name}."}, {"role": "user", "content": user}],
                   completion=completion))  # fmt: skip

    role("reasoner_plan", QUESTION, f"[[ ## complexity ## ]]\nmulti-hop{tag}", complexity="multi-hop", plan=list(plan))
    t.event("plan", complexity="multi-hop", is_multi_hop=True, plan=list(plan), size=len(plan), source="model")
    if searched:
        role("reasoner_step", f"{QUESTION}\nnotes: none", "[[ ## action ## ]]\nsearch", action="search", query="Film X")
        t.add(Step("retrieval", "retrieve", inputs={"query": "Film X", "k": 5}, outputs={"passage_ids": ["film/x"]}))
        role("purifier", "Film X passages", f"[[ ## information ## ]]\n{NOTE}", relevant="yes", information=NOTE)
    role("reasoner_step", f"{QUESTION}\nnotes: {NOTE}", f"[[ ## answer ## ]]\n{answer}", action="answer", answer=answer)
    t.event("sub_question_done", sub_question=1, planned=plan[0], text=plan[0], had_placeholder=False,
            status="solved", answer=answer, searches=int(searched), relevant=[True])  # fmt: skip
    role("reasoner_answer", f"{QUESTION}\ncontext: {NOTE}", f"[[ ## answer ## ]]\n{answer}", answer=answer)
    return t


# ---------------------------------------------------------------------------------------------- cold-start filter
def test_cold_start_keeps_only_exactly_right_runs_that_searched():
    assert cold_start_keep(_run("Varn"), "Varn", ["Varn", "Varn City"])
    assert cold_start_keep(_run("Varn City"), "Varn City", ["Varn", "Varn City"])  # an alias is exactly right
    assert not cold_start_keep(_run("Varn", searched=False), "Varn", ["Varn"])  # right, but never searched
    assert not cold_start_keep(_run("Varn town"), "Varn town", ["Varn"])  # partly right (F1 > 0) is not kept
    assert not cold_start_keep(_run(""), None, ["Varn"])
    example = Example(id="q", question=QUESTION, answers=["Varn"], hops=2)
    assert cold_start_metric(example, dspy.Prediction(answer="varn.", trajectory=_run())) == 1.0  # EM normalizes
    assert cold_start_metric(example, dspy.Prediction(answer="Varn", trajectory=_run(searched=False))) == 0.0


def test_self_cold_start_is_sft_with_the_filter_at_threshold_one():
    sft = SPlanRL(cold_start="self", cold_start_tries=3).cold_start_optimizer()
    assert isinstance(sft, SFT) and sft.metric is cold_start_metric
    assert (sft.sft_config.source, sft.sft_config.threshold, sft.sft_config.tries) == ("self", 1.0, 3)
    assert SPlanRL(cold_start="gold").cold_start_optimizer().sft_config.source == "gold"
    assert SPlanRL(cold_start="none").cold_start_optimizer() is None
    custom = SFT(epochs=1)
    assert SPlanRL(warm_start=custom).cold_start_optimizer() is custom
    teacher = dspy.utils.DummyLM([{"answer": "x"}])
    assert SPlanRL(teacher=teacher).cold_start_optimizer().teacher is teacher


# ---------------------------------------------------------------------------------------------- groups and masking
def test_a_hand_checked_group(smollm_tokenizer):
    """R = [1.0, 0.0, 0.5]: mean 0.5, Bessel std sqrt((0.25 + 0.25 + 0) / 2) = 0.5, so
    A = [0.5, -0.5, 0] / (0.5 + 1e-4) = [0.9998, -0.9998, 0]. Each rollout has three Reasoner calls (plan, step,
    answer), each a sample with its rollout's advantage; the Purifier's call is no sample."""
    runs = [_run(tag=str(i)) for i in range(3)]
    samples, advantages = reasoner_group_samples(runs, [1.0, 0.0, 0.5], smollm_tokenizer, adapter="reasoner")
    torch.testing.assert_close(torch.tensor(advantages), torch.tensor([0.5, -0.5, 0.0]) / (0.5 + 1e-4))
    assert [s.role for s in samples] == ["reasoner_plan", "reasoner_step", "reasoner_step", "reasoner_answer"] * 3
    assert [s.advantage for s in samples] == [a for a in advantages for _ in range(4)]
    assert all(s.adapter == "reasoner" for s in samples)
    # the exact messages each call saw (chat template + generation prompt), and its own completion as the target
    steps = [s for t in runs for s in t.steps if s.kind == "role" and s.role != "purifier"]
    for sample, step in zip(samples, steps, strict=True):
        expected = smollm_tokenizer.apply_chat_template(step.messages, add_generation_prompt=True, tokenize=True)
        assert sample.prompt_ids == list(expected["input_ids"] if "input_ids" in expected else expected)
        completion = smollm_tokenizer.decode(sample.completion_ids)
        assert completion.startswith(step.completion) and "[[ ## completed ## ]]" in completion


def test_advantage_scale_none_is_r_minus_the_group_mean(smollm_tokenizer):
    runs = [_run(tag=str(i)) for i in range(3)]
    _, advantages = reasoner_group_samples(runs, [1.0, 0.0, 0.5], smollm_tokenizer, adapter="reasoner", scale="none")
    assert advantages == pytest.approx([0.5, -0.5, 0.0])
    with pytest.raises(ConfigError, match="advantage_scale"):
        SPlanRLConfig(advantage_scale="minmax")


def test_retrieved_and_purifier_text_carry_no_loss(smollm_tokenizer):
    """The Purifier's note reaches the Reasoner as an input of its next call: it is in that call's prompt (no loss),
    never in a Reasoner completion, and every completion token the Reasoner wrote keeps its loss."""
    samples, _ = reasoner_group_samples([_run(), _run("Oslo")], [1.0, 0.0], smollm_tokenizer, adapter="reasoner")
    with_note = [s for s in samples if NOTE in smollm_tokenizer.decode(s.prompt_ids)]
    assert len(with_note) == 4  # the answering step and the final answer of each rollout
    assert all(NOTE not in smollm_tokenizer.decode(s.completion_ids) for s in samples)
    assert all(s.loss_mask == [1] * len(s.completion_ids) for s in samples)


def test_an_all_equal_group_gives_no_samples(smollm_tokenizer):
    assert reasoner_group_samples([_run(), _run()], [0.7, 0.7], smollm_tokenizer, adapter="reasoner") == ([], [])
    with pytest.raises(ValueError, match="one reward per rollout"):
        reasoner_group_samples([_run()], [0.1, 0.2], smollm_tokenizer, adapter="reasoner")


@pytest.mark.parametrize("use_plan_reward, skipped", [(True, 0.0), (False, 1.0)])
def test_use_plan_reward_false_drops_r_p_before_the_advantages(smollm_tokenizer, use_plan_reward, skipped):
    """Two right runs of a 2-hop question: a 2-step plan (R_p = 1) and a 3-step plan (R_p = 0); R_f = R_ans = 1,
    R_a = R_refine + R_revise = 1 + 1 (c = 1). R = 0.1 R_p + 0.2 + 1: 1.3 vs 1.2 with R_p, 1.2 vs 1.2 without,
    where the group is all-equal and skipped."""
    optimizer = SPlanRL(use_plan_reward=use_plan_reward, cold_start="none")
    optimizer.program = SimpleNamespace(lm=smollm_tokenizer)
    stage = Stage(name="reasoner", adapter="reasoner", steps=1, roles=REASONER_ROLES)
    ctx = StepContext(stage=stage, step=0, global_step=0, position=0, rng=None)
    example = Example(id="q", question=QUESTION, answers=["Varn"], hops=2, supporting_ids=["film/x"])
    preds = [dspy.Prediction(answer="Varn", trajectory=_run(plan=p)) for p in (("a?", "b?"), ("a?", "b?", "c?"))]
    samples, metrics = optimizer.score(ctx, ReasonerRollouts(batch=[example], groups=[preds]))
    assert metrics["reward/plan"] == 0.5 and metrics["groups/skipped"] == skipped
    assert metrics["reward/total"] == pytest.approx(1.25 if use_plan_reward else 1.2)
    assert (len(samples) > 0) is use_plan_reward
    if use_plan_reward:
        assert samples[0].advantage > 0 > samples[-1].advantage


# ---------------------------------------------------------------------------------------------- config
def test_config_defaults_are_the_papers_and_bad_values_fail():
    cfg = SPlanRLConfig()
    assert (cfg.group_size, cfg.alpha, cfg.beta, cfg.lambda_, cfg.use_plan_reward, cfg.kl_beta) == (
        5, 0.1, 0.1, 0.5, True, 0.0)  # fmt: skip
    assert cfg.weights.alpha == 0.1 and SPlanRLConfig(use_plan_reward=False).weights.use_plan_reward is False
    with pytest.raises(ConfigError, match="group_size"):
        SPlanRL(group_size=1)
    with pytest.raises(ConfigError, match="cold_start"):
        SPlanRL(cold_start="teacher")
    with pytest.raises(ConfigError, match="no option 'G'"):
        SPlanRL(G=5)
    with pytest.raises(ConfigError, match="teacher"):
        SPlanRL(cold_start="gold", teacher=dspy.utils.DummyLM([{"answer": "x"}]))
    assert SPlanRL(SPlanRLConfig(steps=3), group_size=4).splanrl_config.steps == 3  # overrides keep the config


def test_only_d2plan_is_trained(world):
    from rolecall.programs import OPERA

    program = OPERA(BM25(world.corpus), lm=dspy.utils.DummyLM([{"sub_goals": "[]"}]))
    with pytest.raises(ConfigError, match="applies to the d2plan program"):
        SPlanRL(cold_start="none").compile(program, trainset=world.train)


# ---------------------------------------------------------------------------------------------- end to end
def _program(world, tiny_model, tokenizer) -> tuple[D2Plan, LocalLM]:
    lm = LocalLM(tiny_model, tokenizer=tokenizer, max_tokens=8)
    program = D2Plan(BM25(world.corpus), lm=lm, max_searches=1, max_sub_questions=2)
    for role in program.roles:
        program.lm_kwargs[role] = {"max_tokens": 8}
    return program, lm


def _weights(lm, adapter):
    return {n: p.detach().clone() for n, p in lm.hf_model.named_parameters() if f".{adapter}." in n}


def test_grpo_steps_move_the_reasoner_and_not_the_purifier(world, tiny_model, smollm_tokenizer, tmp_path, monkeypatch):
    """A random model's outputs never parse (R = 0 for every rollout), so a varying bonus is added to R to give the
    groups a spread; everything else is the real path: rollouts, rewards, samples, GRPO updates, metrics."""
    program, lm = _program(world, tiny_model, smollm_tokenizer)
    program(question=world.train[0].question)  # creates both adapters
    before = {a: _weights(lm, a) for a in ("reasoner", "purifier")}
    assert before["reasoner"] and before["purifier"]
    real, bonus = splanrl_module.splanrl_rewards, itertools.cycle([0.0, 0.5, 1.0])

    def spread(*args, **kw):
        r = real(*args, **kw)
        return {**r, "reward/total": r["reward/total"] + next(bonus)}

    monkeypatch.setattr(splanrl_module, "splanrl_rewards", spread)
    trained = []
    real_step = AdapterTrainer.step

    def spy(self, samples):
        trained.append(list(samples))
        return real_step(self, samples)

    monkeypatch.setattr(AdapterTrainer, "step", spy)
    optimizer = SPlanRL(cold_start="none", steps=2, group_size=3, questions_per_step=1, learning_rate=1e-2,
                        num_threads=3, output_dir=str(tmp_path / "run"), show_progress=False)  # fmt: skip
    assert program.compile(optimizer=optimizer, trainset=world.train) is program
    after = {a: _weights(lm, a) for a in ("reasoner", "purifier")}
    assert any(not torch.equal(after["reasoner"][n], before["reasoner"][n]) for n in after["reasoner"])
    assert all(torch.equal(after["purifier"][n], before["purifier"][n]) for n in after["purifier"])
    assert program.lm_kwargs["reasoner_step"] == {"max_tokens": 8}  # the rollout temperature was put back
    assert len(trained) == 2 and all(trained)
    for samples in trained:
        assert {s.role for s in samples} <= set(REASONER_ROLES) and all(s.adapter == "reasoner" for s in samples)
        assert len({s.advantage for s in samples}) > 1  # rollouts of one group carry their own advantages
    log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["step"]) for r in log] == [("reasoner", 1), ("reasoner", 2)]
    for record in log:
        for key in ("reward/total", "reward/plan", "reward/adapt", "reward/answer", "reward/format", "reward/revise",
                    "groups/skipped", "groups/total", "loss/policy", "grad/norm", "time/generate"):  # fmt: skip
            assert key in record, key
        assert record["groups/skipped"] == 0.0 and record["train/optimizer_steps"] == 1.0
        assert all(v == v for v in record.values() if isinstance(v, float))  # no NaN
    assert (tmp_path / "run" / "adapters" / "reasoner" / "adapter_config.json").is_file()
    assert not (tmp_path / "run" / "adapters" / "purifier").exists()


def test_all_equal_groups_are_skipped_and_counted(world, tiny_model, smollm_tokenizer):
    """Without the bonus every random-model rollout scores R = 0 (R_f = 0): each group is skipped, nothing trains."""
    program, lm = _program(world, tiny_model, smollm_tokenizer)
    optimizer = SPlanRL(cold_start="none", steps=1, group_size=2, questions_per_step=2, num_threads=4,
                        show_progress=False)  # fmt: skip
    program.compile(optimizer=optimizer, trainset=world.train)
    (record,) = optimizer.history
    assert record["groups/skipped"] == 2.0 and record["groups/total"] == 2.0 and record["reward/total"] == 0.0
    assert record["train/samples"] == 0.0


def test_self_cold_start_that_keeps_nothing_says_what_to_do(world, tiny_model, smollm_tokenizer):
    program, _ = _program(world, tiny_model, smollm_tokenizer)
    optimizer = SPlanRL(cold_start="self", cold_start_tries=1, num_threads=4, show_progress=False)
    with pytest.raises(ConfigError, match="no run reached threshold.*cold_start='gold'"):
        program.compile(optimizer=optimizer, trainset=world.train)


def test_reasoner_call_bound(world):
    program = D2Plan(BM25(world.corpus), lm=dspy.utils.DummyLM([{"answer": "x"}]))
    # K = 3, M = 1, S = 5: plan 1 + 6 runs x (refine 1 + 4 steps) + 1 revision + 1 answer
    assert max_reasoner_calls(program) == 1 + 6 * 5 + 1 + 1
