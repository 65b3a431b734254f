"""The role signatures of the MultiAgent-OPD teams (Zhao et al., "MultiAgent-OPD: End-to-End Training of Hierarchical
Multi-Agent Systems with On-Policy Distillation", arXiv 2610.23234).

Three roles share one model in the paper; a role prompt at the start of every call selects the role (Sec. 3.1):

- Leader: ``(question, reports so far) -> delegate subtasks to a wave of Searchers | answer with selected reports``.
- Searcher: one ReAct turn ``(subtask, notes so far) -> search <query> | report <summary>``.
- Answerer: ``(question, selected reports) -> answer``.

The paper's templates (its Appendix C) are not in the published text, so the instructions are written from the role
descriptions. Each opens with the role prompt of :data:`ROLE_PROMPTS`; they are short because the default model is
SmolLM2-135M and every instruction token is paid on every call. Outputs stay flat (``Literal``, ``str``, ``list``).
"""

from __future__ import annotations

from typing import Literal

import dspy

__all__ = [
    "LeaderAction",
    "SearcherAction",
    "ROLE_PROMPTS",
    "DelegateOrAnswer",
    "SearchOrReport",
    "AnswerFromReports",
]

LeaderAction = Literal["delegate", "answer"]
"""The Leader's move: send subtasks to a new wave of Searchers, or hand the selected reports to the Answerer."""

SearcherAction = Literal["search", "report"]
"""The Searcher's move in one ReAct turn: one more retrieval (the paper's ``<search>``), or the final report."""

ROLE_PROMPTS: dict[str, str] = {
    "leader": "You are the Leader of a research team.",
    "searcher": "You are the Searcher of a research team.",
    "answerer": "You are the Answerer of a research team.",
}
"""The role prompt each role's instructions start with; with one shared adapter it is what selects the role."""


class DelegateOrAnswer(dspy.Signature):
    """You are the Leader of a research team. Searchers look facts up for you and send back numbered reports.
    If facts are missing, choose delegate and list short subtasks, one fact each; they are searched at the same time.
    If the reports are enough, choose answer and list the numbers of the useful reports."""

    question: str = dspy.InputField()
    reports: str = dspy.InputField(desc="numbered reports from Searchers, or none yet")
    action: LeaderAction = dspy.OutputField(desc="delegate or answer")
    # selected before subtasks: SmolLM2-135M drops the header of a field that follows a list of questions
    selected: list[int] = dspy.OutputField(desc="numbers of the reports to use; empty when delegating")
    subtasks: list[str] = dspy.OutputField(desc="subtasks for Searchers; empty when answering")


class SearchOrReport(dspy.Signature):
    """You are the Searcher of a research team. Work on your subtask one action at a time.
    To look something up, choose search and write a short query naming the entity.
    When your notes answer the subtask, choose report and write the answer and where it came from."""

    subtask: str = dspy.InputField()
    notes: str = dspy.InputField(desc="your earlier searches and the passages they found")
    action: SearcherAction = dspy.OutputField(desc="search or report")
    content: str = dspy.OutputField(desc="the search query, or the report")


class AnswerFromReports(dspy.Signature):
    """You are the Answerer of a research team. Answer the question from the Searchers' reports.
    Give only the short answer."""

    question: str = dspy.InputField()
    reports: str = dspy.InputField(desc="reports chosen by the Leader")
    answer: str = dspy.OutputField(desc="a few words")
