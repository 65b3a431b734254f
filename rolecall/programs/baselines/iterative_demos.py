"""Default few-shot demos of the iterative retrieval baselines (IRCoT, Iter-RetGen, Self-Ask), and the text formats
their roles read (the reasoning so far, the Self-Ask history), shared by the programs and their demos.

Demos come from examples with gold decompositions and the corpus holding their supporting documents (by default the
built-in world of :func:`rolecall.programs.core.demo_source.default_demo_source`). A reasoning sentence for a gold sub-step is the
sentence of its supporting document that states the sub-answer, with a leading pronoun replaced by the document's
title ("She was born in 1865 in Pelheim." -> "Staekys Granuvell was born in 1865 in Pelheim."), so the chains read like
the extractive chains of thought IRCoT and Iter-RetGen prompt with.

- IRCoT ``reason``: (question, passages newest first, sentences so far) -> the next sentence; the last one ends with
  "So the answer is X."; ``answer``: (question, passages, reasoning) -> the short answer.
- Iter-RetGen ``generate``: (question, gold passages + a distractor) -> reasoning (the chain) + answer.
- Self-Ask ``ask``: (question, history) -> ``follow_up`` + the next sub-question, or ``final_answer`` + the answer;
  ``answer_followup``: (sub-question, gold passage + a distractor) -> the sub-answer.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal

import dspy

from rolecall.data.types import Document, Example, SubStep
from rolecall.errors import ConfigError
from rolecall.programs.core.demo_source import (
    as_corpus_mapping,
    default_demo_source,
    demo_passages,
    distractor_docs,
    docs_by_id,
    filled_steps,
    select_examples,
)

__all__ = [
    "IterativeKind",
    "ITERATIVE_ROLES",
    "ANSWER_CUE",
    "NO_HISTORY",
    "NO_REASONING",
    "ircot_demos",
    "iter_retgen_demos",
    "self_ask_demos",
    "default_iterative_demos",
    "resolve_iterative_demos",
    "format_history",
    "has_answer_cue",
    "answer_after_cue",
]

IterativeKind = Literal["ircot", "iter_retgen", "self_ask"]
"""Which iterative baseline's demos."""

ITERATIVE_ROLES: dict[str, tuple[str, ...]] = {
    "ircot": ("reason", "answer"),
    "iter_retgen": ("generate",),
    "self_ask": ("ask", "answer_followup"),
}
"""Every role each iterative baseline can have (some are switched off by ablation flags)."""

ANSWER_CUE = "So the answer is"
"""IRCoT's stop phrase: a reasoning sentence holding it ends the chain."""

NO_HISTORY = "(none)"
"""The Self-Ask history before the first follow-up question."""

NO_REASONING = "(none)"
"""IRCoT's reasoning before the first sentence."""

_CUE = re.compile(r"answer\s+is\b\s*:?\s*", re.IGNORECASE)
_PRONOUN = re.compile(r"^(He|She|It|They)\b|^(His|Her|Its|Their)\b")


def format_history(pairs: Sequence[tuple[str, str]]) -> str:
    """The Self-Ask history: ``"Follow up: q\\nIntermediate answer: a"`` per pair, or ``"(none)"``.

    Example:
        >>> print(format_history([("Who directed X?", "Ada")]))
        Follow up: Who directed X?
        Intermediate answer: Ada
    """
    if not pairs:
        return NO_HISTORY
    return "\n".join(f"Follow up: {q}\nIntermediate answer: {a}" for q, a in pairs)


def has_answer_cue(sentence: str) -> bool:
    """Whether an IRCoT sentence ends the chain (it says "... the answer is ...").

    Example:
        >>> has_answer_cue("So the answer is Varn."), has_answer_cue("Ada was born in Varn.")
        (True, False)
    """
    return _CUE.search(sentence) is not None


def answer_after_cue(text: str) -> str:
    """The answer stated after the last "answer is" in ``text`` (trailing period and quotes removed), or ``""``.

    Example:
        >>> answer_after_cue("Ada was born in Varn. So the answer is: Varn.")
        'Varn'
    """
    matches = list(_CUE.finditer(text))
    if not matches:
        return ""
    answer = text[matches[-1].end() :].strip().splitlines()[0] if text[matches[-1].end() :].strip() else ""
    return answer.strip().rstrip(".").strip().strip("\"'").strip()


def _fact_sentence(step: SubStep, corpus: Mapping[str, Document], fallback_question: str) -> str:
    """The supporting document's sentence that states ``step.answer``, its leading pronoun replaced by the title;
    ``"<question> <answer>."`` when no sentence states it."""
    for doc in docs_by_id(corpus, step.supporting_ids):
        for sentence in re.split(r"(?<=\.)\s+", doc.text):
            if step.answer in sentence:
                match = _PRONOUN.match(sentence)
                if match is not None:
                    name = doc.title if match.group(1) else f"{doc.title}'s"
                    sentence = name + sentence[match.end() :]
                return sentence.strip()
    return f"{fallback_question} {step.answer}."


def _chain(example: Example, corpus: Mapping[str, Document]) -> list[str]:
    return [_fact_sentence(s, corpus, q) for q, s in filled_steps(example)]


def _with_cue(sentence: str, answer: str) -> str:
    return f"{sentence} {ANSWER_CUE} {answer}."


def ircot_demos(
    examples: Sequence[Example], corpus: Mapping[str, Document] | Sequence[Document], *, n: int = 3, seed: int = 0
) -> dict[str, list[dspy.Example]]:
    """Demos for IRCoT's ``reason`` and ``answer`` roles (``n`` each).

    The ``reason`` demos are states of gold chains: the first demo continues a chain (its first sentence), the others
    end one (the last sentence, followed by "So the answer is X."). Passages are shown newest retrieval first, as the
    program shows them. One ``answer`` demo reads a chain without the answer cue (a run that spent its step budget).

    Args:
        examples: examples with gold decompositions whose supporting ids are in ``corpus``.
        corpus: documents by id (or a list of them).
        n: demos per role.
        seed: picks the distractor passages.

    Returns:
        ``{"reason": [...], "answer": [...]}``.
    """
    corpus = as_corpus_mapping(corpus)
    rng = random.Random(seed)
    demos: dict[str, list[dspy.Example]] = {"reason": [], "answer": []}
    for k, e in enumerate(select_examples(examples, n)):
        steps = e.decomposition or []
        chain = _chain(e, corpus)
        i = 0 if k == 0 and len(steps) > 1 else len(steps) - 1
        newest_first = [d for s in reversed(steps[: i + 1]) for d in docs_by_id(corpus, s.supporting_ids[:1])]
        noise = distractor_docs(corpus, e.supporting_ids, 1, rng)
        shown = newest_first[:1] + noise + newest_first[1:2]
        sentence = chain[i] if i < len(steps) - 1 else _with_cue(chain[i], e.answer)
        demos["reason"].append(
            dspy.Example(
                question=e.question,
                passages=demo_passages(shown),
                reasoning=" ".join(chain[:i]) or NO_REASONING,
                next_sentence=sentence,
            ).with_inputs("question", "passages", "reasoning")
        )
        every_doc = [d for s in reversed(steps) for d in docs_by_id(corpus, s.supporting_ids[:1])]
        reasoning = " ".join(chain) if k == 1 else " ".join([*chain[:-1], _with_cue(chain[-1], e.answer)])
        demos["answer"].append(
            dspy.Example(
                question=e.question,
                passages=demo_passages(every_doc[:1] + noise + every_doc[1:2]),
                reasoning=reasoning,
                answer=e.answer,
            ).with_inputs("question", "passages", "reasoning")
        )
    return demos


def iter_retgen_demos(
    examples: Sequence[Example], corpus: Mapping[str, Document] | Sequence[Document], *, n: int = 3, seed: int = 0
) -> dict[str, list[dspy.Example]]:
    """Demos for Iter-RetGen's ``generate`` role: (question, two gold passages + a distractor) -> reasoning + answer.

    Args:
        examples: examples with gold decompositions whose supporting ids are in ``corpus``.
        corpus: documents by id (or a list of them).
        n: demos.
        seed: picks the distractor passages and where the distractor goes.

    Returns:
        ``{"generate": [...]}``.
    """
    corpus = as_corpus_mapping(corpus)
    rng = random.Random(seed)
    out = []
    for e in select_examples(examples, n):
        gold = docs_by_id(corpus, e.supporting_ids)[-2:]
        docs = gold + distractor_docs(corpus, e.supporting_ids, 1, rng)
        rng.shuffle(docs)
        out.append(
            dspy.Example(
                question=e.question,
                passages=demo_passages(docs),
                reasoning=" ".join(_chain(e, corpus)),
                answer=e.answer,
            ).with_inputs("question", "passages")
        )
    return {"generate": out}


def self_ask_demos(
    examples: Sequence[Example], corpus: Mapping[str, Document] | Sequence[Document], *, n: int = 3, seed: int = 0
) -> dict[str, list[dspy.Example]]:
    """Demos for Self-Ask's ``ask`` and ``answer_followup`` roles (``n`` each).

    ``ask`` demos are states of gold decompositions: the first asks the first follow-up of a chain, the middle ones
    ask the next follow-up with the earlier answers written in, and the last gives the final answer once every
    intermediate answer is known.

    Args:
        examples: examples with gold decompositions whose supporting ids are in ``corpus``.
        corpus: documents by id (or a list of them).
        n: demos per role.
        seed: picks the distractor passages and where the gold passage goes.

    Returns:
        ``{"ask": [...], "answer_followup": [...]}``.
    """
    corpus = as_corpus_mapping(corpus)
    rng = random.Random(seed)
    demos: dict[str, list[dspy.Example]] = {"ask": [], "answer_followup": []}
    chosen = select_examples(examples, n)
    for k, e in enumerate(chosen):
        steps = [(q, s.answer) for q, s in filled_steps(e)]
        final = k == len(chosen) - 1 and k > 0
        i = len(steps) if final else min(k, len(steps) - 1)
        action, text = ("final_answer", e.answer) if i == len(steps) else ("follow_up", steps[i][0])
        demos["ask"].append(
            dspy.Example(question=e.question, history=format_history(steps[:i]), action=action, text=text).with_inputs(
                "question", "history"
            )
        )
        question, step = filled_steps(e)[-1 - (k % len(steps))]
        docs = docs_by_id(corpus, step.supporting_ids)[:1] + distractor_docs(corpus, step.supporting_ids, 1, rng)
        rng.shuffle(docs)
        demos["answer_followup"].append(
            dspy.Example(follow_up=question, passages=demo_passages(docs), answer=step.answer).with_inputs(
                "follow_up", "passages"
            )
        )
    return demos


_BUILDERS = {"ircot": ircot_demos, "iter_retgen": iter_retgen_demos, "self_ask": self_ask_demos}


@functools.lru_cache(maxsize=8)
def _default_iterative_demos(kind: str, n: int) -> dict[str, tuple[dspy.Example, ...]]:
    if kind not in _BUILDERS:
        raise ConfigError(f"unknown demo kind {kind!r}; choose from {', '.join(sorted(_BUILDERS))}")
    examples, corpus = default_demo_source()
    return {role: tuple(d) for role, d in _BUILDERS[kind](examples, corpus, n=n).items()}


def default_iterative_demos(kind: IterativeKind, *, n: int = 3) -> dict[str, list[dspy.Example]]:
    """The built-in demos of ``kind`` from the default demo source (built once per process; fresh copies each call).

    Raises:
        ConfigError: ``kind`` is not one of ``"ircot"``, ``"iter_retgen"``, ``"self_ask"``.
    """
    return {role: [d.copy() for d in demos] for role, demos in _default_iterative_demos(kind, n).items()}


def resolve_iterative_demos(
    demos: Any, kind: IterativeKind, roles: Collection[str]
) -> dict[str, list[dspy.Example]] | None:
    """The initial demos of an iterative baseline, restricted to the roles it has (``roles``).

    Args:
        demos: ``"auto"`` (the built-in ``kind`` demos), None (zero-shot, or whatever a loaded state sets), or a dict
            role -> examples.
        kind: which baseline.
        roles: the roles the program instance has (an ablation flag can switch one off; its demos are dropped).

    Raises:
        ConfigError: ``demos`` is another value, or names a role ``kind`` never has.
    """
    if demos is None:
        return None
    if isinstance(demos, str) and demos == "auto":
        demos = default_iterative_demos(kind)
    elif isinstance(demos, dict):
        unknown = sorted(set(demos) - set(ITERATIVE_ROLES[kind]))
        if unknown:
            raise ConfigError(f"demos for unknown roles {unknown}; {kind} has roles {list(ITERATIVE_ROLES[kind])}")
    else:
        raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {demos!r}")
    return {role: list(d) for role, d in demos.items() if role in roles}
