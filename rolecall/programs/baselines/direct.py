"""The two baselines every paper reports: no-retrieval chain of thought and single-step RAG (retrieve once, then CoT).

Both follow the :class:`~rolecall.programs.core.program.Program` contract with one role, ``answer`` (a ``dspy.ChainOfThought``).
"""

from __future__ import annotations

from typing import Any, Literal

import dspy

from rolecall.errors import ConfigError
from rolecall.programs.baselines.direct_demos import default_cot_demos, default_rag_demos
from rolecall.programs.core.program import Program, format_passages
from rolecall.programs.core.trajectory import Trajectory
from rolecall.retrievers.base import Retriever
from rolecall.signatures.baselines import AnswerFromPassages, AnswerQuestion

__all__ = ["NoRetrievalCoT", "SingleStepRAG", "Demos", "resolve_demos"]


Demos = Literal["auto"] | dict[str, list[dspy.Example]] | None


def resolve_demos(demos: Any, kind: Literal["cot", "rag"]) -> dict[str, list[dspy.Example]] | None:
    """The initial demos of a baseline: ``"auto"`` -> the built-in ``kind`` demos; None or a dict pass through."""
    if demos is None or isinstance(demos, dict):
        return demos
    if demos == "auto":
        return default_cot_demos() if kind == "cot" else default_rag_demos()
    raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {demos!r}")


class NoRetrievalCoT(Program):
    """Closed-book chain of thought: ``question -> reasoning, answer`` (the "Naive (No Retrieval)" baseline).

    Args:
        retriever: ignored (accepted for the common constructor contract).
        lm: LM for the ``answer`` role.
        demos: ``"auto"``, None or a dict ``{"answer": [...]}``.
        per_role_adapters: see :class:`Program`.
        adapter: DSPy adapter for the role call.
        lm_kwargs: LM call arguments by role (see :class:`Program`).
    """

    def __init__(
        self,
        retriever: Retriever | None = None,
        *,
        lm: dspy.LM | None = None,
        demos: Demos = "auto",
        per_role_adapters: bool = True,
        adapter: dspy.Adapter | None = None,
        lm_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(retriever, lm=lm, per_role_adapters=per_role_adapters, adapter=adapter, lm_kwargs=lm_kwargs)
        self.answer = dspy.ChainOfThought(AnswerQuestion)
        initial = resolve_demos(demos, "cot")
        if initial:
            self.set_demos(initial)
        self._bind_lm()

    def forward(self, question: str) -> dspy.Prediction:
        """Answer ``question`` without retrieval; never raises."""
        trajectory = Trajectory(question=question)
        try:
            pred = self.call_role("answer", trajectory, question=question)
            answer = str(pred.answer).strip() if pred is not None and pred.answer else ""
            return dspy.Prediction(answer=answer, trajectory=trajectory)
        except Exception as e:
            return self.failed(trajectory, e)


class SingleStepRAG(Program):
    """Retrieve once with the question, then answer with chain of thought over the passages.

    Args:
        retriever: the retriever tool.
        lm: LM for the ``answer`` role.
        demos: ``"auto"``, None or a dict ``{"answer": [...]}``.
        top_k: passages retrieved.
        max_passage_chars: characters of one passage shown to the LM.
        max_context_chars: characters of all passages shown.
        per_role_adapters: see :class:`Program`.
        adapter: DSPy adapter for the role call.
        lm_kwargs: LM call arguments by role (see :class:`Program`).
    """

    def __init__(
        self,
        retriever: Retriever | None = None,
        *,
        lm: dspy.LM | None = None,
        demos: Demos = "auto",
        top_k: int = 5,
        max_passage_chars: int = 300,
        max_context_chars: int = 900,
        per_role_adapters: bool = True,
        adapter: dspy.Adapter | None = None,
        lm_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(retriever, lm=lm, per_role_adapters=per_role_adapters, adapter=adapter, lm_kwargs=lm_kwargs)
        if top_k < 1:
            raise ConfigError(f"top_k must be >= 1, got {top_k}")
        if max_passage_chars < 20 or max_context_chars < max_passage_chars:
            raise ConfigError(
                f"need 20 <= max_passage_chars <= max_context_chars, got {max_passage_chars} and {max_context_chars}"
            )
        self.top_k, self.max_passage_chars, self.max_context_chars = top_k, max_passage_chars, max_context_chars
        self._config |= {"top_k": top_k, "max_passage_chars": max_passage_chars, "max_context_chars": max_context_chars}
        self.answer = dspy.ChainOfThought(AnswerFromPassages)
        initial = resolve_demos(demos, "rag")
        if initial:
            self.set_demos(initial)
        self._bind_lm()

    def forward(self, question: str) -> dspy.Prediction:
        """Retrieve with ``question`` and answer from the passages; never raises."""
        trajectory = Trajectory(question=question)
        try:
            passages = self.retrieve(trajectory, question, self.top_k)
            shown = format_passages(passages, max_chars=self.max_passage_chars, max_total_chars=self.max_context_chars)
            pred = self.call_role("answer", trajectory, question=question, passages=shown)
            answer = str(pred.answer).strip() if pred is not None and pred.answer else ""
            return dspy.Prediction(answer=answer, trajectory=trajectory)
        except Exception as e:
            return self.failed(trajectory, e)
