"""D2Plan's search for one sub-question (Algorithm 3 of the appendix): at most K searches, each purified, until the
Reasoner answers.

    loop = SearchLoop(act = Reasoner step, observe = Purifier, k = top_k, max_turns = K + 1)
    act:      (action, query, a_i) = Step(q, C, p_i, notes)    # answering without a search is allowed (Table 20)
              answer -> end; after K searches -> end (failed)
    observe:  (J_k, I_k) = Purify(p_i, D_k); notes += (J_k, I_k)

After the K-th search the Reasoner gets one more turn to answer, unless the Purifier judged every search irrelevant
(then the sub-question has failed without asking again). A failed sub-question records its trigger: no relevant
evidence (``failed_sub_question``) or relevant evidence but no answer (``unanswered_sub_question``).
"""

from __future__ import annotations

from typing import Any, Protocol

from rolecall.programs.core.search import Observation, SearchAction, SearchLoop
from rolecall.programs.core.text import format_passages
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.d2plan.context import SubQuestion, entity_query, format_notes
from rolecall.retrievers.base import Passage
from rolecall.signatures.types import is_null_answer

__all__ = ["SearchingProgram", "SubQuestionSearch"]


class SearchingProgram(Protocol):
    """What the search needs of its program (:class:`~rolecall.programs.d2plan.program.D2Plan`): its role calls and
    its search options. A protocol, so that this module does not import the program that imports it."""

    max_searches: int
    top_k: int
    use_purifier: bool
    max_context_chars: int
    max_passage_chars: int

    def call_role(self, role: str, trajectory: Trajectory, /, **kwargs: Any) -> Any:
        """Run one role call, recorded in ``trajectory``."""


class SubQuestionSearch:
    """The bounded act-search-purify loop of one sub-question, recorded in ``trajectory``.

    Args:
        program: the D2Plan program (its roles, retriever and options).
        trajectory: where the role calls, retrievals and events are recorded.
        sub: the sub-question, already refined; its searches, judgements, notes, answer and status are filled in.
        question: the question q.
        context: the global context C the Reasoner sees (see :func:`~rolecall.programs.d2plan.context.format_context`).
    """

    def __init__(
        self, program: SearchingProgram, trajectory: Trajectory, sub: SubQuestion, *, question: str, context: str
    ):
        self.program, self.trajectory, self.sub = program, trajectory, sub
        self.question, self.context = question, context

    def run(self) -> SubQuestion:
        """Search until the Reasoner answers or the budget is spent; returns the filled-in sub-question."""
        program, sub = self.program, self.sub
        loop = SearchLoop(
            program,
            self.trajectory,
            act=self.act,
            observe=self.observe,
            k=program.top_k,
            max_turns=program.max_searches + 1,
            meta={"sub_question": sub.index},
        ).run()
        sub.searches = loop.searches
        if loop.answer is not None:
            sub.answer, sub.status = loop.answer, "solved"
            return sub
        sub.status = "failed"
        sub.failure = "unanswered_sub_question" if any(r is True for r in sub.relevant) else "failed_sub_question"
        self.trajectory.event(
            "sub_question_failed", sub_question=sub.index, trigger=sub.failure
        ).error = f"sub-question {sub.index} unsolved after {sub.searches} searches ({sub.failure})"
        return sub

    def act(self, loop: SearchLoop) -> SearchAction:
        """One Reasoner step: answer, search (with a fallback query when it gave none), or stop at the budget."""
        program, sub, trajectory = self.program, self.sub, self.trajectory
        if loop.searches >= program.max_searches and all(r is False for r in sub.relevant):
            return SearchAction("stop")  # K searches, none relevant: failed without asking the Reasoner again
        notes = format_notes(sub, purified=program.use_purifier, max_chars=program.max_context_chars)
        pred = program.call_role(
            "reasoner_step",
            trajectory,
            question=self.question,
            context=self.context,
            sub_question=sub.text,
            notes=notes,
        )
        trajectory.steps[-1].meta.update(sub_question=sub.index, turn=loop.turn)
        action = str(pred.action) if pred is not None else "search"
        answer = str(pred.answer or "").strip() if pred is not None else ""
        if action == "answer" and not is_null_answer(answer):
            return SearchAction("answer", answer)
        if loop.searches >= program.max_searches:
            return SearchAction("stop")
        query = str(pred.query or "").strip() if pred is not None else ""
        if is_null_answer(query):
            if pred is not None and action == "search":
                trajectory.event(
                    "malformed_output", role="reasoner_step", reason="search without a query"
                ).error = "search without a query"
            tried = {o.query for o in loop.observations}
            query = next((q for q in (sub.text, entity_query(sub.text)) if q and q not in tried), sub.text)
            trajectory.event("query_fallback", sub_question=sub.index, turn=loop.turn, query=query)
        return SearchAction("search", query)

    def observe(self, loop: SearchLoop, observation: Observation) -> None:
        """Purify one search's passages into a note for the Reasoner."""
        relevant, information = self.purify(observation.passages, search=loop.searches + 1)
        observation.notes = information
        self.sub.relevant.append(relevant)
        self.sub.notes.append(information)

    def purify(self, passages: list[Passage], *, search: int) -> tuple[bool | None, str]:
        """The Purifier's (relevant?, key information or summary); raw passages and None without it."""
        program, sub = self.program, self.sub
        shown = format_passages(
            passages, max_chars=program.max_passage_chars, max_total_chars=program.max_context_chars
        )
        if not program.use_purifier:
            return None, shown
        if not passages:  # nothing to judge: no LM call
            return False, "the search returned no passages"
        pred = program.call_role("purifier", self.trajectory, sub_question=sub.text, passages=shown)
        self.trajectory.steps[-1].meta.update(sub_question=sub.index, search=search)
        about = "passages about " + ", ".join(dict.fromkeys(p.title for p in passages[:3]))
        if pred is None:
            return None, about
        information = str(pred.information or "").strip()
        return str(pred.relevant) == "yes", about if is_null_answer(information) else information
