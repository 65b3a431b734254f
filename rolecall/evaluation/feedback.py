"""DSPy metrics on a rolecall prediction: a score for any DSPy optimizer, and a score with text feedback for GEPA.

GEPA (Agrawal et al., "GEPA: Reflective Prompt Evolution Can Outperform Reinforcement Learning", 2025,
https://arxiv.org/abs/2507.19457) rewrites a role's instruction after reading, for a few questions, that role's inputs
and outputs and the metric's *feedback*: a ``dspy.Prediction(score=..., feedback=...)`` from a metric with the
signature ``(gold, pred, trace, pred_name, pred_trace)``. :func:`answer_feedback` is that metric for rolecall programs:

    score    = EM or F1 of ``pred.answer`` against the gold answer and its aliases (rolecall.evaluation.metrics)
    feedback = the gold answer and the program's; what the trajectory did (the roles it called, its retrievals and
               whether they found the supporting passages, its failures); with ``pred_name``, that role's own calls

GEPA shows the reflection LM only the role calls in DSPy's trace, i.e. those that parsed: a rolecall program records a
failed call in its trajectory instead of raising, so GEPA never sees it (its ``add_format_failure_as_feedback`` works
on programs that raise). The feedback text therefore lists the run's failed steps, and a run in which no role call
parsed gives GEPA nothing to reflect on.

:func:`answer_score` is the plain ``metric(example, prediction, trace=None) -> float`` that SIMBA, MIPROv2 and
BootstrapFewShot take. (A ``dspy.Prediction`` is always truthy, so BootstrapFewShot, which keeps a trace when the
metric's value is truthy, must get a number, not :func:`answer_feedback`.)
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Literal

import dspy

from rolecall.data.corpus import paragraph_id_of
from rolecall.evaluation.metrics import exact_match, f1_score

__all__ = ["ScoreName", "answer_score", "answer_feedback", "gold_answers"]

logger = logging.getLogger(__name__)

ScoreName = Literal["em", "f1"]
"""The answer metric a score is: exact match or token F1 (max over the gold aliases)."""

_SCORES = {"em": exact_match, "f1": f1_score}
_MAX_FAILURES = 4  # failures listed in a feedback; the count says how many there were


def _get(obj: Any, key: str) -> Any:
    """``obj[key]`` of a ``dspy.Example`` (None when absent), else the attribute (a rolecall ``Example``)."""
    if isinstance(obj, dspy.Example):
        return obj.get(key)
    return getattr(obj, key, None)


def gold_answers(example: Any) -> list[str]:
    """The gold answer and its aliases of a rolecall ``Example`` or a ``dspy.Example`` (``answers``, else ``answer``).

    Raises:
        ValueError: the example has neither.

    Example:
        >>> gold_answers(dspy.Example(question="Who?", answer="Ada"))
        ['Ada']
    """
    answers = _get(example, "answers") or ([_get(example, "answer")] if _get(example, "answer") else [])
    if not answers:
        raise ValueError(f"the example has no 'answers' or 'answer' to score against: {example!r}")
    return [str(a) for a in answers]


def _predicted_answer(prediction: Any) -> str:
    return "" if prediction is None else str(getattr(prediction, "answer", "") or "")


def _check_score(score: str) -> None:
    if score not in _SCORES:
        raise ValueError(f"score must be one of {sorted(_SCORES)}, got {score!r}")


def answer_score(example: Any, prediction: Any, trace: Any = None, *, score: ScoreName = "em") -> float:
    """The answer metric of ``prediction`` on ``example``, as DSPy's optimizers call a metric.

    Args:
        example: the gold example (a ``dspy.Example`` or a rolecall ``Example``).
        prediction: the program's prediction (its ``answer`` is scored); None (a run that raised) scores 0.
        trace: DSPy's trace (unused; BootstrapFewShot passes it).
        score: ``"em"`` (exact match) or ``"f1"`` (token F1).

    Returns:
        The score in [0, 1].

    Raises:
        ValueError: an unknown ``score``, or an example without a gold answer.

    Example:
        >>> gold = dspy.Example(question="Who?", answers=["Ada Lovelace", "Ada"])
        >>> answer_score(gold, dspy.Prediction(answer="ada"))
        1.0
        >>> answer_score(gold, dspy.Prediction(answer="Lovelace"), score="f1")
        0.6666666666666666
    """
    _check_score(score)
    return _SCORES[score](_predicted_answer(prediction), gold_answers(example))


def answer_feedback(
    gold: Any,
    pred: Any,
    trace: Any = None,
    pred_name: str | None = None,
    pred_trace: Any = None,
    *,
    score: ScoreName = "f1",
    max_chars: int = 2000,
) -> dspy.Prediction:
    """GEPA's feedback metric for rolecall programs: the answer's score and a text saying what went right or wrong.

    Args:
        gold: the gold example (a ``dspy.Example`` or a rolecall ``Example``).
        pred: the program's prediction (``answer`` and ``trajectory``); None (a run that raised) scores 0.
        trace: DSPy's trace of the run (unused: the trajectory holds more).
        pred_name: the predictor GEPA asks about (``"plan"``, ``"extract.predict"``, ...), or None for the whole
            program; its role's own calls are added to the feedback.
        pred_trace: GEPA's trace of that predictor (unused, as ``trace``).
        score: the answer metric, ``"f1"`` (graded, default) or ``"em"``.
        max_chars: the feedback is cut to this many characters.

    Returns:
        ``dspy.Prediction(score=float, feedback=str)``.

    Raises:
        ValueError: an unknown ``score``, or an example without a gold answer.

    Example:
        >>> gold = dspy.Example(question="Where was Ada born?", answers=["London"])
        >>> result = answer_feedback(gold, dspy.Prediction(answer="Paris"))
        >>> result.score, result.feedback.splitlines()[0]
        (0.0, "Wrong: the correct answer is 'London'; the program answered 'Paris' (F1 0.00, exact match 0).")
    """
    _check_score(score)
    answers = gold_answers(gold)
    answer = _predicted_answer(pred)
    value = _SCORES[score](answer, answers)
    em = exact_match(answer, answers)
    aliases = f" (also accepted: {', '.join(repr(a) for a in answers[1:4])})" if len(answers) > 1 else ""
    verdict = "Correct" if em == 1.0 else ("Partly right" if value > 0 else "Wrong")
    said = f"the program answered {answer!r}" if answer else "the program gave no answer"
    lines = [
        f"{verdict}: the correct answer is {answers[0]!r}{aliases}; {said} ({score.upper()} {value:.2f}, "
        f"exact match {em:.0f})."
    ]
    trajectory = getattr(pred, "trajectory", None) if pred is not None else None
    if trajectory is None:
        lines.append("No trajectory was recorded: the program did not run to the end.")
    else:
        lines += _trajectory_lines(trajectory, [str(s) for s in (_get(gold, "supporting_ids") or [])])
        if pred_name is not None:
            lines += _role_lines(trajectory, pred_name)
    feedback = "\n".join(lines)
    if len(feedback) > max_chars:
        feedback = feedback[: max_chars - 3] + "..."
    return dspy.Prediction(score=value, feedback=feedback)


def _trajectory_lines(trajectory: Any, supporting_ids: list[str]) -> list[str]:
    """What the run did: its role calls, its retrievals against the supporting passages, its failures."""
    calls = Counter(s.role for s in trajectory.role_steps())
    order = ", ".join(f"{role} x{n}" if n > 1 else role for role, n in calls.items()) or "none"
    retrievals = trajectory.retrievals()
    lines = [f"The program made {sum(calls.values())} role calls ({order}) and {len(retrievals)} retrievals."]
    if supporting_ids and retrievals:
        found = set(trajectory.retrieved_ids) | {paragraph_id_of(i) for i in trajectory.retrieved_ids}
        missing = [i for i in supporting_ids if i not in found and paragraph_id_of(i) not in found]
        hits = len(supporting_ids) - len(missing)
        titles = ", ".join(repr(i.split("::")[0]) for i in missing[:3])
        lines.append(
            f"Retrieval found {hits} of the {len(supporting_ids)} supporting passages"
            + (f"; it missed {titles}." if missing else ".")
        )
    errors = trajectory.errors
    if errors:
        shown = "; ".join(f"{s.role}: {s.error}" for s in errors[:_MAX_FAILURES])
        more = f" (and {len(errors) - _MAX_FAILURES} more)" if len(errors) > _MAX_FAILURES else ""
        lines.append(f"Failed steps ({len(errors)}): {shown}{more}.")
    return lines


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _role_lines(trajectory: Any, pred_name: str) -> list[str]:
    """The calls of the role behind predictor ``pred_name`` (``"answer.predict"`` is role ``answer``)."""
    role = pred_name if trajectory.role_steps(pred_name) else pred_name.split(".")[0]
    steps = trajectory.role_steps(role)
    if not steps:
        return [f"Role {role!r} was not called in this run."]
    failed = [s for s in steps if not s.ok]
    line = f"Role {role!r} was called {_times(len(steps))}; {len(failed)} of its outputs failed to parse"
    line += f" (first: {failed[0].error})." if failed else "."
    last = next((s for s in reversed(steps) if s.ok), None)
    if last is not None:
        line += f" Its last output: {last.outputs}."
    return [line]
