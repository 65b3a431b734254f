"""IRCoT: interleave retrieval with chain-of-thought reasoning, one sentence at a time (Trivedi et al., ACL 2023).

Control flow:

    P <- retrieve(q, K)                                   # the question opens the collection
    for i = 1..max_steps:
        s_i = Reason(q, P, s_1 .. s_{i-1})                # the next CoT sentence
        if "answer is" in s_i: break                      # the chain has concluded
        P <- P ∪ retrieve(s_i, K)                         # the sentence is the next query
    answer = Answer(q, P, s_1 .. s_i)                     # the reader (or the answer after the cue, reader=False)

Only the first sentence of each generation is kept (the paper's rule; a following "So the answer is" sentence is kept
with it). Passages are shown newest retrieval first, so the prompt's character budget drops the oldest ones: their
facts are already written into the reasoning. At most ``max_passages`` distinct passages are kept (the paper: 15).
"""

from __future__ import annotations

import logging
import re
from typing import Any

import dspy

from rolecall.errors import ConfigError
from rolecall.programs.baselines.direct import Demos
from rolecall.programs.baselines.iterative_demos import (
    NO_REASONING,
    answer_after_cue,
    has_answer_cue,
    resolve_iterative_demos,
)
from rolecall.programs.core.program import Program, default_lm_kwargs, format_passages
from rolecall.programs.core.trajectory import Trajectory
from rolecall.retrievers.base import Passage, Retriever
from rolecall.signatures.baselines import AnswerFromReasoning, NextReasoningSentence
from rolecall.signatures.types import is_null_answer

__all__ = ["IRCoT"]

logger = logging.getLogger(__name__)

_MAX_TOKENS = {"reason": 64, "answer": 32}

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


class IRCoT(Program):
    """Interleaving Retrieval with Chain-of-Thought: each reasoning sentence is the next retrieval query.

    Trivedi et al., "Interleaving Retrieval with Chain-of-Thought Reasoning for Knowledge-Intensive Multi-Step
    Questions", ACL 2023 (arXiv 2212.10509). Roles: ``reason`` (question, passages, reasoning so far -> next sentence)
    and ``answer`` (question, passages, reasoning -> short answer; the paper's QA reader).

    Args:
        retriever: the retriever tool.
        lm: LM for every role (a ``LocalLM`` gets one LoRA adapter per role, see :class:`Program`).
        demos: ``"auto"`` (built-in demos), None (zero-shot, or keep what a loaded state sets), or a dict role ->
            examples.
        top_k: passages retrieved per query (the paper's K, tuned over 2-8).
        max_steps: most reasoning sentences; when the chain has not said "So the answer is" by then, the run records
            ``budget_exhausted`` and the reader answers from what it has.
        max_passages: most distinct passages kept over the run (the paper: 15); the oldest are dropped first.
        max_passage_chars: characters of one passage shown to an LM.
        max_context_chars: characters of all passages shown in one prompt.
        interleave: False -> retrieve once with the question and reason without further retrieval (the paper's
            one-retrieval "OneR" control).
        reader: False -> no ``answer`` role; the answer is what the chain states after "the answer is".
        per_role_adapters: see :class:`Program`.
        adapter: DSPy adapter for the role calls.
        lm_kwargs: LM call arguments by role, ``"*"`` for all. Default: stop on ChatAdapter's completion marker, and
            token budgets reason 64, answer 32.

    Example:
        >>> program = IRCoT(retriever, lm=LocalLM())                            # doctest: +SKIP
        >>> pred = program(question="Who founded the publisher of Krobrend's Hollow?")  # doctest: +SKIP
        >>> pred.answer, pred.reasoning                                         # doctest: +SKIP
    """

    def __init__(
        self,
        retriever: Retriever | None = None,
        *,
        lm: dspy.LM | None = None,
        demos: Demos = "auto",
        top_k: int = 4,
        max_steps: int = 5,
        max_passages: int = 15,
        max_passage_chars: int = 250,
        max_context_chars: int = 1000,
        interleave: bool = True,
        reader: bool = True,
        per_role_adapters: bool = True,
        adapter: dspy.Adapter | None = None,
        lm_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        if lm_kwargs is None:
            lm_kwargs = default_lm_kwargs(_MAX_TOKENS)
        super().__init__(retriever, lm=lm, per_role_adapters=per_role_adapters, adapter=adapter, lm_kwargs=lm_kwargs)
        for name, value in (("top_k", top_k), ("max_steps", max_steps), ("max_passages", max_passages)):
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if max_passage_chars < 20 or max_context_chars < max_passage_chars:
            raise ConfigError(
                f"need 20 <= max_passage_chars <= max_context_chars, got {max_passage_chars} and {max_context_chars}"
            )
        self.top_k, self.max_steps, self.max_passages = top_k, max_steps, max_passages
        self.max_passage_chars, self.max_context_chars = max_passage_chars, max_context_chars
        self.interleave, self.reader = interleave, reader
        self._config |= {
            "top_k": top_k,
            "max_steps": max_steps,
            "max_passages": max_passages,
            "max_passage_chars": max_passage_chars,
            "max_context_chars": max_context_chars,
            "interleave": interleave,
            "reader": reader,
        }
        self.reason = dspy.Predict(NextReasoningSentence)
        if reader:
            self.answer = dspy.Predict(AnswerFromReasoning)
        initial = resolve_iterative_demos(demos, "ircot", self.roles)
        if initial:
            self.set_demos(initial)
        self._bind_lm()

    def forward(self, question: str) -> dspy.Prediction:
        """Answer ``question``; returns ``Prediction(answer, trajectory, reasoning)`` and never raises."""
        trajectory = Trajectory(question=question)
        try:
            return self._run(question, trajectory)
        except Exception as e:  # anything unforeseen becomes a recorded error step
            return self.failed(trajectory, e)

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        collected: list[Passage] = []  # newest first, distinct ids
        query = question
        self._collect(trajectory, collected, query, step=0)
        sentences: list[str] = []
        concluded = False
        for step in range(1, self.max_steps + 1):
            pred = self.call_role(
                "reason",
                trajectory,
                question=question,
                passages=self._show(collected),
                reasoning=" ".join(sentences) or NO_REASONING,
            )
            trajectory.steps[-1].meta.update(step=step, query=query)
            sentence = _first_sentence(str(pred.next_sentence)) if pred is not None and pred.next_sentence else ""
            if not sentence:
                reason = "reason call failed" if pred is None else "empty sentence"
                trajectory.event("fallback", step=step, reason=reason)
                break
            if sentence in sentences:  # greedy decoding would repeat it forever
                trajectory.event("repeated_sentence", step=step, sentence=sentence)
                break
            sentences.append(sentence)
            if has_answer_cue(sentence):
                concluded = True
                break
            if step == self.max_steps:
                event = trajectory.event("budget_exhausted", step=step, max_steps=self.max_steps)
                event.error = f"{self.max_steps} reasoning sentences written without reaching an answer"
                break
            if self.interleave:
                query = sentence
                self._collect(trajectory, collected, query, step=step)
        reasoning = " ".join(sentences)
        answer = self._answer(question, collected, reasoning, len(sentences), concluded, trajectory)
        return dspy.Prediction(answer=answer, trajectory=trajectory, reasoning=reasoning)

    def _collect(self, trajectory: Trajectory, collected: list[Passage], query: str, step: int) -> None:
        """Retrieve with ``query`` and put the new passages in front of ``collected`` (capped at ``max_passages``)."""
        passages = self.retrieve(trajectory, query, self.top_k)
        trajectory.steps[-1].meta.update(step=step, query_source="question" if step == 0 else "reasoning")
        fresh = list({p.id: p for p in passages}.values())
        ids = {p.id for p in fresh}
        collected[:] = (fresh + [p for p in collected if p.id not in ids])[: self.max_passages]

    def _show(self, passages: list[Passage]) -> str:
        return format_passages(passages, max_chars=self.max_passage_chars, max_total_chars=self.max_context_chars)

    def _answer(
        self,
        question: str,
        collected: list[Passage],
        reasoning: str,
        steps: int,
        concluded: bool,
        trajectory: Trajectory,
    ) -> str:
        stated = answer_after_cue(reasoning)
        stated = "" if is_null_answer(stated) else stated
        if not self.reader:
            if not stated:
                trajectory.event("no_answer", steps=steps, concluded=concluded)
            return stated
        pred = self.call_role(
            "answer", trajectory, question=question, passages=self._show(collected), reasoning=reasoning or NO_REASONING
        )
        trajectory.steps[-1].meta.update(step=steps + 1, concluded=concluded)
        answer = str(pred.answer).strip() if pred is not None and pred.answer else ""
        if is_null_answer(answer):
            if stated:
                trajectory.event("fallback", reason="reader gave no answer; using the chain's answer", answer=stated)
            return stated
        return answer


def _first_sentence(text: str) -> str:
    """The first sentence of a generation (IRCoT keeps only that), plus the second when it states the answer, as in
    "Ada was born in Varn. So the answer is Varn."; naive version: ``text.split(". ")[0]``."""
    sentences = _SENTENCE_END.split(" ".join(text.split()))
    if len(sentences) > 1 and not has_answer_cue(sentences[0]) and has_answer_cue(sentences[1]):
        return f"{sentences[0]} {sentences[1]}"
    return sentences[0]
