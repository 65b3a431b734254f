"""Sizes and switches of a synthetic world."""

from __future__ import annotations

from dataclasses import dataclass, fields

from rolecall.errors import ConfigError

__all__ = ["WorldConfig"]

# The smallest sizes at which every question type still finds enough candidates.
_MINIMUMS = {
    "n_countries": 2,
    "n_cities": 6,
    "n_universities": 2,
    "n_people": 60,
    "n_companies": 4,
    "n_films": 8,
    "n_books": 4,
    "n_bands": 4,
}


@dataclass(kw_only=True)
class WorldConfig:
    """How big a synthetic world is and how its questions are split."""

    seed: int = 0
    """Seed of every random draw; the same seed and sizes give a byte-identical world."""
    n_countries: int = 8
    """Number of countries (each has a capital and a language)."""
    n_cities: int = 40
    """Number of cities, spread over the countries; must be at least ``2 * n_countries``."""
    n_universities: int = 16
    """Number of universities (each in a city)."""
    n_people: int = 400
    """Number of people, generated as family trees over five generations plus unrelated people."""
    n_companies: int = 30
    """Number of companies (founder, headquarters, founding year, industry)."""
    n_films: int = 80
    """Number of films (director, cast, studio, release year, genre)."""
    n_books: int = 60
    """Number of books (author, publisher, year, genre, setting)."""
    n_bands: int = 24
    """Number of bands (founder, members, city, formation year, genre)."""
    n_train: int = 500
    """Number of training questions."""
    n_dev: int = 150
    """Number of development questions."""
    n_test: int = 300
    """Number of test questions."""
    distractors: bool = True
    """Add homonyms (a film named like a person, a band named like a city) and near-miss documents (festivals, prizes,
    tours, surname pages) that mention the same entities through other relations. Recommended: True."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.startswith("n_") and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"{f.name} must be an int, got {value!r}")
        for name, minimum in _MINIMUMS.items():
            if getattr(self, name) < minimum:
                raise ConfigError(f"{name}={getattr(self, name)} is too small for a usable world; use >= {minimum}.")
        if self.n_cities < 2 * self.n_countries:
            raise ConfigError(
                f"n_cities ({self.n_cities}) must be at least 2 * n_countries ({2 * self.n_countries}) so every "
                "country has a capital and another city; raise n_cities or lower n_countries."
            )
        for name in ("n_train", "n_dev", "n_test"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ConfigError(f"seed must be an int, got {self.seed!r}")

    @property
    def n_questions(self) -> int:
        """Total number of questions over the three splits."""
        return self.n_train + self.n_dev + self.n_test
