"""Invented names for the synthetic world, built from syllables so no pretrained model can know them.

Every name comes from a ``random.Random`` passed in by the caller, so the same seed always yields the same names.
Names are unique within one :class:`NameFactory`; titles of works mix invented words with a few English nouns so they
read like titles (``"The Lantern of Quessa"``) while staying fictional.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

__all__ = ["COMPANY_SUFFIXES", "NameFactory", "slugify", "join_names"]

_ONSETS = [
    "b",
    "br",
    "d",
    "dr",
    "f",
    "g",
    "gr",
    "h",
    "k",
    "kr",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "st",
    "t",
    "th",
    "v",
    "z",
]
_ONSETS += ["sh", "tr", "vr", "ch", "j", "y", "q"]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ae", "ei", "ou", "ia"]
_CODAS = ["", "", "", "n", "r", "l", "s", "th", "sk", "m", "nd", "rn", "v", "x", "lt"]

_MALE_ENDINGS = ["en", "or", "as", "ric", "an", "el", "us", "im", "ard", "o"]
_FEMALE_ENDINGS = ["a", "ine", "elle", "ys", "eth", "ia", "wen", "ra", "ette", "yn"]
_SURNAME_ENDINGS = ["", "sk", "ov", "ell", "ane", "ik", "orn", "wick", "dal", "mar", "ent", "ssen"]
_CITY_ENDINGS = ["imo", "ara", "heim", "vik", "oria", "ent", "ost", "undra", "ay", "esk", "ulm", "avel"]
_COUNTRY_ENDINGS = ["ia", "land", "mark", "ora", "esh", "avia", "onia", "eth"]
_LANGUAGE_ENDINGS = ["ese", "ic", "ish", "an"]

_NOUNS = [
    "Lantern", "Orchard", "Harbor", "Mirror", "Ember", "Meridian", "Tide", "Glass", "Archive", "Compass", "Garden",
    "Ledger", "Furnace", "Citadel", "Winter", "Hollow", "Signal", "Cathedral", "Anchor", "Atlas", "Thread", "Quarry",
    "Vessel", "Parade", "Orbit", "Canal", "Pilgrim", "Bellows", "Beacon", "Rampart",
]  # fmt: skip
_ADJECTIVES = [
    "Silent", "Amber", "Broken", "Seventh", "Hollow", "Crimson", "Distant", "Gilded", "Paper", "Iron", "Velvet",
    "Northern", "Quiet", "Burning", "Salt", "Copper", "Pale", "Wandering",
]  # fmt: skip
_COLLECTIVES = ["Collective", "Orchestra", "Brothers", "Ensemble", "Society", "Quartet", "Union", "Circus"]
COMPANY_SUFFIXES = ["Industries", "Systems", "Holdings", "Works", "Group", "Labs", "Motors", "Media", "Textiles"]
COMPANY_SUFFIXES += ["Press", "Pictures", "Foods", "Shipping"]


def slugify(name: str) -> str:
    """Lower-case, ASCII, dash-separated form of a name, used in document ids.

    Example:
        >>> slugify("The Lantern of Quessa")
        'the-lantern-of-quessa'
    """
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def join_names(names: list[str]) -> str:
    """English list of names: ``"A"``, ``"A and B"``, ``"A, B and C"``.

    Documents and gold sub-answers both use this helper, so a listed sub-answer appears verbatim in its document.
    """
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


class NameFactory:
    """Draws invented names from syllables, never repeating a name it has already returned for the same pool.

    Args:
        rng: the random generator every draw uses.
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._used: dict[str, set[str]] = {}

    def _unique(self, pool: str, draw: Callable[[], str]) -> str:
        used = self._used.setdefault(pool, set())
        for _ in range(1000):
            name = draw()
            if name not in used and 3 <= len(name) <= 40:
                used.add(name)
                return name
        raise RuntimeError(f"name pool {pool!r} is exhausted after {len(used)} names")

    def word(self, syllables: tuple[int, int] = (2, 2)) -> str:
        """An invented capitalised word of ``syllables`` (min, max) syllables, e.g. ``"Tavri"``."""
        n = self.rng.randint(*syllables)
        parts = []
        for i in range(n):
            coda = self.rng.choice(_CODAS) if i == n - 1 else ""
            parts.append(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + coda)
        return "".join(parts).capitalize()

    def _root(self) -> str:
        # A root ending in a consonant cluster reads better before suffixes like "-imo" or "-ia".
        return (self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_ONSETS[:20])).capitalize()

    def first_name(self, gender: str) -> str:
        """A given name; endings differ by ``gender`` (``"male"`` or ``"female"``). Not unique on its own."""
        endings = _MALE_ENDINGS if gender == "male" else _FEMALE_ENDINGS
        return self._root() + self.rng.choice(endings)

    def surname(self) -> str:
        """A new, unused family name such as ``"Vask"`` or ``"Dremov"``."""
        return self._unique("surname", lambda: self.word((1, 2)) + self.rng.choice(_SURNAME_ENDINGS))

    def person(self, gender: str, surname: str) -> str:
        """A new full name with the given surname, unique among all persons drawn so far."""
        return self._unique("person", lambda: f"{self.first_name(gender)} {surname}")

    def city(self) -> str:
        """A new city name such as ``"Tavrimo"``."""
        return self._unique("place", lambda: self._root() + self.rng.choice(_CITY_ENDINGS))

    def country(self) -> str:
        """A new country name such as ``"Velorna"``; it shares the place pool so no city has a country's name."""
        return self._unique("place", lambda: self._root() + self.rng.choice(_COUNTRY_ENDINGS))

    def language(self, country: str) -> str:
        """The language named after a country: ``"Velornese"``."""
        stem = country.rstrip("aeiouy")
        return self._unique("language", lambda: stem + self.rng.choice(_LANGUAGE_ENDINGS))

    def university(self) -> str:
        """A new university name such as ``"Hollensk University"``."""
        patterns = ["{w} University", "University of {w}", "{w} Institute of Technology", "{w} College"]
        return self._unique("university", lambda: self.rng.choice(patterns).format(w=self.word((2, 3))))

    def company(self, suffix: str | None = None) -> str:
        """A new company name such as ``"Quorin Shipping"``; ``suffix`` fixes the last word (``"Pictures"``)."""
        return self._unique("company", lambda: f"{self.word((2, 2))} {suffix or self.rng.choice(COMPANY_SUFFIXES)}")

    def film(self) -> str:
        """A new film title such as ``"The Lantern of Quessa"``."""
        patterns = ["The {n} of {w}", "{w} {n}", "{a} {n}s of {w}", "The {a} {w}"]
        return self._unique("work", lambda: self._title(patterns))

    def book(self) -> str:
        """A new book title such as ``"A Compass for Drelmo"``; it shares the work pool with films."""
        patterns = ["A {n} for {w}", "{w}'s {n}", "Letters from {w}", "The {a} {n} of {w}"]
        return self._unique("work", lambda: self._title(patterns))

    def band(self) -> str:
        """A new band name such as ``"The Vrenik Collective"``."""
        patterns = ["The {w} {c}", "{a} {w}", "{w} {n}s"]
        return self._unique("work", lambda: self._title(patterns))

    def _title(self, patterns: list[str]) -> str:
        return self.rng.choice(patterns).format(
            w=self.word((2, 2)),
            n=self.rng.choice(_NOUNS),
            a=self.rng.choice(_ADJECTIVES),
            c=self.rng.choice(_COLLECTIVES),
        )

    def claim(self, pool: str, name: str) -> bool:
        """Reserve ``name`` in ``pool``; False if it was already taken (used to make deliberate homonyms)."""
        used = self._used.setdefault(pool, set())
        if name in used:
            return False
        used.add(name)
        return True
