"""Encyclopedia text for the synthetic world: one 3-6 sentence document per entity, plus distractor documents.

Every fact a question can ask is stated in the subject's own document, by name, so a gold supporting document always
contains its sub-answer. Documents mention related entities by name, and the title is the bare entity name (a film
and a person can share a title; their ids ``film/...`` and ``person/...`` differ).
"""

from __future__ import annotations

import random

from rolecall.data.synthetic.entities import Entity, EntityGraph
from rolecall.data.synthetic.names import NameFactory, join_names, slugify
from rolecall.data.types import Document

__all__ = ["entity_documents", "distractor_documents"]

_ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth"]


def _a(word: str) -> str:
    return ("an " if word[0].lower() in "aeiou" else "a ") + word


def _works_by(graph: EntityGraph, kind: str, relation: str, key: str) -> list[Entity]:
    """Entities of ``kind`` whose ``relation`` is (or contains) ``key``, oldest first; the naive equivalent is a scan
    of ``graph.of_kind(kind)``, indexed once per (kind, relation) in ``graph.memo``."""
    memo_key = ("reverse", kind, relation)
    if memo_key not in graph.memo:
        index: dict[str, list[Entity]] = {}
        for w in graph.of_kind(kind):
            value = w.get(relation)
            for target in value if isinstance(value, list) else [value]:
                index.setdefault(target, []).append(w)
        for found in index.values():
            found.sort(key=lambda w: (w.get("release_year") or w.get("publication_year") or 0, w.name))
        graph.memo[memo_key] = index
    return graph.memo[memo_key].get(key, [])


def _titled(kind: str, works: list[Entity]) -> str:
    """``"the film A"`` / ``"the films A and B"``; an empty kind gives the bare names."""
    names = join_names([w.name for w in works[:3]])
    if not kind:
        return names
    return f"the {kind}{'s' if len(works) > 1 else ''} {names}"


def _person(graph: EntityGraph, p: Entity) -> list[str]:
    he = "He" if p.get("gender") == "male" else "She"
    n = graph.name
    s = [f"{p.name} is {_a(p.get('occupation'))} from {n(p.get('nationality'))}."]
    s.append(f"{he} was born in {p.get('birth_year')} in {n(p.get('birth_city'))}.")
    if p.get("father"):
        child = "son" if p.get("gender") == "male" else "daughter"
        s.append(f"{he} is the {child} of {n(p.get('father'))} and {n(p.get('mother'))}.")
    s.append(f"{he} studied at {n(p.get('alma_mater'))}.")
    if p.get("spouse"):
        s.append(f"{he} is married to {n(p.get('spouse'))}.")
    works = [
        ("directed", _works_by(graph, "film", "director", p.key), "film"),
        ("wrote", _works_by(graph, "book", "author", p.key), "book"),
        ("starred in", _works_by(graph, "film", "cast", p.key), "film"),
        ("founded", _works_by(graph, "company", "founder", p.key), ""),
        ("is a member of", _works_by(graph, "band", "members", p.key), ""),
    ]
    for verb, found, kind in works:
        if found and len(s) < 6:
            s.append(f"{he} {verb} {_titled(kind, found)}.")
    return s


def _film(graph: EntityGraph, f: Entity) -> list[str]:
    n = graph.name
    director = graph[f.get("director")]
    s = [f"{f.name} is a {f.get('release_year')} {f.get('genre')} film directed by {director.name}."]
    if f.get("studio"):
        s.append(f"It was produced by {n(f.get('studio'))}.")
    if f.get("cast"):
        s.append(f"Its cast includes {join_names([n(k) for k in f.get('cast')])}.")
    rank = [w.key for w in _works_by(graph, "film", "director", director.key)].index(f.key)
    if rank < len(_ORDINALS):
        s.append(f"It was the {_ORDINALS[rank]} film that {director.name} directed.")
    return s


def _book(graph: EntityGraph, b: Entity) -> list[str]:
    n = graph.name
    author = graph[b.get("author")]
    s = [f"{b.name} is {_a(b.get('genre'))} novel by {author.name}."]
    publisher = f" by {n(b.get('publisher'))}" if b.get("publisher") else ""
    s.append(f"It was published in {b.get('publication_year')}{publisher}.")
    s.append(f"The story is set in {n(b.get('setting'))}.")
    s.append(f"{author.name} wrote it at the age of {b.get('publication_year') - author.get('birth_year')}.")
    return s


def _band(graph: EntityGraph, b: Entity) -> list[str]:
    n = graph.name
    return [
        f"{b.name} is {_a(b.get('genre'))} band formed in {b.get('formation_year')} in {n(b.get('origin'))}.",
        f"It was founded by {n(b.get('founder'))}.",
        f"Its members are {join_names([n(k) for k in b.get('members')])}.",
    ]


def _company(graph: EntityGraph, c: Entity) -> list[str]:
    founder = graph[c.get("founder")]
    s = [
        f"{c.name} is {_a(c.get('industry'))} company founded in {c.get('founding_year')} by {founder.name}.",
        f"It is headquartered in {graph.name(c.get('headquarters'))}.",
        f"{founder.name} was {c.get('founding_year') - founder.get('birth_year')} years old when founding it.",
    ]
    films = _works_by(graph, "film", "studio", c.key)
    books = _works_by(graph, "book", "publisher", c.key)
    if films:
        s.append(f"It produced {_titled('film', films)}.")
    if books:
        s.append(f"It published {_titled('book', books)}.")
    return s


def _university(graph: EntityGraph, u: Entity) -> list[str]:
    city = graph[u.get("city")]
    s = [f"{u.name} is a university in {city.name}, {graph.name(city.get('country'))}."]
    s.append(f"It was founded in {u.get('founding_year')}.")
    alumni = [p.name for p in _works_by(graph, "person", "alma_mater", u.key)][:4]
    if alumni:
        s.append(f"Its alumni include {join_names(alumni)}.")
    return s


def _city(graph: EntityGraph, c: Entity) -> list[str]:
    country = graph[c.get("country")]
    s = [f"{c.name} is a city in {country.name}."]
    s.append(f"It was founded in {c.get('founding_year')} and has a population of {c.get('population'):,}.")
    if country.get("capital") == c.key:
        s.append(f"It is the capital of {country.name}.")
    else:
        s.append(f"The capital of {country.name} is {graph.name(country.get('capital'))}.")
    natives = [p.name for p in _works_by(graph, "person", "birth_city", c.key)][:3]
    if natives:
        s.append(f"Notable people born in {c.name} include {join_names(natives)}.")
    universities = [u.name for u in graph.of_kind("university") if u.get("city") == c.key][:2]
    if universities:
        s.append(f"It is home to {join_names(universities)}.")
    return s


def _country(graph: EntityGraph, c: Entity) -> list[str]:
    others = [x.name for x in graph.of_kind("city") if x.get("country") == c.key and x.key != c.get("capital")]
    s = [
        f"{c.name} is a country whose capital is {graph.name(c.get('capital'))}.",
        f"Its official language is {c.get('language')}.",
    ]
    if others:
        s.append(f"Other cities in {c.name} include {join_names(others[:4])}.")
    return s


_WRITERS = {
    "person": _person,
    "film": _film,
    "book": _book,
    "band": _band,
    "company": _company,
    "university": _university,
    "city": _city,
    "country": _country,
}


def entity_documents(graph: EntityGraph) -> list[Document]:
    """One document per entity; its id is the entity key and its title the bare entity name."""
    return [Document(id=e.key, title=e.name, text=" ".join(_WRITERS[e.kind](graph, e))) for e in graph.values()]


def _award(rng: random.Random, graph: EntityGraph, kind: str, year_field: str) -> tuple[Entity, Entity, Entity] | None:
    """A work of ``kind`` (its ``year_field`` is the award's year), an earlier or same-year work of that kind, and a
    person at least 30 that year who hands out the award; None when there is no such pair or person."""
    works = graph.of_kind(kind)
    w1 = rng.choice(works)
    year = w1.get(year_field)
    earlier = [w for w in works if w.get(year_field) <= year and w.key != w1.key]
    elders = [p for p in graph.of_kind("person") if p.get("birth_year") <= year - 30]
    if not earlier or not elders:
        return None
    return w1, rng.choice(earlier), rng.choice(elders)


def _festival(rng: random.Random, graph: EntityGraph, names: NameFactory) -> tuple[str, str] | None:
    cast = _award(rng, graph, "film", "release_year")
    if cast is None:
        return None
    (f1, f2, juror), city = cast, rng.choice(graph.of_kind("city"))
    year = f1.get("release_year")
    n = graph.name
    title = f"{year} {city.name} Film Festival"
    return title, (
        f"The {title} was held in {city.name}, {n(city.get('country'))}. "
        f"Its main prize went to the film {f1.name}, directed by {n(f1.get('director'))}. "
        f"The film {f2.name} by {n(f2.get('director'))} was also screened. "
        f"The jury was chaired by {juror.name}, who was born in {n(juror.get('birth_city'))}."
    )


def _prize(rng: random.Random, graph: EntityGraph, names: NameFactory) -> tuple[str, str] | None:
    cast = _award(rng, graph, "book", "publication_year")
    if cast is None:
        return None
    b1, b2, presenter = cast
    year = b1.get("publication_year")
    n = graph.name
    title = f"{year} {names.word((2, 2))} Prize"
    return title, (
        f"The {title} was awarded to {n(b1.get('author'))} for the book {b1.name}. "
        f"{b2.name} by {n(b2.get('author'))} was also shortlisted. "
        f"The prize was presented at {rng.choice(graph.of_kind('university')).name} by {presenter.name}, "
        f"{_a(presenter.get('occupation'))} from {n(presenter.get('nationality'))}."
    )


def _tour(rng: random.Random, graph: EntityGraph, names: NameFactory) -> tuple[str, str] | None:
    bands = graph.of_kind("band")
    b1, b2 = rng.sample(bands, 2)
    year = max(b1.get("formation_year"), b2.get("formation_year")) + rng.randint(1, 5)
    sponsors = [c for c in graph.of_kind("company") if c.get("founding_year") <= year]
    if not sponsors:
        return None
    sponsor, city = rng.choice(sponsors), rng.choice(graph.of_kind("city"))
    n = graph.name
    title = f"{b1.name} {year} tour"
    return title, (
        f"In {year}, the band {b1.name} toured {n(city.get('country'))} together with the band {b2.name}. "
        f"The tour opened in {city.name}. "
        f"It was sponsored by {sponsor.name}, the company founded by {n(sponsor.get('founder'))}."
    )


def _surname_pages(graph: EntityGraph) -> list[Document]:
    holders: dict[str, list[Entity]] = {}
    for p in graph.of_kind("person"):
        holders.setdefault(p.name.split()[-1], []).append(p)
    pages = []
    for surname, people in holders.items():
        # Only surnames shared by unrelated people (different fathers and not parent and child) make a useful page.
        fathers = {p.get("father") or p.key for p in people}
        if len(people) < 2 or len(fathers) < 2:
            continue
        lines = [f"{surname} is a family name."]
        lines += [f"{p.name}, born {p.get('birth_year')}, is {_a(p.get('occupation'))}." for p in people[:5]]
        pages.append(Document(id=f"surname/{slugify(surname)}", title=surname, text=" ".join(lines)))
    return pages


def distractor_documents(rng: random.Random, graph: EntityGraph, names: NameFactory) -> list[Document]:
    """Near-miss documents: film festivals, literary prizes, band tours and surname pages.

    They mention the same people and works through relations no question asks (jury chair, shortlist, sponsor), and
    every fact they state agrees with the entity graph, so answers stay unique.
    """
    docs: list[Document] = []
    seen: set[str] = set()
    plan = [(_festival, len(graph.of_kind("film")) // 4), (_prize, len(graph.of_kind("book")) // 4)]
    plan.append((_tour, len(graph.of_kind("band")) // 3))
    for writer, count in plan:
        for _ in range(count):
            made = writer(rng, graph, names)
            if made is None:
                continue
            title, text = made
            key = f"event/{slugify(title)}"
            if key not in seen:
                seen.add(key)
                docs.append(Document(id=key, title=title, text=text))
    return docs + _surname_pages(graph)
