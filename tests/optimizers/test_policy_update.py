"""PPO epochs and the in-stage learning-rate schedule (``num_iterations``, ``lr_schedule``, ``lr_warmup_steps``) in
every program-in-the-loop RL optimizer besides MAPGRPO: SPlanRL, Search-R1 GRPO and OPD's Stage II (issue 56; the
levers that carried MAPGRPO past its warm start in issue 55). Each runs its real loop on a tiny random Llama with a
reward that varies within a group (a random model never answers right)."""

from __future__ import annotations

import itertools
import zlib

import pytest

from rolecall.data.synthetic import synthetic_world
from rolecall.lm import LocalLM
from rolecall.optimizers import OPD, SearchR1GRPO
from rolecall.optimizers import splanrl as splanrl_module
from rolecall.optimizers.core.trainer import AdapterTrainer
from rolecall.optimizers.opd_teacher import OPDTeacher
from rolecall.optimizers.rewards.team import TeamRewards
from rolecall.optimizers.splanrl import SPlanRL
from rolecall.programs.baselines import SearchR1Agent
from rolecall.programs.core.calls import COMPLETED_MARKER
from rolecall.programs.d2plan.program import D2Plan
from rolecall.programs.team.program import HierarchicalTeam
from rolecall.retrievers.bm25 import BM25

LR = 1e-2
UPDATE = {"num_iterations": 2, "lr_schedule": "linear", "lr_warmup_steps": 2, "learning_rate": LR}


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=0, n_train=6, n_dev=1, n_test=1)


class VariedSearchR1(SearchR1GRPO):
    """Search-R1 GRPO whose reward varies with what each rollout wrote (for the EM a random model never earns)."""

    def reward(self, trajectory, record):
        text = "".join(s.completion or "" for s in trajectory.role_steps("agent"))
        return {"reward/total": zlib.crc32(text.encode()) % 1000 / 1000}


def _splanrl(world, tiny_model, tokenizer, monkeypatch):
    lm = LocalLM(tiny_model, tokenizer=tokenizer, max_tokens=8)
    program = D2Plan(BM25(world.corpus), lm=lm, max_searches=1, max_sub_questions=2)
    for role in program.roles:
        program.lm_kwargs[role] = {"max_tokens": 8}
    real, bonus = splanrl_module.splanrl_rewards, itertools.cycle([0.0, 0.5, 1.0])

    def spread(*args, **kw):
        r = real(*args, **kw)
        return {**r, "reward/total": r["reward/total"] + next(bonus)}

    monkeypatch.setattr(splanrl_module, "splanrl_rewards", spread)
    optimizer = SPlanRL(cold_start="none", steps=2, group_size=3, questions_per_step=1, num_threads=3,
                        show_progress=False, **UPDATE)  # fmt: skip
    return program, optimizer


def _search_r1(world, tiny_model, tokenizer, monkeypatch):
    lm = LocalLM(tiny_model, tokenizer=tokenizer)
    program = SearchR1Agent(BM25(world.corpus), lm=lm, max_turns=1, demo_policy="never",
                            lm_kwargs={"*": {"stop": [COMPLETED_MARKER]}, "agent": {"max_tokens": 8}})  # fmt: skip
    optimizer = VariedSearchR1(group_size=2, questions_per_step=2, steps=2, num_threads=4, show_progress=False,
                               **UPDATE)  # fmt: skip
    return program, optimizer


def _opd(world, tiny_model, tokenizer, monkeypatch):
    lm = LocalLM(tiny_model, tokenizer=tokenizer, max_tokens=8)
    team = HierarchicalTeam(BM25(world.corpus), lm=lm, max_steps=3, max_rounds=1, max_subtasks=1,
                            max_searcher_turns=1)  # fmt: skip
    for role in team.roles:
        team.lm_kwargs[role] = {**team.lm_kwargs.get(role, {}), "max_tokens": 8}
    team(question=world.train[0].question)  # creates the team adapter
    lm.backend.ensure_adapter("opd_teacher")
    bonus = itertools.cycle([0.0, 1.0, 0.5, 0.25])

    def rewards(self, trajectory, record):
        b = next(bonus)
        return TeamRewards(outcome=b, answerer=[b, 1.0 - b], searcher=b, leader=b)

    monkeypatch.setattr(OPDTeacher, "team_rewards", rewards)
    monkeypatch.setattr(OPD, "team_rewards", rewards)
    optimizer = OPD(train_teacher=False, steps=2, group_size=2, questions_per_step=1, answer_candidates=2,
                    num_threads=4, teacher_check_questions=0, show_progress=False, **UPDATE)  # fmt: skip
    return team, optimizer


@pytest.mark.parametrize("build", [_splanrl, _search_r1, _opd], ids=["splanrl", "search_r1", "opd"])
def test_two_passes_clip_against_the_trainers_own_pi_old_and_the_lr_warms_up_then_decays(
    world, tiny_model, smollm_tokenizer, monkeypatch, build
):
    """Each RL step trains its batch twice: pi_old is the trainer's own forward before the first pass (stored as every
    sample's ``old_logps``, one per completion token), so both passes see the same samples; the learning rate starts
    below ``learning_rate`` (warm-up) and decays linearly over the stage."""
    program, optimizer = build(world, tiny_model, smollm_tokenizer, monkeypatch)
    calls: list[tuple[list, float]] = []
    real_step = AdapterTrainer.step

    def step(self, samples):
        metrics = real_step(self, samples)
        calls.append((list(samples), metrics["lr"]))
        return metrics

    monkeypatch.setattr(AdapterTrainer, "step", step)
    program.compile(optimizer=optimizer, trainset=world.train)
    assert len(optimizer.history) == 2
    assert [r["train/optimizer_steps"] for r in optimizer.history] == [2.0, 2.0]
    assert len(calls) == 4
    for (first, _), (second, _) in (calls[0:2], calls[2:4]):
        assert first and [s.completion_ids for s in first] == [s.completion_ids for s in second]
        assert all(s.old_logps is not None and len(s.old_logps) == len(s.completion_ids) for s in first)
    # one rate per RL step, both passes alike: step 1 warms up (1 of 3), step 2 is past the warm-up (the trainer
    # has taken 2 optimizer steps) and halfway through the stage's linear decay
    lrs = [lr for _, lr in calls]
    assert lrs == pytest.approx([LR / 3, LR / 3, LR / 2, LR / 2])
