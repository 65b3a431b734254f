"""The role signatures and typed values of REAP (Zhu et al., "REAP: Enhancing RAG with Recursive Evaluation and Adaptive
Planning for Multi-Hop Question Answering", AAAI 2026, arXiv 2511.09966).

Four LM roles; the Plan Updater is rule-based (see ``rolecall.programs.reap.plan``):

- Decomposer: ``Q -> P_0 = {(id_i, q_i, deps_i)}``, written as flat lines ``"2. Where was #1 born? (deps: 1)"``.
- Fact Extractor: ``(q_t, D_t, F_{t-1}) -> f_t = (s_t, e_t, r_t, l_t)`` with ``l_t`` in DirectAnswer / PartialClue /
  Failed, plus the short answer the Plan Updater substitutes into later sub-tasks. **Decision**: the fields are
  generated in the order statement, answer, level, evidence, reasoning (the paper's tuple starts with s_t): a small
  model often copies a whole passage into ``evidence`` and runs out of tokens, and the fields the planner routes on
  are then already written and can be salvaged.
- Re-Planner (for ``l_t`` = PartialClue / Failed): a pragmatic sufficiency check, then a scoped repair: edit the
  sub-query, or prune its branch and inject new sub-tasks. It sees the whole plan (the paper's Sub-task Planner
  "maintains the global task plan"): every sub-task with its status and answer, not only the ones downstream.
- Synthesizer: ``(Q, F) -> answer``.

The paper does not publish its prompts; the instructions below are written from its role descriptions and kept short,
because the default model (SmolLM2-135M) pays for every instruction token on every call. Outputs are flat (``str``,
``list[str]``, a small ``Literal``); ``rolecall.programs.reap.parse.parse_plan`` turns the Decomposer's lines into typed
:class:`SubTask`\\ s, and ``Program.call_role(..., salvage=True)`` recovers fields from a completion the adapter could
not parse.
"""

from __future__ import annotations

from typing import Literal

import dspy
from pydantic import BaseModel, Field

from rolecall.signatures.types import is_null_answer

__all__ = [
    "FactLevel",
    "FACT_LEVELS",
    "ReplanAction",
    "REPLAN_ACTIONS",
    "SubTask",
    "FactTuple",
    "DecomposeTaskPlan",
    "ExtractStructuredFact",
    "RepairPlan",
    "SynthesizeFromFacts",
    "split_answers",
]

FactLevel = Literal["DirectAnswer", "PartialClue", "Failed"]
"""l_t, the satisfaction level of a fact: it answers the sub-query, only gives a clue, or gives nothing."""

FACT_LEVELS: tuple[str, ...] = ("DirectAnswer", "PartialClue", "Failed")

ReplanAction = Literal["sufficient", "edit", "replace"]
"""The Re-Planner's decision: the partial fact is good enough; edit the sub-query (a local issue); or prune the branch
and inject new sub-tasks (a systemic defect)."""

REPLAN_ACTIONS: tuple[str, ...] = ("sufficient", "edit", "replace")

ANSWER_SEPARATOR = ";"
"""Several answers of one sub-task are written ``"A; B"`` (a comma may be part of a name or a list answer)."""


class SubTask(BaseModel):
    """One entry ``(id_i, q_i, deps_i)`` of a REAP plan; ``question`` may hold ``#k`` references to sub-task ``k``."""

    id: int = Field(ge=1, description="1-based id, unique in the plan")
    question: str = Field(min_length=1)
    deps: list[int] = Field(default_factory=list, description="ids of earlier sub-tasks whose answers it needs")

    def line(self) -> str:
        """The flat line the Decomposer writes: ``"2. Where was #1 born? (deps: 1)"``."""
        deps = ", ".join(str(d) for d in self.deps) or "none"
        return f"{self.id}. {self.question} (deps: {deps})"


class FactTuple(BaseModel):
    """f_t = (s_t, e_t, r_t, l_t) of the Fact Extractor, plus the short answer the Plan Updater substitutes."""

    statement: str = ""
    evidence: str = ""
    reasoning: str = ""
    level: FactLevel = "Failed"
    answer: str = ""

    @property
    def answers(self) -> list[str]:
        """The distinct non-null answers (several when the sub-task has several valid sub-answers)."""
        return split_answers(self.answer)

    def brief(self) -> str:
        """One line for later prompts: the statement, or the answer when there is no statement."""
        text = self.statement.strip() if not is_null_answer(self.statement) else ""
        return text or (self.answer.strip() if not is_null_answer(self.answer) else "")


class DecomposeTaskPlan(dspy.Signature):
    """Break the question into simple sub-questions, one fact each, in the order they can be answered.
    Write one line per sub-question: "N. sub-question (deps: ids)". Write #N where the answer of sub-question N is
    needed, and deps: none when it needs no earlier answer."""

    question: str = dspy.InputField()
    plan: list[str] = dspy.OutputField(desc='lines like "2. Where was #1 born? (deps: 1)"')


class ExtractStructuredFact(dspy.Signature):
    """Extract one fact for the sub-question from the passages; use the known facts to resolve names.
    State the fact, give the short answer (separate several answers with ;) and its level: DirectAnswer if the
    passages answer the sub-question, PartialClue if they only give a clue, Failed if they give nothing.
    Then copy the supporting sentence as evidence and explain in one sentence."""

    sub_question: str = dspy.InputField()
    known_facts: str = dspy.InputField(desc="facts found so far, or none")
    passages: str = dspy.InputField(desc="retrieved passages")
    statement: str = dspy.OutputField(desc="the fact as one sentence, or unknown")
    answer: str = dspy.OutputField(desc="a few words, or unknown")
    level: FactLevel = dspy.OutputField()
    evidence: str = dspy.OutputField(desc="a sentence copied from the passages, or none")
    reasoning: str = dspy.OutputField(desc="one short sentence")


class RepairPlan(dspy.Signature):
    """The current sub-question of the plan was not fully answered. Pick an action. sufficient: the fact is good enough
    to go on; give its answer. edit: reword it as one better sub-question. replace: the approach failed; write new
    sub-questions numbered from 1 (#N for their own answers, known names in full) to replace it and the sub-questions
    that depend on it."""

    question: str = dspy.InputField(desc="the main question")
    sub_question: str = dspy.InputField()
    fact: str = dspy.InputField(desc="what the fact extractor found")
    known_facts: str = dspy.InputField(desc="facts found so far, or none")
    plan: str = dspy.InputField(desc="every sub-question: [done: answer], [current], [pending], [failed] or [pruned]")
    action: ReplanAction = dspy.OutputField()
    answer: str = dspy.OutputField(desc="the usable answer if sufficient, else none")
    sub_questions: list[str] = dspy.OutputField(desc="the edited or new sub-questions; [] if sufficient")


class SynthesizeFromFacts(dspy.Signature):
    """Answer the question from the facts found for its sub-questions. Give only the short answer."""

    question: str = dspy.InputField()
    facts: str = dspy.InputField(desc="sub-questions with their answers")
    answer: str = dspy.OutputField(desc="a few words")


def split_answers(answer: str | None) -> list[str]:
    """The distinct non-null answers in ``"A; B"`` (``[]`` for a null answer).

    Example:
        >>> split_answers("Varn; Dellin ; varn; unknown")
        ['Varn', 'Dellin']
    """
    if answer is None:
        return []
    out: dict[str, str] = {}
    for part in str(answer).split(ANSWER_SEPARATOR):
        part = part.strip().strip(".").strip()
        if part and not is_null_answer(part):
            out.setdefault(part.lower(), part)
    return list(out.values())
