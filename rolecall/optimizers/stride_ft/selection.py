"""STRIDE-FT's four selection rules (``seeds/stride.txt`` Sec. 3.3): which of the system's own calls each module learns.

Every rule reads executed runs, a run being one :class:`Run` (a trajectory with its scored :class:`Outcome`):

- Meta-Planner DPO (:func:`preference_pairs`): among the N runs of one question, (winner, loser) where the winner is
  clearly better (correct against incorrect, or an F1 gap above 0.3) and the two plans differ (their token F1 below
  0.8). Runs are ranked by (correct, F1, fewer iterations, fewer failures), the paper's four scores.
- Supervisor SFT (:func:`causal_rewrites`): the Supervisor calls of correct runs whose rewrite was causal (executed,
  not the first attempt, resolved its sub-question; :func:`~rolecall.programs.stride.state.causal_rewrite_steps`).
- Extractor SFT (:func:`minimal_fact_targets`): Extractor calls of correct runs with more than one fact, whose facts a
  frozen selector cut to a strictly smaller non-empty subset; the target is that subset.
- Reasoner SFT (:func:`concise_answer_targets`): Reasoner calls answering the final sub-question whose answer covers
  the gold (F1 > 0.3) but is not exact and is more than 1.5x longer than it, retargeted to the gold answer, plus twice
  as many calls that were already exact (kept as they are), drawn at random.

The rules are pure functions of the runs (and, for the extractor, of the selector), so they are tested on hand-built
trajectories; :class:`~rolecall.optimizers.stride_ft.optimizer.STRIDEFT` turns what they select into samples.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rolecall.evaluation.metrics import exact_match, f1_score
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.programs.stride.parse import parse_facts
from rolecall.programs.stride.state import causal_rewrite_steps

__all__ = [
    "LengthBalance",
    "Outcome",
    "Run",
    "causal_rewrites",
    "clearly_better",
    "concise_answer_targets",
    "minimal_fact_targets",
    "plan_text",
    "preference_pairs",
    "score_run",
]

FactSelector = Callable[[str, list[str]], list[str] | None]
"""``selector(query, facts) -> the facts strictly required`` (None when it gave no usable answer)."""


@dataclass(frozen=True)
class Outcome:
    """The paper's four scores of one executed run."""

    correct: bool
    """Exact match of the final answer with a gold answer."""
    f1: float
    """Token F1 of the final answer against the gold answers."""
    iterations: int
    """Supervisor rounds used."""
    failures: int
    """Failure-log entries (empty extractions, repeated queries, unanswered sub-questions)."""

    def rank(self) -> tuple[bool, float, int, int]:
        """Larger is better: correct first, then F1, then fewer iterations, then fewer failures."""
        return (self.correct, self.f1, -self.iterations, -self.failures)


@dataclass
class Run:
    """One execution of the program on a training question: its trajectory, its prediction's fields and its score."""

    trajectory: Trajectory
    outcome: Outcome
    answers: list[str]
    """The question's gold answers."""
    final_sub_question: int | None = None
    """Id of the plan's last sub-question (whose Reasoner answer is the final answer), None without a plan."""
    meta: dict[str, Any] = field(default_factory=dict)


def score_run(prediction: Any, answers: Sequence[str]) -> Outcome:
    """The :class:`Outcome` of a STRIDE prediction against the gold ``answers``.

    Example:
        >>> import dspy
        >>> score_run(dspy.Prediction(answer="Paris", iterations=2, state={"failures": [{}]}), ["Paris"])
        Outcome(correct=True, f1=1.0, iterations=2, failures=1)
    """
    answer = str(getattr(prediction, "answer", "") or "")
    state = getattr(prediction, "state", None) or {}
    return Outcome(
        correct=bool(exact_match(answer, list(answers))),
        f1=float(f1_score(answer, list(answers))),
        iterations=int(getattr(prediction, "iterations", 0) or 0),
        failures=len(state.get("failures", [])),
    )


def plan_text(trajectory: Trajectory) -> str:
    """The plan P_q of a run as one text: its General Strategy steps, then its sub-questions (from the planner step)."""
    steps = trajectory.role_steps("planner")
    if not steps:
        return ""
    meta = steps[0].meta
    return "\n".join([*meta.get("strategy", []), *meta.get("sub_questions", [])])


def clearly_better(a: Outcome, b: Outcome, f1_gap: float = 0.3) -> bool:
    """The paper's "significantly better outcome": ``a`` correct and ``b`` not, or ``a``'s F1 above ``b``'s by more
    than ``f1_gap``.

    Example:
        >>> clearly_better(Outcome(True, 1.0, 2, 0), Outcome(False, 0.8, 2, 0))
        True
        >>> clearly_better(Outcome(False, 0.5, 1, 0), Outcome(False, 0.3, 1, 0))
        False
    """
    return (a.correct and not b.correct) or (a.f1 - b.f1 > f1_gap)


def preference_pairs(
    runs: Sequence[Run],
    *,
    f1_gap: float = 0.3,
    max_plan_f1: float = 0.8,
    per_question: int = 1,
    avoid_shorter_chosen: bool = False,
) -> list[tuple[int, int]]:
    """(winner, loser) index pairs among the runs of one question, for the Meta-Planner's DPO.

    The best-ranked runs are winners in turn; each is paired with the worst-ranked run it is clearly better than and
    whose plan differs from its own (token F1 of the two plan texts below ``max_plan_f1``). A run is a loser at most
    once. At most ``per_question`` pairs.

    ``avoid_shorter_chosen``: among the losers that qualify for a winner, take the worst-ranked one whose plan is not
    longer than the winner's (so the chosen plan is not the shorter one), falling back to the worst-ranked loser when
    every qualifying plan is longer. The caller turns it on while more of its pairs so far have the shorter plan
    chosen than not (:class:`LengthBalance`), which keeps DPO from learning "shorter is better" from pair selection.

    Example:
        >>> preference_pairs([])
        []
    """
    order = sorted(range(len(runs)), key=lambda i: runs[i].outcome.rank(), reverse=True)
    plans = [plan_text(r.trajectory) for r in runs]
    pairs: list[tuple[int, int]] = []
    used: set[int] = set()
    for w in order:
        if len(pairs) >= per_question:
            break
        qualifying = [lose for lose in reversed(order)
                      if lose != w and lose not in used and clearly_better(runs[w].outcome, runs[lose].outcome, f1_gap)
                      and f1_score(plans[lose], plans[w]) < max_plan_f1]  # fmt: skip
        if not qualifying:
            continue
        lose = qualifying[0]
        if avoid_shorter_chosen:
            lose = next((i for i in qualifying if len(plans[i].split()) <= len(plans[w].split())), lose)
        pairs.append((w, lose))
        used.update((w, lose))
    return pairs


class LengthBalance:
    """The length statistics of the DPO pairs drawn so far (plan lengths in words), and whether the next question's
    pairs should avoid a shorter chosen plan: while more pairs have the shorter plan chosen than the longer one.

    Example:
        >>> balance = LengthBalance()
        >>> balance.add(3, 7); balance.avoid_shorter_chosen, balance.report()["chosen_shorter"]
        (True, 1)
    """

    def __init__(self) -> None:
        self.chosen: list[int] = []
        self.rejected: list[int] = []

    def add(self, chosen_words: int, rejected_words: int) -> None:
        """Count one pair by its two plans' lengths."""
        self.chosen.append(chosen_words)
        self.rejected.append(rejected_words)

    @property
    def avoid_shorter_chosen(self) -> bool:
        """True while the shorter plan was chosen in more pairs than the longer one."""
        shorter = sum(c < r for c, r in zip(self.chosen, self.rejected, strict=True))
        longer = sum(c > r for c, r in zip(self.chosen, self.rejected, strict=True))
        return shorter > longer

    def report(self) -> dict[str, float]:
        """Pairs, how many have the shorter / longer / equally long plan chosen, and the mean lengths."""
        n = len(self.chosen)
        return {
            "pairs": n,
            "chosen_shorter": sum(c < r for c, r in zip(self.chosen, self.rejected, strict=True)),
            "chosen_longer": sum(c > r for c, r in zip(self.chosen, self.rejected, strict=True)),
            "chosen_words": round(sum(self.chosen) / n, 2) if n else 0.0,
            "rejected_words": round(sum(self.rejected) / n, 2) if n else 0.0,
        }


def plan_call_pairs(winner: Trajectory, loser: Trajectory) -> list[tuple[Step, Step]]:
    """The (chosen, rejected) role calls a plan preference trains: each plan call (General Strategy, Concrete Plan)
    whose prompts are identical in both runs and whose completions differ.

    DPO compares two completions of one prompt. The strategy call's prompt is the question, so it always qualifies;
    the Concrete Plan's prompt holds the strategy, so it qualifies only when both runs had the same strategy (or when
    there is no Meta-Planner and the planner sees the question alone).
    """
    pairs = []
    for role in ("meta_planner", "planner"):
        chosen = [s for s in winner.role_steps(role) if s.ok and s.messages]
        rejected = [s for s in loser.role_steps(role) if s.ok and s.messages]
        if chosen and rejected and chosen[0].messages == rejected[0].messages:
            if chosen[0].completion != rejected[0].completion:
                pairs.append((chosen[0], rejected[0]))
    return pairs


def causal_rewrites(runs: Sequence[Run]) -> list[Step]:
    """The Supervisor calls of correct runs whose rewrite was causal (the Supervisor SFT set)."""
    return [step for run in runs if run.outcome.correct for step in causal_rewrite_steps(run.trajectory)]


def minimal_fact_targets(runs: Sequence[Run], selector: FactSelector) -> list[tuple[Step, list[str]]]:
    """(Extractor call, its minimal facts E*) for each call of a correct run with |E| > 1 where the selector kept a
    strictly smaller, non-empty subset of E (facts it returned that are not in E are ignored)."""
    out = []
    for run in runs:
        if not run.outcome.correct:
            continue
        for step in run.trajectory.role_steps("extractor"):
            facts = list(step.meta.get("facts") or [])
            if not step.ok or len(facts) < 2:
                continue
            chosen = selector(str(step.inputs.get("query", "")), facts)
            kept = [f for f in facts if f in set(chosen or ())]
            if 0 < len(kept) < len(facts):
                out.append((step, kept))
    return out


def answer_bearing_facts(answer: str) -> FactSelector:
    """A rule-based selector: the facts that contain ``answer`` (normalized), for when no LM selector is wanted."""
    from rolecall.utils.text import normalize_answer

    target = normalize_answer(answer)

    def select(query: str, facts: list[str]) -> list[str] | None:
        return [f for f in facts if target and target in normalize_answer(f)] or None

    return select


def reasoner_final_steps(run: Run) -> list[Step]:
    """The run's Reasoner calls that answered its final sub-question (the call whose answer is the run's answer)."""
    if run.final_sub_question is None:
        return []
    return [
        s
        for s in run.trajectory.role_steps("reasoner")
        if s.ok and s.meta.get("sub_question") == run.final_sub_question and str(s.meta.get("answer") or "").strip()
    ]


def concise_answer_targets(
    runs: Sequence[Run],
    *,
    min_f1: float = 0.3,
    length_ratio: float = 1.5,
    exact_ratio: float = 2.0,
    rng: random.Random | None = None,
) -> tuple[list[tuple[Step, str]], list[Step]]:
    """The Reasoner SFT set: ``(verbose, exact)``.

    ``verbose``: (call, the gold answer it should have given) for final-answer calls with F1 above ``min_f1``, no
    exact match, and more than ``length_ratio`` times the words of that gold answer (the gold answer with the best
    F1). ``exact``: ``exact_ratio`` times as many already-exact calls (all of them if fewer), drawn with ``rng``.
    """
    verbose: list[tuple[Step, str]] = []
    exact: list[Step] = []
    for run in runs:
        for step in reasoner_final_steps(run):
            answer = str(step.meta.get("answer"))
            if exact_match(answer, run.answers):
                exact.append(step)
                continue
            gold = max(run.answers, key=lambda g: f1_score(answer, [g]), default="")
            if gold and f1_score(answer, [gold]) > min_f1 and len(answer.split()) > length_ratio * len(gold.split()):
                verbose.append((step, gold))
    n = min(len(exact), round(exact_ratio * len(verbose)))
    exact = (rng or random.Random(0)).sample(exact, n) if n < len(exact) else exact
    return verbose, exact


def rewritten_facts(step: Step, kept: Sequence[str]) -> str:
    """The Extractor's ``facts`` output cut to ``kept``: its own lines (bullets as it wrote them) whose fact is kept."""
    text = str(step.outputs.get("facts") or "")
    lines = [line for line in text.splitlines() if parse_facts(line) and parse_facts(line)[0] in set(kept)]
    return "\n".join(lines) if lines else "\n".join(kept)
