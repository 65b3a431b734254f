"""A retriever as a ``dspy.Tool``, so ReAct-style agents can search the corpus by calling ``search(query=...)``.

The function form of :meth:`~rolecall.retrievers.base.Retriever.as_tool`, and the text the tool returns
(:func:`format_passages`, :data:`NO_PASSAGES`, defined with the retriever contract in :mod:`rolecall.retrievers.base`).
"""

from __future__ import annotations

import dspy

from rolecall.retrievers.base import NO_PASSAGES, Retriever, format_passages

__all__ = ["retriever_tool", "format_passages", "NO_PASSAGES"]


def retriever_tool(retriever: Retriever, k: int, name: str = "search") -> dspy.Tool:
    """Wrap ``retriever`` as a ``dspy.Tool`` taking one ``query: str`` and returning :func:`format_passages` text
    (``retriever.as_tool(k, name)``).

    Args:
        retriever: any rolecall retriever.
        k: passages returned per call.
        name: the tool name the agent sees.

    Returns:
        A ``dspy.Tool``; ``tool(query="...")`` returns a string.

    Raises:
        ValueError: if ``k`` is smaller than 1.
    """
    return retriever.as_tool(k=k, name=name)
