"""Built-in demos of the two direct baselines: closed-book chain of thought and single-step RAG, from gold
decompositions (the reasoning is the chain of filled sub-questions and their answers)."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import dspy

from rolecall.data.types import Document, Example
from rolecall.programs.core.demo_source import (
    as_corpus_mapping,
    demo_passages,
    filled_steps,
    gold_and_noise,
    select_examples,
)
from rolecall.programs.core.demos import built_in_demos

__all__ = ["cot_demos", "rag_demos", "default_cot_demos", "default_rag_demos"]


def _reasoning(example: Example) -> str:
    return " ".join(f"{q} {s.answer}." for q, s in filled_steps(example))


def cot_demos(
    examples: Sequence[Example], corpus: Mapping[str, Document] | Sequence[Document] = (), *, n: int = 3
) -> dict[str, list[dspy.Example]]:
    """Demos for ``NoRetrievalCoT``'s ``answer`` role: question -> reasoning (the gold chain) + answer (``corpus`` is
    unused: closed-book demos show no passages)."""
    return {
        "answer": [
            dspy.Example(question=e.question, reasoning=_reasoning(e), answer=e.answer).with_inputs("question")
            for e in select_examples(examples, n)
        ]
    }


def rag_demos(
    examples: Sequence[Example], corpus: Mapping[str, Document] | Sequence[Document], *, n: int = 3, seed: int = 0
) -> dict[str, list[dspy.Example]]:
    """Demos for ``SingleStepRAG``'s ``answer`` role: (question, gold passages + a distractor) -> reasoning + answer."""
    corpus = as_corpus_mapping(corpus)
    rng = random.Random(seed)
    out = []
    for e in select_examples(examples, n):
        gold, noise = gold_and_noise(corpus, e.supporting_ids, rng, n_gold=2)
        docs = gold + noise
        out.append(
            dspy.Example(
                question=e.question, passages=demo_passages(docs), reasoning=_reasoning(e), answer=e.answer
            ).with_inputs("question", "passages")
        )
    return {"answer": out}


default_cot_demos = built_in_demos(cot_demos)
default_rag_demos = built_in_demos(rag_demos)
