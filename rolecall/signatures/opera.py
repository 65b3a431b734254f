"""The role signatures of OPERA (Liu et al., "OPERA: A Reinforcement Learning-Enhanced Orchestrated Planner-Executor
Architecture for Reasoning-Oriented Multi-Hop Retrieval", arXiv 2508.16438).

Three agents, one signature each (Sec. 3.3):

- Plan Agent (Goal Planning Module): ``q -> {p_1, ..., p_m}``, each ``p_i`` may hold ``[t from step j]``, ``j < i``.
- Analysis-Answer Agent (Reason-Execute Module), Eq. 8: ``(p_i, D_i) -> (yes, a_i, c_i)`` or ``(no, ⊥, ρ_i)``.
- Rewrite Agent (Reason-Execute Module): ``(p_i, D_i^insuf, ρ_i) -> q'_i``.

``SynthesizeAnswer`` is the final step of the reference code (on by default in rolecall's OPERA; the paper answers
with the last sub-goal's answer). The paper's prompt templates are not published (its appendix shows empty boxes), so
the instructions below are written from the role descriptions. They are short on purpose: the default model is
SmolLM2-135M, and every instruction token is paid on every call.
"""

from __future__ import annotations

import dspy

from rolecall.signatures.types import Confidence, Sufficiency

__all__ = ["PlanSubGoals", "AnalyzeAnswer", "RewriteQuery", "SynthesizeAnswer"]


class PlanSubGoals(dspy.Signature):
    """Split the question into short sub-questions, one fact each, in the order they must be answered.
    Where a sub-question needs an earlier answer, write [entity from step N] in its place.
    The answer of the last sub-question answers the question."""

    question: str = dspy.InputField()
    sub_goals: list[str] = dspy.OutputField(desc="ordered sub-questions")


class AnalyzeAnswer(dspy.Signature):
    """Read the passages and decide if they answer the sub-question.
    If yes: give the short answer, copied from the passages. If no: answer unknown and say what is missing."""

    sub_goal: str = dspy.InputField(desc="the sub-question")
    passages: str = dspy.InputField(desc="retrieved passages")
    sufficient: Sufficiency = dspy.OutputField(desc="yes or no")
    answer: str = dspy.OutputField(desc="a few words, or unknown")
    confidence: Confidence = dspy.OutputField()
    missing_information: str = dspy.OutputField(desc="what is missing, or none")


class RewriteQuery(dspy.Signature):
    """The passages did not answer the sub-question. Write a short search query that names the entity to look up."""

    sub_goal: str = dspy.InputField(desc="the sub-question")
    passages: str = dspy.InputField(desc="passages that were not enough")
    missing_information: str = dspy.InputField()
    query: str = dspy.OutputField(desc="a short search query")


class SynthesizeAnswer(dspy.Signature):
    """Answer the question from the answers of its sub-questions. Give only the short answer."""

    question: str = dspy.InputField()
    evidence: str = dspy.InputField(desc="sub-questions with their answers")
    answer: str = dspy.OutputField(desc="a few words")
