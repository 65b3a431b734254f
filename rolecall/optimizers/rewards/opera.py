"""OPERA's role rewards (arXiv 2508.16438, Sec. 4, Eq. 7, 9, 10), with the reference code's default weights.

- Plan Agent, Eq. 7: ``r = λ1 f_logic + λ2 f_struct + λ3 f_exec``. Reference weights: 0.25 logical coherence,
  0.25 execution feasibility (structure), 0.30 EM of the executed plan's answer, 0.10 efficiency (1 step 0.3,
  2-3 steps 1.0, 4-5 steps 0.8, more 0.5) and 0.10 placeholder correctness. f_logic is an LLM judge in the paper; the
  default here is a rule check (placeholders point backwards, no duplicate sub-goals, every step used) and any
  callable ``judge(question, sub_goals) -> float in [0, 1]`` can replace it.
- Analysis-Answer Agent, Eq. 9: ``r = α 1[φ = φ*] + β EM(a, a*) + γ f_format``; gold φ* = yes: 0.25 / 0.65 / 0.10,
  gold φ* = no: 0.9 judgement + 0.1 format.
- Rewrite Agent, Eq. 10: ``r = ω1 sqrt(NDCG@k(R(q'), golden docs)) + ω2 f_format``, ω1 = 0.9.

Every function returns ``(reward, components)``; an unparseable output (``None``) scores its format term 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rolecall.errors import ConfigError
from rolecall.evaluation.metrics import exact_match, f1_score, ndcg_at_k
from rolecall.programs.core.plan import fill_placeholders, find_placeholders, find_references
from rolecall.signatures.types import is_null_answer

__all__ = [
    "PlanRewardWeights",
    "AnalysisRewardWeights",
    "RewriteRewardWeights",
    "plan_logic",
    "plan_gold_match",
    "plan_structure",
    "plan_efficiency",
    "plan_placeholder_score",
    "plan_reward",
    "analysis_gold",
    "gold_step_index",
    "analysis_reward",
    "rewrite_reward",
    "SynthesisRewardWeights",
    "synthesis_reward",
]


def _check_weights(obj: Any) -> None:
    for name, value in vars(obj).items():
        if isinstance(value, float) and not 0.0 <= value <= 1.0:
            raise ConfigError(f"{type(obj).__name__}.{name} must be in [0, 1], got {value}")


@dataclass(kw_only=True)
class PlanRewardWeights:
    """Weights of the Plan Agent reward (Eq. 7; values from OPERA's reference code)."""

    logic: float = 0.25
    """f_logic: logical coherence of the plan (rule judge by default)."""
    feasibility: float = 0.25
    """f_struct: the plan parses, has 1..max_steps non-empty sub-goals and valid placeholders."""
    execution: float = 0.30
    """f_exec: EM of the answer obtained by executing the plan downstream."""
    efficiency: float = 0.10
    """Step-count preference: 1 step 0.3, 2-3 steps 1.0, 4-5 steps 0.8, more 0.5."""
    placeholder: float = 0.10
    """Placeholder correctness against the gold decomposition's dependencies (where the dataset has one)."""

    def __post_init__(self) -> None:
        _check_weights(self)


@dataclass(kw_only=True)
class AnalysisRewardWeights:
    """Weights of the Analysis-Answer reward (Eq. 9; values from OPERA's reference code)."""

    judgement_if_sufficient: float = 0.25
    """α when the gold judgement is yes."""
    answer_if_sufficient: float = 0.65
    """β: EM of the answer when the gold judgement is yes."""
    format_if_sufficient: float = 0.10
    """γ when the gold judgement is yes."""
    judgement_if_insufficient: float = 0.90
    """α when the gold judgement is no."""
    format_if_insufficient: float = 0.10
    """γ when the gold judgement is no."""

    def __post_init__(self) -> None:
        _check_weights(self)


@dataclass(kw_only=True)
class RewriteRewardWeights:
    """Weights of the Rewrite reward (Eq. 10)."""

    retrieval: float = 0.9
    """ω1: weight of sqrt(NDCG@k) of the rewritten query's retrieval against the golden documents."""
    format: float = 0.1
    """ω2: the query parses and is a non-empty search string."""
    k: int = 5
    """Depth of the NDCG when the caller does not pass the program's own retrieval depth (MAPGRPO passes it)."""

    def __post_init__(self) -> None:
        _check_weights(self)
        if self.k < 1:
            raise ConfigError(f"RewriteRewardWeights.k must be >= 1, got {self.k}")


@dataclass(kw_only=True)
class SynthesisRewardWeights:
    """Weights of the synthesis role's reward (ours: the paper trains no synthesis agent; see
    :func:`synthesis_reward`)."""

    exact_match: float = 0.5
    """Weight of the final answer's exact match against a gold answer."""
    f1: float = 0.5
    """Weight of its token F1 (partial credit, so that a group of near misses still ranks)."""

    def __post_init__(self) -> None:
        _check_weights(self)


def synthesis_reward(
    answer: str | None, *, gold_answers: Sequence[str], weights: SynthesisRewardWeights | None = None
) -> tuple[float, dict[str, float]]:
    """The synthesis role's reward: ``w_em EM + w_f1 F1`` of its final answer against the gold answers (0 when the
    output did not parse). OPERA answers through this role when ``final_synthesis`` is on, so its answer is the
    program's; one call per question, nothing runs downstream.

    Example:
        >>> synthesis_reward("Yaebroria", gold_answers=["Yaebroria"])
        (1.0, {'em': 1.0, 'f1': 1.0})
    """
    w = weights or SynthesisRewardWeights()
    if answer is None or not str(answer).strip():
        return 0.0, {"em": 0.0, "f1": 0.0}
    em, f1 = exact_match(answer, list(gold_answers)), f1_score(answer, list(gold_answers))
    return w.exact_match * em + w.f1 * f1, {"em": em, "f1": f1}


# ---------------------------------------------------------------------------------------------------------- plan
def plan_logic(sub_goals: Sequence[str], gold_decomposition: Sequence[Any] | None = None) -> float:
    """Rule judge of logical coherence: the mean of three checks.

    1. every placeholder refers to an earlier step (``[... from step j]`` in step i needs 1 <= j < i);
    2. no two sub-goals are the same;
    3. every step but the last is used by a later step (a plan with one step passes trivially). With a gold
       decomposition, a step the gold plan leaves unused at the same position is exempt: a comparison's independent
       look-ups (``In which year was A formed?``, ``... B formed?``) are combined by the final synthesis, not by a
       later step, and the gold plan itself must score 1.
    """
    if not sub_goals:
        return 0.0
    backwards = all(1 <= p.step < i for i, s in enumerate(sub_goals, 1) for p in find_placeholders(s))
    unique = len({s.strip().lower() for s in sub_goals}) == len(sub_goals)
    used_steps = {p.step for s in sub_goals for p in find_placeholders(s)}
    exempt: set[int] = set()
    if gold_decomposition:
        gold_used = {p.step for g in gold_decomposition for p in find_placeholders(_question_of(g))}
        exempt = {i for i in range(1, len(gold_decomposition) + 1) if i not in gold_used}
    used = all(i in used_steps or i in exempt for i in range(1, len(sub_goals))) if len(sub_goals) > 1 else True
    return (backwards + unique + used) / 3.0


# words a sub-goal may add or drop without asking something else ("In which city is the company X headquartered?"
# and "Which city is X headquartered in?" ask the same)
_FILLER_WORDS = frozenset("a an the of in is was which what who company city film book band person country".split())


def _asked_words(text: str) -> frozenset[str]:
    """The words a sub-goal asks with, each reference (``#j``, ``[type from step j]``) written as ``step<j>``."""
    for ref in sorted(find_references(text), key=lambda r: -r.start):
        text = f"{text[: ref.start]} step{ref.step} {text[ref.start + len(ref.text) :]}"
    return frozenset(_text_key(text).split()) - _FILLER_WORDS


def plan_gold_match(sub_goals: Sequence[str], gold_decomposition: Sequence[Any]) -> float:
    """f_logic against a gold decomposition: the share of positions whose sub-goal asks the gold sub-question there.

    A sub-goal asks the gold sub-question when both use the same words outside a short filler list, references
    counted by the step they point to; "Who is the mother of [entity from step 1]?" does not ask "Who is the father
    of #1?". The score is the matches over the longer of the two plans, so a missing or extra step costs its share.
    Where the rule judge (:func:`plan_logic`) passes any plan whose placeholders point backwards, this one sees the
    relation a plan asks, which is where most plans of a SFT-trained 135M planner go wrong (docs/opera-mapgrpo.md).

    Example:
        >>> gold = [{"question": "Who is the mother of Ann?"}, {"question": "Who is the father of #1?"}]
        >>> plan_gold_match(["Who is Ann's mother?", "Who is the mother of [entity from step 1]?"], gold)
        0.0
        >>> plan_gold_match(["Who is the mother of Ann?", "Who is the mother of [entity from step 1]?"], gold)
        0.5
    """
    if not sub_goals or not gold_decomposition:
        return 0.0
    gold = [_asked_words(_question_of(g)) for g in gold_decomposition]
    hits = sum(_asked_words(s) == g for s, g in zip(sub_goals, gold, strict=False))
    return hits / max(len(sub_goals), len(gold))


def plan_structure(sub_goals: Sequence[str] | None, *, max_steps: int = 5) -> float:
    """f_struct: 1 when the plan parsed into 1..max_steps sub-goals of at least three words each, else partial."""
    if not sub_goals:
        return 0.0
    size_ok = 1 <= len(sub_goals) <= max_steps
    words_ok = sum(len(s.split()) >= 3 for s in sub_goals) / len(sub_goals)
    return 0.5 * size_ok + 0.5 * words_ok


def plan_efficiency(n_steps: int) -> float:
    """Reference-code step preference: 1 step 0.3, 2-3 steps 1.0, 4-5 steps 0.8, more 0.5 (0 for an empty plan)."""
    if n_steps <= 0:
        return 0.0
    if n_steps == 1:
        return 0.3
    if n_steps <= 3:
        return 1.0
    if n_steps <= 5:
        return 0.8
    return 0.5


def plan_placeholder_score(sub_goals: Sequence[str], gold_decomposition: Sequence[Any] | None) -> float:
    """Placeholder correctness: how well the plan's dependency pattern matches the gold decomposition's.

    Each step i scores 1 when it depends on an earlier step exactly when gold step i does (``#k`` in the gold
    sub-question); the score is the mean over max(len(plan), len(gold)) positions, so a plan of the wrong length loses
    the missing positions. Without a gold decomposition, a multi-step plan scores 1 if it uses any placeholder.
    """
    if not sub_goals:
        return 0.0
    plan_deps = [bool(find_placeholders(s)) for s in sub_goals]
    if not gold_decomposition:
        return 1.0 if len(sub_goals) == 1 or any(plan_deps) else 0.0
    gold_deps = [bool(find_placeholders(_question_of(g))) for g in gold_decomposition]
    n = max(len(plan_deps), len(gold_deps))
    hits = sum(1 for a, b in zip(plan_deps, gold_deps, strict=False) if a == b)
    return hits / n


def plan_reward(
    sub_goals: Sequence[str] | None,
    *,
    question: str,
    gold_answers: Sequence[str],
    executed_answer: str | None,
    gold_decomposition: Sequence[Any] | None = None,
    weights: PlanRewardWeights | None = None,
    judge: Callable[[str, Sequence[str]], float] | None = None,
    logic: str = "rules",
    max_steps: int = 5,
) -> tuple[float, dict[str, float]]:
    """The Plan Agent's reward (Eq. 7). ``sub_goals=None`` means the output did not parse (reward 0).

    f_logic comes from ``judge`` when given, else from ``logic``: ``"rules"`` (:func:`plan_logic`) or ``"gold"``
    (:func:`plan_gold_match` where the example has a gold decomposition, the rules elsewhere)."""
    if logic not in ("rules", "gold"):
        raise ConfigError(f"plan_reward: logic is 'rules' or 'gold', got {logic!r}")
    w = weights or PlanRewardWeights()
    if not sub_goals:
        return 0.0, {"logic": 0.0, "feasibility": 0.0, "execution": 0.0, "efficiency": 0.0, "placeholder": 0.0}
    parts = {
        "logic": (
            float(judge(question, sub_goals))
            if judge is not None
            else plan_gold_match(sub_goals, gold_decomposition)
            if logic == "gold" and gold_decomposition
            else plan_logic(sub_goals, gold_decomposition)
        ),
        "feasibility": plan_structure(sub_goals, max_steps=max_steps),
        "execution": exact_match(executed_answer or "", list(gold_answers)) if gold_answers else 0.0,
        "efficiency": plan_efficiency(len(sub_goals)),
        "placeholder": plan_placeholder_score(sub_goals, gold_decomposition),
    }
    reward = sum(getattr(w, k) * v for k, v in parts.items())
    return reward, parts


# ------------------------------------------------------------------------------------------------------ analysis
def _question_of(step: Any) -> str:
    return step["question"] if isinstance(step, dict) else step.question


def _field(step: Any, name: str) -> Any:
    return step[name] if isinstance(step, dict) else getattr(step, name)


def gold_step_index(
    sub_goal: str, decomposition: Sequence[Any], *, position: int | None = None, min_f1: float = 0.2
) -> int | None:
    """Which gold step (1-based) a sub-goal is: its text against every gold sub-question with the placeholders
    filled by the gold answers, whether or not that step's passages were retrieved.

    An exact match (case and punctuation aside) wins; otherwise the best token F1 of at least ``min_f1``, ties going
    to the step at ``position`` (the sub-goal's place in its plan) or nearest to it. None when nothing matches.

    Example:
        >>> steps = [{"question": "In which year was the band Yaebroria formed?", "answer": "1961"},
        ...          {"question": "In which year was the band Traveilt Archives formed?", "answer": "2010"}]
        >>> gold_step_index("year Yaebroria formed", steps)
        1
    """
    if not decomposition:
        return None
    answers = {i: str(_field(s, "answer")) for i, s in enumerate(decomposition, 1)}
    filled = [fill_placeholders(_question_of(s), answers, before=i)[0] for i, s in enumerate(decomposition, 1)]
    key = _text_key(sub_goal)
    for i, text in enumerate(filled, 1):
        if _text_key(text) == key:
            return i
    where = position if position is not None else 0
    scored = [(f1_score(sub_goal, text), -abs(i - where), i) for i, text in enumerate(filled, 1)]
    best = max(scored)
    return best[2] if best[0] >= min_f1 else None


def _text_key(text: str) -> str:
    return " ".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def analysis_gold(
    sub_goal: str,
    passage_ids: Sequence[str],
    decomposition: Sequence[Any] | None,
    supporting_ids: Sequence[str],
    *,
    position: int | None = None,
) -> tuple[bool, list[str]]:
    """Gold judgement φ* and gold answers a* for one analysis input, from the example's gold decomposition.

    The gold step is the one the sub-goal *is* (:func:`gold_step_index`, over all gold steps; ``position`` is the
    sub-goal's 1-based place in its plan, for ties). φ* = yes when a supporting passage of that step is among the
    shown ``passage_ids``, with a* = the step's answer; otherwise φ* = no. A sub-goal that matches no gold step is
    φ* = no. Without a decomposition, φ* = yes when any supporting passage was shown, and a* is unknown (empty).

    Example:
        >>> steps = [{"question": "In which year was the band Yaebroria formed?", "answer": "1961",
        ...           "supporting_ids": ["band/yaebroria"]},
        ...          {"question": "In which year was the band Traveilt Archives formed?", "answer": "2010",
        ...           "supporting_ids": ["band/traveilt-archives"]}]
        >>> analysis_gold("year Yaebroria formed", ["band/traveilt-archives"], steps, [])
        (False, [])
    """
    shown = set(passage_ids)
    if not decomposition:
        return bool(shown & set(supporting_ids)), []
    index = gold_step_index(sub_goal, decomposition, position=position)
    if index is None:
        return False, []
    step = decomposition[index - 1]
    if not shown & set(_field(step, "supporting_ids") or []):
        return False, []
    return True, [str(_field(step, "answer"))]


def analysis_reward(
    outputs: dict[str, Any] | None,
    *,
    gold_sufficient: bool,
    gold_answers: Sequence[str],
    weights: AnalysisRewardWeights | None = None,
) -> tuple[float, dict[str, float]]:
    """The Analysis-Answer Agent's reward (Eq. 9). ``outputs=None`` means the output did not parse."""
    w = weights or AnalysisRewardWeights()
    if outputs is None:
        return 0.0, {"judgement": 0.0, "answer": 0.0, "format": 0.0}
    said_yes = str(outputs.get("sufficient", "")).strip().lower() == "yes"
    answer = str(outputs.get("answer") or "")
    fmt = 1.0 if (not said_yes or not is_null_answer(answer)) else 0.5  # "yes" with no answer is half-formed
    if gold_sufficient:
        judgement = float(said_yes)
        em = exact_match(answer, list(gold_answers)) if (said_yes and gold_answers) else 0.0
        reward = w.judgement_if_sufficient * judgement + w.answer_if_sufficient * em + w.format_if_sufficient * fmt
        return reward, {"judgement": judgement, "answer": em, "format": fmt}
    judgement = float(not said_yes)
    reward = w.judgement_if_insufficient * judgement + w.format_if_insufficient * fmt
    return reward, {"judgement": judgement, "answer": 0.0, "format": fmt}


# ------------------------------------------------------------------------------------------------------- rewrite
def rewrite_reward(
    query: str | None,
    *,
    gold_ids: Sequence[str],
    retrieve: Callable[[str, int], Sequence[Any]],
    weights: RewriteRewardWeights | None = None,
    k: int | None = None,
) -> tuple[float, dict[str, float]]:
    """The Rewrite Agent's reward (Eq. 10): ``ω1 sqrt(NDCG@k) + ω2 f_format``; ``retrieve(query, k)`` returns
    passages with ``.id``. ``k`` is the depth the program retrieves the new query with (OPERA: 10, then 15);
    None uses ``weights.k``."""
    w = weights or RewriteRewardWeights()
    if query is None or not query.strip():
        return 0.0, {"ndcg": 0.0, "format": 0.0}
    depth = int(k) if k else w.k
    fmt = 1.0 if 1 <= len(query.split()) <= 32 else 0.5
    ids = [p.id for p in retrieve(query, depth)]
    ndcg = ndcg_at_k(ids, list(gold_ids), depth) if gold_ids else 0.0
    return w.retrieval * math.sqrt(ndcg) + w.format * fmt, {"ndcg": ndcg, "format": fmt}
