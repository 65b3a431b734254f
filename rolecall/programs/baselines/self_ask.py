"""Self-Ask with retrieval: the model asks follow-up questions, retrieval answers them (Press et al., Findings of
EMNLP 2023, arXiv 2210.03350).

Control flow:

    H = []                                                    # (follow-up, intermediate answer) pairs
    for turn = 0..max_follow_ups:
        (action, text) = Ask(q, H)
        if action = final_answer: return text
        if turn = max_follow_ups: budget exhausted
        D = retrieve(text, K)                                 # the paper's search engine answers the follow-up;
        a = AnswerFollowUp(text, D)                           # here retrieval + a short-answer role
        H <- H + [(text, a)]
    answer = the last intermediate answer                     # fallback when no final answer came

Follow-ups that hold OPERA-style placeholders (``[entity from step 1]``, ``#1``) get the earlier answers written in.
"""

from __future__ import annotations

import logging
from typing import Any

import dspy

from rolecall.errors import ConfigError
from rolecall.programs.baselines.direct import Demos
from rolecall.programs.baselines.iterative_demos import format_history, resolve_iterative_demos
from rolecall.programs.core.plan import fill_placeholders
from rolecall.programs.core.program import Program, default_lm_kwargs, format_passages
from rolecall.programs.core.trajectory import Trajectory
from rolecall.retrievers.base import Retriever
from rolecall.signatures.baselines import AnswerFollowUp, AskFollowUp
from rolecall.signatures.types import is_null_answer

__all__ = ["SelfAsk"]

logger = logging.getLogger(__name__)

_MAX_TOKENS = {"ask": 56, "answer_followup": 32}

_UNKNOWN = "unknown"


class SelfAsk(Program):
    """Self-Ask: decompose the question into follow-up questions asked one at a time, each answered from retrieval.

    Press et al., "Measuring and Narrowing the Compositionality Gap in Language Models", Findings of EMNLP 2023
    (Self-Ask + Search Engine). Roles: ``ask`` (question, history -> action ``follow_up`` or ``final_answer``, text)
    and ``answer_followup`` (follow-up, passages -> short answer).

    Args:
        retriever: the retriever tool.
        lm: LM for every role (a ``LocalLM`` gets one LoRA adapter per role, see :class:`Program`).
        demos: ``"auto"`` (built-in demos), None (zero-shot, or keep what a loaded state sets), or a dict role ->
            examples.
        top_k: passages retrieved per follow-up question.
        max_follow_ups: most follow-up questions; asking one more records ``budget_exhausted`` and the last
            intermediate answer becomes the answer.
        use_retrieval: False -> follow-ups are answered closed-book (the paper's Self-Ask without a search engine).
        max_passage_chars: characters of one passage shown to an LM.
        max_context_chars: characters of all passages shown in one prompt.
        per_role_adapters: see :class:`Program`.
        adapter: DSPy adapter for the role calls.
        lm_kwargs: LM call arguments by role, ``"*"`` for all. Default: stop on ChatAdapter's completion marker, and
            token budgets ask 56, answer_followup 32.

    Example:
        >>> program = SelfAsk(retriever, lm=LocalLM())                          # doctest: +SKIP
        >>> pred = program(question="Who founded the publisher of Krobrend's Hollow?")  # doctest: +SKIP
        >>> pred.answer, pred.follow_ups                                        # doctest: +SKIP
    """

    def __init__(
        self,
        retriever: Retriever | None = None,
        *,
        lm: dspy.LM | None = None,
        demos: Demos = "auto",
        top_k: int = 3,
        max_follow_ups: int = 4,
        use_retrieval: bool = True,
        max_passage_chars: int = 300,
        max_context_chars: int = 900,
        per_role_adapters: bool = True,
        adapter: dspy.Adapter | None = None,
        lm_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        if lm_kwargs is None:
            lm_kwargs = default_lm_kwargs(_MAX_TOKENS)
        super().__init__(retriever, lm=lm, per_role_adapters=per_role_adapters, adapter=adapter, lm_kwargs=lm_kwargs)
        for name, value in (("top_k", top_k), ("max_follow_ups", max_follow_ups)):
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if max_passage_chars < 20 or max_context_chars < max_passage_chars:
            raise ConfigError(
                f"need 20 <= max_passage_chars <= max_context_chars, got {max_passage_chars} and {max_context_chars}"
            )
        self.top_k, self.max_follow_ups, self.use_retrieval = top_k, max_follow_ups, use_retrieval
        self.max_passage_chars, self.max_context_chars = max_passage_chars, max_context_chars
        self._config |= {
            "top_k": top_k,
            "max_follow_ups": max_follow_ups,
            "use_retrieval": use_retrieval,
            "max_passage_chars": max_passage_chars,
            "max_context_chars": max_context_chars,
        }
        self.ask = dspy.Predict(AskFollowUp)
        self.answer_followup = dspy.Predict(AnswerFollowUp)
        initial = resolve_iterative_demos(demos, "self_ask", self.roles)
        if initial:
            self.set_demos(initial)
        self._bind_lm()

    def forward(self, question: str) -> dspy.Prediction:
        """Answer ``question``; returns ``Prediction(answer, trajectory, follow_ups)`` and never raises."""
        trajectory = Trajectory(question=question)
        try:
            return self._run(question, trajectory)
        except Exception as e:  # anything unforeseen becomes a recorded error step
            return self.failed(trajectory, e)

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        pairs: list[tuple[str, str]] = []
        final: str | None = None
        for turn in range(self.max_follow_ups + 1):
            follow_up, final = self._next(question, pairs, turn, trajectory)
            if follow_up is None:
                break
            if turn == self.max_follow_ups:
                event = trajectory.event("budget_exhausted", turn=turn, max_follow_ups=self.max_follow_ups)
                event.error = f"{self.max_follow_ups} follow-up questions asked without a final answer"
                break
            if any(follow_up.lower() == q.lower() for q, _ in pairs):  # greedy decoding would ask it forever
                trajectory.event("repeated_follow_up", turn=turn, follow_up=follow_up)
                break
            pairs.append((follow_up, self._answer_follow_up(follow_up, turn, trajectory)))
        answer = final if final is not None else self._fallback_answer(pairs, trajectory)
        return dspy.Prediction(
            answer=answer, trajectory=trajectory, follow_ups=[{"follow_up": q, "answer": a} for q, a in pairs]
        )

    def _next(
        self, question: str, pairs: list[tuple[str, str]], turn: int, trajectory: Trajectory
    ) -> tuple[str | None, str | None]:
        """``(follow_up, None)`` to ask one more, ``(None, answer)`` for a final answer, ``(None, None)`` to stop."""
        pred = self.call_role("ask", trajectory, question=question, history=format_history(pairs))
        trajectory.steps[-1].meta.update(turn=turn)
        action = str(pred.action).strip() if pred is not None and pred.action else ""
        text = " ".join(str(pred.text).split()) if pred is not None and pred.text else ""
        if pred is None or not text:
            reason = "ask call failed" if pred is None else "empty text"
            if not pairs:  # degrade to answering the question itself from retrieval
                trajectory.event("fallback", turn=turn, reason=f"{reason}; asking the question itself")
                return question, None
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

    def _answer_follow_up(self, follow_up: str, turn: int, trajectory: Trajectory) -> str:
        shown = "(no passages)"
        if self.use_retrieval:
            passages = self.retrieve(trajectory, follow_up, self.top_k)
            trajectory.steps[-1].meta.update(turn=turn)
            shown = format_passages(passages, max_chars=self.max_passage_chars, max_total_chars=self.max_context_chars)
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
