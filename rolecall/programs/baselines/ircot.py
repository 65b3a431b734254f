"""IRCoT: interleave retrieval with chain-of-thought reasoning, one sentence at a time (Trivedi et al., ACL 2023).

Control flow (a :class:`~rolecall.programs.core.search.SearchLoop` of ``max_steps`` turns):

    P <- retrieve(q, K)                                   # the question opens the collection (loop.search)
    for i = 1..max_steps:                                 # turn i - 1
        s_i = Reason(q, P, s_1 .. s_{i-1})                # the next CoT sentence
        if "answer is" in s_i: break                      # the chain has concluded (an "answer" action)
        P <- P ∪ retrieve(s_i, K)                         # the sentence is the next query (a "search" action)
    answer = Answer(q, P, s_1 .. s_i)                     # the reader (or the answer after the cue, reader=False)

Only the first sentence of each generation is kept (the paper's rule; a following "So the answer is" sentence is kept
with it). Passages are shown newest retrieval first, so the prompt's character budget drops the oldest ones: their
facts are already written into the reasoning. At most ``max_passages`` distinct passages are kept (the paper: 15).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar

import dspy

from rolecall.programs.baselines.chains import NO_REASONING, answer_after_cue, first_sentence, has_answer_cue
from rolecall.programs.baselines.iterative_demos import default_ircot_demos
from rolecall.programs.core.options import PassageOptions, option
from rolecall.programs.core.passage_program import PassageProgram
from rolecall.programs.core.search import Observation, SearchAction, SearchLoop
from rolecall.programs.core.trajectory import Trajectory
from rolecall.retrievers.base import Passage
from rolecall.signatures.baselines import AnswerFromReasoning, NextReasoningSentence
from rolecall.signatures.types import is_null_answer

__all__ = ["IRCoT", "IRCoTOptions"]

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class IRCoTOptions(PassageOptions):
    """Options of :class:`IRCoT` (``max_passage_chars`` / ``max_context_chars`` inherited)."""

    top_k: int = option(4, low=1)
    """Passages retrieved per query (the paper's K, tuned over 2-8)."""
    max_steps: int = option(5, low=1)
    """Most reasoning sentences; when the chain has not said "So the answer is" by then, the run records
    ``budget_exhausted`` and the reader answers from what it has."""
    max_passages: int = option(15, low=1)
    """Most distinct passages kept over the run (the paper: 15); the oldest are dropped first."""
    max_passage_chars: int = option(250, low=20)
    """Characters of one passage shown to an LM."""
    max_context_chars: int = option(1000, low=20)
    """Characters of all passages shown in one prompt (at least ``max_passage_chars``)."""
    interleave: bool = True
    """False: retrieve once with the question and reason without further retrieval (the paper's one-retrieval
    "OneR" control)."""
    reader: bool = True
    """False: no ``answer`` role; the answer is what the chain states after "the answer is"."""


@dataclass
class _Chain:
    """One question's reasoning chain and passage collection (newest first, distinct ids)."""

    question: str
    sentences: list[str] = field(default_factory=list)
    collected: list[Passage] = field(default_factory=list)


class IRCoT(PassageProgram):
    """Interleaving Retrieval with Chain-of-Thought: each reasoning sentence is the next retrieval query.

    Trivedi et al., "Interleaving Retrieval with Chain-of-Thought Reasoning for Knowledge-Intensive Multi-Step
    Questions", ACL 2023 (arXiv 2212.10509). Roles: ``reason`` (question, passages, reasoning so far -> next sentence)
    and ``answer`` (question, passages, reasoning -> short answer; the paper's QA reader; off with ``reader=False``).
    Options: :class:`IRCoTOptions`; the other arguments: :class:`Program`. Default token budgets: reason 64,
    answer 32.

    Example:
        >>> program = IRCoT(retriever, lm=LocalLM())                            # doctest: +SKIP
        >>> pred = program(question="Who founded the publisher of Krobrend's Hollow?")  # doctest: +SKIP
        >>> pred.answer, pred.reasoning                                         # doctest: +SKIP
    """

    Options: ClassVar[type[IRCoTOptions]] = IRCoTOptions
    ROLES: ClassVar[tuple[str, ...]] = ("reason", "answer")
    MAX_TOKENS: ClassVar[dict[str, int]] = {"reason": 64, "answer": 32}

    top_k: int
    max_steps: int
    max_passages: int
    interleave: bool
    reader: bool

    def _build_roles(self) -> None:
        self.reason = dspy.Predict(NextReasoningSentence)
        if self.reader:
            self.answer = dspy.Predict(AnswerFromReasoning)

    def default_demos(self) -> dict[str, list[dspy.Example]]:
        """States of gold chains (:func:`~rolecall.programs.baselines.iterative_demos.default_ircot_demos`)."""
        return default_ircot_demos()

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        chain = _Chain(question)
        loop = SearchLoop(
            self,
            trajectory,
            act=lambda lp: self._reason(lp, chain),
            k=self.top_k,
            max_turns=self.max_steps,
            observe=lambda lp, obs: self._collect(lp, obs, chain),
        )
        loop.search(question)
        loop.run()
        concluded = loop.final is not None and loop.final.kind == "answer"
        reasoning = " ".join(chain.sentences)
        answer = self._answer(chain, reasoning, concluded, trajectory)
        return dspy.Prediction(answer=answer, trajectory=trajectory, reasoning=reasoning)

    def _reason(self, loop: SearchLoop, chain: _Chain) -> SearchAction:
        """One turn: the next sentence; it concludes (``answer``), is the next query (``search``), or ends the
        chain (``stop``: failed, empty or repeated; ``continue`` on the last turn or without interleaving)."""
        step = loop.turn + 1
        pred = self.call_role(
            "reason",
            loop.trajectory,
            question=chain.question,
            passages=self._show(chain.collected),
            reasoning=" ".join(chain.sentences) or NO_REASONING,
        )
        loop.trajectory.steps[-1].meta.update(step=step, query=loop.observations[-1].query)
        sentence = first_sentence(str(pred.next_sentence)) if pred is not None and pred.next_sentence else ""
        if not sentence:
            reason = "reason call failed" if pred is None else "empty sentence"
            loop.trajectory.event("fallback", step=step, reason=reason)
            return SearchAction("stop")
        if sentence in chain.sentences:  # greedy decoding would repeat it forever
            loop.trajectory.event("repeated_sentence", step=step, sentence=sentence)
            return SearchAction("stop")
        chain.sentences.append(sentence)
        if has_answer_cue(sentence):
            return SearchAction("answer", answer_after_cue(sentence))
        if self.interleave and step < self.max_steps:  # no retrieval after the last allowed sentence
            return SearchAction("search", sentence)
        return SearchAction("continue", sentence)

    def _collect(self, loop: SearchLoop, observation: Observation, chain: _Chain) -> None:
        """Put the new passages in front of the collection (capped at ``max_passages``) and note what the query
        was: the question (step 0) or the sentence of the step that was just written."""
        first = not loop.observations
        loop.trajectory.steps[-1].meta.update(
            step=0 if first else loop.turn + 1, query_source="question" if first else "reasoning"
        )
        fresh = list({p.id: p for p in observation.passages}.values())
        ids = {p.id for p in fresh}
        chain.collected[:] = (fresh + [p for p in chain.collected if p.id not in ids])[: self.max_passages]

    def _show(self, passages: list[Passage]) -> str:
        return self.show_passages(passages)

    def _answer(self, chain: _Chain, reasoning: str, concluded: bool, trajectory: Trajectory) -> str:
        """The reader's answer, else (reader off, or it gave none) the answer the chain states after the cue."""
        steps = len(chain.sentences)
        stated = answer_after_cue(reasoning)
        stated = "" if is_null_answer(stated) else stated
        if not self.reader:
            if not stated:
                trajectory.event("no_answer", steps=steps, concluded=concluded)
            return stated
        pred = self.call_role(
            "answer",
            trajectory,
            question=chain.question,
            passages=self._show(chain.collected),
            reasoning=reasoning or NO_REASONING,
        )
        trajectory.steps[-1].meta.update(step=steps + 1, concluded=concluded)
        answer = str(pred.answer).strip() if pred is not None and pred.answer else ""
        if is_null_answer(answer):
            if stated:
                trajectory.event("fallback", reason="reader gave no answer; using the chain's answer", answer=stated)
            return stated
        return answer
