"""Parametric-memory check: how often does an LM answer synthetic questions with no retrieved context?

The synthetic world only makes sense as a retrieval benchmark if a model cannot know its answers from pretraining.
:func:`parametric_accuracy` asks each question bare and scores it with normalized exact match or cover match (the
normalized gold answer appears inside the normalized prediction). Closed-form types (``comparison``,
``bridge_comparison``, ``yes_no``) are left out by default, because naming one of two options scores 50% by chance.
"""

from __future__ import annotations

import logging
import re
import string
from collections.abc import Callable, Sequence

from rolecall.errors import ConfigError

__all__ = ["OPEN_TYPES", "DEFAULT_PROMPT", "normalize_answer", "answer_matches", "parametric_accuracy"]

logger = logging.getLogger(__name__)

OPEN_TYPES = ("single", "compositional", "intersection", "inference")
"""Question types whose answer is not one of a few options named in the question."""

DEFAULT_PROMPT = "Answer the question with a short answer only, no explanation.\nQuestion: {question}"
"""Prompt sent for each question; ``{question}`` is replaced by the question text."""


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and the articles a / an / the, collapse whitespace (SQuAD normalisation).

    Example:
        >>> normalize_answer("The  Lantern, of Quessa!")
        'lantern of quessa'
    """
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def answer_matches(prediction: str, answers: Sequence[str]) -> bool:
    """True if the normalized prediction equals or contains (as whole words) any normalized gold answer.

    Example:
        >>> answer_matches("It was Orlen Vask.", ["Orlen Vask"]), answer_matches("Orlen", ["Orlen Vask"])
        (True, False)
    """
    pred = f" {normalize_answer(prediction)} "
    for answer in answers:
        gold = normalize_answer(answer)
        if gold and f" {gold} " in pred:
            return True
    return False


def parametric_accuracy(
    world: object,
    lm_generate: Callable[[list[str]], list[str]],
    split: str = "test",
    limit: int | None = None,
    *,
    types: Sequence[str] | None = OPEN_TYPES,
    prompt: str = DEFAULT_PROMPT,
) -> float:
    """Accuracy of ``lm_generate`` on a split's questions asked with no context.

    Args:
        world: a :class:`~rolecall.data.synthetic.world.SyntheticWorld` (anything with a ``splits`` dict works).
        lm_generate: maps a list of prompts to one completion each (it may batch them as it likes).
        split: ``"train"``, ``"dev"`` or ``"test"``.
        limit: ask at most this many questions (the first ones of the split after filtering by type).
        types: question types to ask; None asks all of them, including the 50%-by-chance closed-form ones.
        prompt: the prompt template with a ``{question}`` slot.

    Returns:
        The fraction of questions answered correctly (exact or cover match against any gold alias); 0.0 when no
        question is asked.

    Raises:
        ConfigError: for an unknown split, or when ``lm_generate`` returns the wrong number of completions.

    Example:
        >>> from rolecall.data.synthetic import synthetic_world
        >>> world = synthetic_world(seed=0, n_train=10, n_dev=10, n_test=20)
        >>> parametric_accuracy(world, lambda prompts: ["I don't know"] * len(prompts))
        0.0
    """
    splits = world.splits  # type: ignore[attr-defined]
    if split not in splits:
        raise ConfigError(f"unknown split {split!r}; choose one of {sorted(splits)}")
    examples = [e for e in splits[split] if types is None or e.type in types]
    if limit is not None:
        examples = examples[:limit]
    if not examples:
        return 0.0
    completions = lm_generate([prompt.format(question=e.question) for e in examples])
    if len(completions) != len(examples):
        raise ConfigError(f"lm_generate returned {len(completions)} completions for {len(examples)} prompts")
    hits = [answer_matches(c, e.answers) for c, e in zip(completions, examples, strict=True)]
    by_type: dict[str, list[bool]] = {}
    for hit, e in zip(hits, examples, strict=True):
        by_type.setdefault(e.type, []).append(hit)
    logger.info(
        "parametric accuracy on %s: %.3f over %d questions; by type: %s", split, sum(hits) / len(hits), len(hits),
        {t: round(sum(v) / len(v), 3) for t, v in by_type.items()},
    )  # fmt: skip
    return sum(hits) / len(hits)
