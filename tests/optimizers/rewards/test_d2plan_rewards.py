"""D2Plan's SPlanRL reward on hand-worked cases (arXiv 2601.08282, Sec. 2.3; PAPERS.md section 4), read from
trajectories recorded the way D2Plan records them: R = R_f (0.1 R_p + 0.1 R_a + R_ans)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from dspy.utils.dummies import DummyLM

from rolecall.errors import ConfigError
from rolecall.optimizers.rewards.d2plan import (
    SPlanRLWeights,
    generated_sub_questions,
    initial_plan_reward,
    plan_adaptation_reward,
    plan_revise_reward,
    splanrl_reward,
    splanrl_rewards,
)
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.programs.d2plan.program import D2Plan
from rolecall.retrievers.base import Passage, Retriever

QUESTION = "Where was the director of Film X born?"
GOLD_IDS = ["film/x", "person/ada-quell"]


class Run:
    """Builds a D2Plan trajectory with the steps and events ``D2Plan`` records (``program.py``, ``search.py``)."""

    def __init__(self) -> None:
        self.t = Trajectory(question=QUESTION)

    def plan(self, *subs: str, complexity: str = "multi-hop", planned: int | None = None, kept: int = 5) -> Run:
        self.t.add(Step("role", "reasoner_plan", inputs={"question": QUESTION},
                        outputs={"complexity": complexity, "plan": list(subs)}))  # fmt: skip
        plan = list(subs) if complexity == "multi-hop" else [QUESTION]
        if planned is not None:  # the program cut the plan at max_sub_questions
            self.t.event("plan_truncated", planned=planned, kept=kept)
            plan = plan[:kept]
        self.t.event("plan", complexity=complexity, is_multi_hop=complexity == "multi-hop", plan=plan,
                     size=len(plan), source="model")  # fmt: skip
        return self

    def search(self, i: int, query: str, ids: Sequence[str], relevant: bool = True, turn: int = 0) -> Run:
        self.t.add(Step("role", "reasoner_step", outputs={"action": "search", "query": query, "answer": "unknown"},
                        meta={"sub_question": i, "turn": turn}))  # fmt: skip
        self.t.add(Step("retrieval", "retrieve", inputs={"query": query, "k": 5},
                        outputs={"passage_ids": list(ids)}, meta={"sub_question": i, "turn": turn}))  # fmt: skip
        self.t.add(Step("role", "purifier", outputs={"relevant": "yes" if relevant else "no", "information": "..."},
                        meta={"sub_question": i, "search": turn + 1}))  # fmt: skip
        return self

    def refine(self, i: int, text: str, *, placeholder_after: bool = False, rule_filled: bool = False) -> Run:
        self.t.add(Step("role", "reasoner_refine", outputs={"refined": text}, meta={"sub_question": i}))
        self.t.event("refinement", sub_question=i, had_placeholder_before=True, has_placeholder_after=placeholder_after,
                     rule_filled=rule_filled, reason="placeholder_left" if rule_filled else None, text=text,
                     unresolved=[])  # fmt: skip
        return self

    def solve(self, i: int, planned: str, answer: str, searches: int = 1) -> Run:
        self.t.add(Step("role", "reasoner_step", outputs={"action": "answer", "query": "none", "answer": answer},
                        meta={"sub_question": i, "turn": searches}))  # fmt: skip
        return self._done(i, planned, "solved", answer, searches)

    def fail(self, i: int, planned: str, *, trigger: str = "failed_sub_question", searches: int = 3) -> Run:
        self.t.event("sub_question_failed", sub_question=i, trigger=trigger).error = f"sub-question {i} unsolved"
        return self._done(i, planned, "failed", "", searches)

    def revise(self, i: int, plan_after: Sequence[str], *, trigger: str | None = "failed_sub_question") -> Run:
        self.t.add(Step("role", "reasoner_revise", outputs={"plan": list(plan_after)}, meta={"sub_question": i}))
        self.t.event("revision", sub_question=i, trigger=trigger, applied=bool(plan_after), plan_before=["..."],
                     plan_after=list(plan_after))  # fmt: skip
        return self

    def answer(self, text: str) -> Run:
        self.t.add(Step("role", "reasoner_answer", outputs={"answer": text}))
        return self

    def malformed(self, role: str, reason: str) -> Run:
        self.t.event("malformed_output", role=role, reason=reason).error = reason
        return self

    def _done(self, i: int, planned: str, status: str, answer: str, searches: int) -> Run:
        self.t.event("sub_question_done", sub_question=i, planned=planned, text=planned,
                     had_placeholder="#A_" in planned, status=status, answer=answer, searches=searches,
                     relevant=[status == "solved"])  # fmt: skip
        return self


def two_hop(answer: str = "Varn") -> Trajectory:
    """Plan 2 sub-questions, solve 1, refine 2 (placeholder filled), solve 2, answer."""
    return (
        Run()
        .plan("Who directed Film X?", "Where was #A_1 born?")
        .search(1, "Film X director", ["film/x"])
        .solve(1, "Who directed Film X?", "Ada Quell")
        .refine(2, "Where was Ada Quell born?")
        .search(2, "Ada Quell birthplace", ["person/ada-quell"])
        .solve(2, "Where was #A_1 born?", "Varn")
        .answer(answer)
        .t
    )


def rewards(t: Trajectory, answer: str, hop_count: int = 2, **kwargs) -> dict[str, float]:
    return splanrl_rewards(t, answer=answer, gold_answers=["Varn"], hop_count=hop_count, gold_passage_ids=GOLD_IDS,
                           **kwargs)  # fmt: skip


# ---------------------------------------------------------------------------------------------- formulas
def test_initial_plan_reward_table():
    """Single-hop: 1 only without decomposition. Multi-hop: 1 only when decomposed into exactly hop_count."""
    assert initial_plan_reward(1, decomposed=False, n_sub_questions=1) == 1.0
    assert initial_plan_reward(1, decomposed=True, n_sub_questions=2) == 0.0
    assert initial_plan_reward(2, decomposed=True, n_sub_questions=2) == 1.0
    assert initial_plan_reward(2, decomposed=True, n_sub_questions=3) == 0.0  # over-decomposed
    assert initial_plan_reward(3, decomposed=True, n_sub_questions=2) == 0.0  # under-decomposed
    assert initial_plan_reward(2, decomposed=False, n_sub_questions=1) == 0.0
    with pytest.raises(ValueError, match="hop_count"):
        initial_plan_reward(0, decomposed=False, n_sub_questions=1)


def test_plan_revise_reward_table():
    """c = 1 -> 1; c = 0 and r = 1 -> 0.5 (R_t + R_q); no revision and not correct -> 0."""
    assert plan_revise_reward(True, False, 0.0, 0.0) == 1.0
    assert plan_revise_reward(False, True, 1.0, 1.0) == 1.0
    assert plan_revise_reward(False, True, 1.0, 0.0) == 0.5
    assert plan_revise_reward(False, True, 0.0, 1.0) == 0.5
    assert plan_revise_reward(False, True, 0.0, 0.0) == 0.0
    assert plan_revise_reward(False, False, 1.0, 1.0) == 0.0
    assert plan_revise_reward(False, True, 1.0, 1.0, lambda_=0.25) == 0.5


def test_total_reward_formula():
    """R = R_f (0.1 R_p + 0.1 R_a + R_ans): (1, 1, 2, 1) -> 0.1 + 0.2 + 1 = 1.3; R_f = 0 gates everything to 0."""
    assert splanrl_reward(1.0, 1.0, plan_adaptation_reward(1.0, 1.0), 1.0) == pytest.approx(1.3)
    assert splanrl_reward(1.0, 0.0, 0.5, 0.5) == pytest.approx(0.55)
    assert splanrl_reward(0.0, 1.0, 2.0, 1.0) == 0.0


def test_weights_are_validated():
    with pytest.raises(ConfigError, match="alpha"):
        SPlanRLWeights(alpha=-0.1)
    with pytest.raises(ConfigError, match="lambda_"):
        SPlanRLWeights(lambda_=2.0)


# ---------------------------------------------------------------------------------------------- from a trajectory
def test_two_hop_run_with_the_annotated_hop_count():
    """2 sub-questions for a 2-hop question: R_p = 1; sub-question 2 was refined without placeholders: R_refine = 1;
    no revision and EM right: c = 1, R_revise = 1, R_a = 2; R_ans = 1; R = 0.1 + 0.2 + 1 = 1.3."""
    r = rewards(two_hop(), "Varn")
    assert r == pytest.approx({
        "reward/total": 1.3, "reward/format": 1.0, "reward/plan": 1.0, "reward/adapt": 2.0, "reward/refine": 1.0,
        "reward/revise": 1.0, "reward/trigger": 0.0, "reward/query": 0.0, "reward/answer": 1.0,
        "plan/sub_questions": 2.0, "plan/correct_without_revision": 1.0, "plan/revised": 0.0,
    })  # fmt: skip


def test_plan_with_more_sub_questions_than_hops():
    """3 sub-questions for a 2-hop question: R_p = 0; everything else as in the 2-hop run: R = 0.2 + 1 = 1.2.
    Without R_p (the over-decomposition ablation) the 2-hop plan loses its 0.1 and this one loses nothing."""
    t = (
        Run()
        .plan("Who directed Film X?", "Where was #A_1 born?", "In which country is #A_2?")
        .search(1, "Film X director", ["film/x"]).solve(1, "Who directed Film X?", "Ada Quell")
        .refine(2, "Where was Ada Quell born?")
        .search(2, "Ada Quell", ["person/ada-quell"]).solve(2, "Where was #A_1 born?", "Varn")
        .refine(3, "In which country is Varn?")
        .search(3, "Varn country", ["city/varn"]).solve(3, "In which country is #A_2?", "Ostria")
        .answer("Varn")
        .t
    )  # fmt: skip
    r = rewards(t, "Varn")
    assert r["plan/sub_questions"] == 3.0 and r["reward/plan"] == 0.0 and r["reward/total"] == pytest.approx(1.2)
    no_rp = SPlanRLWeights(use_plan_reward=False)
    assert rewards(t, "Varn", weights=no_rp)["reward/total"] == pytest.approx(1.2)
    exact = rewards(two_hop(), "Varn", weights=no_rp)
    assert exact["reward/total"] == pytest.approx(1.2) and exact["reward/plan"] == 1.0  # R_p still reported


def test_a_plan_cut_by_the_program_counts_what_the_reasoner_planned():
    """7 planned sub-questions cut to 5 for a 5-hop question: the Reasoner over-decomposed, R_p = 0."""
    t = Run().plan(*(f"Step {i}?" for i in range(1, 8)), planned=7, kept=5).t
    assert generated_sub_questions(t) == 7
    assert rewards(t, "", hop_count=5)["reward/plan"] == 0.0
    assert rewards(Run().plan(*(f"Step {i}?" for i in range(1, 6))).t, "", hop_count=5)["reward/plan"] == 1.0


def test_single_hop_without_decomposition():
    """A single-hop question the Reasoner did not decompose (the question is the one sub-question): R_p = 1, no
    dependent sub-question (R_refine = 1 vacuously), c = 1 (R_revise = 1): R = 0.1 + 0.2 + 1 = 1.3. Decomposing it into
    two sub-questions instead: R_p = 0."""
    t = Run().plan(complexity="single-hop").search(1, QUESTION, ["person/ada-quell"]).solve(1, QUESTION, "Varn").t
    r = rewards(t, "Varn", hop_count=1)
    assert r["reward/plan"] == 1.0 and r["reward/refine"] == 1.0 and r["reward/total"] == pytest.approx(1.3)
    assert rewards(two_hop(), "Varn", hop_count=1)["reward/plan"] == 0.0


def test_invalid_tags_zero_the_reward():
    """A malformed output (a search without a query) makes R_f = 0: R = 0 although the answer is right; the terms are
    still reported. An unparseable role call does the same."""
    t = two_hop()
    t.steps.insert(3, Step("event", "malformed_output", meta={"role": "reasoner_step"}, error="search without a query"))
    r = rewards(t, "Varn")
    assert r["reward/format"] == 0.0 and r["reward/total"] == 0.0 and r["reward/answer"] == 1.0
    t = two_hop()
    t.steps[0].error = "parse error: missing field plan"
    assert rewards(t, "Varn")["reward/total"] == 0.0


def test_revision_after_a_failed_sub_question_whose_next_query_finds_gold():
    """Sub-question 1 fails after K = 3 irrelevant searches, the plan is revised at once (R_t = 1) and the first query
    after it retrieves gold passage person/ada-quell (R_q = 1): c = 0, r = 1, R_revise = 0.5 (1 + 1) = 1; R_refine = 1
    (no dependent sub-question), R_a = 2, R_ans = 1, and 1 sub-question for a 2-hop question (R_p = 0):
    R = 0 + 0.2 + 1 = 1.2. When that query misses gold: R_q = 0, R_revise = 0.5, R = 0.15 + 1 = 1.15."""

    def run(first_ids: list[str]) -> Trajectory:
        return (
            Run()
            .plan("Where was the director of Film X born?", complexity="multi-hop")
            .search(1, "Film X", ["band/y"], relevant=False, turn=0)
            .search(1, "Film X director", ["band/y"], relevant=False, turn=1)
            .search(1, "director Film X", ["band/z"], relevant=False, turn=2)
            .fail(1, "Where was the director of Film X born?")
            .revise(1, ["Where was Ada Quell born?"])
            .search(1, "Ada Quell born", first_ids)
            .solve(1, "Where was Ada Quell born?", "Varn")
            .t
        )

    r = rewards(run(["person/ada-quell"]), "Varn")
    assert (r["plan/revised"], r["plan/correct_without_revision"]) == (1.0, 0.0)
    assert (r["reward/trigger"], r["reward/query"], r["reward/revise"]) == (1.0, 1.0, 1.0)
    assert r["reward/total"] == pytest.approx(1.2)
    r = rewards(run(["band/y"]), "Varn")
    assert r["reward/query"] == 0.0 and r["reward/revise"] == 0.5 and r["reward/total"] == pytest.approx(1.15)


def test_revision_without_a_failure_gets_no_trigger_credit():
    """A revision that did not follow K searches without relevant evidence scores R_t = 0: after an unanswered
    sub-question (the Purifier found relevant evidence), or recorded with no failure at all. Its first query still finds
    gold (R_q = 1): R_revise = 0.5 (0 + 1) = 0.5."""
    for trigger in ("unanswered_sub_question", None):
        t = (
            Run()
            .plan("Who directed Film X?", "Where was #A_1 born?")
            .revise(1, ["Who made Film X?", "Where was #A_1 born?"], trigger=trigger)
            .search(1, "Film X maker", ["film/x"])
            .t
        )
        r = rewards(t, "Lyon")
        assert (r["reward/trigger"], r["reward/query"], r["reward/revise"]) == (0.0, 1.0, 0.5)


def test_rule_filled_refinement_and_partial_answer():
    """The Reasoner's rewrite kept #A_1, so the program filled it by rule: R_refine = 0. The answer "Varn city" against
    "Varn": P = 1/2, R = 1, F1 = 2/3, not an exact match, so c = 0 and R_revise = 0 (no revision).
    R = 0.1 * 1 + 0.1 * 0 + 2/3 = 0.76667."""
    t = (
        Run()
        .plan("Who directed Film X?", "Where was #A_1 born?")
        .search(1, "Film X director", ["film/x"]).solve(1, "Who directed Film X?", "Ada Quell")
        .refine(2, "Where was Ada Quell born?", placeholder_after=True, rule_filled=True)
        .search(2, "Ada Quell", ["person/ada-quell"]).solve(2, "Where was #A_1 born?", "Varn")
        .t
    )  # fmt: skip
    r = rewards(t, "Varn city")
    assert r["reward/refine"] == 0.0 and r["reward/revise"] == 0.0 and r["reward/answer"] == pytest.approx(2 / 3)
    assert r["reward/total"] == pytest.approx(0.1 + 2 / 3)


def test_a_failed_sub_question_without_revision_is_not_c():
    """Plan adaptation off: sub-question 2 failed and was never revised, yet the answer is right. It needed a revision,
    so c = 0, r = 0 and R_revise = 0; no refinement happened either (R_refine = 0): R = 0.1 + 0 + 1 = 1.1."""
    t = (
        Run()
        .plan("Who directed Film X?", "Where was #A_1 born?")
        .search(1, "Film X director", ["film/x"]).solve(1, "Who directed Film X?", "Ada Quell")
        .fail(2, "Where was #A_1 born?")
        .answer("Varn")
        .t
    )  # fmt: skip
    r = rewards(t, "Varn")
    assert r["plan/correct_without_revision"] == 0.0 and r["reward/revise"] == 0.0 and r["reward/refine"] == 0.0
    assert r["reward/total"] == pytest.approx(1.1)


# ---------------------------------------------------------------------------------------------- a real run
class _Passages(Retriever):
    def retrieve_batch(self, queries: Sequence[str], k: int | None = None) -> list[list[Passage]]:
        return [[Passage("person/ada-quell", "Ada Quell", "Ada Quell was born in Varn.")] for _ in queries]

    def save(self, path) -> None:  # pragma: no cover - not used
        raise NotImplementedError

    @classmethod
    def load(cls, path) -> _Passages:  # pragma: no cover - not used
        raise NotImplementedError


def test_reward_of_a_real_d2plan_run():
    """The scripted two-hop run of D2Plan's own tests scores as the hand-built one: R = 1.3."""
    script = [
        {"complexity": "multi-hop", "plan": ["Who directed Film X?", "Where was #A_1 born?"]},
        {"action": "search", "query": "Film X director", "answer": "unknown"},
        {"relevant": "yes", "information": "Film X was directed by Ada Quell."},
        {"action": "answer", "query": "none", "answer": "Ada Quell"},
        {"refined": "Where was Ada Quell born?"},
        {"action": "search", "query": "Ada Quell", "answer": "unknown"},
        {"relevant": "yes", "information": "Ada Quell was born in Varn."},
        {"action": "answer", "query": "none", "answer": "Varn"},
        {"answer": "Varn"},
    ]
    pred = D2Plan(_Passages(), lm=DummyLM(script), demos=None)(question=QUESTION)
    r = rewards(pred.trajectory, pred.answer)
    assert pred.answer == "Varn" and r["reward/total"] == pytest.approx(1.3)
    assert (r["reward/format"], r["reward/plan"], r["reward/refine"], r["reward/revise"]) == (1.0, 1.0, 1.0, 1.0)
