"""Text shown to an LM: numbered passages, shortened strings, and unseen passages first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rolecall.retrievers.base import Passage

__all__ = ["format_passages", "shorten", "fresh_first", "show_fresh"]


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
    """Unseen passages first (a larger k, or a rewritten query, should show new evidence), then the seen ones.

    Example:
        >>> [p.id for p in fresh_first([Passage("a", "", "x"), Passage("b", "", "y")], {"a"})]
        ['b', 'a']
    """
    return [p for p in passages if p.id not in seen] + [p for p in passages if p.id in seen]


def show_fresh(
    passages: list[Passage], seen: set[str], *, max_chars: int, max_total_chars: int
) -> tuple[list[Passage], str, list[str]]:
    """Order ``passages`` unseen first, format them for a prompt, and add to ``seen`` only the ids that were shown
    (:func:`format_passages` cuts at ``max_total_chars``: a passage retrieved but cut off was not seen, so a retry
    with a larger k or a rewritten query must still be able to show it).

    Returns:
        ``(ordered passages, the prompt text, the ids shown)``.

    Example:
        >>> seen = set()
        >>> docs = [Passage(i, "", "word " * 30) for i in "abc"]
        >>> _, text, shown = show_fresh(docs, seen, max_chars=200, max_total_chars=400)
        >>> shown, sorted(seen)  # c did not fit in 400 characters: not seen
        (['a', 'b'], ['a', 'b'])
    """
    ordered = fresh_first(passages, seen)
    text = format_passages(ordered, max_chars=max_chars, max_total_chars=max_total_chars)
    shown = [p.id for p in ordered[: len(text.splitlines()) if ordered else 0]]
    seen.update(shown)
    return ordered, text, shown
