"""The role signatures of STRIDE (Strategic Iterative Decision-making, SIGIR 2026; ``seeds/stride.txt``).

Three layers, five modules (Sec. 3.2):

- Strategy layer, Meta-Planner (Eq. 2): ``q -> P_q = (S_q, C_q)``, in two calls: ``MetaPlan`` writes the General
  Strategy ``S_q`` (reasoning steps over entity types, no names), then ``ConcretePlan`` instantiates it,
  ``(q, S_q) -> C_q`` (sub-questions grounded in the question's entities; the paper derives ``C_q`` "by instantiating
  ``S_q``", so the strategy is an input of the plan step). Dependencies between sub-questions are written as
  ``[entity from step N]`` placeholders. ``DirectPlan`` is the "w/o Meta-Planner" ablation: the concrete plan alone,
  without any General Strategy prompt. ``MetaPlan``'s output is named ``steps``: SmolLM2-135M writes no field at all
  when a lone output is named ``strategy`` (it jumps to the completion marker).
- Control layer, Supervisor (Eq. 3): ``(q, C_q, Ω) -> (α_i, z_i)`` with ``α_i ∈ {retrieve, rewrite, answer}``. The
  paper emits one directive per ready sub-question in one call; here one call answers for one ready sub-question (the
  calls of one iteration run concurrently), because a 135M model writes two flat fields reliably, not a list of
  typed directives. Its ``action`` is a plain string read leniently by the program (the first of
  :data:`ACTIONS` it names, :func:`rolecall.programs.stride.parse.read_action`), so "Retrieve." is not a parse
  failure.
- Execution layer: Extractor (Eq. 4) ``(z_i, D_{z_i}) -> E_i`` (atomic facts one per line, or ``none``: a plain string
  rather than a JSON list, which the default model often breaks by copying passage numbers), Reasoner (Eq. 5)
  ``(c_i, X_i) -> a_i`` and the Fallback Reasoner ``(q, P_q, facts, passages) -> a_final``, whose ``plan`` is the
  whole ``P_q``: the General Strategy and every sub-question with its answer or ``pending``.

The paper does not publish its prompts; the instructions below are written from its descriptions and kept short (every
instruction token is paid on every call of the default SmolLM2-135M model).
"""

from __future__ import annotations

from typing import Literal

import dspy

__all__ = [
    "Action",
    "ACTIONS",
    "MetaPlan",
    "ConcretePlan",
    "DirectPlan",
    "Supervise",
    "ExtractFacts",
    "ReasonAnswer",
    "FallbackAnswer",
    "SelectFacts",
]

Action = Literal["retrieve", "rewrite", "answer"]
"""α_i of the Supervisor: search with a first query, search with a reformulated query after a failure, or answer from
the facts already gathered (comparison, intersection) without searching."""

ACTIONS: tuple[str, ...] = ("retrieve", "rewrite", "answer")
"""The values of :data:`Action`, in the paper's order."""


class MetaPlan(dspy.Signature):
    """Write a general strategy for the question: the reasoning steps over entity types (person, city, film), one
    step per fact to find, without names."""

    question: str = dspy.InputField()
    steps: list[str] = dspy.OutputField(desc="the general strategy: steps over entity types, no names")


class ConcretePlan(dspy.Signature):
    """Turn the strategy into a concrete plan: one short sub-question per step, using the names from the question.
    Where a sub-question needs an earlier answer, write [entity from step N]."""

    question: str = dspy.InputField()
    strategy: list[str] = dspy.InputField(desc="steps over entity types")
    sub_questions: list[str] = dspy.OutputField(desc="ordered sub-questions")


class DirectPlan(dspy.Signature):
    """Split the question into short sub-questions, one fact each, in the order they must be answered.
    Where a sub-question needs an earlier answer, write [entity from step N]."""

    question: str = dspy.InputField()
    sub_questions: list[str] = dspy.OutputField(desc="ordered sub-questions")


class Supervise(dspy.Signature):
    """Choose the next action for the ready sub-question.
    retrieve: search with a short query naming the entity.
    rewrite: earlier queries found nothing; write a different query, not one of the failed queries.
    answer: the solved answers already answer it (a comparison or a common member); no search."""

    question: str = dspy.InputField()
    progress: str = dspy.InputField(desc="the plan with solved answers and pending sub-questions")
    sub_question: str = dspy.InputField(desc="the ready sub-question")
    failed_queries: str = dspy.InputField(desc="queries that found nothing, or none")
    action: str = dspy.OutputField(desc="retrieve, rewrite or answer")
    query: str = dspy.OutputField(desc="a short search query, or the question to answer")


class ExtractFacts(dspy.Signature):
    """Copy the short facts from the passages that help answer the query, one fact per line.
    If no passage helps, write none."""

    query: str = dspy.InputField()
    passages: str = dspy.InputField(desc="retrieved passages")
    facts: str = dspy.OutputField(desc="one atomic fact per line, or none")


class ReasonAnswer(dspy.Signature):
    """Answer the sub-question from the facts. Give only the short answer, or unknown."""

    sub_question: str = dspy.InputField()
    facts: str = dspy.InputField(desc="known facts")
    answer: str = dspy.OutputField(desc="a few words")


class FallbackAnswer(dspy.Signature):
    """The plan could not be finished. Give the best short answer to the question from the plan, facts and passages."""

    question: str = dspy.InputField()
    plan: str = dspy.InputField(desc="the strategy, and each sub-question with its answer or pending")
    facts: str = dspy.InputField(desc="facts found so far")
    passages: str = dspy.InputField(desc="retrieved passages")
    answer: str = dspy.OutputField(desc="a few words")


class SelectFacts(dspy.Signature):
    """Given the query and candidate facts, select only the facts strictly required to answer the question."""

    query: str = dspy.InputField()
    facts: str = dspy.InputField(desc="candidate facts, one per line")
    required: str = dspy.OutputField(desc="the required facts, copied one per line")
