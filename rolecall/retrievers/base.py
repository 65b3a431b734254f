"""The retriever contract: ``retriever(query, k) -> list[Passage]``, a batch method, save/load, and ``as_tool`` (the
retriever as the ``search`` tool of a ReAct-style agent).

The tool's text (:func:`format_passages`, :data:`NO_PASSAGES`) lives here with the contract, so that
:mod:`rolecall.retrievers.tool` depends on this module and never the reverse.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import dspy

if TYPE_CHECKING:
    from rolecall.data.types import Document

__all__ = ["Passage", "Retriever", "format_passages", "NO_PASSAGES"]

logger = logging.getLogger(__name__)

NO_PASSAGES = "No passages found for this query. Try different or more specific keywords."
"""What the search tool returns when retrieval comes back empty (an empty query, or no matching document)."""


@dataclass(frozen=True)
class Passage:
    """A retrieved passage. ``id`` matches the corpus document id so rewards can score it against gold ids."""

    id: str
    title: str
    text: str
    score: float = 0.0

    @classmethod
    def of(cls, doc: Document, score: float) -> Passage:
        """Corpus document ``doc`` retrieved with ``score``."""
        return cls(id=doc.id, title=doc.title, text=doc.text, score=score)

    def format(self) -> str:
        """``"title | text"``, the way programs show a passage to an LM."""
        return f"{self.title} | {self.text}" if self.title else self.text


def format_passages(passages: Sequence[Passage]) -> str:
    """The search tool's text: numbered passages, one a line (``"[1] title | text"``), uncut; :data:`NO_PASSAGES`
    when there are none.

    Example:
        >>> format_passages([Passage(id="a", title="Paris", text="Capital of France.")])
        '[1] Paris | Capital of France.'
    """
    if not passages:
        return NO_PASSAGES
    return "\n".join(f"[{i}] {p.format()}" for i, p in enumerate(passages, start=1))


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

    def _resolve_k(self, k: int | None, corpus_size: int) -> int:
        """``k`` (default :attr:`default_k`) clamped to the corpus size.

        Raises:
            ValueError: if ``k`` is smaller than 1.
        """
        k = self.default_k if k is None else k
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}.")
        return min(k, corpus_size)

    @staticmethod
    def _live_queries(queries: Sequence[str]) -> list[int]:
        """Positions of the queries with something to search for (non-empty, non-blank strings)."""
        return [i for i, q in enumerate(queries) if isinstance(q, str) and q.strip()]

    def _retrieve_live(
        self,
        queries: Sequence[str],
        k: int | None,
        corpus_size: int,
        search: Callable[[list[str], int], Sequence[list[Passage]]],
    ) -> list[list[Passage]]:
        """The frame of a batch retrieval: ``k`` resolved (:meth:`_resolve_k`), ``[]`` for each empty or blank query,
        and ``search(texts, k)`` called once with the other queries, returning their passages in order.

        Raises:
            ValueError: if ``k`` is smaller than 1.
        """
        k = self._resolve_k(k, corpus_size)
        results: list[list[Passage]] = [[] for _ in queries]
        live = self._live_queries(queries)
        if not live:
            return results
        for qi, passages in zip(live, search([queries[i] for i in live], k), strict=True):
            results[qi] = passages
        return results

    @abstractmethod
    def save(self, path: str | Path) -> None:
        """Write the index and its corpus to directory ``path`` (no pickle)."""

    @classmethod
    @abstractmethod
    def load(cls, path: str | Path) -> Retriever:
        """Read an index written by :meth:`save`."""

    def as_tool(self, k: int | None = None, name: str = "search") -> dspy.Tool:
        """This retriever as a ``dspy.Tool`` taking one ``query: str`` and returning :func:`format_passages` text.

        Args:
            k: passages returned per call (None: :attr:`default_k`).
            name: the tool name the agent sees.

        Raises:
            ValueError: if ``k`` is smaller than 1.
        """
        k = self.default_k if k is None else k
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}.")

        def search(query: str) -> str:
            passages = self.retrieve(query, k)
            if not passages:
                logger.debug("Tool %s: no passages for %r", name, query)
            return format_passages(passages)

        desc = (
            f"Search the corpus and return the top {k} passages for `query`, numbered as '[i] title | text'. "
            "Use short keyword queries that name the entity or fact you need."
        )
        return dspy.Tool(search, name=name, desc=desc, arg_desc={"query": "keywords or a question to search for"})
