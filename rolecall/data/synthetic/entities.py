"""Entities of the synthetic world, the graph that holds them, and the places (countries, cities, universities).

An entity's ``key`` is also the id of its encyclopedia document (``"person/orlen-vask"``). Relations to other entities
are stored in ``attrs`` as keys (``attrs["director"] == "person/orlen-vask"``), lists of keys for many-valued relations
(``cast``, ``members``), and plain ints or strings for literal attributes (``birth_year``, ``genre``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from rolecall.data.synthetic.config import WorldConfig
from rolecall.data.synthetic.names import NameFactory, slugify

__all__ = ["KINDS", "Entity", "EntityGraph", "build_places"]

KINDS = ("country", "city", "university", "person", "company", "film", "book", "band")
"""Every entity kind, in the order they are generated."""


@dataclass
class Entity:
    """One fictional entity: its kind, its unique-within-kind name and its attributes."""

    key: str
    kind: str
    name: str
    attrs: dict[str, Any] = field(default_factory=dict)

    def get(self, relation: str) -> Any:
        """The value of ``relation`` (an entity key, a list of keys, an int, a string) or None when unset."""
        return self.attrs.get(relation)


class EntityGraph(Mapping[str, Entity]):
    """All entities of a world by key, in generation order, with lookups by kind and by name."""

    def __init__(self) -> None:
        self._entities: dict[str, Entity] = {}
        self._by_kind: dict[str, list[Entity]] = {kind: [] for kind in KINDS}
        self.memo: dict[Any, Any] = {}
        """Derived indexes (reverse relations, value groups) that readers build once; cleared by :meth:`add`."""

    def __getitem__(self, key: str) -> Entity:
        return self._entities[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entities)

    def __len__(self) -> int:
        return len(self._entities)

    def add(self, kind: str, name: str, **attrs: Any) -> Entity:
        """Create and register an entity; its key is ``kind/slug(name)``, which must be new."""
        key = f"{kind}/{slugify(name)}"
        if key in self._entities:
            raise ValueError(f"duplicate entity key {key!r}")
        entity = Entity(key=key, kind=kind, name=name, attrs=dict(attrs))
        self.memo.clear()
        self._entities[key] = entity
        self._by_kind[kind].append(entity)
        return entity

    def of_kind(self, kind: str) -> list[Entity]:
        """Entities of one kind, in generation order."""
        return self._by_kind[kind]

    def name(self, key: str) -> str:
        """The name of the entity with this key."""
        return self._entities[key].name

    def target(self, entity: Entity, relation: str) -> Entity | None:
        """The entity that ``relation`` of ``entity`` points to, or None if unset or literal."""
        value = entity.get(relation)
        return self._entities.get(value) if isinstance(value, str) else None


def build_places(config: WorldConfig, rng: random.Random, names: NameFactory, graph: EntityGraph) -> None:
    """Add countries (capital, language), cities (country, population, founding year) and universities (city, year).

    Every country gets at least two cities; the first is its capital. Populations are distinct so "which city is
    larger" always has one answer.
    """
    countries = []
    for _ in range(config.n_countries):
        name = names.country()
        countries.append(graph.add("country", name, language=names.language(name)))
    populations = rng.sample(range(8, 4000), config.n_cities)  # thousands, distinct
    for i in range(config.n_cities):
        country = countries[i % len(countries)] if i < 2 * len(countries) else rng.choice(countries)
        city = graph.add(
            "city",
            names.city(),
            country=country.key,
            population=populations[i] * 1000 + rng.randrange(0, 1000, 10),
            founding_year=rng.randint(900, 1800),
        )
        if "capital" not in country.attrs:
            country.attrs["capital"] = city.key
    cities = graph.of_kind("city")
    for _ in range(config.n_universities):
        graph.add("university", names.university(), city=rng.choice(cities).key, founding_year=rng.randint(1400, 1840))
