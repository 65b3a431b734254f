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
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import dspy

from rolecall.programs.baselines.iterative_demos import default_iter_retgen_demos
from rolecall.programs.core.options import PassageOptions, option
from rolecall.programs.core.passage_program import PassageProgram
from rolecall.programs.core.trajectory import Trajectory
from rolecall.signatures.baselines import GenerateWithPassages
from rolecall.signatures.types import is_null_answer

__all__ = ["IterRetGen", "IterRetGenOptions", "QueryWith"]

logger = logging.getLogger(__name__)

QueryWith = Literal["generation", "answer"]
"""What of ``y_{t-1}`` joins the question in the next query: the whole generation (the paper) or only its answer."""


@dataclass(kw_only=True)
class IterRetGenOptions(PassageOptions):
    """Options of :class:`IterRetGen` (``max_passage_chars`` / ``max_context_chars`` inherited)."""

    top_k: int = option(5, low=1)
    """Passages retrieved per iteration."""
    iterations: int = option(3, low=1)
    """T, the number of retrieval-generation iterations (the step budget)."""
    query_with: QueryWith = "generation"
    """``"generation"``: question + reasoning + answer of the last iteration (the paper); ``"answer"``: question + the
    last answer only."""
    stop_when_stable: bool = False
    """Stop early once an iteration repeats the previous iteration's answer (recorded ``converged``); a run that never
    converges records ``budget_exhausted``. Off in the paper."""


class IterRetGen(PassageProgram):
    """Iter-RetGen: alternate retrieval and chain-of-thought generation, querying with question + last generation.

    Shao et al., "Enhancing Retrieval-Augmented Large Language Models with Iterative Retrieval-Generation Synergy",
    Findings of EMNLP 2023. One role, ``generate`` (a ``dspy.ChainOfThought``: question, passages -> reasoning,
    answer); the answer of the last iteration is the final answer. Options: :class:`IterRetGenOptions`; the other
    arguments: :class:`Program`. Default token budget: 128 for ``generate`` (reasoning and answer).

    The iterations are a fixed schedule, not an act-search-observe policy: every iteration retrieves (the generator
    never chooses to stop or answer), so :class:`~rolecall.programs.core.search.SearchLoop` does not fit.

    Example:
        >>> program = IterRetGen(retriever, lm=LocalLM(), iterations=2)         # doctest: +SKIP
        >>> pred = program(question="Who founded the publisher of Krobrend's Hollow?")  # doctest: +SKIP
        >>> pred.answer, [g["answer"] for g in pred.generations]                # doctest: +SKIP
    """

    Options: ClassVar[type[IterRetGenOptions]] = IterRetGenOptions
    ROLES: ClassVar[tuple[str, ...]] = ("generate",)
    MAX_TOKENS: ClassVar[dict[str, int]] = {"generate": 128}

    top_k: int
    iterations: int
    query_with: QueryWith
    stop_when_stable: bool

    def _build_roles(self) -> None:
        self.generate = dspy.ChainOfThought(GenerateWithPassages)

    def default_demos(self) -> dict[str, list[dspy.Example]]:
        """Gold chains over gold passages and a distractor
        (:func:`~rolecall.programs.baselines.iterative_demos.default_iter_retgen_demos`)."""
        return default_iter_retgen_demos()

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        generations: list[dict[str, Any]] = []
        feedback = ""  # what of y_{t-1} steers retrieval t
        converged = False
        t = 0
        for t in range(1, self.iterations + 1):
            query = f"{question} {feedback}".strip()
            passages = self.retrieve(trajectory, query, self.top_k)
            trajectory.steps[-1].meta.update(iteration=t)
            shown = self.show_passages(passages)
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
