"""Shared fixtures of the program tests: dspy settings reset after each test, and a scripted retriever."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path

import dspy
import pytest
from dspy.dsp.utils.settings import DEFAULT_CONFIG

from rolecall.retrievers.base import Passage, Retriever


@pytest.fixture(autouse=True)
def reset_dspy_settings():
    """Every test starts and ends with DSPy's default settings."""
    yield
    dspy.configure(**copy.deepcopy(DEFAULT_CONFIG))


class ScriptedRetriever(Retriever):
    """A retriever whose passages come from a function of the query; it records every (query, k) call."""

    def __init__(self, fn: Callable[[str, int], list[Passage]] | None = None, error: Exception | None = None) -> None:
        self.fn = fn or (lambda q, k: [Passage(f"p{i}", f"Title {i}", f"Some text number {i}.") for i in range(k)])
        self.error = error
        self.calls: list[tuple[str, int]] = []

    def retrieve_batch(self, queries: Sequence[str], k: int | None = None) -> list[list[Passage]]:
        out = []
        for q in queries:
            self.calls.append((q, k or self.default_k))
            if self.error is not None:
                raise self.error
            out.append(self.fn(q, k or self.default_k))
        return out

    def save(self, path: str | Path) -> None:  # pragma: no cover - not used
        raise NotImplementedError

    @classmethod
    def load(cls, path: str | Path) -> ScriptedRetriever:  # pragma: no cover - not used
        raise NotImplementedError


@pytest.fixture
def retriever() -> ScriptedRetriever:
    return ScriptedRetriever()


@pytest.fixture
def make_retriever() -> type[ScriptedRetriever]:
    """The ``ScriptedRetriever`` class, for tests that need a custom passage function or a failing index."""
    return ScriptedRetriever
