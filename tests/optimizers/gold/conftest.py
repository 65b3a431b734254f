"""Fixtures of the gold-path tests: the seed-0 synthetic world and a BM25 index over its corpus (built once)."""

from __future__ import annotations

import pytest

from rolecall.data.synthetic import synthetic_world
from rolecall.retrievers.bm25 import BM25


@pytest.fixture(scope="session")
def world():
    return synthetic_world(seed=0)


@pytest.fixture(scope="session")
def bm25(world):
    return BM25(world.corpus)
