"""D2Plan's SPlanRL reward for the Reasoner (Luo, Wu and Feng, arXiv 2601.08282, Sec. 2.3; PAPERS.md section 4).

    R = R_f · (α R_p + β R_a + R_ans),  α = β = 0.1

- R_f = 1 when every tag is well formed, else 0 (a prerequisite: it gates the whole reward).
- R_ans = F1(a_pred, a_gt), word-level.
- R_p (initial planning) = 1 if (single-hop and no decomposition) or (multi-hop and #sub-questions == annotated hop
  count), else 0. ``use_plan_reward=False`` drops it (the "w/o R_p" over-decomposition ablation, Table 4).
- R_a = R_refine + R_revise (plan adaptation). R_refine = 1 when every dependent sub-question was rewritten without
  placeholders after its dependencies were solved (vacuously 1 when none depends on another). ::

      R_revise = 1                 if c = 1
                 λ · (R_t + R_q)   if c = 0 and r = 1          λ = 0.5
                 0                 otherwise

  PAPERS.md's Decision (the paper's text lost the definitions): c = the run needed no revision and answered correctly;
  r = a revision happened; R_t = the revision came right after a failed sub-question (K searches without relevant
  evidence); R_q = the first query after the revision retrieved a gold passage for some sub-question.

The formulas are pure functions of numbers; :func:`splanrl_rewards` reads their inputs from a
:class:`~rolecall.programs.d2plan.program.D2Plan` trajectory (through
:func:`~rolecall.programs.d2plan.facts.d2plan_facts`) and returns every term in a flat dict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rolecall.errors import ConfigError
from rolecall.evaluation.metrics import exact_match, f1_score
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.d2plan.facts import D2PlanFacts, d2plan_facts

__all__ = [
    "TIMELY_TRIGGER",
    "SPlanRLWeights",
    "initial_plan_reward",
    "plan_revise_reward",
    "plan_adaptation_reward",
    "splanrl_reward",
    "generated_sub_questions",
    "splanrl_rewards",
]

TIMELY_TRIGGER = "failed_sub_question"
"""The revision trigger D2Plan records after K searches without relevant evidence (R_t = 1)."""


@dataclass(kw_only=True)
class SPlanRLWeights:
    """Weights and switches of the SPlanRL reward (the paper's values, Sec. 3 / App. C)."""

    alpha: float = 0.1
    """α: weight of the initial planning reward R_p."""
    beta: float = 0.1
    """β: weight of the plan adaptation reward R_a = R_refine + R_revise."""
    lambda_: float = 0.5
    """λ: the discount of R_revise = λ (R_t + R_q) for a run that revised its plan."""
    use_plan_reward: bool = True
    """False drops α R_p from the total (the "w/o R_p" ablation: the model then over-decomposes, Table 4)."""

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "lambda_"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"SPlanRLWeights.{name} must be in [0, 1], got {value}")


# ---------------------------------------------------------------------------------------------- reward formulas
def initial_plan_reward(hop_count: int, *, decomposed: bool, n_sub_questions: int) -> float:
    """R_p: 1 for a single-hop question left undecomposed, or a multi-hop question decomposed into exactly its
    annotated hop count of sub-questions; else 0.

    Example:
        >>> initial_plan_reward(1, decomposed=False, n_sub_questions=1), initial_plan_reward(2, decomposed=True,
        ...     n_sub_questions=3)
        (1.0, 0.0)
    """
    if hop_count < 1:
        raise ValueError(f"hop_count must be >= 1 (1 for a single-hop question), got {hop_count}")
    if hop_count == 1:
        return float(not decomposed)
    return float(decomposed and n_sub_questions == hop_count)


def plan_revise_reward(c: bool, r: bool, r_t: float, r_q: float, *, lambda_: float = 0.5) -> float:
    """R_revise = 1 if c = 1; λ (R_t + R_q) if c = 0 and r = 1; else 0.

    Example:
        >>> plan_revise_reward(True, False, 0.0, 0.0), plan_revise_reward(False, True, 1.0, 0.0)
        (1.0, 0.5)
    """
    if c:
        return 1.0
    if r:
        return lambda_ * (r_t + r_q)
    return 0.0


def plan_adaptation_reward(r_refine: float, r_revise: float) -> float:
    """R_a = R_refine + R_revise (in [0, 2])."""
    return r_refine + r_revise


def splanrl_reward(r_f: float, r_p: float, r_a: float, r_ans: float, *, alpha: float = 0.1, beta: float = 0.1) -> float:
    """R = R_f · (α R_p + β R_a + R_ans).

    Example:
        >>> round(splanrl_reward(1.0, 1.0, 2.0, 1.0), 4), splanrl_reward(0.0, 1.0, 2.0, 1.0)
        (1.3, 0.0)
    """
    return r_f * (alpha * r_p + beta * r_a + r_ans)


# ---------------------------------------------------------------------------------------------- from a trajectory
def generated_sub_questions(trajectory: Trajectory, facts: D2PlanFacts | None = None) -> int:
    """Sub-questions the Reasoner's initial plan held before the program cut it at ``max_sub_questions``.

    ``facts.plan_size`` counts the plan after the cut, so a 7-step plan for a 5-hop question would otherwise match the
    hop count; the initial plan's ``plan_truncated`` event (the one without ``sub_question``: a revision's has one)
    keeps the planned size. Repeated sub-questions the program dropped (a small model's plan that loops until its
    token budget) are not counted.
    """
    facts = facts if facts is not None else d2plan_facts(trajectory)
    cut = next(
        (
            s
            for s in trajectory.steps
            if s.kind == "event" and s.role == "plan_truncated" and "sub_question" not in s.meta
        ),
        None,
    )
    return int(cut.meta.get("planned", facts.plan_size)) if cut is not None else facts.plan_size


def splanrl_rewards(
    trajectory: Trajectory,
    *,
    answer: str | None,
    gold_answers: str | Sequence[str],
    hop_count: int,
    gold_passage_ids: Sequence[str] = (),
    weights: SPlanRLWeights | None = None,
) -> dict[str, float]:
    """SPlanRL's reward of one D2Plan run, with every term, as a flat dict.

    Inputs read from the trajectory (:func:`~rolecall.programs.d2plan.facts.d2plan_facts`):

    - R_f: ``facts.tags_well_formed`` (every role call parsed, no ``error`` / ``malformed_output`` event).
    - R_p: decomposed = the Reasoner judged the question multi-hop (``facts.is_multi_hop``; a single-hop judgement
      runs the question itself), #sub-questions = :func:`generated_sub_questions`.
    - R_refine: ``facts.every_dependent_refined`` (a rule fill of ``#A_j`` does not count).
    - r: an applied revision (``facts.revised``). c: no sub-question failed (so none needed a revision), no revision
      and the answer is an exact match. R_t: the applied revision's trigger is ``"failed_sub_question"`` (K searches,
      no relevant evidence; a revision after an unanswered sub-question with relevant evidence, or one recorded
      without a failure, scores 0). R_q: the first search after that revision retrieved a passage in
      ``gold_passage_ids``.

    Args:
        trajectory: the run's trajectory.
        answer: the run's final answer (``pred.answer``; the trajectory does not record which answer was returned).
        gold_answers: the reference answer and its aliases.
        hop_count: the annotated hop count (``Example.hops``; 1 for single-hop).
        gold_passage_ids: the gold supporting passages of every sub-question (``Example.supporting_ids``); empty
            means R_q = 0.
        weights: α, β, λ and the ``use_plan_reward`` switch.

    Returns:
        ``reward/total`` and the terms ``reward/format`` (R_f), ``reward/plan`` (R_p, reported even when
        ``use_plan_reward=False`` drops it from the total), ``reward/adapt`` (R_a), ``reward/refine``,
        ``reward/revise``, ``reward/trigger`` (R_t), ``reward/query`` (R_q), ``reward/answer`` (R_ans), and
        ``plan/sub_questions``, ``plan/correct_without_revision`` (c), ``plan/revised`` (r).
    """
    w = weights or SPlanRLWeights()
    facts = d2plan_facts(trajectory)
    n_sub_questions = generated_sub_questions(trajectory, facts)
    revision = next((rev for rev in facts.revisions if rev.applied), None)
    failed = any(s.kind == "event" and s.role == "sub_question_failed" for s in trajectory.steps)
    gold_ids = set(gold_passage_ids)

    r_f = float(facts.tags_well_formed)
    r_ans = f1_score(answer, gold_answers)
    r_p = initial_plan_reward(hop_count, decomposed=facts.is_multi_hop, n_sub_questions=n_sub_questions)
    r = revision is not None
    c = not r and not failed and exact_match(answer, gold_answers) == 1.0
    r_t = float(revision is not None and revision.trigger == TIMELY_TRIGGER)
    r_q = float(revision is not None and bool(gold_ids & set(facts.first_query_after_revision_ids)))
    r_refine = float(facts.every_dependent_refined)
    r_revise = plan_revise_reward(c, r, r_t, r_q, lambda_=w.lambda_)
    r_a = plan_adaptation_reward(r_refine, r_revise)
    total = splanrl_reward(r_f, r_p if w.use_plan_reward else 0.0, r_a, r_ans, alpha=w.alpha, beta=w.beta)
    return {
        "reward/total": total,
        "reward/format": r_f,
        "reward/plan": r_p,
        "reward/adapt": r_a,
        "reward/refine": r_refine,
        "reward/revise": r_revise,
        "reward/trigger": r_t,
        "reward/query": r_q,
        "reward/answer": r_ans,
        "plan/sub_questions": float(n_sub_questions),
        "plan/correct_without_revision": float(c),
        "plan/revised": float(r),
    }
