"""Default few-shot demos for D2Plan's roles, built from examples with gold decompositions.

The paper cold-starts both agents with SFT on teacher-synthesized trajectories (Sec. 2.2); before any training a 135M
model needs demos to emit the ChatAdapter format at all. Each role gets ``n`` demos built from gold data:

- ``reasoner_plan``: question -> complexity + gold sub-questions with ``#A_j`` (a single-hop question: itself);
- ``reasoner_step``: an empty notebook -> search; an irrelevant note -> search for the entity by name; a relevant
  note -> answer;
- ``reasoner_refine``: a gold sub-question with ``#A_j`` + the solved earlier steps -> the filled sub-question;
- ``reasoner_revise``: a plan that kept a multi-hop question whole failed -> the gold sub-questions in its place;
- ``reasoner_answer``: question + solved sub-questions -> gold answer;
- ``purifier``: (sub-question, gold passage + distractor) -> yes + the answering sentence; (distractors) -> no + what
  they are about.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Mapping, Sequence

import dspy

from rolecall.data.types import Document, Example, SubStep
from rolecall.programs.core.demo_source import (
    as_corpus_mapping,
    default_demo_source,
    demo_passages,
    distractor_docs,
    docs_by_id,
    filled_steps,
    select_examples,
)
from rolecall.programs.d2plan.refs import to_answer_refs

__all__ = ["d2plan_demos", "default_d2plan_demos", "format_solved", "NO_NOTES"]

NO_NOTES = "(none yet)"
"""The notes a sub-question starts with, before its first search."""

_NULL = "unknown"
_NO_QUERY = "none"


def format_solved(items: Sequence[tuple[int, str, str]]) -> str:
    """``"j. sub-question -> answer"`` lines (the Reasoner's view of solved sub-questions), or ``"(none)"``.

    Example:
        >>> format_solved([(1, "Who directed X?", "Ada Quell")])
        '1. Who directed X? -> Ada Quell'
    """
    return "\n".join(f"{j}. {text} -> {answer or _NULL}" for j, text, answer in items) or "(none)"


def _plan(example: Example) -> list[str]:
    steps = example.decomposition or []
    return [to_answer_refs(s.question) for s in steps] if len(steps) > 1 else [example.question]


def _key_sentence(doc: Document, answer: str) -> str:
    """The sentence of ``doc`` that holds ``answer`` (else its first), prefixed with the title when it does not name
    it (``"Pelheim: It has a population of 13,550."``), so the note stands alone."""
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", doc.text) if s.strip()] or [doc.text]
    sentence = next((s for s in sentences if answer.lower() in s.lower()), sentences[0])
    return sentence if doc.title.lower() in sentence.lower() else f"{doc.title}: {sentence}"


def _about(docs: Sequence[Document]) -> str:
    return "passages about " + " and ".join(d.title for d in docs[:2]) if docs else "no passages"


def _solved(example: Example, upto: int) -> str:
    return format_solved([(j, q, s.answer) for j, (q, s) in enumerate(filled_steps(example)[:upto], start=1)])


def _single_steps(examples: Sequence[Example], corpus: Mapping[str, Document]) -> list[tuple[str, SubStep]]:
    """Filled gold sub-steps with a supporting document: the last step of each example, then earlier ones."""
    return [(q, s) for e in examples for q, s in reversed(filled_steps(e)) if docs_by_id(corpus, s.supporting_ids)]


def d2plan_demos(
    examples: Sequence[Example], corpus: Mapping[str, Document] | Sequence[Document], *, n: int = 3, seed: int = 0
) -> dict[str, list[dspy.Example]]:
    """Demos for D2Plan's six roles (up to ``n`` each; see the module docstring).

    Args:
        examples: examples with gold decompositions whose supporting ids are in ``corpus``.
        corpus: documents by id (or a list of them), for the gold and distractor passages.
        n: demos per role.
        seed: picks the distractor passages.

    Returns:
        Role name -> list of ``dspy.Example`` with the role's input and output fields.
    """
    corpus = as_corpus_mapping(corpus)
    rng = random.Random(seed)
    chosen = select_examples(examples, n)
    multi = select_examples([e for e in examples if len(e.decomposition or []) > 1], n)
    demos: dict[str, list[dspy.Example]] = {
        "reasoner_plan": [
            dspy.Example(
                question=e.question,
                complexity="multi-hop" if len(e.decomposition or []) > 1 else "single-hop",
                plan=_plan(e),
            ).with_inputs("question")
            for e in chosen
        ],
        "reasoner_answer": [
            dspy.Example(
                question=e.question, solved=_solved(e, len(e.decomposition or [])), answer=e.answer
            ).with_inputs("question", "solved")
            for e in multi
        ],
    }
    demos["reasoner_refine"] = _refine_demos(multi)
    demos["reasoner_revise"] = _revise_demos(multi, corpus, rng)
    steps = _single_steps(chosen, corpus)
    demos["reasoner_step"] = _step_demos(steps, corpus, rng, n)
    demos["purifier"] = _purifier_demos(steps, corpus, rng, n)
    return demos


def _refine_demos(examples: Sequence[Example]) -> list[dspy.Example]:
    out = []
    for e in examples:
        filled = filled_steps(e)
        # the first dependent sub-question of the example (one with a #k reference)
        j = next((i for i, s in enumerate(e.decomposition or []) if i > 0 and "#" in s.question), None)
        if j is None:
            continue
        out.append(
            dspy.Example(
                sub_question=to_answer_refs(e.decomposition[j].question), solved=_solved(e, j), refined=filled[j][0]
            ).with_inputs("sub_question", "solved")
        )
    return out


def _revise_demos(
    examples: Sequence[Example], corpus: Mapping[str, Document], rng: random.Random
) -> list[dspy.Example]:
    """A plan that kept the question (or its remainder) as one sub-question failed; the revision decomposes it.

    The first demo has solved its first step (plan ``[step 1, question]``): the revision replaces position 2 onwards,
    so its ``#A_j`` keep pointing at plan positions.
    """
    out = []
    for i, e in enumerate(examples):
        steps = e.decomposition or []
        start = 1 if i == 0 and len(steps) > 2 else 0  # solved steps before the failed one
        noise = distractor_docs(corpus, e.supporting_ids, 2, rng)
        out.append(
            dspy.Example(
                question=e.question,
                solved=_solved(e, start),
                failed=e.question,
                failure=f"3 searches found nothing relevant, only {_about(noise)}",
                plan=[to_answer_refs(s.question) for s in steps[start:]],
            ).with_inputs("question", "solved", "failed", "failure")
        )
    return out


def _step_demos(
    steps: Sequence[tuple[str, SubStep]], corpus: Mapping[str, Document], rng: random.Random, n: int
) -> list[dspy.Example]:
    out = []
    for i, (question, step) in enumerate(steps[:n]):
        gold = docs_by_id(corpus, step.supporting_ids)[0]
        kind = i % 3
        if kind == 0:  # nothing searched yet: search with the sub-question
            notes, action, query, answer = NO_NOTES, "search", question, _NULL
        elif kind == 1:  # the first search missed: search for the entity by name
            notes = f"[1] not relevant: {_about(distractor_docs(corpus, step.supporting_ids, 2, rng))}"
            action, query, answer = "search", gold.title, _NULL
        else:  # the Purifier found the key sentence: answer
            notes = f"[1] relevant: {_key_sentence(gold, step.answer)}"
            action, query, answer = "answer", _NO_QUERY, step.answer
        out.append(
            dspy.Example(sub_question=question, notes=notes, action=action, query=query, answer=answer).with_inputs(
                "sub_question", "notes"
            )
        )
    return out


def _purifier_demos(
    steps: Sequence[tuple[str, SubStep]], corpus: Mapping[str, Document], rng: random.Random, n: int
) -> list[dspy.Example]:
    out = []
    for i, (question, step) in enumerate(steps[:n]):
        gold = docs_by_id(corpus, step.supporting_ids)[:1]
        if i == 1:  # one negative demo: only distractors
            noise = distractor_docs(corpus, step.supporting_ids, 2, rng)
            relevant, information, shown = "no", _about(noise), noise
        else:
            noise = distractor_docs(corpus, step.supporting_ids, 1, rng)
            relevant, information = "yes", _key_sentence(gold[0], step.answer)
            shown = gold + noise if i % 2 == 0 else noise + gold
        out.append(
            dspy.Example(
                sub_question=question, passages=demo_passages(shown), relevant=relevant, information=information
            ).with_inputs("sub_question", "passages")
        )
    return out


@functools.lru_cache(maxsize=4)
def _default(n: int) -> dict[str, tuple[dspy.Example, ...]]:
    examples, corpus = default_demo_source()
    return {role: tuple(d) for role, d in d2plan_demos(examples, corpus, n=n).items()}


def default_d2plan_demos(*, n: int = 3) -> dict[str, list[dspy.Example]]:
    """D2Plan's built-in demos from the default demo source (cached; each call returns fresh lists of copies)."""
    return {role: [d.copy() for d in demos] for role, demos in _default(n).items()}
