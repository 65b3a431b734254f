"""Default few-shot demos for D2Plan's roles, built from examples with gold decompositions.

The paper cold-starts both agents with SFT on teacher-synthesized trajectories (Sec. 2.2); before any training a 135M
model needs demos to emit the ChatAdapter format at all. Each role gets ``n`` demos built from gold data; every
Reasoner demo after planning shows the question and its global context C (the gold plan, the earlier gold steps solved
with the key sentence of their gold passage as evidence), as the program does:

- ``reasoner_plan``: question -> complexity + gold sub-questions with ``#A_j`` (a single-hop question: itself);
- ``reasoner_step``: an empty notebook -> search; an irrelevant note -> search for the entity by name; a relevant
  note -> answer;
- ``reasoner_refine``: a gold sub-question with ``#A_j`` + C -> the filled sub-question;
- ``reasoner_revise``: a plan that kept a multi-hop question whole failed -> the gold sub-questions in its place;
- ``reasoner_answer``: question + C with every step solved -> gold answer;
- ``purifier``: (sub-question, gold passage + distractor) -> yes + the answering sentence; (distractors) -> no + what
  they are about.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence

import dspy

from rolecall.data.types import Document, Example, SubStep
from rolecall.programs.core.demo_source import (
    as_corpus_mapping,
    demo_passages,
    distractor_docs,
    docs_by_id,
    filled_steps,
    interleave,
    select_examples,
)
from rolecall.programs.core.demos import built_in_demos
from rolecall.programs.core.plan import to_answer_refs
from rolecall.programs.d2plan.context import NO_ANSWER, NO_NOTES, ContextEntry, format_context

__all__ = ["d2plan_demos", "default_d2plan_demos"]

_NO_QUERY = "none"


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


def _context(example: Example, corpus: Mapping[str, Document], upto: int, plan: Sequence[str] | None = None) -> str:
    """The global context C of ``example`` before plan position ``upto`` runs: the earlier gold sub-questions solved
    (answer and the key sentence of their gold passage), the rest of ``plan`` (default: the gold plan) pending."""
    plan = list(plan if plan is not None else _plan(example))
    solved = filled_steps(example)[: upto - 1]
    entries: list[ContextEntry] = []
    for j, (text, step) in enumerate(solved, start=1):
        gold = docs_by_id(corpus, step.supporting_ids)
        entries.append((j, text, step.answer, _key_sentence(gold[0], step.answer) if gold else ""))
    entries += [(j, text, None, "") for j, text in enumerate(plan[len(solved) :], start=len(solved) + 1)]
    return format_context(entries)


def _single_steps(
    examples: Sequence[Example], corpus: Mapping[str, Document]
) -> list[tuple[Example, int, str, SubStep]]:
    """``(example, plan position, filled sub-question, gold step)`` of gold sub-steps with a supporting document: the
    last step of each example, then earlier ones."""
    out = []
    for e in examples:
        steps = list(enumerate(filled_steps(e), start=1))
        out += [(e, j, q, s) for j, (q, s) in reversed(steps) if docs_by_id(corpus, s.supporting_ids)]
    return out


def d2plan_demos(
    examples: Sequence[Example], corpus: Mapping[str, Document] | Sequence[Document], *, n: int = 3, seed: int = 0
) -> dict[str, list[dspy.Example]]:
    """Up to ``n`` demos (``dspy.Example`` s with the role's input and output fields) for each of D2Plan's six roles
    (see the module docstring), from ``examples`` with gold decompositions and the ``corpus`` (documents by id, or a
    list) holding their gold passages and the distractors ``seed`` picks."""
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
                question=e.question, context=_context(e, corpus, len(e.decomposition or []) + 1), answer=e.answer
            ).with_inputs("question", "context")
            for e in multi
        ],
    }
    demos["reasoner_refine"] = _refine_demos(multi, corpus)
    demos["reasoner_revise"] = _revise_demos(multi, corpus, rng)
    steps = _single_steps(chosen, corpus)
    demos["reasoner_step"] = _step_demos(steps, corpus, rng, n)
    demos["purifier"] = _purifier_demos(steps, corpus, rng, n)
    return demos


def _refine_demos(examples: Sequence[Example], corpus: Mapping[str, Document]) -> list[dspy.Example]:
    out = []
    for e in examples:
        filled = filled_steps(e)
        # the first dependent sub-question of the example (one with a #k reference)
        j = next((i for i, s in enumerate(e.decomposition or []) if i > 0 and "#" in s.question), None)
        if j is None:
            continue
        out.append(
            dspy.Example(
                question=e.question,
                context=_context(e, corpus, j + 1),
                sub_question=to_answer_refs(e.decomposition[j].question),
                refined=filled[j][0],
            ).with_inputs("question", "context", "sub_question")
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
        kept = [to_answer_refs(s.question) for s in steps[:start]]
        out.append(
            dspy.Example(
                question=e.question,
                context=_context(e, corpus, start + 1, plan=[*kept, e.question]),
                failed=e.question,
                failure=f"3 searches found nothing relevant, only {_about(noise)}",
                plan=[to_answer_refs(s.question) for s in steps[start:]],
            ).with_inputs("question", "context", "failed", "failure")
        )
    return out


def _step_demos(
    steps: Sequence[tuple[Example, int, str, SubStep]], corpus: Mapping[str, Document], rng: random.Random, n: int
) -> list[dspy.Example]:
    out = []
    for i, (example, j, question, step) in enumerate(steps[:n]):
        gold = docs_by_id(corpus, step.supporting_ids)[0]
        kind = i % 3
        if kind == 0:  # nothing searched yet: search with the sub-question
            notes, action, query, answer = NO_NOTES, "search", question, NO_ANSWER
        elif kind == 1:  # the first search missed: search for the entity by name
            notes = f"[1] not relevant: {_about(distractor_docs(corpus, step.supporting_ids, 2, rng))}"
            action, query, answer = "search", gold.title, NO_ANSWER
        else:  # the Purifier found the key sentence: answer
            notes = f"[1] relevant: {_key_sentence(gold, step.answer)}"
            action, query, answer = "answer", _NO_QUERY, step.answer
        out.append(
            dspy.Example(
                question=example.question,
                context=_context(example, corpus, j),
                sub_question=question,
                notes=notes,
                action=action,
                query=query,
                answer=answer,
            ).with_inputs("question", "context", "sub_question", "notes")
        )
    return out


def _purifier_demos(
    steps: Sequence[tuple[Example, int, str, SubStep]], corpus: Mapping[str, Document], rng: random.Random, n: int
) -> list[dspy.Example]:
    out = []
    for i, (_, _, question, step) in enumerate(steps[:n]):
        gold = docs_by_id(corpus, step.supporting_ids)[:1]
        if i == 1:  # one negative demo: only distractors
            noise = distractor_docs(corpus, step.supporting_ids, 2, rng)
            relevant, information, shown = "no", _about(noise), noise
        else:
            noise = distractor_docs(corpus, step.supporting_ids, 1, rng)
            relevant, information = "yes", _key_sentence(gold[0], step.answer)
            shown = interleave(gold, noise, i)
        out.append(
            dspy.Example(
                sub_question=question, passages=demo_passages(shown), relevant=relevant, information=information
            ).with_inputs("sub_question", "passages")
        )
    return out


default_d2plan_demos = built_in_demos(d2plan_demos)
