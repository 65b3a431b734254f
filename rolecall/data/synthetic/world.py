"""The synthetic world: rolecall's built-in, offline multi-hop QA benchmark, generated from a seed with no data files.

Fictional people, places, companies, films, books and bands (invented names, so a pretrained model cannot answer from
memory) get one encyclopedia document each, plus homonym and near-miss distractors. Questions of seven types come with
gold decompositions and supporting documents, split into train / dev / test that share no question and no fact.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

from rolecall.data.synthetic.config import WorldConfig
from rolecall.data.synthetic.documents import distractor_documents, entity_documents
from rolecall.data.synthetic.entities import EntityGraph, build_places
from rolecall.data.synthetic.export import write_corpus, write_questions
from rolecall.data.synthetic.names import NameFactory
from rolecall.data.synthetic.people import build_people
from rolecall.data.synthetic.questions import Candidate
from rolecall.data.synthetic.splits import allocate, draw_pools
from rolecall.data.synthetic.works import build_works
from rolecall.data.types import Document, Example

__all__ = ["SyntheticWorld", "synthetic_world"]

logger = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")


@dataclass
class SyntheticWorld:
    """A generated benchmark: entity graph, corpus and three question splits.

    Attributes:
        seed: the seed it was built from.
        config: every size and switch it was built with.
        entities: the entity graph by key (``"person/orlen-vask"``); each key is also a document id.
        corpus: entity documents followed by distractor documents.
        train: training questions.
        dev: development questions.
        test: test questions.
    """

    seed: int
    config: WorldConfig
    entities: EntityGraph
    corpus: list[Document]
    train: list[Example]
    dev: list[Example]
    test: list[Example]

    @property
    def splits(self) -> dict[str, list[Example]]:
        """``{"train": ..., "dev": ..., "test": ...}``."""
        return {"train": self.train, "dev": self.dev, "test": self.test}

    def document(self, doc_id: str) -> Document:
        """The corpus document with this id; raises KeyError if there is none."""
        for doc in self.corpus:
            if doc.id == doc_id:
                return doc
        raise KeyError(doc_id)

    def to_flashrag(self, directory: str | Path) -> dict[str, Path]:
        """Write ``train.jsonl dev.jsonl test.jsonl corpus.jsonl`` (FlashRAG format) into ``directory``.

        Returns:
            The written paths by name (``"train"``, ``"dev"``, ``"test"``, ``"corpus"``).
        """
        directory = Path(directory)
        paths = {name: write_questions(examples, directory / f"{name}.jsonl") for name, examples in self.splits.items()}
        paths["corpus"] = write_corpus(self.corpus, directory / "corpus.jsonl")
        return paths


def _example(candidate: Candidate, example_id: str) -> Example:
    return Example(
        id=example_id,
        question=candidate.question,
        answers=list(candidate.answers),
        supporting_ids=candidate.supporting_ids,
        decomposition=list(candidate.decomposition),
        hops=candidate.hops,
        type=candidate.type,
        dataset="synthetic",
        metadata={
            "subtype": candidate.subtype,
            "template": candidate.template,
            "program": candidate.program,
            "facts": list(candidate.facts),
        },
    )


def synthetic_world(
    seed: int = 0,
    *,
    n_countries: int = 8,
    n_cities: int = 40,
    n_universities: int = 16,
    n_people: int = 400,
    n_companies: int = 30,
    n_films: int = 80,
    n_books: int = 60,
    n_bands: int = 24,
    n_train: int = 500,
    n_dev: int = 150,
    n_test: int = 300,
    distractors: bool = True,
) -> SyntheticWorld:
    """Build a synthetic multi-hop QA world from ``seed``; the same arguments always give a byte-identical world.

    Args:
        seed: seed of every random draw (``random.Random``; the global generator is never touched).
        n_countries: number of countries.
        n_cities: number of cities (at least ``2 * n_countries``).
        n_universities: number of universities.
        n_people: number of people (family trees plus unrelated people).
        n_companies: number of companies.
        n_films: number of films.
        n_books: number of books.
        n_bands: number of bands.
        n_train: number of training questions.
        n_dev: number of development questions.
        n_test: number of test questions.
        distractors: add homonyms and near-miss documents (festivals, prizes, tours, surname pages).

    Returns:
        The world; the defaults give about 660 entities, 740 documents and 500 / 150 / 300 questions in about 0.2 s.

    Raises:
        ConfigError: if a size is out of range.

    Example:
        >>> world = synthetic_world(seed=0, n_train=20, n_dev=10, n_test=10)
        >>> len(world.test), world.test[0].dataset
        (10, 'synthetic')
    """
    config = WorldConfig(
        seed=seed,
        n_countries=n_countries,
        n_cities=n_cities,
        n_universities=n_universities,
        n_people=n_people,
        n_companies=n_companies,
        n_films=n_films,
        n_books=n_books,
        n_bands=n_bands,
        n_train=n_train,
        n_dev=n_dev,
        n_test=n_test,
        distractors=distractors,
    )
    start = time.perf_counter()
    # One generator per stage, seeded by a string (hashed with SHA-512, not Python's salted hash), so changing one
    # size does not reshuffle the other stages.
    names = NameFactory(random.Random(f"{seed}/names"))
    graph = EntityGraph()
    build_places(config, random.Random(f"{seed}/places"), names, graph)
    build_people(config, random.Random(f"{seed}/people"), names, graph)
    build_works(config, random.Random(f"{seed}/works"), names, graph)
    corpus = entity_documents(graph)
    if distractors:
        corpus += distractor_documents(random.Random(f"{seed}/distractors"), graph, names)
    rng = random.Random(f"{seed}/questions")
    pools = draw_pools(rng, graph, config.n_questions)
    chosen = allocate(pools, {"test": n_test, "dev": n_dev, "train": n_train})
    splits = {}
    for split in SPLITS:
        candidates = chosen[split]
        rng.shuffle(candidates)
        splits[split] = [_example(c, f"synthetic-{seed}-{split}-{i:04d}") for i, c in enumerate(candidates)]
    logger.info(
        "synthetic world seed=%d: %d entities, %d documents, %d/%d/%d questions in %.2fs", seed, len(graph),
        len(corpus), len(splits["train"]), len(splits["dev"]), len(splits["test"]), time.perf_counter() - start,
    )  # fmt: skip
    return SyntheticWorld(seed=seed, config=config, entities=graph, corpus=corpus, **splits)
