"""Answer and retrieval metrics for multi-hop QA: EM, F1, cover-EM, recall@k and NDCG@k.

The answer metrics follow the official HotpotQA evaluation script (Yang et al., EMNLP 2018,
https://github.com/hotpotqa/hotpot), whose normalization is SQuAD's (Rajpurkar et al., EMNLP 2016):

    normalize(s) = collapse_whitespace(remove_articles(remove_punctuation(lowercase(s))))

    EM = 1[normalize(prediction) == normalize(gold)]
    P  = |tokens(pred) ∩ tokens(gold)| / |tokens(pred)|        (multiset intersection)
    R  = |tokens(pred) ∩ tokens(gold)| / |tokens(gold)|
    F1 = 2 P R / (P + R)

HotpotQA adds one rule to F1: when either normalized side is ``yes``, ``no`` or ``noanswer`` and the two sides differ,
P, R and F1 are all 0 (a "yes it is" answer to a yes/no question earns no partial credit).

Two deliberate differences from the official script, both about degenerate inputs:

* A prediction that is ``None`` or normalizes to the empty string scores 0 on every metric (the official EM would give
  1 when the gold also normalizes to empty). A failed or empty answer is never rewarded.
* A gold alias that normalizes to the empty string (``""``, ``"The"``, ``"?"``) never matches anything.

Every answer metric takes the maximum over gold aliases, as HotpotQA's and 2Wiki's scripts do for ``answers`` lists.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from rolecall.utils.text import normalize_answer

__all__ = [
    "normalize_answer",
    "exact_match",
    "f1_score",
    "f1_precision_recall",
    "cover_exact_match",
    "qa_scores",
    "answer_exact_match",
    "recall_at_k",
    "ndcg_at_k",
]

logger = logging.getLogger(__name__)

# HotpotQA's special answers: a mismatch involving one of these scores F1 = 0 instead of partial overlap.
_SPECIAL_ANSWERS = frozenset({"yes", "no", "noanswer"})
_ZERO_PRF = (0.0, 0.0, 0.0)


def _normalized_prediction(prediction: str | None) -> str:
    """The normalized prediction; ``None`` becomes ``""`` so a missing answer scores 0 instead of raising."""
    if prediction is None:
        return ""
    if not isinstance(prediction, str):
        raise TypeError(
            f"prediction must be a str or None, got {type(prediction).__name__}: {prediction!r}. "
            "Pass the answer text (e.g. `pred.answer`), converting numbers with str()."
        )
    return normalize_answer(prediction)


def _normalized_aliases(gold: str | Sequence[str]) -> list[str]:
    """The normalized gold aliases, dropping those that normalize to ``""`` (they can never be matched)."""
    if isinstance(gold, str):
        aliases: Sequence[str] = [gold]
    elif isinstance(gold, Sequence) and not isinstance(gold, (bytes, bytearray)):
        aliases = gold
    else:
        raise TypeError(
            f"gold must be a str or a sequence of str (the answer and its aliases), got {type(gold).__name__}: "
            f"{gold!r}."
        )
    normalized = []
    for i, alias in enumerate(aliases):
        if not isinstance(alias, str):
            raise TypeError(f"gold alias {i} must be a str, got {type(alias).__name__}: {alias!r}.")
        norm = normalize_answer(alias)
        if norm:
            normalized.append(norm)
    return normalized


def _prf(pred: str, gold: str) -> tuple[float, float, float]:
    """(F1, precision, recall) of two normalized strings, with HotpotQA's yes/no/noanswer rule."""
    if pred != gold and (pred in _SPECIAL_ANSWERS or gold in _SPECIAL_ANSWERS):
        return _ZERO_PRF
    pred_tokens, gold_tokens = pred.split(), gold.split()
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return _ZERO_PRF
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


def _contains_tokens(haystack: list[str], needle: list[str]) -> bool:
    """Whether ``needle`` occurs as a contiguous run of whole tokens in ``haystack``."""
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def exact_match(prediction: str | None, gold: str | Sequence[str]) -> float:
    """Strict exact match after normalization, maximized over gold aliases.

    Args:
        prediction: the predicted answer; ``None`` or an answer that normalizes to ``""`` scores 0.
        gold: the gold answer, or the gold answer and its aliases.

    Returns:
        1.0 if the normalized prediction equals some normalized gold alias, else 0.0.

    Raises:
        TypeError: if ``prediction`` is neither a str nor None, or ``gold`` is not a str or a sequence of str.

    Example:
        >>> exact_match("The Eiffel Tower", "eiffel tower!")
        1.0
        >>> exact_match("Paris", ["City of Light", "Paris, France"])
        0.0
    """
    pred = _normalized_prediction(prediction)
    if not pred:
        return 0.0
    return float(any(pred == alias for alias in _normalized_aliases(gold)))


def f1_precision_recall(prediction: str | None, gold: str | Sequence[str]) -> tuple[float, float, float]:
    """Token-level (F1, precision, recall) with HotpotQA's yes/no rule, taken from the gold alias with the best F1.

    Ties between aliases keep the first one listed.

    Args:
        prediction: the predicted answer; ``None`` or an answer that normalizes to ``""`` scores (0, 0, 0).
        gold: the gold answer, or the gold answer and its aliases.

    Returns:
        ``(f1, precision, recall)``, each in [0, 1].

    Raises:
        TypeError: if ``prediction`` is neither a str nor None, or ``gold`` is not a str or a sequence of str.

    Example:
        >>> f1_precision_recall("the big red dog", "red dog")  # P = 2/3, R = 1, F1 = 0.8
        (0.8, 0.6666666666666666, 1.0)
        >>> f1_precision_recall("yes", "yes it is")  # the yes/no rule: no partial credit
        (0.0, 0.0, 0.0)
    """
    pred = _normalized_prediction(prediction)
    best = _ZERO_PRF
    if not pred:
        return best
    for alias in _normalized_aliases(gold):
        scores = _prf(pred, alias)
        if scores[0] > best[0]:
            best = scores
    return best


def f1_score(prediction: str | None, gold: str | Sequence[str]) -> float:
    """Token-level F1 with HotpotQA's yes/no rule, maximized over gold aliases.

    See :func:`f1_precision_recall` for the precision and recall behind it.

    Example:
        >>> round(f1_score("the big red dog", "red dog barked"), 4)  # P = R = 2/3
        0.6667
    """
    return f1_precision_recall(prediction, gold)[0]


def cover_exact_match(prediction: str | None, gold: str | Sequence[str]) -> float:
    """Cover-EM: whether some normalized gold alias appears inside the normalized prediction.

    Containment is checked on whole tokens: the alias's tokens must occur as a contiguous run of the prediction's
    tokens. So ``"1990"`` is found in ``"born in 1990"`` but not in ``"19901"``, and ``"art"`` is not found in
    ``"martial arts"``. Plain substring containment (used by some RAG papers) would credit both; token boundaries
    avoid rewarding an answer that merely contains the gold's characters. An alias that normalizes to ``""`` never
    matches (the empty string is inside everything).

    Args:
        prediction: the predicted answer; ``None`` or an answer that normalizes to ``""`` scores 0.
        gold: the gold answer, or the gold answer and its aliases.

    Returns:
        1.0 if some alias is covered, else 0.0.

    Raises:
        TypeError: if ``prediction`` is neither a str nor None, or ``gold`` is not a str or a sequence of str.

    Example:
        >>> cover_exact_match("He was born in 1990.", "1990")
        1.0
        >>> cover_exact_match("19901", "1990")
        0.0
    """
    pred_tokens = _normalized_prediction(prediction).split()
    if not pred_tokens:
        return 0.0
    return float(any(_contains_tokens(pred_tokens, alias.split()) for alias in _normalized_aliases(gold)))


def qa_scores(prediction: str | None, gold: str | Sequence[str]) -> dict[str, float]:
    """All answer metrics of one prediction at once.

    Args:
        prediction: the predicted answer (``None`` scores 0 everywhere).
        gold: the gold answer, or the gold answer and its aliases.

    Returns:
        ``{"em", "f1", "precision", "recall", "cover_em"}``; precision and recall come from the alias with the best F1.

    Raises:
        TypeError: if ``prediction`` is neither a str nor None, or ``gold`` is not a str or a sequence of str.

    Example:
        >>> qa_scores("The Eiffel Tower", ["Eiffel Tower", "Tour Eiffel"])["em"]
        1.0
    """
    f1, precision, recall = f1_precision_recall(prediction, gold)
    return {
        "em": exact_match(prediction, gold),
        "f1": f1,
        "precision": precision,
        "recall": recall,
        "cover_em": cover_exact_match(prediction, gold),
    }


def answer_exact_match(example: Any, prediction: Any, trace: Any = None) -> bool:
    """A DSPy metric (``metric(example, prediction, trace)``, as BootstrapFewShot calls it): whether the
    prediction's ``answer`` exactly matches one of the example's ``answers``.

    Example:
        >>> import dspy
        >>> answer_exact_match(dspy.Example(answers=["Paris"]), dspy.Prediction(answer="paris"))
        True
    """
    return bool(exact_match(str(prediction.answer or ""), list(example.answers)))


def _check_ids(ids: Sequence[Hashable], name: str) -> None:
    """Reject a bare string (it would be read as a list of one-character ids) and non-sequences."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise TypeError(
            f"{name} must be a sequence of ids (e.g. a list of str), got {type(ids).__name__}: {ids!r}. "
            "Wrap a single id in a list."
        )


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {type(k).__name__}: {k!r}.")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}.")


def _hit_ranks(retrieved_ids: Sequence[Hashable], gold: set[Hashable], k: int) -> list[int]:
    """1-based ranks within the first k slots that hold a gold id seen for the first time (a repeat earns nothing)."""
    seen: set[Hashable] = set()
    ranks = []
    for rank, doc in enumerate(retrieved_ids[:k], start=1):
        if doc in gold and doc not in seen:
            ranks.append(rank)
        seen.add(doc)
    return ranks


def recall_at_k(retrieved_ids: Sequence[Hashable], gold_ids: Sequence[Hashable], k: int) -> float:
    """Fraction of the distinct gold ids found in the first ``k`` retrieved ids.

    ``recall@k = |top_k(retrieved) ∩ gold| / |gold|``. Duplicates in ``retrieved_ids`` count once and still occupy
    their slot. With no gold ids the result is 0.0, the default of torchmetrics' and torcheval's retrieval metrics
    (``empty_target_action="neg"``); trec_eval instead leaves such queries out of its averages, so filter them out
    before averaging if you want its numbers.

    Args:
        retrieved_ids: ids in rank order, best first.
        gold_ids: the relevant ids (order and repeats do not matter).
        k: how many retrieved slots to look at (>= 1; may exceed ``len(retrieved_ids)``).

    Returns:
        Recall in [0, 1].

    Raises:
        TypeError: if an id list is a bare string or not a sequence, or ``k`` is not an int.
        ValueError: if ``k < 1``.

    Example:
        >>> recall_at_k(["x", "g1", "y", "g2"], ["g1", "g2", "g3"], k=2)  # g1 of 3 gold
        0.3333333333333333
    """
    _check_ids(retrieved_ids, "retrieved_ids")
    _check_ids(gold_ids, "gold_ids")
    _check_k(k)
    gold = set(gold_ids)
    if not gold:
        return 0.0
    return len(_hit_ranks(retrieved_ids, gold, k)) / len(gold)


def ndcg_at_k(retrieved_ids: Sequence[Hashable], gold_ids: Sequence[Hashable], k: int) -> float:
    """Normalized discounted cumulative gain at ``k`` with binary relevance (Järvelin & Kekäläinen, TOIS 2002).

    ``DCG@k = Σ_{i=1..k} rel_i / log2(i + 1)`` with ``rel_i = 1`` when the id at rank ``i`` is gold and has not
    appeared at an earlier rank, else 0. ``IDCG@k`` is the DCG of ``min(|gold|, k)`` hits at ranks 1, 2, ...;
    ``NDCG@k = DCG@k / IDCG@k``. With no gold ids the result is 0.0 (see :func:`recall_at_k`).

    Args:
        retrieved_ids: ids in rank order, best first.
        gold_ids: the relevant ids (order and repeats do not matter).
        k: the rank cut-off (>= 1).

    Returns:
        NDCG in [0, 1].

    Raises:
        TypeError: if an id list is a bare string or not a sequence, or ``k`` is not an int.
        ValueError: if ``k < 1``.

    Example:
        >>> round(ndcg_at_k(["g1", "x", "g2"], ["g1", "g2"], k=3), 4)  # (1 + 1/log2(4)) / (1 + 1/log2(3))
        0.9197
    """
    _check_ids(retrieved_ids, "retrieved_ids")
    _check_ids(gold_ids, "gold_ids")
    _check_k(k)
    gold = set(gold_ids)
    if not gold:
        return 0.0
    dcg = sum(1.0 / math.log2(rank + 1) for rank in _hit_ranks(retrieved_ids, gold, k))
    idcg = sum(1.0 / math.log2(rank + 1) for rank in range(1, min(len(gold), k) + 1))
    return dcg / idcg
