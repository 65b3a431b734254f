"""The source of every built-in few-shot demo set: examples with gold decompositions, and helpers that pick them.

Small models need them: SmolLM2-135M parses DSPy's ChatAdapter format 0/5 zero-shot and 5/5 with three demos. Demos
come from any examples that carry a gold decomposition (the synthetic world's train split, MuSiQue) and the corpus
holding their supporting documents:

- plan: question -> sub-goals, the gold ``#k`` references rewritten as ``[entity from step k]``;
- analysis: (sub-question, gold passage + a distractor) -> yes + sub-answer; plus one (sub-question, distractors) -> no;
- rewrite: (sub-question, distractors, missing information) -> a query naming the entity to look up;
- synthesis, and the baselines' chain-of-thought answers, from the same decompositions.

:func:`default_demo_source` gives the examples and corpus every built-in demo set is made from (a small built-in world,
``synthetic_world(seed=12345)``, or a fixed hand-written set when the synthetic-world module is absent); each system's
``demos.py`` holds its builders, cached with :func:`rolecall.programs.core.demos.built_in_demos`.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Mapping, Sequence

from rolecall.data.types import Document, Example, SubStep
from rolecall.programs.core.plan import hash_refs_to_placeholders
from rolecall.programs.core.text import format_passages

__all__ = [
    "default_demo_source",
    "select_examples",
    "filled_steps",
    "placeholder_plan",
    "docs_by_id",
    "distractor_docs",
    "gold_and_noise",
    "interleave",
    "steps_with_gold",
    "demo_passages",
    "as_corpus_mapping",
    "DEMO_PASSAGE_CHARS",
    "HANDWRITTEN_EXAMPLES",
    "HANDWRITTEN_CORPUS",
]

logger = logging.getLogger(__name__)

DEMO_PASSAGE_CHARS = 200
"""Passages in demos are cut shorter than at run time: demos are paid for on every call."""

_TYPE_PREFERENCE = ("compositional", "inference", "single", "bridge", "bridge_comparison", "comparison")


def select_examples(examples: Sequence[Example], n: int, *, multi_hop_first: bool = True) -> list[Example]:
    """Up to ``n`` examples with usable gold decompositions, of distinct types where possible (deterministic).

    Types are taken in the order compositional, inference, single, bridge, ... so the demos show a chain, another
    chain and a one-step plan; remaining slots are filled in dataset order.
    """
    usable = [e for e in examples if e.decomposition and all(s.question and s.answer for s in e.decomposition)]
    order = list(_TYPE_PREFERENCE) if multi_hop_first else ["single", *_TYPE_PREFERENCE]
    chosen: list[Example] = []
    for kind in order:
        match = next((e for e in usable if e.type == kind and e not in chosen), None)
        if match is not None and len(chosen) < n:
            chosen.append(match)
    for e in usable:
        if len(chosen) >= n:
            break
        if e not in chosen:
            chosen.append(e)
    return chosen


def filled_steps(example: Example) -> list[tuple[str, SubStep]]:
    """Each gold sub-step with its ``#k`` references replaced by the gold answers of earlier steps."""
    steps = example.decomposition or []
    answers = {i: s.answer for i, s in enumerate(steps, start=1)}
    out = []
    for s in steps:
        text = s.question
        for j in sorted(answers, reverse=True):  # #12 before #1
            text = text.replace(f"#{j}", answers[j])
        out.append((text, s))
    return out


def placeholder_plan(example: Example) -> list[str]:
    steps = example.decomposition or []
    answers = {i: s.answer for i, s in enumerate(steps, start=1)}
    return [hash_refs_to_placeholders(s.question, answers) for s in steps]


def docs_by_id(corpus: Mapping[str, Document], ids: Sequence[str]) -> list[Document]:
    """The documents of ``ids`` found in ``corpus``, in order (missing ids skipped)."""
    return [corpus[i] for i in ids if i in corpus]


def distractor_docs(corpus: Mapping[str, Document], avoid: Sequence[str], n: int, rng: random.Random) -> list[Document]:
    """``n`` random documents of ``corpus`` whose ids are not in ``avoid`` (fewer when the corpus is small)."""
    pool = [d for d in corpus.values() if d.id not in set(avoid)]
    return rng.sample(pool, min(n, len(pool)))


def gold_and_noise(
    corpus: Mapping[str, Document], ids: Sequence[str], rng: random.Random, *, n_gold: int = 1, n_noise: int = 1
) -> tuple[list[Document], list[Document]]:
    """The first ``n_gold`` documents of ``ids`` found in ``corpus`` and ``n_noise`` distractors (other documents).

    Naive equivalent: ``(docs_by_id(corpus, ids)[:n_gold], distractor_docs(corpus, ids, n_noise, rng))``.
    """
    return docs_by_id(corpus, ids)[:n_gold], distractor_docs(corpus, ids, n_noise, rng)


def interleave(gold: list[Document], noise: list[Document], i: int) -> list[Document]:
    """The passages of demo ``i``: the gold ones first in even demos and last in odd ones, so the demos do not teach
    that the answer is always in the first passage."""
    return gold + noise if i % 2 == 0 else noise + gold


def steps_with_gold(examples: Sequence[Example], corpus: Mapping[str, Document]) -> list[tuple[str, SubStep]]:
    """The filled gold sub-steps (:func:`filled_steps`) of each example, last step first, that have a supporting
    document in ``corpus`` (demos of one sub-step: the last step's query holds a filled-in answer)."""
    return [(q, s) for e in examples for q, s in reversed(filled_steps(e)) if docs_by_id(corpus, s.supporting_ids)]


def demo_passages(docs: Sequence[Document]) -> str:
    """Demo passages: each cut to ``DEMO_PASSAGE_CHARS``, all of them kept (room left for the ``"[n] "`` prefixes)."""
    return format_passages(
        docs, max_chars=DEMO_PASSAGE_CHARS, max_total_chars=max(len(docs), 1) * (DEMO_PASSAGE_CHARS + 8)
    )


def as_corpus_mapping(corpus: Mapping[str, Document] | Sequence[Document]) -> Mapping[str, Document]:
    """``corpus`` as documents by id (a list of documents is indexed)."""
    return corpus if isinstance(corpus, Mapping) else {d.id: d for d in corpus}


@functools.lru_cache(maxsize=1)
def default_demo_source() -> tuple[tuple[Example, ...], tuple[Document, ...]]:
    """The examples and corpus default demos come from: ``synthetic_world(seed=12345)``'s train split, or a fixed
    hand-written set when the synthetic-world module is not available."""
    try:
        from rolecall.data.synthetic import synthetic_world
    except ImportError:
        logger.info("rolecall.data.synthetic is not available; using the hand-written demo set")
        return HANDWRITTEN_EXAMPLES, HANDWRITTEN_CORPUS
    world = synthetic_world(seed=12345)
    return tuple(world.train), tuple(world.corpus)


# ---------------------------------------------------------------------------------------------------------------------
# A fixed, hand-written demo source (fictional, so no model can answer from memory), used without the synthetic world.
# ---------------------------------------------------------------------------------------------------------------------
HANDWRITTEN_CORPUS: tuple[Document, ...] = (
    Document("city/varn", "Varn", "Varn is a city in the country of Ostria, on the river Melk."),
    Document(
        "country/ostria", "Ostria", "Ostria is a country whose capital is Dellin. Its official language is Ostrian."
    ),
    Document("film/the-grey-lantern", "The Grey Lantern", "The Grey Lantern is a 1961 film directed by Tamsa Orvel."),
    Document("person/tamsa-orvel", "Tamsa Orvel", "Tamsa Orvel, born 1922 in Varn, is a film director."),
    Document("band/kelpie-road", "Kelpie Road", "Kelpie Road is a band formed in 1990 by Ivo Brask and Nell Ardo."),
    Document("company/morrow-books", "Morrow Books", "Morrow Books is a publisher founded by Ada Quell in 1950."),
)
HANDWRITTEN_EXAMPLES: tuple[Example, ...] = (
    Example(
        id="demo-1",
        question="What is the official language of the country in which the city of Varn lies?",
        answers=["Ostrian"],
        supporting_ids=["city/varn", "country/ostria"],
        decomposition=[
            SubStep("In which country is the city of Varn located?", "Ostria", ["city/varn"]),
            SubStep("What is the official language of #1?", "Ostrian", ["country/ostria"]),
        ],
        hops=2,
        type="compositional",
    ),
    Example(
        id="demo-2",
        question="In which city was the director of the film The Grey Lantern born?",
        answers=["Varn"],
        supporting_ids=["film/the-grey-lantern", "person/tamsa-orvel"],
        decomposition=[
            SubStep("Who directed the film The Grey Lantern?", "Tamsa Orvel", ["film/the-grey-lantern"]),
            SubStep("In which city was #1 born?", "Varn", ["person/tamsa-orvel"]),
        ],
        hops=2,
        type="inference",
    ),
    Example(
        id="demo-3",
        question="Who founded the publisher Morrow Books?",
        answers=["Ada Quell"],
        supporting_ids=["company/morrow-books"],
        decomposition=[SubStep("Who founded the publisher Morrow Books?", "Ada Quell", ["company/morrow-books"])],
        hops=1,
        type="single",
    ),
)
