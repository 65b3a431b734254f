"""MultiAgent-OPD (arXiv 2610.23234): hand-checked Stage II advantages (Eq. 5 Searcher tokens, role-normalized Leader
and Answerer rewards with the KL toward the Teacher, the outcome-only ablation), the per-token KL and the roles that
carry it, all-equal groups skipped, the normalization setting, the Searchers' share of the advantage mass, masking,
Answerer candidates, the avg@4 / pass@4 evaluation, the Teacher check before Stage II, and both stages on a tiny
random Llama (the Teacher frozen, the student moved; per-role adapters)."""

from __future__ import annotations

import itertools
import json
import logging
from types import SimpleNamespace

import dspy
import pytest
import torch

from rolecall.data.synthetic import synthetic_world
from rolecall.errors import ConfigError
from rolecall.lm import LocalLM
from rolecall.optimizers import OPD, OPDConfig
from rolecall.optimizers.core.trainer import AdapterTrainer
from rolecall.optimizers.mapgrpo_roles import GoldRecord, as_gold_record
from rolecall.optimizers.opd import StageTwoStats, advantage_metrics, evaluate_avg_pass_at_k
from rolecall.optimizers.opd_teacher import OPDTeacher, TeamRollouts, answerer_samples, load_teacher, role_samples
from rolecall.optimizers.rewards.team import (
    TeamRewards,
    hierarchical_team_rewards,
    kl_penalized_reward,
    role_advantages,
    teacher_kl,
)
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.programs.team.base import TeamProgram
from rolecall.programs.team.program import CascadedTeam, HierarchicalTeam
from rolecall.retrievers.bm25 import BM25

QUESTION = "Where was the director of Film X born?"
PASSAGE = "Film X is a 1999 film directed by Ada Quell, who was born in Varn."
SEARCH = "[[ ## action ## ]]\nsearch\n\n[[ ## content ## ]]\nFilm X director"


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=0, n_train=4, n_dev=1, n_test=1)


def _role(t: Trajectory, role: str, user: str, completion: str, **meta) -> Step:
    return t.add(Step("role", role, messages=[{"role": "system", "content": f"You are the {role}."},
                                              {"role": "user", "content": user}],
                      completion=completion, meta=meta))  # fmt: skip


def _team_run(candidates=("Varn",), *, tag: str = "", masked: bool = False) -> Trajectory:
    """A HierarchicalTeam-shaped run: the Leader delegates, one Searcher searches then reports, the Leader answers,
    the Answerer writes ``candidates`` in one call. ``masked`` marks the query of the search turn as not the
    Searcher's own (``meta["masked_spans"]``), to check masked tokens get no advantage."""
    t = Trajectory(question=QUESTION)
    _role(t, "leader", QUESTION, f"[[ ## action ## ]]\ndelegate{tag}", round=1, env_step=1, action="delegate",
          valid=True)  # fmt: skip
    spans = [[SEARCH.index("Film X"), len(SEARCH)]] if masked else []
    _role(t, "searcher", f"subtask: {QUESTION}\nnotes: none", SEARCH, searcher=1, env_step=2, action="search",
          valid=True, masked_spans=spans)  # fmt: skip
    t.add(Step("retrieval", "retrieve", inputs={"query": "Film X director", "k": 3}, outputs={"passage_ids": ["x"]}))
    _role(t, "searcher", f"subtask: {QUESTION}\nnotes: {PASSAGE}", f"[[ ## action ## ]]\nreport{tag}\n\n"
          "[[ ## content ## ]]\nborn in Varn", searcher=1, env_step=3, action="report", valid=True)  # fmt: skip
    _role(t, "leader", f"{QUESTION}\nreports: [1] born in Varn", "[[ ## action ## ]]\nanswer", round=2, env_step=4,
          action="answer", valid=True)  # fmt: skip
    texts = [f"[[ ## answer ## ]]\n{c}" for c in candidates]
    step = _role(t, "answerer", f"{QUESTION}\nreports: [1] born in Varn", texts[0], candidates=list(candidates))
    if len(texts) > 1:
        step.meta["completions"] = texts
    return t


def _logps(samples, value):
    """Stand-in log-probs: ``value(t)`` on each loss token, 0 on masked ones (as completion_logps returns them)."""
    return {id(s): torch.tensor([value(t) * m for t, m in enumerate(s.loss_mask)]) for s in samples}


def _optimizer(tokenizer, scored_calls=None, **kw) -> OPD:
    """An OPD whose Stage II scoring runs on hand-made runs: old log π = -1 per token, log π_T = -0.5 (t + 1)."""
    optimizer = OPD(**kw)
    optimizer.program = SimpleNamespace(lm=tokenizer, adapter_name=lambda role: "team")

    def scores(samples):
        if scored_calls is not None:
            scored_calls.append(list(samples))
        return _logps(samples, lambda t: -1.0), _logps(samples, lambda t: -0.5 * (t + 1))

    optimizer.scores = scores
    return optimizer


def _by_role(samples):
    out = {"leader": [], "searcher": [], "answerer": []}
    for s in samples:
        out[s.role].append(s)
    return out


def _score(optimizer, runs, scored):
    """``score`` of one step on hand-made runs of one question, rollout i getting the rewards ``scored[i]``."""
    rewards = iter(scored)
    optimizer.team_rewards = lambda trajectory, record: next(rewards)
    rollouts = TeamRollouts(batch=[GoldRecord(question=QUESTION, answers=["Varn"])],
                            groups=[[SimpleNamespace(trajectory=t) for t in runs]])  # fmt: skip
    return optimizer.score(SimpleNamespace(stage=SimpleNamespace(adapter="team")), rollouts)


def _stand_in_kl(samples) -> float:
    """The per-token KL of the stand-in log-probs (log π - log π_T = -1 + 0.5 (t + 1)), pooled over ``samples``'s
    loss tokens."""
    terms = [-1.0 + 0.5 * (t + 1) for s in samples for t, m in enumerate(s.loss_mask) if m]
    return sum(terms) / len(terms)


def _with_leader(scored, leaders):
    return [TeamRewards(**{**vars(r), "leader": leader}) for r, leader in zip(scored, leaders, strict=True)]


# ---------------------------------------------------------------------------------------------- config
def test_config_defaults_are_the_papers_and_bad_values_fail():
    """The paper's values, except β = 1.0, the per-token KL on the Answerer only, and the Teacher check (see module)."""
    cfg = OPDConfig()
    assert (cfg.group_size, cfg.answer_candidates, cfg.kl_coef, cfg.outcome_only) == (5, 5, 1e-3, False)
    assert (cfg.teacher_adapter, cfg.train_teacher, cfg.weights.invalid_reward, cfg.weights.tool_cap) == (
        "opd_teacher", True, -1.0, 6)  # fmt: skip
    assert (cfg.beta, cfg.kl_reduction, cfg.kl_roles, cfg.advantage_scale, cfg.teacher_check_questions) == (
        1.0, "mean", ("answerer",), "std", 50)  # fmt: skip
    with pytest.raises(ConfigError, match="group_size"):
        OPD(group_size=1)
    with pytest.raises(ConfigError, match="kl_estimator"):
        OPD(kl_estimator="k2")
    with pytest.raises(ConfigError, match="teacher_adapter"):
        OPD(teacher_adapter=" ")
    with pytest.raises(ConfigError, match="teacher_minutes"):
        OPD(teacher_minutes=0)
    with pytest.raises(ConfigError, match="train_teacher=True"):
        OPD(teacher=object(), train_teacher=False)
    assert OPD(OPDConfig(steps=3), group_size=4).opd_config.steps == 3  # overrides keep the config


def test_config_checks_the_new_stage_two_settings():
    """kl_roles names only roles whose reward can carry the KL (the message names the bad one and the valid ones);
    kl_reduction, advantage_scale and teacher_check_questions are checked before any model loads."""
    assert OPDConfig(kl_roles=["leader", "answerer"]).kl_roles == ("leader", "answerer")  # the paper's, as a tuple
    assert OPDConfig(kl_roles=()).kl_roles == () and OPDConfig(teacher_check_questions=0).teacher_check_questions == 0
    with pytest.raises(ConfigError, match=r"kl_roles has 'searcher'; valid roles are \['leader', 'answerer'\]"):
        OPD(kl_roles=("answerer", "searcher"))
    with pytest.raises(ConfigError, match="kl_roles"):
        OPD(kl_roles="leader")
    with pytest.raises(ConfigError, match="kl_reduction"):
        OPD(kl_reduction="max")
    with pytest.raises(ConfigError, match="advantage_scale"):
        OPD(advantage_scale="mad")
    with pytest.raises(ConfigError, match="teacher_check_questions"):
        OPD(teacher_check_questions=-1)


# ---------------------------------------------------------------------------------------------- samples
def test_answerer_candidates_become_one_sample_each(smollm_tokenizer):
    """One call with J samples; J calls of one sample each (``attempts``), matched to the candidates by their answer
    whatever the recorded order; a candidate the JSON fallback wrote; and an unreadable candidate."""
    team = lambda role: "team"  # noqa: E731
    one_call = answerer_samples(_team_run(("Varn", "Oslo", "Lyon")), smollm_tokenizer, team)
    assert [smollm_tokenizer.decode(s.completion_ids).split("\n")[1] for s in one_call] == ["Varn", "Oslo", "Lyon"]
    assert len({tuple(s.prompt_ids) for s in one_call}) == 1 and all(s.role == "answerer" for s in one_call)

    t = _team_run(("Varn", "Oslo"))
    step = t.role_steps("answerer")[-1]
    json_messages = [{"role": "user", "content": "answer in JSON"}]
    chat = [{"messages": step.messages, "completions": [f"[[ ## answer ## ]]\n{c}"]} for c in ("Varn", "Oslo")]
    step.meta["attempts"] = [*chat, {"messages": json_messages, "completions": ['{"a": 1}']}]
    separate = answerer_samples(t, smollm_tokenizer, team)
    assert [smollm_tokenizer.decode(s.completion_ids).split("\n")[1] for s in separate] == ["Varn", "Oslo"]

    chat.reverse()  # concurrent one-sample calls are recorded in start order, not candidate order
    step.meta["attempts"] = [*chat, {"messages": json_messages, "completions": ['{"a": 1}']}]
    aligned = answerer_samples(t, smollm_tokenizer, team)
    assert [smollm_tokenizer.decode(s.completion_ids).split("\n")[1] for s in aligned] == ["Varn", "Oslo"]

    step.meta["candidates"] = ["Lyon"]  # the JSON fallback wrote the one parsed candidate
    step.meta["attempts"][-1]["completions"] = ['{"answer": "Lyon"}']
    (fallback,) = answerer_samples(t, smollm_tokenizer, team)
    assert "Lyon" in smollm_tokenizer.decode(fallback.completion_ids)
    assert smollm_tokenizer.decode(fallback.prompt_ids).count("answer in JSON") == 1

    step.meta["candidates"] = [None]  # every sample failed: the program's one recovered candidate is unreadable
    step.meta["attempts"][0]["completions"] = ["no sections at all"]
    (failed,) = answerer_samples(t, smollm_tokenizer, team)
    assert "no sections at all" in smollm_tokenizer.decode(failed.completion_ids)


def test_retrieved_passages_carry_no_loss(smollm_tokenizer):
    """A Searcher turn is a separate call: the passages of its earlier search are in its prompt (no loss), never in
    a completion, and every token the Searcher wrote keeps its loss."""
    samples = role_samples(_team_run(), smollm_tokenizer, "searcher", lambda role: "team")
    assert len(samples) == 2
    assert PASSAGE in smollm_tokenizer.decode(samples[1].prompt_ids)
    assert all(PASSAGE not in smollm_tokenizer.decode(s.completion_ids) for s in samples)
    assert all(s.loss_mask == [1] * len(s.completion_ids) for s in samples)


# ---------------------------------------------------------------------------------------------- Stage II advantages
def test_searcher_tokens_get_eq5_advantages(smollm_tokenizer):
    """Â_t = β M_t (log π_T - log π_old) with the paper's β = 0.01, log π_old = -1 and log π_T = -0.5 (t + 1): tokens
    0, 1, 2 get 0.01 * (0.5, 0, -0.5) = (0.005, 0, -0.005); the masked query tokens of the search turn get exactly 0.
    Searcher samples carry per-token advantages only (no scalar), whatever the team reward."""
    optimizer = _optimizer(smollm_tokenizer, kl_coef=0.0, beta=0.01)
    runs = [_team_run(masked=True), _team_run(tag=" now", masked=True)]
    scored = [TeamRewards(outcome=o, leader=o) for o in (1.0, 0.0)]
    searchers = _by_role(optimizer.group_samples("team", runs, scored))["searcher"]
    assert len(searchers) == 4 and all(s.advantage is None for s in searchers)
    search = searchers[0]
    torch.testing.assert_close(torch.tensor(search.token_advantages[:3]), torch.tensor([0.005, 0.0, -0.005]))
    mask = torch.tensor(search.loss_mask)
    assert 0 < int(mask.sum()) < len(mask)  # the query is masked, the action is not
    expected = [0.01 * (-0.5 * (t + 1) + 1.0) * m for t, m in enumerate(search.loss_mask)]
    torch.testing.assert_close(torch.tensor(search.token_advantages), torch.tensor(expected))
    assert all(a == 0.0 for a, m in zip(search.token_advantages, search.loss_mask, strict=True) if m == 0)


def test_leader_and_answerer_advantages_are_role_normalized(smollm_tokenizer):
    """Leader, over the G = 2 rollouts: R_L = [1, 0], mean 0.5, Bessel std 0.7071, Â = ±0.5 / (0.7071 + 1e-4), the
    same on both Leader turns of a rollout. Answerer, within its request: c = [1, 0, 0] for ("Varn", "Oslo",
    "Lyon"), mean 1/3, std sqrt(1/3) = 0.57735, Â = (2/3, -1/3, -1/3) / (0.57735 + 1e-4)."""
    optimizer = _optimizer(smollm_tokenizer, kl_coef=0.0)
    runs = [_team_run(("Varn", "Oslo", "Lyon")), _team_run(("Oslo",), tag=" now")]
    gold = ["Varn"]
    scored = [hierarchical_team_rewards(t, gold) for t in runs]
    scored = [TeamRewards(**{**vars(r), "leader": leader}) for r, leader in zip(scored, (1.0, 0.0), strict=True)]
    by_role = _by_role(optimizer.group_samples("team", runs, scored))
    a = 0.5 / (0.5**0.5 + 1e-4)
    assert [s.advantage for s in by_role["leader"]] == pytest.approx([a, a, -a, -a], abs=1e-5)
    std = (1 / 3) ** 0.5
    expected = [(2 / 3) / (std + 1e-4), (-1 / 3) / (std + 1e-4), (-1 / 3) / (std + 1e-4)]
    assert [s.advantage for s in by_role["answerer"]] == pytest.approx(expected, abs=1e-5)  # one-candidate run: none
    assert all(s.token_advantages is None for s in by_role["leader"] + by_role["answerer"])


def test_the_papers_summed_kl_toward_the_teacher_enters_the_leader_reward(smollm_tokenizer):
    """The paper's setting (KL on the Leader, summed), KL coefficient 0.1 (k1): each Leader turn of n tokens adds
    Σ_t (log π - log π_T) = Σ_t (-1 + 0.5 (t + 1)); the rollout whose Leader wrote more tokens pays more and gets the
    negative advantage although its task reward is higher (R_L = 0.5 against 0.6)."""
    optimizer = _optimizer(smollm_tokenizer, kl_coef=0.1, kl_roles=("leader", "answerer"), kl_reduction="sum")
    runs = [_team_run(), _team_run(tag=" and then much longer text")]
    scored = [TeamRewards(outcome=0.0, leader=leader) for leader in (0.5, 0.6)]
    stats = StageTwoStats()
    leaders = _by_role(optimizer.group_samples("team", runs, scored, stats))["leader"]
    lengths = [[len(s.completion_ids) for s in role_samples(t, smollm_tokenizer, "leader", lambda r: "team")]
               for t in runs]  # fmt: skip
    kl = [sum(sum(-1.0 + 0.5 * (t + 1) for t in range(n)) for n in ns) for ns in lengths]
    r = [leader - 0.1 * k for leader, k in zip((0.5, 0.6), kl, strict=True)]
    a = role_advantages(r).tolist()
    assert [s.advantage for s in leaders] == pytest.approx([a[0], a[0], a[1], a[1]], abs=1e-5)
    assert a[0] > 0 > a[1]
    assert stats.kl == pytest.approx(kl)  # one KL̂ per rollout: its Leader's turns together


def test_outcome_only_gives_searchers_the_team_outcome(smollm_tokenizer):
    """The ablation: Searcher turns carry Â = (R_EM - mean) / (std + ε) of their rollout, no Teacher signal; with
    no KL either, nothing is scored."""
    calls: list = []
    optimizer = _optimizer(smollm_tokenizer, calls, kl_coef=0.0, outcome_only=True)
    runs = [_team_run(), _team_run(tag=" now")]
    scored = [TeamRewards(outcome=o, leader=0.5) for o in (1.0, 0.0)]
    searchers = _by_role(optimizer.group_samples("team", runs, scored))["searcher"]
    a = 0.5 / (0.5**0.5 + 1e-4)
    assert [s.advantage for s in searchers] == pytest.approx([a, a, -a, -a], abs=1e-5)
    assert all(s.token_advantages is None for s in searchers) and calls == [[]]


def test_per_role_stage_keeps_only_its_adapters_samples(smollm_tokenizer):
    optimizer = _optimizer(smollm_tokenizer, kl_coef=0.0)
    optimizer.program = SimpleNamespace(lm=smollm_tokenizer, adapter_name=lambda role: role)
    runs = [_team_run(("Varn", "Oslo")), _team_run(("Oslo", "Oslo"), tag=" now")]
    scored = [hierarchical_team_rewards(t, ["Varn"]) for t in runs]
    samples = optimizer.group_samples("searcher", runs, scored)
    assert samples and {s.role for s in samples} == {"searcher"} and {s.adapter for s in samples} == {"searcher"}


# ---------------------------------------------------------------------------------------------- KL, skips, scale
def test_the_kl_is_a_per_token_mean_by_default_and_the_papers_sum_on_request(smollm_tokenizer):
    """Hand case: log π = [-1, -2, -3], log π_T = [-2, -2.5, -9], the third token masked: k1 = [1, 0.5], sum 1.5,
    mean 0.75, so R = 1 - 0.1 KL̂ = 0.925 (mean) or 0.85 (sum). In Stage II each Answerer candidate (c = [1, 0],
    n_1 != n_2 tokens) pays 0.1 KL̂ with KL̂ = mean_t (-1 + 0.5 (t + 1)) by default, n times that with ``"sum"``; with
    advantage_scale="none", Â_1 = -Â_2 = ((1 - 0.1 KL̂_1) - (0 - 0.1 KL̂_2)) / 2."""
    logps, teacher, mask = torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([-2.0, -2.5, -9.0]), torch.tensor([1, 1, 0])
    assert teacher_kl(logps, teacher, mask).item() == pytest.approx(1.5)  # the function's default: the paper's sum
    assert teacher_kl(logps, teacher, mask, reduction="mean").item() == pytest.approx(0.75)
    assert kl_penalized_reward(1.0, logps, teacher, mask, kl_coef=0.1, reduction="mean").item() == pytest.approx(0.925)
    assert kl_penalized_reward(1.0, logps, teacher, mask, kl_coef=0.1, reduction="sum").item() == pytest.approx(0.85)
    with pytest.raises(ConfigError, match="reduction"):
        teacher_kl(logps, teacher, mask, reduction="max")  # type: ignore[arg-type]

    runs = [_team_run(("Varn", "Oslo is the answer here")), _team_run(("Oslo",), tag=" now")]
    scored = [hierarchical_team_rewards(t, ["Varn"]) for t in runs]
    candidates = answerer_samples(runs[0], smollm_tokenizer, lambda role: "team")
    assert len({c.num_loss_tokens for c in candidates}) == 2
    for reduction in ("mean", "sum"):
        optimizer = _optimizer(smollm_tokenizer, kl_coef=0.1, advantage_scale="none", kl_reduction=reduction)
        stats = StageTwoStats()
        answerers = _by_role(optimizer.group_samples("team", runs, scored, stats))["answerer"]
        kl = [_stand_in_kl([c]) * (c.num_loss_tokens if reduction == "sum" else 1) for c in candidates]
        a = ((1.0 - 0.1 * kl[0]) - (0.0 - 0.1 * kl[1])) / 2
        assert [s.advantage for s in answerers] == pytest.approx([a, -a], abs=1e-5), reduction
        assert stats.kl == pytest.approx(kl)  # one KL̂ per candidate; the one-candidate request is skipped


def test_the_leader_carries_no_kl_by_default_and_the_papers_with_kl_roles(smollm_tokenizer):
    """R_L = [1, 0] with Leaders of different lengths, KL coefficient 0.1, advantage_scale="none". By default (the
    Teacher never played the Leader) Â_L = ±0.5 exactly and no Leader token is scored; with kl_roles=("leader",
    "answerer") rollout i's R_L pays 0.1 KL̂_i, the per-token KL over all its Leader tokens, both turns pooled
    (token-weighted), and ``kl/teacher/leader`` is the per-token KL over every Leader token of the step."""
    runs = [_team_run(), _team_run(tag=" and then much longer text")]
    scored = [TeamRewards(outcome=o, leader=o) for o in (1.0, 0.0)]
    calls: list = []
    stats = StageTwoStats()
    optimizer = _optimizer(smollm_tokenizer, calls, kl_coef=0.1, advantage_scale="none")
    leaders = _by_role(optimizer.group_samples("team", runs, scored, stats))["leader"]
    assert [s.advantage for s in leaders] == pytest.approx([0.5, 0.5, -0.5, -0.5], abs=1e-6)
    assert all(s.role != "leader" for s in calls[0]) and "kl/teacher/leader" not in stats.metrics()

    stats = StageTwoStats()
    optimizer = _optimizer(smollm_tokenizer, kl_coef=0.1, advantage_scale="none", kl_roles=("leader", "answerer"))
    leaders = _by_role(optimizer.group_samples("team", runs, scored, stats))["leader"]
    turns = [role_samples(t, smollm_tokenizer, "leader", lambda r: "team") for t in runs]
    kl = [_stand_in_kl(ts) for ts in turns]
    assert kl[0] != pytest.approx(sum(_stand_in_kl([s]) for s in turns[0]) / 2)  # pooled, not a mean of turn means
    r = [1.0 - 0.1 * kl[0], 0.0 - 0.1 * kl[1]]
    a = [r[0] - sum(r) / 2, r[1] - sum(r) / 2]
    assert [s.advantage for s in leaders] == pytest.approx([a[0], a[0], a[1], a[1]], abs=1e-5)
    assert stats.kl == pytest.approx(kl)
    assert stats.metrics()["kl/teacher/leader"] == pytest.approx(_stand_in_kl(turns[0] + turns[1]))


def test_a_group_without_task_signal_gives_no_samples_whatever_its_kl(smollm_tokenizer):
    """R_L = 0.5 in both rollouts, Leaders of different lengths, the paper's Leader KL on: the KL's tiny differences
    would be normalized into Â = ±0.707; instead the group gives no Leader samples, is not scored, and is counted.
    Likewise an Answerer request whose candidates all miss (c = [0, 0]) gives no Answerer samples. A group with a
    spread in R_L (0.5 against 0.6) trains."""
    calls: list = []
    optimizer = _optimizer(smollm_tokenizer, calls, kl_coef=0.1, kl_roles=("leader", "answerer"))
    runs = [_team_run(("Oslo", "Lyon")), _team_run(("Oslo", "Lyon it is"), tag=" and then much longer text")]
    scored = [hierarchical_team_rewards(t, ["Varn"]) for t in runs]
    samples, metrics = _score(optimizer, runs, _with_leader(scored, (0.5, 0.5)))
    by_role = _by_role(samples)
    assert not by_role["leader"] and not by_role["answerer"] and len(by_role["searcher"]) == 4
    assert {s.role for s in calls[0]} == {"searcher"}  # neither skipped group is scored
    assert (metrics["groups/total"], metrics["groups/skipped"], metrics["groups/informative"]) == (1.0, 1.0, 0.0)
    assert (metrics["answerer/requests"], metrics["answerer/skipped_requests"]) == (2.0, 2.0)
    assert "kl/teacher" not in metrics and metrics["samples/leader"] == 0.0

    samples, metrics = _score(_optimizer(smollm_tokenizer, kl_coef=0.1, kl_roles=("leader", "answerer")), runs,
                              _with_leader(scored, (0.5, 0.6)))  # fmt: skip
    assert len(_by_role(samples)["leader"]) == 4 and (metrics["groups/skipped"], metrics["groups/informative"]) == (
        0.0, 1.0)  # fmt: skip
    assert "kl/teacher" in metrics and "kl/teacher/leader" in metrics


def test_advantage_scale_none_gives_r_minus_the_group_mean(smollm_tokenizer):
    """kl_coef 0, advantage_scale="none": Leader R_L = [1, 0.25] -> Â = ±0.375; Answerer c = [1, 0, 0] -> (2/3, -1/3,
    -1/3); outcome-only Searchers R_EM = [1, 0] -> ±0.5 (Eq. 1 would give ±0.7070, (1.1545, -0.5772, -0.5772) and
    ±0.7070)."""
    runs = [_team_run(("Varn", "Oslo", "Lyon")), _team_run(("Oslo",), tag=" now")]
    scored = _with_leader([hierarchical_team_rewards(t, ["Varn"]) for t in runs], (1.0, 0.25))
    by_role = _by_role(_optimizer(smollm_tokenizer, kl_coef=0.0, advantage_scale="none").group_samples(
        "team", runs, scored))  # fmt: skip
    assert [s.advantage for s in by_role["leader"]] == pytest.approx([0.375, 0.375, -0.375, -0.375])
    assert [s.advantage for s in by_role["answerer"]] == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    outcome = _optimizer(smollm_tokenizer, kl_coef=0.0, advantage_scale="none", outcome_only=True)
    searchers = _by_role(outcome.group_samples("team", runs, scored))["searcher"]
    assert [s.advantage for s in searchers] == pytest.approx([0.5, 0.5, -0.5, -0.5])


def test_the_searchers_share_of_the_advantage_mass_is_logged(smollm_tokenizer):
    """One hand-built step: R_L = [1, 0] (Â_L = ±a, a = 0.5 / (0.7071 + 1e-4)), c = [1, 0, 0] in one request
    (Â_A = (2/3, -1/3, -1/3) / (0.57735 + 1e-4)), and log π_T = log π_old - 0.5 on every token, so each Searcher token
    gets |Â_t| = 0.5 β and every Answerer candidate the same per-token KL (no change to its advantages).
    ``advantage/searcher_share`` = Σ over Searcher tokens of |A_t| / Σ over all trained tokens of |A_t| (a scalar Â
    counts once per loss token); ``advantage/abs_mean`` = Σ |A_t| / #tokens. With the default β = 1.0 distillation
    has a real share of the step; with the paper's β = 0.01 it is about 1%."""
    runs = [_team_run(("Varn", "Oslo", "Lyon")), _team_run(("Oslo",), tag=" now")]
    scored = _with_leader([hierarchical_team_rewards(t, ["Varn"]) for t in runs], (1.0, 0.0))
    tokens = {role: [sum(s.num_loss_tokens for s in role_samples(t, smollm_tokenizer, role, lambda r: "team"))
                     for t in runs] for role in ("leader", "searcher")}  # fmt: skip
    candidates = [c.num_loss_tokens for c in answerer_samples(runs[0], smollm_tokenizer, lambda role: "team")]
    a_leader = 0.5 / (0.5**0.5 + 1e-4) * sum(tokens["leader"])
    a_answerer = sum(abs(c) * n for c, n in zip((2 / 3, -1 / 3, -1 / 3), candidates, strict=True)) / (
        (1 / 3) ** 0.5 + 1e-4)  # fmt: skip
    shares = {}
    for beta in (1.0, 0.01):
        optimizer = _optimizer(smollm_tokenizer, **({} if beta == 1.0 else {"beta": beta}))
        optimizer.scores = lambda samples: (_logps(samples, lambda t: -1.0), _logps(samples, lambda t: -1.5))
        samples, metrics = _score(optimizer, runs, scored)
        searcher = 0.5 * beta * sum(tokens["searcher"])
        total = searcher + a_leader + a_answerer
        trained = sum(s.num_loss_tokens for s in samples)
        assert trained == sum(tokens["leader"]) + sum(tokens["searcher"]) + sum(candidates)
        assert metrics["advantage/searcher_share"] == pytest.approx(searcher / total, rel=1e-4)
        assert metrics["advantage/abs_mean"] == pytest.approx(total / trained, rel=1e-4)
        shares[beta] = metrics["advantage/searcher_share"]
    assert shares[1.0] > 0.1 and shares[0.01] < 0.02
    assert advantage_metrics([]) == {"advantage/abs_mean": 0.0, "advantage/searcher_share": 0.0}  # nothing trains


# ---------------------------------------------------------------------------------------------- evaluation
class _Canned:
    """A program answering from a fixed list in call order (one thread), recording its sampling settings."""

    def __init__(self, answers):
        self.answers, self.lm_kwargs, self.seen = iter(answers), {"answerer": {"max_tokens": 32}}, []
        self.roles = {"leader": None, "answerer": None}

    def __call__(self, question):
        self.seen.append(dict(self.lm_kwargs["answerer"]))
        return dspy.Prediction(answer=next(self.answers), trajectory=Trajectory())


def test_avg_and_pass_at_4_with_bootstrap_intervals():
    """Question 1: 3 of 4 runs right (avg 0.75, pass 1); question 2: none (0, 0): avg@4 0.375, pass@4 0.5."""
    program = _Canned(["Varn", "Oslo", "varn.", "Varn", "x", "y", "z", "w"])
    examples = [GoldRecord(question="q1", answers=["Varn"]), GoldRecord(question="q2", answers=["Lyon"])]
    result = evaluate_avg_pass_at_k(program, examples, k=4, num_threads=1, n_boot=200)
    assert (result["avg@4"], result["pass@4"], result["questions"], result["k"]) == (0.375, 0.5, 2.0, 4.0)
    assert result["avg@4/lo"] <= 0.375 <= result["avg@4/hi"] and result["pass@4/lo"] <= 0.5 <= result["pass@4/hi"]
    assert all(s["temperature"] == 0.6 and s["top_p"] == 0.95 for s in program.seen)
    assert program.lm_kwargs == {"answerer": {"max_tokens": 32}}  # put back
    with pytest.raises(ValueError, match="k must be"):
        evaluate_avg_pass_at_k(program, examples, k=0)


# ---------------------------------------------------------------------------------------------- errors
def test_only_the_hierarchical_team_is_trained(world, smollm_tokenizer):
    lm = dspy.utils.DummyLM([{"answer": "x"}])
    with pytest.raises(ConfigError, match="applies to the hierarchical_team program"):
        OPD().compile(CascadedTeam(BM25(world.corpus), lm=lm), trainset=world.train)
    team = HierarchicalTeam(BM25(world.corpus), lm=lm)
    with pytest.raises(ConfigError, match="one of the student's adapters"):
        OPD(teacher_adapter="team").compile(team, trainset=world.train)


def test_a_missing_teacher_adapter_says_how_to_load_it(world, tiny_model, smollm_tokenizer):
    team = HierarchicalTeam(BM25(world.corpus), lm=LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8))
    with pytest.raises(ConfigError, match="train_teacher=False needs the Teacher adapter 'opd_teacher'"):
        OPD(train_teacher=False).compile(team, trainset=world.train)


# ---------------------------------------------------------------------------------------------- end to end
def _team(world, tiny_model, tokenizer, **options) -> tuple[HierarchicalTeam, LocalLM]:
    lm = LocalLM(tiny_model, tokenizer=tokenizer, max_tokens=8)
    team = HierarchicalTeam(BM25(world.corpus), lm=lm, max_steps=3, max_rounds=1, max_subtasks=1,
                            max_searcher_turns=1, **options)  # fmt: skip
    for role in team.roles:
        team.lm_kwargs[role] = {**team.lm_kwargs.get(role, {}), "max_tokens": 8}
    return team, lm


def _weights(lm, adapter):
    return {n: p.detach().clone() for n, p in lm.hf_model.named_parameters() if f".{adapter}." in n}


def _changed(after, before):
    return any(not torch.equal(after[n], before[n]) for n in after)


def _spread(monkeypatch):
    """A random model never answers right (every reward alike): each rollout gets the next of a cycle of rewards."""
    bonus = itertools.cycle([0.0, 1.0, 0.5, 0.25])

    def rewards(self, trajectory, record):
        b = next(bonus)
        return TeamRewards(outcome=b, answerer=[b, 1.0 - b], searcher=b, leader=b)

    monkeypatch.setattr(OPDTeacher, "team_rewards", rewards)
    monkeypatch.setattr(OPD, "team_rewards", rewards)


def _spy(monkeypatch):
    trained: list[list] = []
    real = AdapterTrainer.step

    def step(self, samples):
        trained.append((self.adapter, self.config.loss, list(samples)))
        return real(self, samples)

    monkeypatch.setattr(AdapterTrainer, "step", step)
    return trained


def test_stage_one_freezes_the_teacher_and_stage_two_moves_the_team(world, tiny_model, smollm_tokenizer, tmp_path,
                                                                    monkeypatch):  # fmt: skip
    team, lm = _team(world, tiny_model, smollm_tokenizer)
    team(question=world.train[0].question)  # creates the team adapter
    _spread(monkeypatch)
    trained = _spy(monkeypatch)
    frozen = {}
    real_stage_one = OPD.stage_one

    def stage_one(self, student, trainset):
        frozen["team"] = _weights(lm, "team")
        real_stage_one(self, student, trainset)
        frozen["teacher"] = _weights(lm, "opd_teacher")
        frozen["team_after"] = _weights(lm, "team")

    monkeypatch.setattr(OPD, "stage_one", stage_one)
    optimizer = OPD(teacher_steps=1, steps=2, group_size=2, questions_per_step=1, answer_candidates=2,
                    learning_rate=1e-2, num_threads=4, output_dir=str(tmp_path / "run"), teacher_check_questions=0,
                    show_progress=False)  # fmt: skip
    assert team.compile(optimizer=optimizer, trainset=world.train) is team
    # Stage I trained the Teacher (LoRA B starts at 0) and left the student alone
    assert any(float(p.abs().sum()) > 0 for n, p in frozen["teacher"].items() if "lora_B" in n)
    assert not _changed(frozen["team_after"], frozen["team"])
    # Stage II moved the student, never the Teacher
    assert _changed(_weights(lm, "team"), frozen["team"])
    assert not _changed(_weights(lm, "opd_teacher"), frozen["teacher"])
    stage_one, *stage_two = trained
    assert stage_one[:2] == ("opd_teacher", "grpo") and {s.role for s in stage_one[2]} <= {"searcher", "answerer"}
    assert len(stage_two) == 2 and all(t[:2] == ("team", "token_advantage") for t in stage_two)
    for _, _, samples in stage_two:
        roles = _by_role(samples)
        assert roles["searcher"] and all(s.token_advantages is not None for s in roles["searcher"])
        assert roles["leader"] and all(s.advantage is not None for s in roles["leader"])
    log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["step"]) for r in log] == [("team", 1), ("team", 2)]
    for key in ("reward/leader", "reward/outcome", "kl/teacher/searcher", "samples/searcher",
                "groups/informative", "advantage/searcher_share", "loss/policy", "grad/norm"):  # fmt: skip
        assert all(key in r for r in log), key
    assert all("kl/teacher/leader" not in r for r in log)  # the Leader is not scored: not a kl_roles role
    assert (tmp_path / "run" / "teacher" / "metrics.jsonl").is_file()
    assert optimizer.teacher_check is None and not (tmp_path / "run" / "teacher_check.json").exists()
    assert team.lm_kwargs["answerer"] == {"max_tokens": 8} and team.answer_candidates == 1  # put back


def test_per_role_mode_trains_three_adapters(world, tiny_model, smollm_tokenizer, monkeypatch):
    """``parameter_sharing="per_role"`` with an existing (perturbed) Teacher: one stage per adapter, each moved.
    The random Answerer never parses, so two candidates are forced to give its request a group."""
    team, lm = _team(world, tiny_model, smollm_tokenizer, parameter_sharing="per_role")
    team(question=world.train[0].question)
    backend = lm.backend
    backend.ensure_adapter("opd_teacher")
    with torch.no_grad():
        for name, p in lm.hf_model.named_parameters():
            if ".opd_teacher." in name and "lora_B" in name:
                p.normal_(0.0, 0.1)
    before = {a: _weights(lm, a) for a in ("leader", "searcher", "answerer", "opd_teacher")}
    _spread(monkeypatch)
    monkeypatch.setattr(TeamProgram, "_candidates", lambda self, pred, step, trajectory: ["a", "b"])
    optimizer = OPD(train_teacher=False, steps=1, group_size=2, questions_per_step=1, answer_candidates=2,
                    learning_rate=1e-2, num_threads=4, teacher_check_questions=0, show_progress=False)  # fmt: skip
    team.compile(optimizer=optimizer, trainset=world.train)
    assert sorted(r["stage"] for r in optimizer.history) == ["answerer", "leader", "searcher"]
    for adapter in ("leader", "searcher", "answerer"):
        assert _changed(_weights(lm, adapter), before[adapter]), adapter
    assert not _changed(_weights(lm, "opd_teacher"), before["opd_teacher"])


def test_a_passed_in_teacher_is_copied_frozen_and_the_student_starts_from_the_base(world, tiny_model, smollm_tokenizer,
                                                                                    monkeypatch):  # fmt: skip
    """A cascade trained on the student's own adapter name: Stage I's result is copied into ``teacher_adapter``
    (equal weights), and the student's adapter of that name is put back to the identity (LoRA B = 0) for Stage II."""
    team, lm = _team(world, tiny_model, smollm_tokenizer)
    cascade = CascadedTeam(BM25(world.corpus), lm=lm, max_steps=2)
    for role in cascade.roles:
        cascade.lm_kwargs[role] = {**cascade.lm_kwargs.get(role, {}), "max_tokens": 8}
    _spread(monkeypatch)
    copied = {}
    real_copy = type(lm.backend).copy_adapter

    def copy_adapter(self, source, target):
        copied[(source, target)] = _weights(lm, source)
        real_copy(self, source, target)

    monkeypatch.setattr(type(lm.backend), "copy_adapter", copy_adapter)
    checked = []
    real_program = OPD.teacher_check_program
    monkeypatch.setattr(OPD, "teacher_check_program",
                        lambda self, student: checked.append(real_program(self, student)) or checked[-1])  # fmt: skip
    optimizer = OPD(teacher=cascade, teacher_steps=1, steps=0, group_size=2, questions_per_step=1,
                    answer_candidates=2, learning_rate=1e-2, num_threads=4, show_progress=False)  # fmt: skip
    team.compile(optimizer=optimizer, trainset=world.train)
    # the Teacher check ran the trained cascade (its own max_steps) on the frozen copy, not on the reset "team"
    (teacher,) = checked
    assert teacher.adapter_roles() == {"opd_teacher": ["searcher", "answerer"]} and teacher.max_steps == 2
    assert {teacher.role_lm(role).adapter for role in teacher.roles} == {"opd_teacher"}
    assert cascade.adapter_roles() == {"team": ["searcher", "answerer"]}  # the passed-in cascade is left as it was
    assert (optimizer.teacher_check["n"], optimizer.teacher_check["source"]) == (len(world.train), "trainset")
    trained = copied[("team", "opd_teacher")]
    assert any(float(p.abs().sum()) > 0 for n, p in trained.items() if "lora_B" in n)
    teacher = _weights(lm, "opd_teacher")
    assert all(torch.equal(teacher[n.replace(".team.", ".opd_teacher.")], p) for n, p in trained.items())
    assert all(float(p.abs().sum()) == 0 for n, p in _weights(lm, "team").items() if "lora_B" in n)


def test_the_teacher_check_runs_before_stage_two_and_warns_when_the_teacher_is_not_better(
        world, tiny_model, smollm_tokenizer, tmp_path, caplog, monkeypatch):  # fmt: skip
    """train_teacher=False, the Teacher a copy of the student's adapter: before Stage II starts, the student and the
    Teacher (a cascade on ``opd_teacher``) answer the valset's first 2 questions greedily (every role at temperature
    0); a random model answers nothing right, so the Teacher is not better: a warning, and teacher_check.json."""
    team, lm = _team(world, tiny_model, smollm_tokenizer)
    team(question=world.train[0].question)  # creates the team adapter
    lm.backend.copy_adapter("team", "opd_teacher")
    kwargs_before = json.loads(json.dumps(team.lm_kwargs))
    events: list[str] = []
    runs: list[tuple] = []
    for cls in (HierarchicalTeam, CascadedTeam):

        def forward(self, question, _real=cls.forward):
            temperatures = {self.lm_kwargs.get(role, {}).get("temperature") for role in self.roles}
            runs.append((type(self).__name__, sorted(self.adapter_roles()), temperatures))
            return _real(self, question)

        monkeypatch.setattr(cls, "forward", forward)
    real_stages, real_check = OPD.stages, OPD.check_teacher
    monkeypatch.setattr(OPD, "stages", lambda self, *a: events.append("stage II") or real_stages(self, *a))
    monkeypatch.setattr(OPD, "check_teacher", lambda self, *a, **k: events.append("check") or real_check(self, *a, **k))
    optimizer = OPD(train_teacher=False, steps=0, teacher_check_questions=2, num_threads=2,
                    output_dir=str(tmp_path / "run"), show_progress=False)  # fmt: skip
    with caplog.at_level(logging.INFO, logger="rolecall.optimizers.opd"):
        team.compile(optimizer=optimizer, trainset=world.train, valset=world.train[1:])
    assert events == ["check", "stage II"]
    assert sorted(runs) == [("CascadedTeam", ["opd_teacher"], {0.0})] * 2 + [("HierarchicalTeam", ["team"], {0.0})] * 2
    result = json.loads((tmp_path / "run" / "teacher_check.json").read_text())
    assert result == optimizer.teacher_check
    assert (result["n"], result["source"], result["name_a"], result["name_b"]) == (2, "valset", "student", "teacher")
    assert result["em_diff"] <= 0 and "is not better than the student it teaches" in caplog.text
    assert "distillation may pull the student down" in caplog.text
    assert team.lm_kwargs == kwargs_before  # the greedy settings were put back


def test_a_raising_run_scores_zero_and_a_better_teacher_gives_no_warning(world, tiny_model, smollm_tokenizer, caplog,
                                                                         monkeypatch):  # fmt: skip
    """The student raises on every question (EM 0 each, logged, the run goes on), the Teacher answers the gold: it wins
    every trainset question and no warning says otherwise. ``teacher_check_questions=0`` skips the check."""
    team, lm = _team(world, tiny_model, smollm_tokenizer)
    lm.backend.ensure_adapter("opd_teacher")
    gold = {r.question: r.answers[0] for r in map(as_gold_record, world.train)}
    monkeypatch.setattr(CascadedTeam, "_run", lambda self, question, trajectory: dspy.Prediction(
        answer=gold[question], trajectory=trajectory))  # fmt: skip

    def down(self, question):
        raise RuntimeError("student down")

    monkeypatch.setattr(HierarchicalTeam, "forward", down)
    optimizer = OPD(train_teacher=False, steps=0, num_threads=2, show_progress=False)
    with caplog.at_level(logging.INFO, logger="rolecall.optimizers.opd"):
        team.compile(optimizer=optimizer, trainset=world.train)
    check = optimizer.teacher_check
    n = len(world.train)
    assert (check["n"], check["em_a"], check["em_b"], check["won"], check["source"]) == (n, 0.0, 1.0, n, "trainset")
    assert caplog.text.count("the student raised on question") == n and "student down" in caplog.text
    assert "is not better" not in caplog.text
    off = OPD(train_teacher=False, steps=0, teacher_check_questions=0, show_progress=False)
    team.compile(optimizer=off, trainset=world.train)
    assert off.teacher_check is None


def test_load_teacher_copies_a_saved_cascade_into_the_teacher_adapter(world, tiny_model, smollm_tokenizer, tmp_path):
    """A saved Stage I cascade becomes ``opd_teacher``: its saved weights, not the ones the LM holds under the same
    adapter name ("team", the student's default too) when it is loaded."""
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=8)
    cascade = CascadedTeam(BM25(world.corpus), lm=lm, parameter_sharing="shared")
    lm.backend.ensure_adapter("team")

    def perturb() -> None:
        with torch.no_grad():
            for name, p in lm.hf_model.named_parameters():
                if ".team." in name and "lora_B" in name:
                    p.normal_(0.0, 0.1)

    perturb()
    saved = _weights(lm, "team")
    cascade.save(tmp_path / "teacher")
    perturb()  # the LM's "team" now differs from the saved Teacher

    assert load_teacher(lm, tmp_path / "teacher") == "team"
    copied = {n.replace(".opd_teacher.", ".team."): w for n, w in _weights(lm, "opd_teacher").items()}
    assert copied.keys() == saved.keys()
    assert all(torch.equal(w, saved[n]) for n, w in copied.items())
