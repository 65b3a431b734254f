"""Question candidates of the synthetic world: single-hop look-ups, compositional chains and kinship inference.

Each generator draws one :class:`Candidate` (or None when the draw hits a dead end) with its gold decomposition, a
``program`` the resolver re-runs on the entity graph, and the ``facts`` (``"entity_key.relation"``) it reads; the
splitter keeps every fact inside one split so a chain seen in training never reappears at test time.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rolecall.data.synthetic.entities import Entity, EntityGraph
from rolecall.data.synthetic.relations import FAMILY, Relation, answer_aliases, answer_text, ref, relation, relations_of
from rolecall.data.types import SubStep

__all__ = ["QUESTION_TYPES", "Candidate", "chain_candidate", "single", "compositional", "inference"]

QUESTION_TYPES = ("single", "compositional", "comparison", "bridge_comparison", "intersection", "inference", "yes_no")
"""Every question type a synthetic world holds; each split contains all of them."""

_START_KINDS = {
    "person": 3.0,
    "film": 3.0,
    "book": 2.0,
    "band": 1.5,
    "company": 1.5,
    "university": 1.0,
    "city": 1.0,
    "country": 0.5,
}
_KINSHIP = [
    ("paternal grandfather", ["father", "father"]),
    ("paternal grandmother", ["father", "mother"]),
    ("maternal grandfather", ["mother", "father"]),
    ("maternal grandmother", ["mother", "mother"]),
    ("father-in-law", ["spouse", "father"]),
    ("mother-in-law", ["spouse", "mother"]),
]


@dataclass
class Candidate:
    """A generated question before it is assigned to a split and given an id."""

    type: str
    subtype: str
    question: str
    answers: list[str]
    decomposition: list[SubStep]
    program: dict[str, Any]
    facts: list[str]
    template: str
    hops: int

    @property
    def supporting_ids(self) -> list[str]:
        """Union of the steps' supporting ids, in first-use order."""
        return list(dict.fromkeys(s for step in self.decomposition for s in step.supporting_ids))


Generator = Callable[[random.Random, EntityGraph], "Candidate | None"]


def _walk(rng: random.Random, graph: EntityGraph, start: Entity, hops: int) -> list[tuple[Entity, Relation]] | None:
    """A random path of ``hops`` relations from ``start``: entity-valued until the last, never revisiting an entity,
    and never two kinship relations in a row (those are ``inference`` questions)."""
    steps: list[tuple[Entity, Relation]] = []
    visited = {start.key}
    current = start
    for i in range(hops):
        last = i == hops - 1
        options = []
        for rel in relations_of(current.kind):
            value = current.get(rel.name)
            if value is None or (rel.target is None and not last):
                continue
            if rel.target is not None and value in visited:
                continue
            if steps and steps[-1][1].name in FAMILY and rel.name in FAMILY:
                continue
            options.append(rel)
        if not options:
            return None
        rel = rng.choice(options)
        steps.append((current, rel))
        if rel.target is not None:
            current = graph[current.get(rel.name)]
            visited.add(current.key)
    return steps


def chain_candidate(
    graph: EntityGraph, steps: list[tuple[Entity, Relation]], type_: str, subtype: str, question: str, template: str
) -> Candidate:
    """The candidate that follows ``steps``: one sub-question per relation, ``#k`` standing for earlier answers."""
    decomposition = []
    for k, (entity, rel) in enumerate(steps):
        subject = ref(entity.kind, entity.name if k == 0 else f"#{k}")
        decomposition.append(SubStep(rel.question.format(x=subject), answer_text(graph, entity, rel), [entity.key]))
    last_entity, last_rel = steps[-1]
    return Candidate(
        type=type_,
        subtype=subtype,
        question=question,
        answers=answer_aliases(graph, last_entity, last_rel),
        decomposition=decomposition,
        program={"op": "chain", "start": steps[0][0].key, "path": [rel.name for _, rel in steps]},
        facts=[f"{entity.key}.{rel.name}" for entity, rel in steps],
        template=template,
        hops=len(steps),
    )


def _chain(rng: random.Random, graph: EntityGraph, hops: int, type_: str, subtype: str) -> Candidate | None:
    kinds = [k for k in _START_KINDS if graph.of_kind(k)]
    kind = rng.choices(kinds, weights=[_START_KINDS[k] for k in kinds])[0]
    start = rng.choice(graph.of_kind(kind))
    steps = _walk(rng, graph, start, hops)
    if steps is None:
        return None
    phrase = ref(start.kind, start.name)
    for _, rel in steps[:-1]:
        phrase = rel.phrase.format(x=phrase)
    question = steps[-1][1].question.format(x=phrase)
    template = "/".join([start.kind] + [rel.name for _, rel in steps])
    return chain_candidate(graph, steps, type_, subtype, question, template)


def single(rng: random.Random, graph: EntityGraph) -> Candidate | None:
    """``"Who directed the film X?"``: one relation of one entity."""
    return _chain(rng, graph, 1, "single", "single")


def compositional(hops: int) -> Generator:
    """A generator of ``hops``-hop chains: ``"In which country was the director of the film X born?"``."""

    def generate(rng: random.Random, graph: EntityGraph) -> Candidate | None:
        return _chain(rng, graph, hops, "compositional", f"compositional/{hops}")

    return generate


def inference(rng: random.Random, graph: EntityGraph) -> Candidate | None:
    """``"Who is the paternal grandfather of X?"``: two kinship relations the question names as one word."""
    label, path = rng.choice(_KINSHIP)
    person = rng.choice(graph.of_kind("person"))
    steps = []
    current: Entity | None = person
    for name in path:
        if current is None or current.get(name) is None:
            return None
        steps.append((current, relation("person", name)))
        current = graph.target(current, name)
    question = f"Who is the {label} of {person.name}?"
    return chain_candidate(graph, steps, "inference", "inference", question, f"person/{label}")
