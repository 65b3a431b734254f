"""Default few-shot demos for REAP's four roles, built from examples with gold decompositions.

SmolLM2-135M only follows DSPy's ChatAdapter format with a few demos, so every role gets some (``n`` each, default 3):

- decomposer: question -> the gold decomposition as plan lines ``"2. In which city was #1 born? (deps: 1)"`` (a chain,
  a comparison with two independent sub-tasks, a second chain);
- extractor: one fact of each level: DirectAnswer (a later hop, with the earlier fact as a known fact), Failed
  (distractor passages only) and PartialClue (the whole multi-hop question over the first hop's passage: a clue, not
  the answer);
- replanner: one decision of each action: sufficient (a partial fact whose statement already holds the answer), edit
  (a sub-question left with an unresolved reference, repaired from a known fact) and replace (an undecomposed question
  whose clue gives the first hop, replaced by the remaining hops with the clue written in full); each shows the whole
  plan as the program does (:meth:`TaskPlan.view`, built by the real Plan Updater);
- synthesizer: question + the gold sub-answers -> the answer.

``default_reap_demos()`` builds them once per process from ``default_demo_source()`` (the synthetic world seed 12345).
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
)
from rolecall.programs.core.demos import built_in_demos
from rolecall.programs.core.plan import dependencies, renumber_references
from rolecall.programs.reap.plan import TaskPlan
from rolecall.signatures.reap import SubTask

__all__ = ["reap_demos", "default_reap_demos", "plan_lines", "gold_tasks"]

_TYPE_PREFERENCE = ("compositional", "comparison", "inference", "bridge_comparison", "single", "intersection")
_NULL = "unknown"
_PRONOUNS = {"It": "", "He": "", "She": "", "They": "", "Its": "'s", "His": "'s", "Her": "'s", "Their": "'s"}


def gold_tasks(steps: Sequence[SubStep]) -> list[SubTask]:
    """Gold sub-steps as REAP sub-tasks ``(id, question, deps)``, deps read from the ``#k`` references."""
    return [
        SubTask(id=i, question=s.question, deps=sorted(d for d in dependencies(s.question) if d < i))
        for i, s in enumerate(steps, start=1)
    ]


def plan_lines(steps: Sequence[SubStep]) -> list[str]:
    """Gold sub-steps as Decomposer lines: ``"N. question (deps: ...)"``."""
    return [t.line() for t in gold_tasks(steps)]


def _choose(examples: Sequence[Example], n: int) -> list[Example]:
    usable = [e for e in examples if e.decomposition and all(s.question and s.answer for s in e.decomposition)]
    chosen: list[Example] = []
    for kind in _TYPE_PREFERENCE:
        match = next((e for e in usable if e.type == kind and e not in chosen), None)
        if match is not None and len(chosen) < n:
            chosen.append(match)
    chosen += [e for e in usable if e not in chosen][: max(0, n - len(chosen))]
    return chosen


def _is_chain(example: Example) -> bool:
    steps = example.decomposition or []
    return len(steps) >= 2 and bool(dependencies(steps[1].question))


def _evidence(doc: Document, answer: str) -> str:
    """The sentence of ``doc`` that holds ``answer`` (else its first sentence)."""
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", doc.text.strip()) if s]
    return next((s for s in sentences if answer.lower() in s.lower()), sentences[0] if sentences else doc.text)


def _statement(sentence: str, title: str) -> str:
    """``sentence`` with a leading pronoun replaced by ``title`` ("She was born in X." -> "Ada was born in X.")."""
    first, _, rest = sentence.partition(" ")
    if first in _PRONOUNS:
        return f"{title}{_PRONOUNS[first]} {rest}"
    return sentence


def _fact(doc: Document, answer: str) -> tuple[str, str]:
    evidence = _evidence(doc, answer)
    return evidence, _statement(evidence, doc.title)


def _short_doc(doc: Document, answer: str) -> Document:
    """``doc`` cut to its first sentence and the evidence sentence, so a short demo passage still shows the evidence."""
    first = re.split(r"(?<=[.!?])\s+", doc.text.strip())[0]
    evidence = _evidence(doc, answer)
    return Document(doc.id, doc.title, first if evidence == first else f"{first} {evidence}")


def reap_demos(
    examples: Sequence[Example], corpus: Mapping[str, Document] | Sequence[Document], *, n: int = 3, seed: int = 0
) -> dict[str, list[dspy.Example]]:
    """Demos for REAP's ``decomposer``, ``extractor``, ``replanner`` and ``synthesizer`` roles (up to ``n`` each).

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
    chosen = _choose(examples, n)
    usable = [
        e
        for e in _choose(examples, len(examples))
        if all(docs_by_id(corpus, s.supporting_ids) for s in e.decomposition)
    ]
    chains = [e for e in usable if _is_chain(e) and len(e.decomposition) <= 3]
    demos: dict[str, list[dspy.Example]] = {"decomposer": [], "extractor": [], "replanner": [], "synthesizer": []}
    for e in chosen:
        demos["decomposer"].append(
            dspy.Example(question=e.question, plan=plan_lines(e.decomposition)).with_inputs("question")
        )
        facts = "\n".join(f"{q} -> {s.answer}" for q, s in filled_steps(e))
        demos["synthesizer"].append(
            dspy.Example(question=e.question, facts=facts, answer=e.answer).with_inputs("question", "facts")
        )
    if not usable:
        return demos
    for i in range(n):
        chain = chains[i % len(chains)] if chains else None
        kind = ("direct", "failed", "partial")[i % 3]
        demos["extractor"].append(_extractor_demo(kind, chain, usable[i % len(usable)], corpus, rng, flip=i % 2 == 1))
        kind = ("sufficient", "edit", "replace")[i % 3]
        other = chains[(i + 1) % len(chains)] if chains else None
        demos["replanner"].append(_replanner_demo(kind, chain if kind == "edit" else other, usable[i], corpus, rng))
    return demos


def _extractor_demo(
    kind: str, chain: Example | None, example: Example, corpus: Mapping[str, Document], rng: random.Random, flip: bool
) -> dspy.Example:
    inputs = ("sub_question", "known_facts", "passages")
    if kind == "failed" or chain is None:
        question, step = filled_steps(example)[0]
        noise = demo_passages(distractor_docs(corpus, step.supporting_ids, 2, rng))
        return dspy.Example(
            sub_question=question,
            known_facts="none",
            passages=noise,
            evidence="none",
            reasoning="No passage is about this.",
            statement=_NULL,
            answer=_NULL,
            level="Failed",
        ).with_inputs(*inputs)
    steps = filled_steps(chain)
    if kind == "direct":
        (_, first), (question, step) = steps[0], steps[1]
        _, known = _fact(docs_by_id(corpus, first.supporting_ids)[0], first.answer)
        gold = _short_doc(docs_by_id(corpus, step.supporting_ids)[0], step.answer)
        shown = [gold, *distractor_docs(corpus, step.supporting_ids, 1, rng)]
        evidence, statement = _fact(gold, step.answer)
        return dspy.Example(
            sub_question=question,
            known_facts=f"- {known}",
            passages=demo_passages(shown[::-1] if flip else shown),
            evidence=evidence,
            reasoning=f"The passage on {gold.title} answers it.",
            statement=statement,
            answer=step.answer,
            level="DirectAnswer",
        ).with_inputs(*inputs)
    first = steps[0][1]  # partial: the whole question over the first hop's passage gives a clue only
    gold = _short_doc(docs_by_id(corpus, first.supporting_ids)[0], first.answer)
    evidence, statement = _fact(gold, first.answer)
    return dspy.Example(
        sub_question=chain.question,
        known_facts="none",
        passages=demo_passages([gold, *distractor_docs(corpus, first.supporting_ids, 1, rng)]),
        evidence=evidence,
        reasoning=f"It names {first.answer}, but not the final answer.",
        statement=statement,
        answer=_NULL,
        level="PartialClue",
    ).with_inputs(*inputs)


def _replanner_demo(
    kind: str, chain: Example | None, example: Example, corpus: Mapping[str, Document], rng: random.Random
) -> dspy.Example:
    inputs = ("question", "sub_question", "fact", "known_facts", "plan")
    if kind == "sufficient" or chain is None:  # the first sub-task of a fresh plan
        question, step = filled_steps(example)[0]
        _, statement = _fact(docs_by_id(corpus, step.supporting_ids)[0], step.answer)
        plan = TaskPlan(gold_tasks(example.decomposition))
        return dspy.Example(
            question=example.question,
            sub_question=question,
            fact=f"level: PartialClue; statement: {statement}; answer: {_NULL}",
            known_facts="none",
            plan=plan.view(plan.nodes["1"]),
            action="sufficient",
            answer=step.answer,
            sub_questions=[],
        ).with_inputs(*inputs)
    steps = filled_steps(chain)
    (_, first), (second_q, _) = steps[0], steps[1]
    _, clue = _fact(docs_by_id(corpus, first.supporting_ids)[0], first.answer)
    if kind == "edit":  # the first hop failed, so its reference was left as its question; a known fact names it
        plan = TaskPlan(gold_tasks(chain.decomposition))
        plan.give_up(plan.nodes["1"])
        broken = plan.nodes["2"]
        return dspy.Example(
            question=chain.question,
            sub_question=broken.question,
            fact=f"level: Failed; statement: {_NULL}; answer: {_NULL}",
            known_facts=f"- {clue}",
            plan=plan.view(broken),
            action="edit",
            answer="none",
            sub_questions=[second_q],
        ).with_inputs(*inputs)
    # replace: the undecomposed question only gave the first hop; the remaining hops replace it, the clue in full
    rest = [SubStep(s.question.replace("#1", first.answer), s.answer) for _, s in steps[1:]]
    rest = [SubStep(renumber_references(s.question, {k: k - 1 for k in range(2, 10)}), s.answer) for s in rest]
    plan = TaskPlan([SubTask(id=1, question=chain.question)])  # the Decomposer's fallback: the question itself
    return dspy.Example(
        question=chain.question,
        sub_question=chain.question,
        fact=f"level: PartialClue; statement: {clue}; answer: {_NULL}",
        known_facts="none",
        plan=plan.view(plan.nodes["1"]),
        action="replace",
        answer="none",
        sub_questions=plan_lines(rest),
    ).with_inputs(*inputs)


default_reap_demos = built_in_demos(reap_demos)
