"""Answer normalization shared by the metrics and the programs that compare answers (a leaf module: it imports
nothing from rolecall, so :mod:`rolecall.programs` and :mod:`rolecall.evaluation` can both use it without an import
cycle). :mod:`rolecall.evaluation.metrics` re-exports :func:`normalize_answer`.

The normalization is SQuAD's (Rajpurkar et al., EMNLP 2016), as in the official HotpotQA evaluation script:

    normalize(s) = collapse_whitespace(remove_articles(remove_punctuation(lowercase(s))))
"""

from __future__ import annotations

import re
import string

__all__ = ["holds_answer", "normalize_answer"]

# ASCII punctuation only, as in the official script, so our numbers match published ones character for character.
_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Normalize an answer the SQuAD / HotpotQA way: lowercase, drop punctuation and articles, collapse whitespace.

    Punctuation is deleted, not replaced by a space (``"U.S."`` becomes ``"us"``), and articles are removed only as
    whole words (``"theater"`` keeps its ``the``), exactly as the official scripts do.

    Args:
        s: the text to normalize.

    Returns:
        The normalized text; tokens are separated by single spaces.

    Raises:
        TypeError: if ``s`` is not a string.

    Example:
        >>> normalize_answer("The  Eiffel Tower!")
        'eiffel tower'
        >>> normalize_answer("U.S. and an apple")
        'us and apple'
    """
    if not isinstance(s, str):
        raise TypeError(f"normalize_answer expects a str, got {type(s).__name__}: {s!r}. Convert it with str() first.")
    text = s.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def holds_answer(text: str, answer: str) -> bool:
    """Whether ``text`` contains ``answer`` as whole words, both SQuAD-normalized (:func:`normalize_answer`).

    Example:
        >>> holds_answer("Its cast includes Ann Lee and Bob.", "ann lee"), holds_answer("Annabel", "Ann")
        (True, False)
    """
    target = normalize_answer(answer)
    return bool(target) and f" {target} " in f" {normalize_answer(text)} "
