"""The two baselines every paper reports: no-retrieval chain of thought and single-step RAG (retrieve once, then CoT).

Both have one role, ``answer`` (a ``dspy.ChainOfThought``: reasoning, then the short answer), with a token budget of
128 like the other chain-of-thought roles (Iter-RetGen's ``generate``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import dspy

from rolecall.programs.baselines.direct_demos import default_cot_demos, default_rag_demos
from rolecall.programs.core.options import PassageOptions, ProgramOptions, option
from rolecall.programs.core.passage_program import PassageProgram
from rolecall.programs.core.program import Program
from rolecall.programs.core.trajectory import Trajectory
from rolecall.signatures.baselines import AnswerFromPassages, AnswerQuestion

__all__ = ["NoRetrievalCoT", "SingleStepRAG", "SingleStepRAGOptions"]

_COT_TOKENS = {"answer": 128}
"""Reasoning and answer of one chain-of-thought call."""


def _answer_of(pred: dspy.Prediction | None) -> str:
    return str(pred.answer).strip() if pred is not None and pred.answer else ""


class NoRetrievalCoT(Program):
    """Closed-book chain of thought: ``question -> reasoning, answer`` (the "Naive (No Retrieval)" baseline).

    No options; the retriever is accepted (the common constructor contract) and ignored. Other arguments:
    :class:`Program`.
    """

    Options: ClassVar[type[ProgramOptions]] = ProgramOptions
    ROLES: ClassVar[tuple[str, ...]] = ("answer",)
    MAX_TOKENS: ClassVar[dict[str, int]] = _COT_TOKENS

    def _build_roles(self) -> None:
        self.answer = dspy.ChainOfThought(AnswerQuestion)

    def default_demos(self) -> dict[str, list[dspy.Example]]:
        """Gold chains as reasoning (:func:`~rolecall.programs.baselines.direct_demos.default_cot_demos`)."""
        return default_cot_demos()

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        pred = self.call_role("answer", trajectory, question=question)
        return dspy.Prediction(answer=_answer_of(pred), trajectory=trajectory)


@dataclass(kw_only=True)
class SingleStepRAGOptions(PassageOptions):
    """Options of :class:`SingleStepRAG` (``max_passage_chars`` / ``max_context_chars`` inherited)."""

    top_k: int = option(5, low=1)
    """Passages retrieved with the question."""


class SingleStepRAG(PassageProgram):
    """Retrieve once with the question, then answer with chain of thought over the passages.

    Options: :class:`SingleStepRAGOptions`; other arguments: :class:`Program`.
    """

    Options: ClassVar[type[SingleStepRAGOptions]] = SingleStepRAGOptions
    ROLES: ClassVar[tuple[str, ...]] = ("answer",)
    MAX_TOKENS: ClassVar[dict[str, int]] = _COT_TOKENS

    top_k: int

    def _build_roles(self) -> None:
        self.answer = dspy.ChainOfThought(AnswerFromPassages)

    def default_demos(self) -> dict[str, list[dspy.Example]]:
        """Gold passages and a distractor (:func:`~rolecall.programs.baselines.direct_demos.default_rag_demos`)."""
        return default_rag_demos()

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        passages = self.retrieve(trajectory, question, self.top_k)
        shown = self.show_passages(passages)
        pred = self.call_role("answer", trajectory, question=question, passages=shown)
        return dspy.Prediction(answer=_answer_of(pred), trajectory=trajectory)
