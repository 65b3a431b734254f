"""Where MAPGRPO's learning signal comes from (issue 55): c_best in or out of the group baseline, advantages as
r - mean or standardized, a learning-rate warm-up, and the informative-group metrics of every step."""

from __future__ import annotations

import math
import random

import dspy
import pytest
import torch

from rolecall.data.synthetic import synthetic_world
from rolecall.lm import LocalLM
from rolecall.optimizers import MAPGRPO, MAPGRPOConfig
from rolecall.optimizers.core.config import TrainerConfig
from rolecall.optimizers.core.trainer import AdapterTrainer
from rolecall.optimizers.mapgrpo import expert_group_advantages
from rolecall.optimizers.mapgrpo_roles import GoldRecord, OperaRoleTasks, RoleInput, as_gold_record
from rolecall.programs import OPERA
from rolecall.programs.core.trajectory import Trajectory
from rolecall.retrievers.bm25 import BM25

COMPARISON = GoldRecord(question="Which band was formed earlier, Yaebroria or Traveilt Archives?",
                        answers=["Yaebroria"])  # fmt: skip


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=3, n_train=20, n_dev=4, n_test=4)


def test_c_best_in_the_baseline_pulls_every_sample_down_and_outside_it_does_not():
    rewards, expert = [0.2, 0.4, 0.6], 1.0
    inside = expert_group_advantages(rewards, expert, expert_in_baseline=True)
    g = len(rewards) + 1
    mean_policy = sum(rewards) / len(rewards)
    # Eq. 11 as the paper writes it: the on-policy advantages sum to (G-1)/G * (mean_policy - r_expert) < 0
    assert math.isclose(float(inside[:-1].sum()), (g - 1) / g * (mean_policy - expert), abs_tol=1e-6)
    outside = expert_group_advantages(rewards, expert, expert_in_baseline=False)
    assert math.isclose(float(outside[:-1].sum()), 0.0, abs_tol=1e-6)  # the samples' own mean
    assert math.isclose(float(outside[-1]), expert - mean_policy, abs_tol=1e-6)  # c_best measured against them
    assert torch.equal(
        expert_group_advantages(rewards, None), expert_group_advantages(rewards, None, expert_in_baseline=False)
    )


def test_standardized_advantages_have_unit_spread_over_the_baseline():
    adv = expert_group_advantages([0.0, 0.0, 1.0, 1.0], None, scale="std")
    assert math.isclose(float(adv.std()), 1.0, rel_tol=1e-3) and math.isclose(float(adv.mean()), 0.0, abs_tol=1e-6)
    assert torch.allclose(expert_group_advantages([0.0, 1.0], 1.0), torch.tensor([-2 / 3, 1 / 3, 1 / 3]))


def test_std_scale_with_c_best_outside_the_baseline_stays_bounded_when_the_samples_agree():
    # the on-policy samples agree: their own std is 0, so dividing by it + 1e-4 made c_best's advantage 7000
    adv = expert_group_advantages([0.2, 0.2, 0.2, 0.2], 0.9, expert_in_baseline=False, scale="std")
    assert adv[:-1].abs().max() == 0.0
    assert 0.0 < float(adv[-1]) < 3.0  # (0.9 - 0.2) / std of the whole group, about 2.0
    spread = expert_group_advantages([0.0, 0.5, 1.0], 1.0, expert_in_baseline=False, scale="std")
    assert math.isclose(float(spread[:-1].sum()), 0.0, abs_tol=1e-6)  # still the samples' own mean


def test_the_new_settings_are_checked():
    with pytest.raises(Exception, match="advantage_scale"):
        MAPGRPOConfig(advantage_scale="minmax")
    with pytest.raises(Exception, match="lr_warmup_steps"):
        MAPGRPOConfig(lr_warmup_steps=-1)


def test_warm_up_raises_the_learning_rate_over_the_first_steps(tiny_model, smollm_tokenizer):
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=4)
    lm.backend.ensure_adapter("plan")
    trainer = AdapterTrainer(lm.backend, "plan", TrainerConfig(learning_rate=1e-3, lr_warmup_steps=3))
    seen = []
    for step in range(5):
        trainer.steps = step
        seen.append(trainer.set_progress(0.0))
    assert seen == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    linear = AdapterTrainer(lm.backend, "plan", TrainerConfig(learning_rate=1e-3, lr_schedule="linear"))
    assert linear.set_progress(0.5) == pytest.approx(5e-4)


@pytest.mark.parametrize("expert_in_baseline", [True, False])
def test_a_step_logs_its_informative_groups_and_trains_the_advantages_the_setting_gives(
    world, tiny_model, smollm_tokenizer, tmp_path, monkeypatch, expert_in_baseline
):
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    program = OPERA(BM25(world.corpus), lm=lm, max_steps=1, max_rewrites=0)

    # rewards that differ within a group, c_best (scored last, alone) above them all
    def score(self, role, item, outs):
        return [(0.5 if len(outs) == 1 else 0.1 * i, {}) for i in range(len(outs))]

    monkeypatch.setattr(OperaRoleTasks, "score", score)
    trained: list[list] = []
    real_step = AdapterTrainer.step
    monkeypatch.setattr(
        AdapterTrainer, "step", lambda self, samples: trained.append(list(samples)) or real_step(self, samples)
    )
    config = MAPGRPOConfig(stages=("plan",), steps={"plan": 1}, group_size=3, inputs_per_step=2, collect_questions=2,
                           max_completion_length=8, expert_in_baseline=expert_in_baseline, show_progress=False,
                           execute_plans=False, output_dir=tmp_path / "run")  # fmt: skip
    optimizer = MAPGRPO(config)
    program.compile(optimizer=optimizer, trainset=world.train)
    record = optimizer.history[0]
    assert record["groups/informative"] == 2.0 and record["groups/total"] == 2.0
    advantages = [s.advantage for s in trained[0]]  # two groups of G - 1 = 2 samples with rewards 0.0, 0.1
    expected = expert_group_advantages([0.0, 0.1], 0.5, expert_in_baseline=expert_in_baseline)[:2].tolist()
    assert advantages == pytest.approx(expected * 2)
    assert record["advantage/abs_mean"] == pytest.approx(sum(abs(a) for a in expected) / 2)


class _CountingProgram:
    """Records the questions it runs (the analysis stage collects its inputs from the program's calls)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, question: str) -> dspy.Prediction:
        self.asked.append(question)
        return dspy.Prediction(answer="x", trajectory=Trajectory(question=question))


def test_input_pools_come_from_the_whole_training_set(world):
    records = [as_gold_record(e) for e in world.train]
    program = _CountingProgram()
    tasks = OperaRoleTasks(program, MAPGRPOConfig(collect_questions=7, num_threads=2))
    plan_pool = tasks.collect("plan", records, random.Random(0))
    assert sorted(i.inputs["question"] for i in plan_pool) == sorted(r.question for r in records)  # every question
    tasks.collect("analysis", records, random.Random(0))
    assert len(program.asked) == 7 and len(set(program.asked)) == 7
    assert MAPGRPOConfig().collect_questions >= 100  # a stage's pool is not a dozen questions reused every step


def test_the_synthesis_stage_is_trained_where_the_program_answers_through_it():
    cfg = MAPGRPOConfig()
    assert cfg.stage_order(True) == ("plan", "analysis", "rewrite", "synthesis")
    assert cfg.stage_order(False) == ("plan", "analysis", "rewrite")  # the paper's rule: the last sub-goal answers
    assert MAPGRPOConfig(stages=("plan",), steps={"plan": 1}).stage_order(True) == ("plan",)
    record = COMPARISON
    tasks = OperaRoleTasks(_CountingProgram(), cfg)
    item = RoleInput({"question": record.question, "evidence": "..."}, record)
    scores = tasks.score("synthesis", item, [{"answer": "Yaebroria"}, {"answer": "the Yaebroria band"}, None])
    assert [round(r, 3) for r, _ in scores] == [1.0, 0.333, 0.0]
    assert tasks.gold_expert("synthesis", item) is None  # its evidence does not name the answer: no c_best
    always = OperaRoleTasks(_CountingProgram(), MAPGRPOConfig(synthesis_expert="always"))
    assert always.gold_expert("synthesis", item) == {"answer": "Yaebroria"}


def test_the_synthesis_expert_stands_only_where_the_evidence_holds_the_gold_chain():
    """c_best = the gold final answer over evidence whose chain went wrong teaches the role to ignore its evidence
    (measured: lr 1e-3 off-policy guidance made 12 of 85 synthesis misses 20); grounded, it stands only where every
    gold sub-answer is in the evidence."""
    record = GoldRecord(
        question="Which band was formed earlier, Yaebroria or Traveilt Archives?",
        answers=["Yaebroria"],
        decomposition=[{"question": "In which year was the band Yaebroria formed?", "answer": "1961"},
                       {"question": "In which year was the band Traveilt Archives formed?", "answer": "2010"},
                       {"question": "Which is earlier, #1 or #2?", "answer": "Yaebroria"}],
    )  # fmt: skip
    right = "In which year was the band Yaebroria formed? -> 1961\nIn which year was Traveilt Archives formed? -> 2010."
    wrong = "In which year was the band Yaebroria formed? -> 1961\nIn which year was Traveilt Archives formed? -> 1950"
    tasks = OperaRoleTasks(_CountingProgram(), MAPGRPOConfig())
    assert MAPGRPOConfig().synthesis_expert == "grounded"
    expert = tasks.gold_expert("synthesis", RoleInput({"question": record.question, "evidence": right}, record))
    assert expert == {"answer": "Yaebroria"}
    assert tasks.gold_expert("synthesis", RoleInput({"question": record.question, "evidence": wrong}, record)) is None
    chain = [{"question": "Year of A?", "answer": "1961"}, {"question": "Same?", "answer": "no"}]
    yes_no = GoldRecord(question="Were both formed in 1961?", answers=["no"], decomposition=chain)
    assert tasks.gold_expert("synthesis", RoleInput({"evidence": "Year of A? -> 1961"}, yes_no)) == {"answer": "no"}


def test_mapgrpo_trains_opera_synthesis_with_the_gold_answer_as_c_best(world, tiny_model, smollm_tokenizer, tmp_path):
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    program = OPERA(BM25(world.corpus), lm=lm, max_steps=1, max_rewrites=0)
    config = MAPGRPOConfig(steps={"synthesis": 1}, group_size=3, inputs_per_step=2, collect_questions=3,
                           max_completion_length=8, show_progress=False, output_dir=tmp_path / "run",
                           synthesis_expert="always")  # a random model's chains are never right  # fmt: skip
    optimizer = MAPGRPO(config)
    program.compile(optimizer=optimizer, trainset=world.train)
    (record,) = optimizer.history
    assert record["stage"] == "synthesis" and record["groups/total"] == 2.0
    assert record["reward/expert"] == 1.0  # c_best is the gold answer: EM and F1 both 1


def test_a_stage_out_of_informative_groups_ends_and_the_next_stage_runs(
    world, tiny_model, smollm_tokenizer, tmp_path, monkeypatch
):
    """The plan stage's groups all score alike (no advantage anywhere): after ``stage_patience`` steps it ends, its
    reason recorded, and the analysis stage still trains; ``stage_patience=0`` never ends a stage."""
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    program = OPERA(BM25(world.corpus), lm=lm, max_steps=1, max_rewrites=0)

    def score(self, role, item, outs):  # plan: every output alike; analysis: distinct rewards
        return [(0.3 if role == "plan" else 0.1 * i, {}) for i in range(len(outs))]

    monkeypatch.setattr(OperaRoleTasks, "score", score)
    base = dict(steps={"plan": 4, "analysis": 1}, group_size=3, inputs_per_step=2, collect_questions=3,
                max_completion_length=8, show_progress=False, execute_plans=False, min_informative=0.25)  # fmt: skip
    optimizer = MAPGRPO(MAPGRPOConfig(**base, stage_patience=2, output_dir=tmp_path / "ends"))
    program.compile(optimizer=optimizer, trainset=world.train)
    assert optimizer.steps == {"plan": 2, "analysis": 1}
    assert "out of signal: 0 of 4 groups informative in its last 2 steps" in optimizer.stopped["plan"]
    assert [r["groups/informative"] for r in optimizer.history] == [0.0, 0.0, 2.0]

    flat = [{"groups/informative": 0.0, "groups/total": 4.0}] * 3
    assert MAPGRPO(MAPGRPOConfig(**base, stage_patience=0)).stage_exhausted("plan", flat) is None  # 0: never ends
    assert MAPGRPO(MAPGRPOConfig(**base, stage_patience=4)).stage_exhausted("plan", flat) is None  # not 4 steps yet
    mixed = flat + [{"groups/informative": 3.0, "groups/total": 4.0}]  # 3 of 16 < 0.25, 3 of 12 is not
    assert MAPGRPO(MAPGRPOConfig(**base, stage_patience=4)).stage_exhausted("plan", mixed) is not None
    assert MAPGRPO(MAPGRPOConfig(**base, stage_patience=3)).stage_exhausted("plan", mixed) is None


@pytest.mark.parametrize("expert_gradient", [False, True])
def test_a_group_whose_samples_all_miss_informs_only_through_c_best(
    world, tiny_model, smollm_tokenizer, tmp_path, monkeypatch, expert_gradient
):
    """Every policy sample scores 0 and c_best 1: without off-policy guidance nothing trains (0 informative groups);
    with it each group trains c_best, so both groups count as informative and the stage is not out of signal."""
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    program = OPERA(BM25(world.corpus), lm=lm, max_steps=1, max_rewrites=0)

    def score(self, role, item, outs):  # c_best is scored alone
        return [(float(len(outs) == 1), {})] * len(outs)

    monkeypatch.setattr(OperaRoleTasks, "score", score)
    config = MAPGRPOConfig(stages=("plan",), steps={"plan": 1}, group_size=3, inputs_per_step=2, collect_questions=2,
                           max_completion_length=8, expert_gradient=expert_gradient, expert_in_baseline=False,
                           show_progress=False, execute_plans=False, output_dir=tmp_path / "run")  # fmt: skip
    optimizer = MAPGRPO(config)
    program.compile(optimizer=optimizer, trainset=world.train)
    record = optimizer.history[0]
    assert record["groups/skipped"] == 2.0 and record["groups/flat_below_expert"] == 2.0
    assert record["groups/informative"] == (2.0 if expert_gradient else 0.0)


def test_the_gold_plan_judge_sees_the_relation_a_plan_asks():
    """The rule judge scores a plan asking the wrong relation as highly as the gold plan; plan_logic="gold" scores
    the share of sub-goals asking the gold sub-question, so the plan stage's groups can tell them apart."""
    record = GoldRecord(
        question="Who is the maternal grandfather of Pekim Sansk?",
        answers=["Dravan Nojovorn"],
        decomposition=[{"question": "Who is the mother of Pekim Sansk?", "answer": "Jiagria Nojovorn"},
                       {"question": "Who is the father of #1?", "answer": "Dravan Nojovorn"}],
    )  # fmt: skip
    item = RoleInput({"question": record.question}, record)
    right = {"sub_goals": ["Who is Pekim Sansk's mother?", "Who is the father of [person from step 1]?"]}
    wrong = {"sub_goals": ["Who is Pekim Sansk's mother?", "Who is the mother of [person from step 1]?"]}
    paraphrase = {"sub_goals": ["Who is the mother of Pekim Sansk?", "Who is the father of [person from step 1]?"]}
    rules = OperaRoleTasks(_CountingProgram(), MAPGRPOConfig(execute_plans=False))
    (r_right, _), (r_wrong, _) = rules.score("plan", item, [right, wrong])
    assert r_right == r_wrong  # the paper-faithful rule judge cannot tell a mother from a father
    gold = OperaRoleTasks(_CountingProgram(), MAPGRPOConfig(execute_plans=False, plan_logic="gold"))
    scored = gold.score("plan", item, [right, wrong, paraphrase])
    assert [parts["logic"] for _, parts in scored] == [0.5, 0.0, 1.0]  # "Pekim Sansk's" is another wording
    assert scored[2][0] > scored[0][0] > scored[1][0]
    with pytest.raises(Exception, match="plan_logic"):
        MAPGRPOConfig(plan_logic="judge")


def test_pool_screening_keeps_only_the_inputs_that_can_teach(
    world, tiny_model, smollm_tokenizer, tmp_path, monkeypatch
):
    """A converged warm start answers most inputs alike every time (no advantage); ``screen_pool`` samples each
    collected input once and keeps those whose group disagrees, so every step's groups can teach."""
    import json

    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    program = OPERA(BM25(world.corpus), lm=lm, max_steps=2, max_rewrites=0)

    def teaches(item):  # an input property the screening cannot see except through the rewards
        return len(str(item.inputs.get("sub_goal", ""))) % 2 == 1

    def score(self, role, item, outs):  # inputs that teach: rewards that differ; the rest: all alike
        return [(0.1 * i if teaches(item) else 0.3, {}) for i in range(len(outs))]

    monkeypatch.setattr(OperaRoleTasks, "score", score)
    config = MAPGRPOConfig(steps={"analysis": 1}, group_size=3, inputs_per_step=2, collect_questions=8,
                           max_completion_length=8, show_progress=False, execute_plans=False, screen_pool=True,
                           output_dir=tmp_path / "run")  # fmt: skip
    optimizer = MAPGRPO(config)
    program.compile(optimizer=optimizer, trainset=world.train)
    kept, counts = optimizer.pools["analysis"], optimizer.screened["analysis"]
    assert kept and all(teaches(item) for item in kept)
    assert counts["kept"] == len(kept) < counts["collected"]  # the inputs answered alike were dropped
    (record,) = optimizer.history
    assert record["groups/informative"] == record["groups/total"] and record["pool/size"] == len(kept)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["pool_screening"] == {"analysis": counts}
