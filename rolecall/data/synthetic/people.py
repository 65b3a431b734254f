"""People of the synthetic world, generated as family trees so kinship questions ("paternal grandfather") have answers.

Generation 0 is born 1830-1860; each married couple has children 22-38 years after the older parent, who carry the
father's surname. Spouses from outside the families join each generation, and about a quarter of them reuse a surname
already in use, so two unrelated people often share a surname (homonym distractors for retrieval).
"""

from __future__ import annotations

import random

from rolecall.data.synthetic.config import WorldConfig
from rolecall.data.synthetic.entities import Entity, EntityGraph
from rolecall.data.synthetic.names import NameFactory

__all__ = ["OCCUPATIONS", "build_people"]

OCCUPATIONS = ("actor", "director", "writer", "musician", "entrepreneur", "scientist", "politician")
"""Every occupation a person can have; films, books, bands and companies draw their people by occupation."""

_LAST_BIRTH_YEAR = 2002


def _occupation(rng: random.Random, birth_year: int) -> str:
    # Films start in 1920 and bands in 1950, so actors, directors and musicians must be born late enough to work.
    choices = ["writer", "entrepreneur", "scientist", "politician"]
    if birth_year >= 1870:
        choices += ["actor", "actor", "director", "writer"]
    if birth_year >= 1925:
        choices += ["musician", "musician", "actor"]
    return rng.choice(choices)


class _PeopleBuilder:
    def __init__(self, rng: random.Random, names: NameFactory, graph: EntityGraph) -> None:
        self.rng = rng
        self.names = names
        self.graph = graph
        self.cities = graph.of_kind("city")
        self.countries = graph.of_kind("country")
        self.universities = graph.of_kind("university")
        self.surnames: list[str] = []

    def person(
        self, gender: str, surname: str, birth_year: int, birth_city: Entity, parents: tuple[Entity, Entity] | None
    ) -> Entity:
        rng = self.rng
        nationality = birth_city.get("country")
        if rng.random() < 0.15:  # emigrants: nationality differs from the country of birth
            nationality = rng.choice([c.key for c in self.countries if c.key != nationality])
        attrs = {
            "gender": gender,
            "birth_year": birth_year,
            "birth_city": birth_city.key,
            "nationality": nationality,
            "alma_mater": rng.choice(self.universities).key,
            "occupation": _occupation(rng, birth_year),
        }
        if parents is not None:
            attrs["father"], attrs["mother"] = parents[0].key, parents[1].key
        if surname not in self.surnames:
            self.surnames.append(surname)
        return self.graph.add("person", self.names.person(gender, surname), **attrs)

    def outsider(self, years: tuple[int, int]) -> Entity:
        rng = self.rng
        reuse = self.surnames and rng.random() < 0.25
        surname = rng.choice(self.surnames) if reuse else self.names.surname()
        gender = rng.choice(["male", "female"])
        return self.person(gender, surname, rng.randint(*years), rng.choice(self.cities), None)

    def marry(self, people: list[Entity]) -> list[tuple[Entity, Entity]]:
        rng = self.rng
        men = [p for p in people if p.get("gender") == "male"]
        women = [p for p in people if p.get("gender") == "female"]
        rng.shuffle(men)
        rng.shuffle(women)
        couples = []
        for man in men:
            if rng.random() > 0.8:
                continue
            for i, woman in enumerate(women):
                siblings = man.get("father") is not None and man.get("father") == woman.get("father")
                if not siblings and abs(man.get("birth_year") - woman.get("birth_year")) <= 12:
                    man.attrs["spouse"], woman.attrs["spouse"] = woman.key, man.key
                    couples.append((man, women.pop(i)))
                    break
        return couples

    def children(self, father: Entity, mother: Entity, budget: int) -> list[Entity]:
        rng = self.rng
        out = []
        for _ in range(min(budget, rng.choice([1, 2, 2, 3, 3, 4]))):
            year = max(father.get("birth_year"), mother.get("birth_year")) + rng.randint(22, 38)
            if year > _LAST_BIRTH_YEAR:
                continue
            city = self.graph[father.get("birth_city")] if rng.random() < 0.5 else rng.choice(self.cities)
            out.append(
                self.person(rng.choice(["male", "female"]), father.name.split()[-1], year, city, (father, mother))
            )
        return out


def build_people(config: WorldConfig, rng: random.Random, names: NameFactory, graph: EntityGraph) -> None:
    """Add ``config.n_people`` people: family trees over up to five generations, then unrelated people.

    Each person has gender, birth year, birth city, nationality (usually the birth city's country), alma mater and
    occupation; family members also have father, mother and spouse.
    """
    builder = _PeopleBuilder(rng, names, graph)
    target = config.n_people
    count = 0
    generation = []
    for _ in range(max(10, target // 6)):
        generation.append(builder.outsider((1830, 1860)))
    count = len(generation)
    while count < target and generation:
        couples = builder.marry(generation)
        born: list[Entity] = []
        for father, mother in couples:
            born += builder.children(father, mother, target - count - len(born))
        count += len(born)
        if not born:
            break
        years = (min(p.get("birth_year") for p in born), max(p.get("birth_year") for p in born))
        spouses = [builder.outsider(years) for _ in range(min(len(born) // 3, target - count))]
        count += len(spouses)
        generation = born + spouses
    while count < target:  # unrelated people of every era, mostly the late ones that bands and films need
        builder.outsider((1860, _LAST_BIRTH_YEAR) if rng.random() < 0.3 else (1930, 1995))
        count += 1
