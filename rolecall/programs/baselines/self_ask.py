"""Self-Ask with retrieval: the model asks follow-up questions, retrieval answers them (Press et al., Findings of
EMNLP 2023, arXiv 2210.03350).

Control flow (a :class:`~rolecall.programs.core.search.SearchLoop` of ``max_follow_ups + 1`` ask turns):

    H = []                                                    # (follow-up, intermediate answer) pairs
    for turn = 0..max_follow_ups:
        (action, text) = Ask(q, H)
        if action = final_answer: return text                 # an "answer" action
        if turn = max_follow_ups: budget exhausted            # no follow-up left to ask
        D = retrieve(text, K)                                 # a "search" action: the paper's search engine answers
        a = AnswerFollowUp(text, D)                           # the follow-up; here retrieval + a short-answer role
        H <- H + [(text, a)]
    answer = the last intermediate answer                     # fallback when no final answer came

Follow-ups that hold OPERA-style placeholders (``[entity from step 1]``, ``#1``) get the earlier answers written in.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar

import dspy

from rolecall.programs.baselines.chains import format_history
from rolecall.programs.baselines.iterative_demos import default_self_ask_demos
from rolecall.programs.core.options import PassageOptions, option
from rolecall.programs.core.passage_program import PassageProgram
from rolecall.programs.core.plan import fill_placeholders
from rolecall.programs.core.search import Observation, SearchAction, SearchLoop
from rolecall.programs.core.trajectory import Trajectory
from rolecall.signatures.baselines import AnswerFollowUp, AskFollowUp
from rolecall.signatures.types import is_null_answer

__all__ = ["SelfAsk", "SelfAskOptions"]

logger = logging.getLogger(__name__)

_UNKNOWN = "unknown"
_NO_PASSAGES = "(no passages)"


@dataclass(kw_only=True)
class SelfAskOptions(PassageOptions):
    """Options of :class:`SelfAsk` (``max_passage_chars`` / ``max_context_chars`` inherited)."""

    top_k: int = option(3, low=1)
    """Passages retrieved per follow-up question."""
    max_follow_ups: int = option(4, low=1)
    """Most follow-up questions; asking one more records ``budget_exhausted`` and the last intermediate answer
    becomes the answer."""
    use_retrieval: bool = True
    """False: follow-ups are answered closed-book (the paper's Self-Ask without a search engine)."""


@dataclass
class _History:
    """One question's follow-ups with their intermediate answers."""

    question: str
    pairs: list[tuple[str, str]] = field(default_factory=list)


class SelfAsk(PassageProgram):
    """Self-Ask: decompose the question into follow-up questions asked one at a time, each answered from retrieval.

    Press et al., "Measuring and Narrowing the Compositionality Gap in Language Models", Findings of EMNLP 2023
    (Self-Ask + Search Engine). Roles: ``ask`` (question, history -> action ``follow_up`` or ``final_answer``, text)
    and ``answer_followup`` (follow-up, passages -> short answer). Options: :class:`SelfAskOptions`; the other
    arguments: :class:`Program`. Default token budgets: ask 56, answer_followup 32.

    Example:
        >>> program = SelfAsk(retriever, lm=LocalLM())                          # doctest: +SKIP
        >>> pred = program(question="Who founded the publisher of Krobrend's Hollow?")  # doctest: +SKIP
        >>> pred.answer, pred.follow_ups                                        # doctest: +SKIP
    """

    Options: ClassVar[type[SelfAskOptions]] = SelfAskOptions
    ROLES: ClassVar[tuple[str, ...]] = ("ask", "answer_followup")
    MAX_TOKENS: ClassVar[dict[str, int]] = {"ask": 56, "answer_followup": 32}

    top_k: int
    max_follow_ups: int
    use_retrieval: bool

    def _build_roles(self) -> None:
        self.ask = dspy.Predict(AskFollowUp)
        self.answer_followup = dspy.Predict(AnswerFollowUp)

    def default_demos(self) -> dict[str, list[dspy.Example]]:
        """States of gold decompositions
        (:func:`~rolecall.programs.baselines.iterative_demos.default_self_ask_demos`)."""
        return default_self_ask_demos()

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        history = _History(question)
        loop = SearchLoop(
            self,
            trajectory,
            act=lambda lp: self._ask(lp, history),
            k=self.top_k,
            max_turns=self.max_follow_ups + 1,
            observe=lambda lp, obs: self._answer_from(obs, history, trajectory),
        ).run()
        answer = loop.answer if loop.answer is not None else self._fallback_answer(history.pairs, trajectory)
        follow_ups = [{"follow_up": q, "answer": a} for q, a in history.pairs]
        return dspy.Prediction(answer=answer, trajectory=trajectory, follow_ups=follow_ups)

    def _ask(self, loop: SearchLoop, history: _History) -> SearchAction:
        """One turn: ``answer`` (a final answer), ``search`` (a follow-up, answered in :meth:`_answer_from`),
        ``continue`` (a follow-up answered closed-book, or one past the budget) or ``stop``."""
        turn, trajectory = loop.turn, loop.trajectory
        follow_up, final = self._next(history, turn, trajectory)
        if final is not None:
            return SearchAction("answer", final)
        if follow_up is None:
            return SearchAction("stop")
        if turn == self.max_follow_ups:  # the budget is spent: the loop records budget_exhausted
            return SearchAction("continue", follow_up)
        if any(follow_up.lower() == q.lower() for q, _ in history.pairs):  # greedy decoding would ask it forever
            trajectory.event("repeated_follow_up", turn=turn, follow_up=follow_up)
            return SearchAction("stop")
        if self.use_retrieval:
            return SearchAction("search", follow_up)
        history.pairs.append((follow_up, self._answer_follow_up(follow_up, _NO_PASSAGES, turn, trajectory)))
        return SearchAction("continue", follow_up)

    def _next(self, history: _History, turn: int, trajectory: Trajectory) -> tuple[str | None, str | None]:
        """``(follow_up, None)`` to ask one more, ``(None, answer)`` for a final answer, ``(None, None)`` to stop."""
        pairs = history.pairs
        pred = self.call_role("ask", trajectory, question=history.question, history=format_history(pairs))
        trajectory.steps[-1].meta.update(turn=turn)
        action = str(pred.action).strip() if pred is not None and pred.action else ""
        text = " ".join(str(pred.text).split()) if pred is not None and pred.text else ""
        if pred is None or not text:
            reason = "ask call failed" if pred is None else "empty text"
            if not pairs:  # degrade to answering the question itself from retrieval
                trajectory.event("fallback", turn=turn, reason=f"{reason}; asking the question itself")
                return history.question, None
            trajectory.event("fallback", turn=turn, reason=reason)
            return None, None
        if action == "final_answer":
            if is_null_answer(text):
                trajectory.event("fallback", turn=turn, reason="null final answer")
                return None, None
            return None, text
        filled, unresolved = fill_placeholders(text, {i: a for i, (_, a) in enumerate(pairs, start=1)})
        if unresolved:
            trajectory.event("unresolved_placeholder", turn=turn, placeholders=unresolved)
        return filled, None

    def _answer_from(self, observation: Observation, history: _History, trajectory: Trajectory) -> None:
        """Answer a searched follow-up from its passages (the loop's observer)."""
        shown = self.show_passages(observation.passages)
        observation.notes = self._answer_follow_up(observation.query, shown, observation.turn, trajectory)
        history.pairs.append((observation.query, observation.notes))

    def _answer_follow_up(self, follow_up: str, shown: str, turn: int, trajectory: Trajectory) -> str:
        pred = self.call_role("answer_followup", trajectory, follow_up=follow_up, passages=shown)
        trajectory.steps[-1].meta.update(turn=turn, query=follow_up)
        answer = " ".join(str(pred.answer).split()) if pred is not None and pred.answer else ""
        return _UNKNOWN if is_null_answer(answer) else answer

    @staticmethod
    def _fallback_answer(pairs: list[tuple[str, str]], trajectory: Trajectory) -> str:
        """The last real intermediate answer (in a chain of hops, the last hop answers the question), or ``""``."""
        for _, answer in reversed(pairs):
            if not is_null_answer(answer):
                trajectory.event("fallback", reason="no final answer; using the last intermediate answer")
                return answer
        return ""
