"""Texts in the gold paths: a sub-question as the program wrote it against the one the gold path planned, and the
words a passage states a relation in (the gold query after a missed search)."""

from __future__ import annotations

import re

from rolecall.data.io import split_sentences
from rolecall.data.types import Document

__all__ = ["relation_words", "text_key"]

_WORD = re.compile(r"[\w'-]+")


def text_key(text: str) -> str:
    """``text`` with its whitespace collapsed and case folded, so two spellings of one sub-question compare equal.

    Example:
        >>> text_key("  Where is   Varn? ") == text_key("where is varn?")
        True
    """
    return " ".join(str(text).split()).casefold()


def relation_words(doc: Document, answer: str) -> list[str]:
    """The words of ``doc``'s first sentence holding ``answer`` (else its first), the title's and the answer's words
    dropped: how the passage words the relation a sub-question asks about.

    Example:
        >>> relation_words(Document("p", "Trabryn Fefelmar", "Trabryn is a director. She is married to Paman Dro."),
        ...                "Paman Dro")
        ['She', 'is', 'married', 'to']
    """
    sentences = split_sentences(doc.text) or [doc.text]
    sentence = next((s for s in sentences if answer.casefold() in s.casefold()), sentences[0])
    drop = {w.casefold() for w in f"{doc.title} {answer}".split()}
    return [w for w in _WORD.findall(sentence) if w.casefold() not in drop]
