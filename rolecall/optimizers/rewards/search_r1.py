"""The Search-R1 baseline's reward: outcome exact match with a per-turn format penalty (Jin et al., arXiv 2503.09516;
PAPERS.md baselines: a Search-R1-style single agent "trained with plain GRPO").

    R = EM(a, a*) - λ_f · 1[some turn's action was not exactly one well-formed tag]
    R = EM(a, a*) - λ_f · (invalid turns / turns)                  (graded: ``graded_format=True``)

a is the final ``<answer>``. Search-R1 trains on the outcome only (the MultiAgent-OPD paper: "Search-R1 trains a single
agent with outcome rewards"; Search-R1 itself adds no format reward), so ``format_penalty=0`` is that reward. Its
follow-up study (Jin et al., arXiv 2505.15117, which D2Plan cites) finds a format term helps a model that does not yet
follow the format, as a 135M model does not; the seeds give neither its form nor its weight, so here it is a penalty
of λ_f = 0.2 subtracted when any turn was malformed, which keeps R = EM for a well-formed run (searching or not: no
search is no penalty) and ranks a right answer in a sloppy run (0.8) above a wrong one in a clean run (0). The
graded form charges each malformed turn its share: the base model malforms nearly every turn, so the all-or-nothing
penalty gives every rollout of a group the same -λ_f and GRPO no advantage, where the graded one still ranks a run
with one well-formed turn above a run with none (same end points: 0 for a clean run, -λ_f for an all-malformed one).

:func:`search_r1_reward` is the formula over numbers; :func:`search_r1_rewards` reads a
:class:`~rolecall.programs.baselines.search_r1.SearchR1Agent` trajectory, whose every ``agent`` call records
``meta["valid_action"]`` (exactly one complete, non-empty ``<search>`` or ``<answer>`` tag; a sloppy tag the program
still executed is not valid), ``meta["action"]`` and the ``meta["answer"]`` of an answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from rolecall.errors import ConfigError
from rolecall.evaluation.metrics import exact_match
from rolecall.programs.core.trajectory import Trajectory

__all__ = ["DEFAULT_FORMAT_PENALTY", "search_r1_reward", "final_answer", "search_r1_rewards"]

DEFAULT_FORMAT_PENALTY = 0.2
"""λ_f: what a run with a malformed turn loses (0 gives Search-R1's outcome-only reward)."""


def search_r1_reward(
    em: float,
    format_valid: bool,
    *,
    format_penalty: float = DEFAULT_FORMAT_PENALTY,
    invalid_fraction: float | None = None,
) -> float:
    """R = EM - λ_f · 1[not format_valid], or graded, R = EM - λ_f · invalid_fraction.

    Args:
        em: exact match of the final answer, in {0, 1}.
        format_valid: every turn's action was exactly one well-formed tag.
        format_penalty: λ_f, >= 0.
        invalid_fraction: the share of malformed turns, in [0, 1]; given, it replaces the all-or-nothing indicator.

    Raises:
        ConfigError: If ``format_penalty`` is negative or ``invalid_fraction`` is outside [0, 1].

    Example:
        >>> search_r1_reward(1.0, True), search_r1_reward(1.0, False), search_r1_reward(0.0, False)
        (1.0, 0.8, -0.2)
        >>> search_r1_reward(0.0, False, invalid_fraction=0.25)
        -0.05
    """
    if format_penalty < 0:
        raise ConfigError(f"format_penalty must be >= 0 (0: outcome reward only), got {format_penalty}")
    if invalid_fraction is None:
        return em - format_penalty * float(not format_valid)
    if not 0.0 <= invalid_fraction <= 1.0:
        raise ConfigError(f"invalid_fraction must be in [0, 1] (malformed turns / turns), got {invalid_fraction}")
    return em - format_penalty * invalid_fraction


def final_answer(trajectory: Trajectory) -> str:
    """The answer of the last ``agent`` turn that answered (``""`` when none did: the forced turn gave no answer)."""
    answers = [s.meta.get("answer") or "" for s in trajectory.role_steps("agent") if s.meta.get("action") == "answer"]
    return answers[-1] if answers else ""


def search_r1_rewards(
    trajectory: Trajectory,
    gold_answers: str | Sequence[str],
    *,
    format_penalty: float = DEFAULT_FORMAT_PENALTY,
    graded_format: bool = False,
) -> dict[str, float]:
    """The reward of one Search-R1 run, with its terms, as a flat dict.

    The run is format-valid when it has agent turns and every one has ``meta["valid_action"]`` (the program's
    ``Prediction.format_valid``). The forced answer turn after the search budget counts like any other. With
    ``graded_format`` the penalty is λ_f times the share of malformed turns (a run with no turns counts as all
    malformed).

    Returns:
        ``reward/total``, ``reward/answer`` (EM of the final answer), ``reward/format`` (1 when format-valid),
        ``search_r1/turns``, ``search_r1/invalid_turns`` and ``search_r1/searches`` (the agent's search actions).
    """
    turns = trajectory.role_steps("agent")
    invalid = sum(1 for s in turns if not s.meta.get("valid_action"))
    format_valid = bool(turns) and invalid == 0
    em = exact_match(final_answer(trajectory), gold_answers)
    fraction = (invalid / len(turns) if turns else 1.0) if graded_format else None
    return {
        "reward/total": search_r1_reward(em, format_valid, format_penalty=format_penalty, invalid_fraction=fraction),
        "reward/answer": em,
        "reward/format": float(format_valid),
        "search_r1/turns": float(len(turns)),
        "search_r1/invalid_turns": float(invalid),
        "search_r1/searches": float(sum(1 for s in turns if s.meta.get("action") == "search")),
    }
