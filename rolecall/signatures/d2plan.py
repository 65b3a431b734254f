"""The role signatures of D2Plan (Luo, Wu and Feng, "D2Plan: Dual-Agent Dynamic Global Planning for Complex
Retrieval-Augmented Reasoning", arXiv 2601.08282).

D2Plan has two agents (Sec. 2.1). The Reasoner is, in the paper, one multi-turn generation with tags: it assesses the
question's complexity, writes a ``<plan>`` of ordered sub-questions (``#A_j`` stands for the answer of sub-question
``j``), searches up to K times per sub-question, refines the next sub-question after solving one, writes a ``<replan>``
after a failure and ends with ``<answer>``. Here that generation is split into five typed calls a 135M model can emit,
one per tag-delimited part of the paper's trajectory; the ``reasoner_`` prefix of their role names marks them as one
policy (SPlanRL trains the Reasoner as a whole):

- ``ReasonerPlan``: ``q -> (complexity, plan)``; a single-hop question is not decomposed.
- ``ReasonerStep``: ``(q, C, sub-question, notes so far) -> search with a query, or answer``.
- ``ReasonerRefine``: ``(q, C, next sub-question) -> the sub-question made self-contained``.
- ``ReasonerRevise``: ``(q, C, failed sub-question, what the searches found) -> new remaining plan``.
- ``ReasonerAnswer``: ``(q, C) -> answer``.

``C`` is the paper's global context: the current plan, each solved sub-question with its answer and evidence, as one
``context`` field (:func:`rolecall.programs.d2plan.context.format_context`); every Reasoner call after planning sees
it. The Purifier (``Purify``) sits between the retriever and the Reasoner: ``(sub-question, passages) -> (relevant?,
key information)``, or a short summary of the passages when they are irrelevant.

The paper's prompts (its Appendix J) are not in the text we have, so the instructions are written from the role
descriptions, and kept short: every instruction token is paid on every call of a 135M-parameter model.
"""

from __future__ import annotations

from typing import Literal

import dspy

__all__ = [
    "Complexity",
    "Action",
    "Relevance",
    "ReasonerPlan",
    "ReasonerStep",
    "ReasonerRefine",
    "ReasonerRevise",
    "ReasonerAnswer",
    "Purify",
]

Complexity = Literal["single-hop", "multi-hop"]
"""The Reasoner's complexity assessment: single-hop questions are not decomposed (Sec. 2.1)."""

Action = Literal["search", "answer"]
"""What the Reasoner does next on a sub-question: search again or answer it."""

Relevance = Literal["yes", "no"]
"""The Purifier's relevance judgement J_k: do the passages hold the key information for the sub-question?"""


class ReasonerPlan(dspy.Signature):
    """Does the question need one fact (single-hop) or a chain of facts (multi-hop)?
    Single-hop: the plan is the question itself. Multi-hop: list sub-questions in order, one fact each;
    write #A_1, #A_2, ... for the answer of sub-question 1, 2, ..."""

    question: str = dspy.InputField()
    complexity: Complexity = dspy.OutputField()
    plan: list[str] = dspy.OutputField(desc="ordered sub-questions")


_CONTEXT = "the plan; solved sub-questions with answer and evidence"


class ReasonerStep(dspy.Signature):
    """Solve the sub-question of the plan. If the notes give its answer, answer it.
    Otherwise search with a short query that names the entity to look up."""

    question: str = dspy.InputField()
    context: str = dspy.InputField(desc=_CONTEXT)
    sub_question: str = dspy.InputField()
    notes: str = dspy.InputField(desc="what earlier searches found")
    action: Action = dspy.OutputField(desc="search or answer")
    query: str = dspy.OutputField(desc="a short search query, or none")
    answer: str = dspy.OutputField(desc="a few words, or unknown")


class ReasonerRefine(dspy.Signature):
    """Rewrite the sub-question so it stands alone: replace each #A_j by the answer of sub-question j."""

    question: str = dspy.InputField()
    context: str = dspy.InputField(desc=_CONTEXT)
    sub_question: str = dspy.InputField()
    refined: str = dspy.OutputField(desc="the sub-question without #A_j")


class ReasonerRevise(dspy.Signature):
    """Searching did not answer the failed sub-question. Write a new plan for the rest of the question,
    starting in its place: smaller or reworded sub-questions. Write #A_j for the answer of sub-question j."""

    question: str = dspy.InputField()
    context: str = dspy.InputField(desc=_CONTEXT)
    failed: str = dspy.InputField(desc="the sub-question that failed")
    failure: str = dspy.InputField(desc="what the searches found")
    plan: list[str] = dspy.OutputField(desc="new sub-questions replacing the failed one and those after it")


class ReasonerAnswer(dspy.Signature):
    """Answer the question from its solved sub-questions. Give only the short answer."""

    question: str = dspy.InputField()
    context: str = dspy.InputField(desc=_CONTEXT)
    answer: str = dspy.OutputField(desc="a few words")


class Purify(dspy.Signature):
    """Do the passages hold the answer to the sub-question?
    If yes, copy the sentence that answers it. If no, say in a few words what the passages are about."""

    sub_question: str = dspy.InputField()
    passages: str = dspy.InputField(desc="retrieved passages")
    relevant: Relevance = dspy.OutputField(desc="yes or no")
    information: str = dspy.OutputField(desc="the key sentence, or a short summary")
