"""A retriever as a ``dspy.Tool``, so ReAct-style agents can search the corpus by calling ``search(query=...)``."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from rolecall.retrievers.base import Passage, Retriever

__all__ = ["retriever_tool", "format_passages", "NO_PASSAGES"]

logger = logging.getLogger(__name__)

NO_PASSAGES = "No passages found for this query. Try different or more specific keywords."
"""What the tool returns when retrieval comes back empty (an empty query, or no matching document)."""


def format_passages(passages: Sequence[Passage]) -> str:
    """Numbered passages, one a line: ``"[1] title | text"``; :data:`NO_PASSAGES` when there are none.

    Example:
        >>> format_passages([Passage(id="a", title="Paris", text="Capital of France.")])
        '[1] Paris | Capital of France.'
    """
    if not passages:
        return NO_PASSAGES
    return "\n".join(f"[{i}] {p.format()}" for i, p in enumerate(passages, start=1))


def retriever_tool(retriever: Retriever, k: int, name: str = "search") -> Any:
    """Wrap ``retriever`` as a ``dspy.Tool`` taking one ``query: str`` and returning :func:`format_passages` text.

    Args:
        retriever: any rolecall retriever.
        k: passages returned per call.
        name: the tool name the agent sees.

    Returns:
        A ``dspy.Tool``; ``tool(query="...")`` returns a string.

    Raises:
        ValueError: if ``k`` is smaller than 1.
    """
    import dspy

    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}.")

    def search(query: str) -> str:
        passages = retriever.retrieve(query, k)
        if not passages:
            logger.debug("Tool %s: no passages for %r", name, query)
        return format_passages(passages)

    desc = (
        f"Search the corpus and return the top {k} passages for `query`, numbered as '[i] title | text'. "
        "Use short keyword queries that name the entity or fact you need."
    )
    return dspy.Tool(search, name=name, desc=desc, arg_desc={"query": "keywords or a question to search for"})
