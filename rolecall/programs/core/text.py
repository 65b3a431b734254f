"""Text shown to an LM: numbered passages, shortened strings, and unseen passages first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rolecall.retrievers.base import Passage

__all__ = ["format_passages", "shorten", "fresh_first"]


def format_passages(passages: Sequence[Any], *, max_chars: int = 300, max_total_chars: int = 1200) -> str:
    """Number and truncate passages for a prompt: ``"[1] title | text"`` lines, each cut to ``max_chars`` and
    stopping before the total would pass ``max_total_chars`` (the first passage is always kept).

    Args:
        passages: passages, documents (anything with ``title`` and ``text``) or strings.
        max_chars: most characters of one passage (title included).
        max_total_chars: most characters of all passages together.

    Returns:
        The formatted block, or ``"(no passages)"`` when there are none.

    Example:
        >>> format_passages([Passage("d1", "Paris", "Paris is the capital of France.")])
        '[1] Paris | Paris is the capital of France.'
    """
    lines: list[str] = []
    total = 0
    for i, p in enumerate(passages, start=1):
        text = p if isinstance(p, str) else (f"{p.title} | {p.text}" if getattr(p, "title", "") else p.text)
        text = " ".join(text.split())
        if len(text) > max_chars:
            text = text[: max_chars - 3].rsplit(" ", 1)[0] + "..."
        line = f"[{i}] {text}"
        if lines and total + len(line) > max_total_chars:
            break
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines) if lines else "(no passages)"


def shorten(text: str, limit: int) -> str:
    """``text`` with its white space folded, cut at a word boundary to at most ``limit`` characters (``...`` marks
    the cut); naive version: ``text[:limit]``.

    Example:
        >>> shorten("Ada  Quell founded Morrow Books in 1950.", 24)
        'Ada Quell founded...'
    """
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rsplit(" ", 1)[0] + "..."


def fresh_first(passages: list[Passage], seen: set[str]) -> list[Passage]:
    """Unseen passages first (a larger k, or a rewritten query, should show new evidence), then the seen ones; adds
    every id to ``seen``.

    Example:
        >>> seen = {"a"}
        >>> [p.id for p in fresh_first([Passage("a", "", "x"), Passage("b", "", "y")], seen)], sorted(seen)
        (['b', 'a'], ['a', 'b'])
    """
    fresh = [p for p in passages if p.id not in seen]
    ordered = fresh + [p for p in passages if p.id in seen]
    seen.update(p.id for p in passages)
    return ordered
