"""Companies, films, books and bands of the synthetic world, each tied to people and places with consistent dates.

A work is created after its creator is at least 16-22 years old; studios and publishers are founded before the works
they produce. With ``distractors`` on, some films are titled after a person ("Orlen Vask" the film and the person) and
some bands after a city, so a title alone does not identify a document.
"""

from __future__ import annotations

import random

from rolecall.data.synthetic.config import WorldConfig
from rolecall.data.synthetic.entities import Entity, EntityGraph
from rolecall.data.synthetic.names import COMPANY_SUFFIXES, NameFactory

__all__ = ["INDUSTRIES", "FILM_GENRES", "BOOK_GENRES", "BAND_GENRES", "build_works"]

INDUSTRIES = {
    "Industries": "manufacturing",
    "Systems": "electronics",
    "Holdings": "finance",
    "Works": "engineering",
    "Group": "retail",
    "Labs": "research",
    "Motors": "automotive",
    "Media": "broadcasting",
    "Textiles": "textiles",
    "Press": "publishing",
    "Pictures": "film production",
    "Foods": "food processing",
    "Shipping": "shipping",
}
"""Industry of a company by the last word of its name."""
FILM_GENRES = ("drama", "comedy", "thriller", "western", "musical", "documentary", "horror", "science fiction")
BOOK_GENRES = ("mystery", "historical", "science fiction", "fantasy", "crime", "satirical", "romance")
BAND_GENRES = ("rock", "jazz", "folk", "punk", "electronic", "blues", "metal", "pop")

_ATTEMPTS = 200


def _people(graph: EntityGraph, occupation: str) -> list[Entity]:
    found = [p for p in graph.of_kind("person") if p.get("occupation") == occupation]
    return found or list(graph.of_kind("person"))


def _year_range(birth_year: int, after: tuple[int, int], lo: int, hi: int) -> tuple[int, int]:
    return max(lo, birth_year + after[0]), min(hi, birth_year + after[1])


def _pick_creator(rng: random.Random, pool: list[Entity], after: tuple[int, int], lo: int, hi: int):
    for _ in range(_ATTEMPTS):
        person = rng.choice(pool)
        first, last = _year_range(person.get("birth_year"), after, lo, hi)
        if first <= last:
            return person, rng.randint(first, last)
    raise RuntimeError("no person is old enough for this work; raise n_people")


def _pick_company(rng: random.Random, graph: EntityGraph, year: int, industry: str) -> Entity | None:
    founded = [c for c in graph.of_kind("company") if c.get("founding_year") <= year]
    preferred = [c for c in founded if c.get("industry") == industry]
    if preferred and rng.random() < 0.8:
        return rng.choice(preferred)
    return rng.choice(founded) if founded else None


def _build_companies(config: WorldConfig, rng: random.Random, names: NameFactory, graph: EntityGraph) -> None:
    founders = _people(graph, "entrepreneur")
    cities = graph.of_kind("city")
    for i in range(config.n_companies):
        # A few studios and publishers first, so films and books can be produced by one.
        suffix = ["Pictures", "Press", "Pictures", "Press"][i] if i < 4 else rng.choice(COMPANY_SUFFIXES)
        founder, year = _pick_creator(rng, founders, (20, 55), 1850, 2015)
        graph.add(
            "company",
            names.company(suffix),
            founder=founder.key,
            founding_year=year,
            headquarters=rng.choice(cities).key,
            industry=INDUSTRIES[suffix],
        )


def _homonym_title(rng: random.Random, names: NameFactory, candidates: list[Entity], exclude: set[str]) -> str | None:
    for _ in range(20):
        other = rng.choice(candidates)
        if other.key not in exclude and names.claim("work", other.name):
            return other.name
    return None


def _build_films(config: WorldConfig, rng: random.Random, names: NameFactory, graph: EntityGraph) -> None:
    directors = _people(graph, "director")
    actors = _people(graph, "actor")
    people = graph.of_kind("person")
    for _ in range(config.n_films):
        director, year = _pick_creator(rng, directors, (22, 70), 1920, 2023)
        eligible = [a for a in actors if year - 75 <= a.get("birth_year") <= year - 16 and a.key != director.key]
        cast = rng.sample(eligible, min(len(eligible), rng.choice([2, 3, 3, 4])))
        title = None
        if config.distractors and rng.random() < 0.12:
            title = _homonym_title(rng, names, people, {director.key, *(a.key for a in cast)})
        attrs = {
            "director": director.key,
            "release_year": year,
            "genre": rng.choice(FILM_GENRES),
            "cast": [a.key for a in cast],
        }
        studio = _pick_company(rng, graph, year, "film production")
        if studio is not None:
            attrs["studio"] = studio.key
        graph.add("film", title or names.film(), **attrs)


def _build_books(config: WorldConfig, rng: random.Random, names: NameFactory, graph: EntityGraph) -> None:
    authors = _people(graph, "writer")
    cities = graph.of_kind("city")
    for _ in range(config.n_books):
        author, year = _pick_creator(rng, authors, (20, 75), 1860, 2023)
        attrs = {
            "author": author.key,
            "publication_year": year,
            "genre": rng.choice(BOOK_GENRES),
            "setting": rng.choice(cities).key,
        }
        publisher = _pick_company(rng, graph, year, "publishing")
        if publisher is not None:
            attrs["publisher"] = publisher.key
        graph.add("book", names.book(), **attrs)


def _build_bands(config: WorldConfig, rng: random.Random, names: NameFactory, graph: EntityGraph) -> None:
    musicians = _people(graph, "musician")
    cities = graph.of_kind("city")
    for _ in range(config.n_bands):
        founder, year = _pick_creator(rng, musicians, (16, 35), 1950, 2020)
        eligible = [m for m in musicians if year - 50 <= m.get("birth_year") <= year - 15 and m.key != founder.key]
        members = [founder] + rng.sample(eligible, min(len(eligible), rng.choice([2, 2, 3])))
        origin = rng.choice(cities)
        name = None
        if config.distractors and rng.random() < 0.2:
            name = _homonym_title(rng, names, cities, {origin.key})
        graph.add(
            "band",
            name or names.band(),
            founder=founder.key,
            members=[m.key for m in members],
            origin=origin.key,
            formation_year=year,
            genre=rng.choice(BAND_GENRES),
        )


def build_works(config: WorldConfig, rng: random.Random, names: NameFactory, graph: EntityGraph) -> None:
    """Add companies, then films, books and bands (which need people and companies to exist)."""
    _build_companies(config, rng, names, graph)
    _build_films(config, rng, names, graph)
    _build_books(config, rng, names, graph)
    _build_bands(config, rng, names, graph)
