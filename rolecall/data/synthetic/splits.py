"""Draw candidate questions and deal them into train / dev / test without sharing a fact between splits.

A *fact* is one (entity, relation) edge such as ``film/the-lantern-of-quessa.director``. Once a split uses a fact, no
other split may: a test question never re-asks a hop a training question taught. Slots are dealt round-robin over
splits and question subtypes so every split gets every type in the proportions of :data:`SUBTYPE_WEIGHTS`.
"""

from __future__ import annotations

import logging
import random

from rolecall.data.synthetic.comparisons import bridge_comparison, comparison, intersection, yes_no
from rolecall.data.synthetic.entities import EntityGraph
from rolecall.data.synthetic.questions import Candidate, Generator, compositional, inference, single

__all__ = ["SUBTYPE_WEIGHTS", "draw_pools", "allocate"]

logger = logging.getLogger(__name__)

SUBTYPE_WEIGHTS = {
    "single": 0.14,
    "compositional/2": 0.14,
    "compositional/3": 0.10,
    "compositional/4": 0.07,
    "comparison": 0.12,
    "bridge_comparison": 0.10,
    "intersection": 0.09,
    "inference": 0.11,
    "yes_no": 0.13,
}
"""Share of each question subtype in every split (compositional chains are split by hop count)."""

_GENERATORS: dict[str, Generator] = {
    "single": single,
    "compositional/2": compositional(2),
    "compositional/3": compositional(3),
    "compositional/4": compositional(4),
    "comparison": comparison,
    "bridge_comparison": bridge_comparison,
    "intersection": intersection,
    "inference": inference,
    "yes_no": yes_no,
}
_POOL_FACTOR = 4  # candidates drawn per needed question; the fact constraint discards many of them
_ATTEMPTS_PER_CANDIDATE = 30


def draw_pools(rng: random.Random, graph: EntityGraph, n_questions: int) -> dict[str, list[Candidate]]:
    """Draw distinct candidates for every subtype, about ``_POOL_FACTOR`` times what the splits need.

    Question texts are unique over all pools; a text drawn twice with different answers would be ambiguous, so both
    copies are dropped.
    """
    pools: dict[str, list[Candidate]] = {}
    by_text: dict[str, Candidate] = {}
    ambiguous: set[str] = set()
    for subtype, generate in _GENERATORS.items():
        want = max(4, round(n_questions * SUBTYPE_WEIGHTS[subtype] * _POOL_FACTOR))
        pool: list[Candidate] = []
        for _ in range(want * _ATTEMPTS_PER_CANDIDATE):
            if len(pool) >= want:
                break
            candidate = generate(rng, graph)
            if candidate is None:
                continue
            seen = by_text.get(candidate.question)
            if seen is not None:
                if seen.answers[0] != candidate.answers[0]:
                    ambiguous.add(candidate.question)
                continue
            by_text[candidate.question] = candidate
            pool.append(candidate)
        pools[subtype] = _alternate_answers(pool) if subtype == "yes_no" else pool
    return {s: [c for c in pool if c.question not in ambiguous] for s, pool in pools.items()}


def _alternate_answers(pool: list[Candidate]) -> list[Candidate]:
    """Reorder yes/no candidates as yes, no, yes, no, ... so even a small split gets both answers."""
    yes = [c for c in pool if c.answers[0] == "yes"]
    no = [c for c in pool if c.answers[0] != "yes"]
    out = [c for pair in zip(yes, no, strict=False) for c in pair]
    return out + yes[len(no) :] + no[len(yes) :]


def _quotas(total: int) -> dict[str, int]:
    quotas = {s: max(1, round(total * w)) if total else 0 for s, w in SUBTYPE_WEIGHTS.items()}
    largest = max(quotas, key=quotas.__getitem__)
    quotas[largest] += total - sum(quotas.values())
    return quotas


def allocate(pools: dict[str, list[Candidate]], sizes: dict[str, int]) -> dict[str, list[Candidate]]:
    """Deal candidates into splits of the given sizes so that no fact is used by two splits.

    Slots ``(split, subtype)`` are interleaved by their fractional position so splits fill at the same pace; each slot
    takes the first remaining candidate of its subtype whose facts are free or already owned by that split. Slots that
    find none are refilled afterwards from any subtype.
    """
    order = list(sizes)
    slots = []
    for si, split in enumerate(order):
        for ti, (subtype, quota) in enumerate(_quotas(sizes[split]).items()):
            slots += [((i + 0.5) / quota, si, ti, split, subtype) for i in range(quota)]
    slots.sort()
    owner: dict[str, str] = {}
    remaining = {s: list(pool) for s, pool in pools.items()}
    chosen: dict[str, list[Candidate]] = {split: [] for split in order}

    def take(split: str, subtype: str) -> bool:
        pool = remaining[subtype]
        for i, candidate in enumerate(pool):
            if all(owner.get(f, split) == split for f in candidate.facts):
                for f in candidate.facts:
                    owner[f] = split
                chosen[split].append(pool.pop(i))
                return True
        return False

    missing = {split: 0 for split in order}
    for _, _, _, split, subtype in slots:
        if not take(split, subtype):
            missing[split] += 1
    for split in order:
        for subtype in list(SUBTYPE_WEIGHTS) * max(1, missing[split]):
            if missing[split] == 0:
                break
            if take(split, subtype):
                missing[split] -= 1
        if missing[split]:
            logger.warning("split %r got %d questions fewer than the %d asked; use a larger world", split,
                           missing[split], sizes[split])  # fmt: skip
    return chosen
