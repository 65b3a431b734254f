"""The retriever contract: ``retriever(query, k) -> list[Passage]``, a batch method, save/load and ``as_tool``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Passage", "Retriever"]


@dataclass(frozen=True)
class Passage:
    """A retrieved passage. ``id`` matches the corpus document id so rewards can score it against gold ids."""

    id: str
    title: str
    text: str
    score: float = 0.0

    def format(self) -> str:
        """``"title | text"``, the way programs show a passage to an LM."""
        return f"{self.title} | {self.text}" if self.title else self.text


class Retriever(ABC):
    """Base contract of every retriever. Subclasses implement :meth:`retrieve_batch`, :meth:`save` and :meth:`load`."""

    default_k: int = 5

    def __call__(self, query: str, k: int | None = None) -> list[Passage]:
        """Top-``k`` passages for ``query`` (best first)."""
        return self.retrieve(query, k)

    def retrieve(self, query: str, k: int | None = None) -> list[Passage]:
        """Top-``k`` passages for one query (best first). An empty or blank query returns ``[]``."""
        return self.retrieve_batch([query], k)[0]

    @abstractmethod
    def retrieve_batch(self, queries: Sequence[str], k: int | None = None) -> list[list[Passage]]:
        """Top-``k`` passages for each query."""

    @abstractmethod
    def save(self, path: str | Path) -> None:
        """Write the index and its corpus to directory ``path`` (no pickle)."""

    @classmethod
    @abstractmethod
    def load(cls, path: str | Path) -> Retriever:
        """Read an index written by :meth:`save`."""

    def as_tool(self, k: int | None = None, name: str = "search") -> Any:
        """This retriever as a ``dspy.Tool`` that ReAct-style agents can call with a ``query`` string."""
        from rolecall.retrievers.tool import retriever_tool

        return retriever_tool(self, k=k or self.default_k, name=name)
