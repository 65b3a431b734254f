"""The relations questions can ask about, how each is phrased, and how answers are written.

Each :class:`Relation` has a question template (``"Who directed {x}?"``) and, when it points to another entity, a noun
phrase (``"the director of {x}"``) so relations nest into multi-hop questions:
``"In which city was the director of the film Orlen Vask born?"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rolecall.data.synthetic.entities import Entity, EntityGraph

__all__ = ["Relation", "RELATIONS", "FAMILY", "ref", "relation", "relations_of", "answer_text", "answer_aliases"]


@dataclass(frozen=True)
class Relation:
    """One queryable attribute of an entity kind."""

    kind: str
    """The kind of entity the relation starts from."""
    name: str
    """The attribute name in :attr:`Entity.attrs`."""
    target: str | None
    """The kind of entity it points to, or None for a literal (year, genre, population)."""
    question: str
    """Question template; ``{x}`` is a reference to the subject."""
    phrase: str = ""
    """Noun-phrase template naming the target (only for entity-valued relations)."""


_TABLE = [
    Relation("person", "birth_year", None, "In which year was {x} born?"),
    Relation("person", "birth_city", "city", "In which city was {x} born?", "the birthplace of {x}"),
    Relation("person", "nationality", "country", "Which country is {x} from?", "the home country of {x}"),
    Relation("person", "father", "person", "Who is the father of {x}?", "the father of {x}"),
    Relation("person", "mother", "person", "Who is the mother of {x}?", "the mother of {x}"),
    Relation("person", "spouse", "person", "Who is the spouse of {x}?", "the spouse of {x}"),
    Relation("person", "alma_mater", "university", "Which university did {x} attend?", "the alma mater of {x}"),
    Relation("person", "occupation", None, "What is the occupation of {x}?"),
    Relation("film", "director", "person", "Who directed {x}?", "the director of {x}"),
    Relation("film", "release_year", None, "In which year was {x} released?"),
    Relation("film", "genre", None, "What is the genre of {x}?"),
    Relation("film", "studio", "company", "Which company produced {x}?", "the company that produced {x}"),
    Relation("book", "author", "person", "Who wrote {x}?", "the author of {x}"),
    Relation("book", "publication_year", None, "In which year was {x} published?"),
    Relation("book", "genre", None, "What is the genre of {x}?"),
    Relation("book", "publisher", "company", "Which company published {x}?", "the publisher of {x}"),
    Relation("book", "setting", "city", "In which city is {x} set?", "the city in which {x} is set"),
    Relation("band", "founder", "person", "Who founded {x}?", "the founder of {x}"),
    Relation("band", "origin", "city", "In which city was {x} formed?", "the city where {x} was formed"),
    Relation("band", "formation_year", None, "In which year was {x} formed?"),
    Relation("band", "genre", None, "What genre of music does {x} play?"),
    Relation("company", "founder", "person", "Who founded {x}?", "the founder of {x}"),
    Relation("company", "headquarters", "city", "In which city is {x} headquartered?", "the headquarters city of {x}"),
    Relation("company", "founding_year", None, "In which year was {x} founded?"),
    Relation("university", "city", "city", "In which city is {x} located?", "the city where {x} is located"),
    Relation("university", "founding_year", None, "In which year was {x} founded?"),
    Relation("city", "country", "country", "In which country is {x} located?", "the country in which {x} lies"),
    Relation("city", "population", None, "What is the population of {x}?"),
    Relation("city", "founding_year", None, "In which year was {x} founded?"),
    Relation("country", "capital", "city", "What is the capital of {x}?", "the capital of {x}"),
    Relation("country", "language", None, "What is the official language of {x}?"),
]
# A company's industry is stated in its document but never asked: it can be guessed from the name ("... Pictures").
RELATIONS: dict[tuple[str, str], Relation] = {(r.kind, r.name): r for r in _TABLE}
"""Every relation by (kind, name)."""

FAMILY = frozenset({"father", "mother", "spouse"})
"""Kinship relations; chains of two of them are asked as ``inference`` questions, not ``compositional`` ones."""

_REFS = {
    "person": "{name}",
    "film": "the film {name}",
    "book": "the book {name}",
    "band": "the band {name}",
    "company": "the company {name}",
    "university": "{name}",
    "city": "the city of {name}",
    "country": "{name}",
}
_SUFFIX_ALIASES = {"film": " film", "book": " novel", "band": " music"}


def ref(kind: str, name: str) -> str:
    """How a question names an entity of ``kind``; the kind word keeps homonyms apart (``"the film Orlen Vask"``)."""
    return _REFS[kind].format(name=name)


def relation(kind: str, name: str) -> Relation:
    """The relation ``name`` of ``kind``; raises KeyError for an unknown pair."""
    return RELATIONS[(kind, name)]


def relations_of(kind: str) -> list[Relation]:
    """All relations starting from ``kind``, in table order."""
    return [r for r in _TABLE if r.kind == kind]


def answer_text(graph: EntityGraph, entity: Entity, rel: Relation) -> str:
    """The canonical answer string of ``rel`` for ``entity``: a name, a year, a population with commas, a genre."""
    value = entity.get(rel.name)
    if rel.target is not None:
        return graph.name(value)
    if rel.name == "population":
        return f"{value:,}"
    return str(value)


def answer_aliases(graph: EntityGraph, entity: Entity, rel: Relation) -> list[str]:
    """The canonical answer followed by natural aliases (``"1,234,000"`` and ``"1234000"``; ``"drama film"``)."""
    text = answer_text(graph, entity, rel)
    aliases = [text]
    value: Any = entity.get(rel.name)
    if rel.name == "population":
        aliases.append(str(value))
    elif rel.name == "genre" and entity.kind in _SUFFIX_ALIASES:
        aliases.append(text + _SUFFIX_ALIASES[entity.kind])
    return aliases
