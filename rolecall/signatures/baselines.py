"""Role signatures of the baselines every paper compares against (PAPERS.md, "Baselines"): closed-book CoT,
single-step RAG and the iterative retrieval baselines."""

from __future__ import annotations

import dspy

__all__ = ["AnswerQuestion", "AnswerFromPassages"]


class AnswerQuestion(dspy.Signature):
    """Answer the question. Give only the short answer."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField(desc="a few words")


class AnswerFromPassages(dspy.Signature):
    """Answer the question using the passages. Give only the short answer."""

    question: str = dspy.InputField()
    passages: str = dspy.InputField(desc="retrieved passages")
    answer: str = dspy.OutputField(desc="a few words")
