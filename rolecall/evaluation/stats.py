"""Evaluation statistics: question-bootstrap confidence intervals, avg@k and pass@k.

Bootstrap (Efron & Tibshirani, 1993, percentile method): resample the per-question scores with replacement B times,
take the mean of each resample, and report the ``alpha/2`` and ``1 - alpha/2`` quantiles of those B means. Questions
are the unit of resampling, so the interval reflects which questions a benchmark happened to contain.

With k independent runs per question (sampling temperature > 0), writing ``s_qj`` for the score of run j on question q:

    avg@k  = (1/Q) Σ_q (1/k) Σ_j s_qj                 (mean over runs, then over questions)
    pass@k = (1/Q) Σ_q 1[max_j s_qj >= threshold]      (a question counts when any of its k runs is correct)

These are the empirical avg@k / pass@k used by reasoning and multi-agent distillation papers that report k sampled
runs per question; pass@k here is the "any of the k runs" estimate, not Chen et al.'s (2021) unbiased estimator from
n > k samples.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

__all__ = ["mean_and_ci", "avg_at_k", "pass_at_k", "avg_pass_at_k"]

logger = logging.getLogger(__name__)

# Bootstrap resamples are drawn in blocks of at most this many indices, so 1000 resamples of a 100k-question
# benchmark stay near 80 MB instead of 800 MB.
_MAX_BLOCK_ELEMENTS = 10_000_000


def _as_vector(values: Sequence[float]) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"values must be a flat sequence of numbers (one score per question): {err}") from err
    if array.ndim != 1:
        raise ValueError(f"values must be one-dimensional (one score per question), got shape {array.shape}.")
    if array.size == 0:
        raise ValueError("values is empty: a mean and an interval need at least one score.")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"values holds {int(np.sum(~np.isfinite(array)))} non-finite score(s) (NaN or inf).")
    return array


def _as_matrix(scores_per_question: Sequence[Sequence[float]]) -> np.ndarray:
    """Scores as a (Q, k) array, checking every question has the same number of runs."""
    if isinstance(scores_per_question, (str, bytes)) or not isinstance(scores_per_question, (Sequence, np.ndarray)):
        raise TypeError(
            "scores_per_question must be a sequence (one entry per question) of sequences (one score per run), "
            f"got {type(scores_per_question).__name__}."
        )
    if len(scores_per_question) == 0:
        raise ValueError("scores_per_question is empty: need at least one question.")
    run_counts = []
    for q, runs in enumerate(scores_per_question):
        if isinstance(runs, (str, bytes)) or not isinstance(runs, (Sequence, np.ndarray)):
            raise TypeError(
                f"scores_per_question[{q}] must be a sequence of per-run scores, got {type(runs).__name__}: {runs!r}."
            )
        run_counts.append(len(runs))
    if min(run_counts) == 0:
        raise ValueError(f"question {run_counts.index(0)} has no runs; every question needs at least one score.")
    if len(set(run_counts)) > 1:
        # A run that crashed should be scored 0 (failure is data), not dropped: unequal k would bias avg@k.
        raise ValueError(
            f"every question must have the same number of runs k, got between {min(run_counts)} and "
            f"{max(run_counts)}. Score failed runs as 0 instead of dropping them."
        )
    matrix = np.asarray(scores_per_question, dtype=np.float64)  # (Q, k)
    if not np.all(np.isfinite(matrix)):
        raise ValueError("scores_per_question holds non-finite score(s) (NaN or inf).")
    return matrix


def mean_and_ci(
    values: Sequence[float], *, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float, float]:
    """Mean of per-question scores with a percentile-bootstrap confidence interval over questions.

    Naive equivalent::

        rng = np.random.default_rng(seed)
        means = [rng.choice(values, size=len(values), replace=True).mean() for _ in range(n_boot)]
        lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])

    Args:
        values: one score per question (e.g. EM in {0, 1} or F1 in [0, 1]).
        n_boot: number of bootstrap resamples; 1000 is the common choice for 95% intervals, use 10000 for a table.
        alpha: 1 - confidence level (0.05 gives a 95% interval); must lie in (0, 1).
        seed: seed of the resampling generator; the same seed and values give the same interval.

    Returns:
        ``(mean, lo, hi)``: the sample mean and the interval's lower and upper ends.

    Raises:
        TypeError: if ``values`` is not a flat sequence of numbers.
        ValueError: if ``values`` is empty or non-finite, ``n_boot < 1`` or ``alpha`` is outside (0, 1).

    Example:
        >>> mean, lo, hi = mean_and_ci([1.0, 0.0, 1.0, 1.0], seed=0)
        >>> mean, lo <= mean <= hi
        (0.75, True)
    """
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot must be a positive int (1000 is typical), got {n_boot!r}.")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1) (0.05 gives a 95% interval), got {alpha!r}.")
    array = _as_vector(values)  # (Q,)
    n = array.size
    rng = np.random.default_rng(seed)
    boot_means = np.empty(n_boot, dtype=np.float64)  # (B,)
    block = max(1, _MAX_BLOCK_ELEMENTS // n)
    for start in range(0, n_boot, block):
        stop = min(start + block, n_boot)
        indices = rng.integers(0, n, size=(stop - start, n))  # (b, Q)
        boot_means[start:stop] = array[indices].mean(axis=1)
    lo, hi = np.quantile(boot_means, [alpha / 2, 1 - alpha / 2])
    return float(array.mean()), float(lo), float(hi)


def avg_at_k(scores_per_question: Sequence[Sequence[float]]) -> float:
    """avg@k: the mean score over the k runs of each question, then over questions.

    Args:
        scores_per_question: ``scores_per_question[q][j]`` is the score of run j on question q; every question must
            have the same number of runs k >= 1.

    Returns:
        avg@k.

    Raises:
        TypeError: if the input is not a sequence of sequences.
        ValueError: if it is empty, a question has no runs, run counts differ, or a score is non-finite.

    Example:
        >>> avg_at_k([[1, 0, 1, 1], [0, 0, 0, 1]])  # (0.75 + 0.25) / 2
        0.5
    """
    return float(_as_matrix(scores_per_question).mean(axis=1).mean())


def pass_at_k(scores_per_question: Sequence[Sequence[float]], *, threshold: float = 1.0) -> float:
    """pass@k: the fraction of questions where at least one of the k runs is correct.

    Args:
        scores_per_question: ``scores_per_question[q][j]`` is the score of run j on question q; every question must
            have the same number of runs k >= 1.
        threshold: a run is correct when its score is >= threshold; 1.0 suits EM (and any 0/1 score), use e.g. 0.5
            to count F1 >= 0.5 as correct.

    Returns:
        pass@k in [0, 1].

    Raises:
        TypeError: if the input is not a sequence of sequences.
        ValueError: if it is empty, a question has no runs, run counts differ, or a score is non-finite.

    Example:
        >>> pass_at_k([[1, 0, 0], [0, 0, 0], [0, 1, 1]])  # questions 0 and 2 pass
        0.6666666666666666
    """
    return float((_as_matrix(scores_per_question).max(axis=1) >= threshold).mean())


def avg_pass_at_k(
    scores_per_question: Sequence[Sequence[float]],
    *,
    threshold: float = 1.0,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict[str, float]:
    """avg@k and pass@k with question-bootstrap intervals (MultiAgent-OPD's evaluation: k = 4 runs per question).

    Each question contributes its mean over the k runs (avg@k) and 1[max_j s_qj >= threshold] (pass@k); both are
    then averaged over questions with :func:`mean_and_ci`, so questions are the resampled unit. Naive equivalent:
    ``mean_and_ci([mean(runs) for runs in s])`` and ``mean_and_ci([max(runs) >= threshold for runs in s])``.

    Args:
        scores_per_question: ``scores_per_question[q][j]``, the score of run j on question q (same k everywhere).
        threshold: a run is correct when its score is >= threshold (1.0 for EM).
        n_boot: bootstrap resamples.
        alpha: 1 - confidence level (0.05: 95% intervals).
        seed: seed of the resampling.

    Returns:
        ``{"avg@k": ..., "avg@k/lo", "avg@k/hi", "pass@k", "pass@k/lo", "pass@k/hi", "questions": Q, "k": k}`` with k
        written as its number (``"avg@4"``).

    Raises:
        TypeError, ValueError: as :func:`avg_at_k` and :func:`mean_and_ci`.

    Example:
        >>> r = avg_pass_at_k([[1, 0, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]])
        >>> round(r["avg@4"], 4), round(r["pass@4"], 4), r["questions"]  # (0.75 + 0.25 + 0) / 3; 2 of 3 pass
        (0.3333, 0.6667, 3.0)
    """
    matrix = _as_matrix(scores_per_question)  # (Q, k)
    k = matrix.shape[1]
    out: dict[str, float] = {}
    for name, per_question in (("avg", matrix.mean(axis=1)), ("pass", (matrix.max(axis=1) >= threshold) * 1.0)):
        mean, lo, hi = mean_and_ci(per_question.tolist(), n_boot=n_boot, alpha=alpha, seed=seed)
        out.update({f"{name}@{k}": mean, f"{name}@{k}/lo": lo, f"{name}@{k}/hi": hi})
    out.update({"questions": float(matrix.shape[0]), "k": float(k)})
    return out
