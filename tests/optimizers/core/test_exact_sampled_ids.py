"""The trajectory-based trainers (Search-R1 GRPO, SPlanRL, OPD) train on exactly the token ids the engine sampled:
nothing re-tokenized, no ``[[ ## completed ## ]]`` or EOS that was never sampled, a truncated call as truncated."""

from __future__ import annotations

import pytest

import rolecall.lm.local as local_module
from rolecall.data.synthetic import synthetic_world
from rolecall.lm import LocalLM
from rolecall.optimizers.core.role_sampling import role_lm_overrides
from rolecall.optimizers.core.samples import samples_from_trajectory
from rolecall.optimizers.opd_teacher import answerer_samples, role_samples
from rolecall.optimizers.search_r1_grpo import rollout_samples
from rolecall.optimizers.splanrl import reasoner_group_samples
from rolecall.programs.baselines.search_r1 import SearchR1Agent
from rolecall.programs.core.calls import COMPLETED_MARKER
from rolecall.programs.d2plan.program import REASONER_ROLES, D2Plan
from rolecall.programs.team.program import HierarchicalTeam
from rolecall.retrievers.bm25 import BM25


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=0, n_train=4, n_dev=1, n_test=1)


def _sampled_run(program, question, monkeypatch):
    """One run with every role sampled at T = 0.9; the ids (and finish reasons) each engine call sampled."""
    sampled: list[tuple[list[int], str]] = []
    real = local_module._report_sampled

    def spy(completion):
        sampled.append((list(completion.token_ids), completion.finish_reason))
        real(completion)

    monkeypatch.setattr(local_module, "_report_sampled", spy)
    with role_lm_overrides(program, {role: {"temperature": 0.9} for role in program.roles}):
        prediction = program(question=question)
    return prediction.trajectory, sampled


def _check(samples, sampled):
    """Every sample's completion is exactly one sampled sequence (a truncated one included, nothing appended)."""
    assert samples, "the run produced no training samples"
    ids = [s for s, _ in sampled]
    for sample in samples:
        assert sample.completion_ids in ids  # not a re-tokenization of its text
        assert len(sample.loss_mask) == len(sample.completion_ids) and all(m == 1 for m in sample.loss_mask)


def test_search_r1_agent_calls_train_on_their_sampled_ids(world, tiny_model, smollm_tokenizer, monkeypatch):
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer)
    lm_kwargs = {"*": {"stop": [COMPLETED_MARKER]}, "agent": {"max_tokens": 8}}
    program = SearchR1Agent(BM25(world.corpus), lm=lm, max_turns=1, demo_policy="never", lm_kwargs=lm_kwargs)
    trajectory, sampled = _sampled_run(program, world.train[0].question, monkeypatch)
    samples = rollout_samples(trajectory, lm, adapter="agent", advantage=1.0)
    _check(samples, sampled)
    truncated = [ids for ids, finish in sampled if finish == "length"]  # 8 tokens of a random model
    assert truncated and any(s.completion_ids in truncated for s in samples)  # trained as truncated
    # before: the text was re-tokenized and the completion marker and EOS appended, which were never sampled
    old = samples_from_trajectory(trajectory, lm, roles=("agent",), include_failed=True, exact_ids=False)
    assert [s.completion_ids for s in old] != [s.completion_ids for s in samples]
    assert all(s.completion_ids[-1] == smollm_tokenizer.eos_token_id for s in old)


def test_splanrl_reasoner_calls_train_on_their_sampled_ids(world, tiny_model, smollm_tokenizer, monkeypatch):
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    program = D2Plan(BM25(world.corpus), lm=lm, max_searches=1, max_sub_questions=2)
    for role in program.roles:
        program.lm_kwargs[role] = {"max_tokens": 8}
    runs = [_sampled_run(program, world.train[0].question, monkeypatch) for _ in range(2)]
    samples, _ = reasoner_group_samples([t for t, _ in runs], [1.0, 0.0], lm, adapter="reasoner",
                                        roles=REASONER_ROLES)  # fmt: skip
    _check(samples, [s for _, sampled in runs for s in sampled])


def test_opd_team_calls_train_on_their_sampled_ids(world, tiny_model, smollm_tokenizer, monkeypatch):
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    team = HierarchicalTeam(BM25(world.corpus), lm=lm, max_steps=3, max_rounds=1, max_subtasks=1,
                            max_searcher_turns=1)  # fmt: skip
    for role in team.roles:
        team.lm_kwargs[role] = {**team.lm_kwargs.get(role, {}), "max_tokens": 8}
    trajectory, sampled = _sampled_run(team, world.train[0].question, monkeypatch)
    samples = [s for role in ("leader", "searcher") for s in role_samples(trajectory, lm, role, lambda r: r)]
    samples += answerer_samples(trajectory, lm, lambda r: r)
    _check(samples, sampled)
