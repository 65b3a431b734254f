"""Question candidates that join two look-ups: comparison, bridge-comparison, yes/no comparison and intersection.

Every candidate is drawn so its answer is unique: compared values differ, bridged entities differ, and the two sets of
an intersection share exactly one member.
"""

from __future__ import annotations

import random
from typing import Any

from rolecall.data.synthetic.entities import Entity, EntityGraph
from rolecall.data.synthetic.names import join_names
from rolecall.data.synthetic.questions import Candidate
from rolecall.data.synthetic.relations import answer_text, ref, relation
from rolecall.data.types import SubStep

__all__ = ["comparison", "bridge_comparison", "yes_no", "intersection", "path_values"]

# (kind, path, question template, pick): the answer is the entity whose final value is the min or max.
_COMPARISONS = [
    ("person", ["birth_year"], "Who was born first, {a} or {b}?", "min"),
    ("person", ["birth_year"], "Who was born later, {a} or {b}?", "max"),
    ("film", ["release_year"], "Which film came out earlier, {a} or {b}?", "min"),
    ("film", ["release_year"], "Which film came out later, {a} or {b}?", "max"),
    ("book", ["publication_year"], "Which book was published first, {a} or {b}?", "min"),
    ("company", ["founding_year"], "Which company was founded first, {a} or {b}?", "min"),
    ("city", ["population"], "Which city has the larger population, {a} or {b}?", "max"),
    ("city", ["population"], "Which city is smaller, {a} or {b}?", "min"),
    ("university", ["founding_year"], "Which university is older, {a} or {b}?", "min"),
    ("band", ["formation_year"], "Which band was formed earlier, {a} or {b}?", "min"),
]
_BRIDGE_COMPARISONS = [
    ("film", ["director", "birth_year"], "Which film has the director who was born later, {a} or {b}?", "max"),
    ("film", ["director", "birth_year"], "Which film's director was born first, {a} or {b}?", "min"),
    ("book", ["author", "birth_year"], "Which book's author was born first, {a} or {b}?", "min"),
    ("company", ["founder", "birth_year"], "Which company's founder was born later, {a} or {b}?", "max"),
    ("band", ["origin", "population"], "Which band was formed in the larger city, {a} or {b}?", "max"),
    ("person", ["father", "birth_year"], "Whose father was born first, {a} or {b}?", "min"),
    ("film", ["studio", "founding_year"], "Which film was produced by the older company, {a} or {b}?", "min"),
]
# (kind, path, question template): the answer is yes when both final values are equal.
_SAME = [
    ("person", ["nationality"], "Are {a} and {b} from the same country?"),
    ("person", ["birth_city"], "Were {a} and {b} born in the same city?"),
    ("film", ["director"], "Were the films {a} and {b} directed by the same person?"),
    ("band", ["origin"], "Were the bands {a} and {b} formed in the same city?"),
    ("company", ["headquarters"], "Are the companies {a} and {b} headquartered in the same city?"),
    ("book", ["author", "nationality"], "Are the authors of the books {a} and {b} from the same country?"),
]
# (kind, many-valued relation, noun of one item, question template)
_INTERSECTIONS = [
    ("film", "cast", "actors appeared in", "Which actor appeared in both the film {a} and the film {b}?"),
    ("band", "members", "people were members of", "Who was a member of both the band {a} and the band {b}?"),
]


def path_values(graph: EntityGraph, entity: Entity, path: list[str]) -> list[Entity] | None:
    """The entities visited along ``path`` (``entity`` first), or None where a relation is unset.

    The last relation may be literal; its value is not included (read it with ``entity.get``).
    """
    visited = [entity]
    for name in path[:-1]:
        nxt = graph.target(visited[-1], name)
        if nxt is None:
            return None
        visited.append(nxt)
    return visited if visited[-1].get(path[-1]) is not None else None


def _paired_steps(graph: EntityGraph, a: list[Entity], b: list[Entity], path: list[str]) -> list[SubStep]:
    """Sub-steps level by level: (a, b) for the first relation, then (#1, #2) for the next, and so on."""
    steps = []
    for level, name in enumerate(path):
        for side, visited in enumerate((a, b)):
            entity = visited[level]
            rel = relation(entity.kind, name)
            subject = ref(entity.kind, entity.name if level == 0 else f"#{2 * (level - 1) + side + 1}")
            steps.append(SubStep(rel.question.format(x=subject), answer_text(graph, entity, rel), [entity.key]))
    return steps


def _facts(visits: list[list[Entity]], path: list[str]) -> list[str]:
    return [f"{visited[i].key}.{name}" for visited in visits for i, name in enumerate(path)]


def _draw_pair(rng: random.Random, graph: EntityGraph, kind: str, path: list[str]):
    entities = graph.of_kind(kind)
    if len(entities) < 2:
        return None
    a, b = rng.sample(entities, 2)
    va, vb = path_values(graph, a, path), path_values(graph, b, path)
    if va is None or vb is None or any(x.key == y.key for x, y in zip(va[1:], vb[1:], strict=True)):
        return None  # a bridge shared by both sides would make one of the look-ups redundant
    return va, vb


def _compare(rng: random.Random, graph: EntityGraph, table: list, type_: str) -> Candidate | None:
    kind, path, template, pick = rng.choice(table)
    pair = _draw_pair(rng, graph, kind, path)
    if pair is None:
        return None
    va, vb = pair
    xa, xb = va[-1].get(path[-1]), vb[-1].get(path[-1])
    if xa == xb:
        return None
    winner = va[0] if (xa < xb) == (pick == "min") else vb[0]
    program: dict[str, Any] = {"op": "compare", "entities": [va[0].key, vb[0].key], "path": path, "pick": pick}
    return Candidate(
        type=type_,
        subtype=type_,
        question=template.format(a=va[0].name, b=vb[0].name),
        answers=[winner.name],
        decomposition=_paired_steps(graph, va, vb, path),
        program=program,
        facts=_facts([va, vb], path),
        template=f"{kind}/{'.'.join(path)}/{pick}",
        hops=2 * len(path),
    )


def comparison(rng: random.Random, graph: EntityGraph) -> Candidate | None:
    """``"Who was born first, A or B?"``: the answer is one of the two names."""
    return _compare(rng, graph, _COMPARISONS, "comparison")


def bridge_comparison(rng: random.Random, graph: EntityGraph) -> Candidate | None:
    """``"Which film has the director who was born later, X or Y?"``: a bridge look-up on each side, then compare."""
    return _compare(rng, graph, _BRIDGE_COMPARISONS, "bridge_comparison")


def yes_no(rng: random.Random, graph: EntityGraph) -> Candidate | None:
    """``"Are X and Y from the same country?"``: yes or no, drawn half and half."""
    kind, path, template = rng.choice(_SAME)
    want_yes = rng.random() < 0.5
    if want_yes:
        memo_key = ("same", kind, tuple(path))
        if memo_key not in graph.memo:
            groups: dict[Any, list[list[Entity]]] = {}
            for entity in graph.of_kind(kind):
                visited = path_values(graph, entity, path)
                if visited is not None:
                    groups.setdefault(visited[-1].get(path[-1]), []).append(visited)
            graph.memo[memo_key] = [g for g in groups.values() if len(g) >= 2]
        shared = graph.memo[memo_key]
        if not shared:
            return None
        va, vb = rng.sample(rng.choice(shared), 2)
        if any(x.key == y.key for x, y in zip(va[1:], vb[1:], strict=True)):
            return None
    else:
        pair = _draw_pair(rng, graph, kind, path)
        if pair is None:
            return None
        va, vb = pair
    same = va[-1].get(path[-1]) == vb[-1].get(path[-1])
    if same != want_yes:
        return None
    return Candidate(
        type="yes_no",
        subtype="yes_no",
        question=template.format(a=va[0].name, b=vb[0].name),
        answers=["yes" if same else "no"],
        decomposition=_paired_steps(graph, va, vb, path),
        program={"op": "same", "entities": [va[0].key, vb[0].key], "path": path},
        facts=_facts([va, vb], path),
        template=f"{kind}/{'.'.join(path)}/same",
        hops=2 * len(path),
    )


def intersection(rng: random.Random, graph: EntityGraph) -> Candidate | None:
    """``"Which actor appeared in both the film X and the film Y?"``: two lists that share exactly one name."""
    kind, rel_name, noun, template = rng.choice(_INTERSECTIONS)
    entities = graph.of_kind(kind)
    if len(entities) < 2:
        return None
    a, b = rng.sample(entities, 2)
    common = [k for k in a.get(rel_name) or [] if k in (b.get(rel_name) or [])]
    if len(common) != 1:
        return None
    answer = graph.name(common[0])
    steps = [
        SubStep(f"Which {noun} {ref(x.kind, x.name)}?", join_names([graph.name(k) for k in x.get(rel_name)]), [x.key])
        for x in (a, b)
    ]
    steps.append(SubStep("Which person is in both #1 and #2?", answer, [a.key, b.key]))
    return Candidate(
        type="intersection",
        subtype="intersection",
        question=template.format(a=a.name, b=b.name),
        answers=[answer],
        decomposition=steps,
        program={"op": "intersect", "entities": [a.key, b.key], "relation": rel_name},
        facts=[f"{a.key}.{rel_name}", f"{b.key}.{rel_name}"],
        template=f"{kind}/{rel_name}/intersect",
        hops=2,
    )
