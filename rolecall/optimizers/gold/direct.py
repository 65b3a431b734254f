"""Gold outputs of the direct baselines' one role (SFT with ``source="gold"``): ``NoRetrievalCoT`` and
``SingleStepRAG`` (:mod:`rolecall.programs.baselines.direct`).

Both programs have one ``answer`` role, a ``dspy.ChainOfThought`` (``reasoning``, then ``answer``). :func:`direct_gold`
gives the override :func:`rolecall.programs.core.gold.gold_path` runs them with:

- reasoning, from the first source the example has:

  1. its gold decomposition: each sub-question, its ``#k`` filled with the earlier gold answers, followed by its gold
     answer (``"In which country is the city of Varn located? Ostria. What is the official language of Ostria?
     Ostrian."``), exactly as the built-in demos write it (:mod:`rolecall.programs.baselines.direct_demos`), since that
     is what the model is prompted with;
  2. its gold supporting sentences (HotpotQA's ``metadata["supporting_sentence_ids"]``, whose texts come from a
     ``level="sentence"`` corpus, else from the paragraph in a paragraph-level corpus split with
     :func:`~rolecall.data.io.split_sentences`), at most :data:`MAX_FACTS` of them and :data:`MAX_REASONING_CHARS`
     characters;
  3. else the gold answer alone;

- answer: the gold answer ``example.answer``.

A paragraph split by :func:`~rolecall.data.io.split_sentences` numbers its sentences as the dataset does for most
supporting facts (about 89% of HotpotQA's dev distractor facts), not all: pass the sentence-level corpus
(``build_corpus(name, path, level="sentence")``) for exact supporting sentences.

Example:
    >>> with gold_path(direct_gold(example, corpus=corpus)):                 # doctest: +SKIP
    ...     pred = SingleStepRAG(retriever, lm=SchemaLM())(question=example.question)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from rolecall.data.corpus import paragraph_id_of
from rolecall.data.io import split_sentences
from rolecall.data.types import Document, Example
from rolecall.programs.baselines.direct import NoRetrievalCoT, SingleStepRAG
from rolecall.programs.core.demo_source import as_corpus_mapping, filled_steps
from rolecall.programs.core.gold import Override
from rolecall.programs.core.program import Program
from rolecall.programs.core.trajectory import Trajectory

__all__ = ["direct_gold", "gold_reasoning", "supporting_sentences", "MAX_FACTS", "MAX_REASONING_CHARS"]

logger = logging.getLogger(__name__)

MAX_FACTS = 4
"""Supporting sentences a gold reasoning quotes at most (HotpotQA cites 2 to 4 for most questions)."""

MAX_REASONING_CHARS = 400
"""Characters of quoted supporting sentences at most: the role's 128-token budget holds reasoning and answer."""

_ROLE = "answer"
_PROGRAMS = (NoRetrievalCoT, SingleStepRAG)


def _sentence(sentence_id: str, corpus: Mapping[str, Document]) -> str | None:
    """The text of ``"<paragraph id>#s<i>"``: the document of that id, else sentence ``i`` of its paragraph."""
    if sentence_id in corpus:
        return corpus[sentence_id].text.strip() or None
    paragraph_id = paragraph_id_of(sentence_id)
    index = sentence_id.rpartition("#s")[2]
    if paragraph_id == sentence_id or paragraph_id not in corpus or not index.isdigit():
        return None
    sentences = split_sentences(corpus[paragraph_id].text)
    return sentences[int(index)] if int(index) < len(sentences) else None


def supporting_sentences(example: Example, corpus: Mapping[str, Document] | Sequence[Document] | None) -> list[str]:
    """The texts of ``example``'s gold supporting sentences found in ``corpus``, in fact order, cut to
    :data:`MAX_FACTS` sentences and :data:`MAX_REASONING_CHARS` characters (the first sentence is always kept)."""
    if corpus is None:
        return []
    corpus = as_corpus_mapping(corpus)
    texts: list[str] = []
    for sentence_id in example.metadata.get("supporting_sentence_ids") or []:
        text = _sentence(str(sentence_id), corpus)
        if text is None or text in texts:
            continue
        if len(texts) == MAX_FACTS or (texts and len(" ".join([*texts, text])) > MAX_REASONING_CHARS):
            break
        texts.append(text)
    return texts


def _step_reasoning(example: Example) -> str:
    return " ".join(f"{question} {step.answer.strip().rstrip('.')}." for question, step in filled_steps(example))


def gold_reasoning(example: Example, corpus: Mapping[str, Document] | Sequence[Document] | None = None) -> str:
    """The gold ``reasoning`` of ``example``: its filled gold steps, else its supporting sentences, else its answer.

    Example:
        >>> from rolecall.data.types import SubStep
        >>> e = Example("e", "q", ["Ostrian"], decomposition=[SubStep("Where is Varn?", "Ostria"),
        ...     SubStep("What is the language of #1?", "Ostrian")])
        >>> gold_reasoning(e)
        'Where is Varn? Ostria. What is the language of Ostria? Ostrian.'
        >>> gold_reasoning(Example("f", "q", ["Paris"]))
        'Paris'
    """
    if example.decomposition:
        return _step_reasoning(example)
    facts = supporting_sentences(example, corpus)
    if facts:
        return " ".join(facts)
    return example.answer


class _DirectGold:
    """The override of one example (a class so the reasoning is built once)."""

    def __init__(self, example: Example, corpus: Mapping[str, Document] | None) -> None:
        self.example = example
        self.reasoning = gold_reasoning(example, corpus) if example.answer else ""

    def __call__(self, program: Program, role: str, inputs: dict[str, Any], trajectory: Trajectory) -> dict | None:
        if role != _ROLE or not isinstance(program, _PROGRAMS):
            logger.debug("%s role %r has no direct-baseline gold; left to the LM", type(program).__name__, role)
            return None
        if not self.example.answer:
            logger.debug("example %s has no gold answer; role %s left to the LM", self.example.id, role)
            return None
        outputs = {"reasoning": self.reasoning, "answer": self.example.answer}
        fields = program.roles[role].signature.output_fields  # a plain Predict answer role has no reasoning
        return {name: value for name, value in outputs.items() if name in fields}


def direct_gold(example: Example, corpus: Mapping[str, Document] | Sequence[Document] | None = None) -> Override:
    """The gold output of ``NoRetrievalCoT``'s and ``SingleStepRAG``'s ``answer`` role for ``example``, as an
    override for :func:`~rolecall.programs.core.gold.gold_path`.

    Args:
        example: the example; its gold decomposition, else its supporting sentences, gives the reasoning.
        corpus: documents by id, or a list of them, holding the supporting sentences' texts (a ``level="sentence"``
            corpus, or the paragraphs, see the module docstring); only read for examples without a decomposition.

    Returns:
        ``override(program, role, inputs, trajectory)``: ``{"reasoning": ..., "answer": example.answer}`` (the role's
        output fields) for the ``answer`` role of either baseline; None for any other program or role, and for an
        example without an answer.
    """
    return _DirectGold(example, as_corpus_mapping(corpus) if corpus is not None else None)
