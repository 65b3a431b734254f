"""Paired comparison of two evaluations of the same questions: is program B better than program A?

Two programs evaluated on the same questions are judged question by question, not by their two means with separate
intervals: with d_i = EM_B(i) - EM_A(i),

- won / lost / tied count the questions where B is right and A wrong, A right and B wrong, or both alike;
- the paired bootstrap resamples questions (the same index for both programs) and gives the 95% interval of mean(d);
- McNemar's exact test (a two-sided sign test on the discordant questions) gives the p-value of "B and A are equally
  often right": with b won and c lost, p = min(1, 2 * P[Binomial(b + c, 1/2) <= min(b, c)]).

On 200 questions two unpaired 95% intervals are about +-7 points wide; pairing removes the variance the two programs
share (the questions both get right or both miss), so the paired interval is the one that can see a few points.

Example:
    >>> result = paired_comparison({"q1": 1.0, "q2": 0.0, "q3": 0.0}, {"q1": 1.0, "q2": 1.0, "q3": 0.0})
    >>> (result.won, result.lost, result.tied)
    (1, 0, 2)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rolecall.errors import ConfigError

__all__ = ["PairedComparison", "compare_runs", "format_comparison", "mcnemar_exact", "paired_comparison"]


def mcnemar_exact(won: int, lost: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts ``won`` (b) and ``lost`` (c).

    Naive equivalent: ``scipy.stats.binomtest(min(b, c), b + c, 0.5).pvalue``.

    Example:
        >>> round(mcnemar_exact(10, 2), 4)
        0.0386
        >>> mcnemar_exact(0, 0)
        1.0
    """
    n = won + lost
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(won, lost) + 1)) / 2**n
    return min(1.0, 2.0 * tail)


@dataclass(frozen=True)
class PairedComparison:
    """The paired judgement of B against A on ``n`` shared questions (EM and F1 as fractions)."""

    n: int
    em_a: float
    em_b: float
    f1_a: float
    f1_b: float
    won: int
    """Questions B answers exactly right and A does not."""
    lost: int
    """Questions A answers exactly right and B does not."""
    tied: int
    em_diff: float
    """mean(EM_B - EM_A)."""
    ci_low: float
    """2.5th percentile of the paired bootstrap of mean(EM_B - EM_A)."""
    ci_high: float
    """97.5th percentile of the same."""
    p_value: float
    """McNemar's exact two-sided p-value."""
    f1_diff: float
    name_a: str = "A"
    name_b: str = "B"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return asdict(self)


def paired_comparison(
    em_a: Mapping[str, float],
    em_b: Mapping[str, float],
    *,
    f1_a: Mapping[str, float] | None = None,
    f1_b: Mapping[str, float] | None = None,
    resamples: int = 10_000,
    seed: int = 0,
    names: tuple[str, str] = ("A", "B"),
) -> PairedComparison:
    """Compare per-question EM of two programs on the same question ids.

    Args:
        em_a: question id -> EM (0/1) of program A.
        em_b: the same for program B; must hold exactly the ids of ``em_a``.
        f1_a: question id -> F1 of A (default: EM).
        f1_b: the same for B.
        resamples: bootstrap resamples of the questions.
        seed: the bootstrap's seed (the interval is reproducible).
        names: labels of A and B.

    Raises:
        ConfigError: the two question sets differ, or are empty (the message counts and names a few ids).
    """
    ids_a, ids_b = set(em_a), set(em_b)
    if ids_a != ids_b:
        only_a, only_b = sorted(ids_a - ids_b), sorted(ids_b - ids_a)
        raise ConfigError(
            f"{names[0]} and {names[1]} were not evaluated on the same questions: {len(ids_a)} against {len(ids_b)}; "
            f"only in {names[0]}: {len(only_a)} {only_a[:3]}, only in {names[1]}: {len(only_b)} {only_b[:3]}; "
            "evaluate both on the same dataset, split, seed and --limit"
        )
    if not ids_a:
        raise ConfigError("no questions to compare: both evaluations are empty")
    ids = sorted(ids_a)
    a = np.array([float(em_a[i]) for i in ids])  # (n,)
    b = np.array([float(em_b[i]) for i in ids])  # (n,)
    fa = np.array([float((f1_a or em_a)[i]) for i in ids])
    fb = np.array([float((f1_b or em_b)[i]) for i in ids])
    d = b - a  # (n,)
    won, lost = int(((b > 0.5) & (a <= 0.5)).sum()), int(((a > 0.5) & (b <= 0.5)).sum())
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(ids), size=(resamples, len(ids)))].mean(axis=1)  # (resamples,)
    low, high = np.percentile(means, [2.5, 97.5])
    return PairedComparison(
        n=len(ids),
        em_a=float(a.mean()),
        em_b=float(b.mean()),
        f1_a=float(fa.mean()),
        f1_b=float(fb.mean()),
        won=won,
        lost=lost,
        tied=len(ids) - won - lost,
        em_diff=float(d.mean()),
        ci_low=float(low),
        ci_high=float(high),
        p_value=mcnemar_exact(won, lost),
        f1_diff=float((fb - fa).mean()),
        name_a=names[0],
        name_b=names[1],
    )


def _records_file(run: Path) -> Path:
    path = run / "records.jsonl" if run.is_dir() else run
    if not path.is_file():
        raise ConfigError(f"{run} is not an evaluation: no records.jsonl there; pass a folder `rolecall eval` wrote")
    return path


def compare_runs(run_a: str | Path, run_b: str | Path, *, resamples: int = 10_000, seed: int = 0) -> PairedComparison:
    """:func:`paired_comparison` of two evaluation folders (or their ``records.jsonl`` files).

    Raises:
        ConfigError: a folder holds no records, or the two hold different questions.
        DataFormatError: a records file is damaged before its last line.
    """
    from rolecall.evaluation.records import read_records

    runs = (Path(run_a), Path(run_b))
    records = [read_records(_records_file(run)) for run in runs]
    em = [{r.id: r.em for r in rs} for rs in records]
    f1 = [{r.id: r.f1 for r in rs} for rs in records]
    return paired_comparison(
        em[0], em[1], f1_a=f1[0], f1_b=f1[1], resamples=resamples, seed=seed, names=(str(runs[0]), str(runs[1]))
    )


def format_comparison(c: PairedComparison) -> str:
    """A few lines for the terminal: both programs' EM / F1, won / lost / tied, the interval and the p-value."""
    verdict = "B better" if c.ci_low > 0 else "A better" if c.ci_high < 0 else "no difference shown"
    return "\n".join(
        [
            f"A: {c.name_a}",
            f"B: {c.name_b}",
            f"n = {c.n} questions",
            f"EM  A {100 * c.em_a:.1f}  B {100 * c.em_b:.1f}  B - A {100 * c.em_diff:+.1f} "
            f"(paired bootstrap 95% CI {100 * c.ci_low:+.1f} .. {100 * c.ci_high:+.1f})",
            f"F1  A {100 * c.f1_a:.1f}  B {100 * c.f1_b:.1f}  B - A {100 * c.f1_diff:+.1f}",
            f"B won {c.won}, lost {c.lost}, tied {c.tied}; McNemar exact p = {c.p_value:.4g}; {verdict}",
        ]
    )
