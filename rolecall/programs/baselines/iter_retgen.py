"""Iter-RetGen: iterative retrieval-generation synergy (Shao et al., Findings of EMNLP 2023, arXiv 2305.15294).

Control flow (T iterations, default 3):

    y_0 = ""
    for t = 1..T:
        D_t = retrieve(q || y_{t-1}, K)                   # the previous generation steers retrieval
        y_t = Generate(q, D_t)                            # chain of thought, then the answer
    answer = answer of y_T

Each iteration sees only its own passages (they are not accumulated); the generation of iteration t is what tells the
retriever of iteration t + 1 which entities the next hop needs.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import dspy

from rolecall.errors import ConfigError
from rolecall.programs.baselines.direct import Demos
from rolecall.programs.baselines.iterative_demos import resolve_iterative_demos
from rolecall.programs.core.program import Program, default_lm_kwargs, format_passages
from rolecall.programs.core.trajectory import Trajectory
from rolecall.retrievers.base import Retriever
from rolecall.signatures.baselines import GenerateWithPassages
from rolecall.signatures.types import is_null_answer

__all__ = ["IterRetGen", "QueryWith"]

logger = logging.getLogger(__name__)

_MAX_TOKENS = {"generate": 128}

QueryWith = Literal["generation", "answer"]
"""What of ``y_{t-1}`` joins the question in the next query: the whole generation (the paper) or only its answer."""


class IterRetGen(Program):
    """Iter-RetGen: alternate retrieval and chain-of-thought generation, querying with question + last generation.

    Shao et al., "Enhancing Retrieval-Augmented Large Language Models with Iterative Retrieval-Generation Synergy",
    Findings of EMNLP 2023. One role, ``generate`` (a ``dspy.ChainOfThought``: question, passages -> reasoning,
    answer); the answer of the last iteration is the final answer.

    Args:
        retriever: the retriever tool.
        lm: LM for the role (a ``LocalLM`` gets one LoRA adapter, see :class:`Program`).
        demos: ``"auto"`` (built-in demos), None (zero-shot, or keep what a loaded state sets), or a dict
            ``{"generate": [...]}``.
        top_k: passages retrieved per iteration.
        iterations: T, the number of retrieval-generation iterations (the step budget).
        query_with: ``"generation"`` (question + reasoning + answer of the last iteration, the paper) or ``"answer"``
            (question + the last answer only).
        stop_when_stable: stop early once an iteration repeats the previous iteration's answer (recorded
            ``converged``); a run that never converges records ``budget_exhausted``. Off in the paper.
        max_passage_chars: characters of one passage shown to the LM.
        max_context_chars: characters of all passages shown in one prompt.
        per_role_adapters: see :class:`Program`.
        adapter: DSPy adapter for the role calls.
        lm_kwargs: LM call arguments by role, ``"*"`` for all. Default: stop on ChatAdapter's completion marker and
            128 tokens for ``generate`` (reasoning and answer).

    Example:
        >>> program = IterRetGen(retriever, lm=LocalLM(), iterations=2)         # doctest: +SKIP
        >>> pred = program(question="Who founded the publisher of Krobrend's Hollow?")  # doctest: +SKIP
        >>> pred.answer, [g["answer"] for g in pred.generations]                # doctest: +SKIP
    """

    def __init__(
        self,
        retriever: Retriever | None = None,
        *,
        lm: dspy.LM | None = None,
        demos: Demos = "auto",
        top_k: int = 5,
        iterations: int = 3,
        query_with: QueryWith = "generation",
        stop_when_stable: bool = False,
        max_passage_chars: int = 300,
        max_context_chars: int = 900,
        per_role_adapters: bool = True,
        adapter: dspy.Adapter | None = None,
        lm_kwargs: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        if lm_kwargs is None:
            lm_kwargs = default_lm_kwargs(_MAX_TOKENS)
        super().__init__(retriever, lm=lm, per_role_adapters=per_role_adapters, adapter=adapter, lm_kwargs=lm_kwargs)
        for name, value in (("top_k", top_k), ("iterations", iterations)):
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if query_with not in ("generation", "answer"):
            raise ConfigError(f"query_with must be 'generation' or 'answer', got {query_with!r}")
        if max_passage_chars < 20 or max_context_chars < max_passage_chars:
            raise ConfigError(
                f"need 20 <= max_passage_chars <= max_context_chars, got {max_passage_chars} and {max_context_chars}"
            )
        self.top_k, self.iterations, self.query_with = top_k, iterations, query_with
        self.stop_when_stable = stop_when_stable
        self.max_passage_chars, self.max_context_chars = max_passage_chars, max_context_chars
        self._config |= {
            "top_k": top_k,
            "iterations": iterations,
            "query_with": query_with,
            "stop_when_stable": stop_when_stable,
            "max_passage_chars": max_passage_chars,
            "max_context_chars": max_context_chars,
        }
        self.generate = dspy.ChainOfThought(GenerateWithPassages)
        initial = resolve_iterative_demos(demos, "iter_retgen", self.roles)
        if initial:
            self.set_demos(initial)
        self._bind_lm()

    def forward(self, question: str) -> dspy.Prediction:
        """Answer ``question``; returns ``Prediction(answer, trajectory, generations)`` and never raises."""
        trajectory = Trajectory(question=question)
        try:
            return self._run(question, trajectory)
        except Exception as e:  # anything unforeseen becomes a recorded error step
            return self.failed(trajectory, e)

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        generations: list[dict[str, Any]] = []
        feedback = ""  # what of y_{t-1} steers retrieval t
        converged = False
        t = 0
        for t in range(1, self.iterations + 1):
            query = f"{question} {feedback}".strip()
            passages = self.retrieve(trajectory, query, self.top_k)
            trajectory.steps[-1].meta.update(iteration=t)
            shown = format_passages(passages, max_chars=self.max_passage_chars, max_total_chars=self.max_context_chars)
            pred = self.call_role("generate", trajectory, question=question, passages=shown)
            trajectory.steps[-1].meta.update(iteration=t, query=query)
            if pred is None:
                trajectory.event("fallback", iteration=t, reason="generation failed; keeping the previous query")
                continue
            reasoning = " ".join(str(pred.get("reasoning") or "").split())
            answer = str(pred.answer).strip() if pred.answer else ""
            generations.append({"iteration": t, "query": query, "reasoning": reasoning, "answer": answer})
            known = "" if is_null_answer(answer) else answer
            steer = f"{reasoning} {known}".strip() if self.query_with == "generation" else known
            feedback = steer or feedback  # an empty generation keeps the previous query
            if self.stop_when_stable and len(generations) > 1 and not is_null_answer(answer):
                if _same(answer, generations[-2]["answer"]):
                    trajectory.event("converged", iteration=t, answer=answer)
                    converged = True
                    break
        if self.stop_when_stable and not converged:
            trajectory.event("budget_exhausted", iterations=self.iterations)
        return dspy.Prediction(
            answer=self._final_answer(generations, t, trajectory), trajectory=trajectory, generations=generations
        )

    @staticmethod
    def _final_answer(generations: list[dict[str, Any]], last_iteration: int, trajectory: Trajectory) -> str:
        """The answer of the last iteration run; when that one failed or gave none, the latest real answer."""
        for g in reversed(generations):
            if is_null_answer(g["answer"]):
                continue
            if g["iteration"] != last_iteration:
                trajectory.event("fallback", reason="last iteration gave no answer", iteration=g["iteration"])
            return g["answer"]
        return ""


def _same(a: str, b: str) -> bool:
    return " ".join(a.lower().strip(" .").split()) == " ".join(b.lower().strip(" .").split())
