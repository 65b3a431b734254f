"""Comparing texts in the gold paths: a sub-question as the program wrote it against the one the gold path planned."""

from __future__ import annotations

__all__ = ["text_key"]


def text_key(text: str) -> str:
    """``text`` with its whitespace collapsed and case folded, so two spellings of one sub-question compare equal.

    Example:
        >>> text_key("  Where is   Varn? ") == text_key("where is varn?")
        True
    """
    return " ".join(str(text).split()).casefold()
