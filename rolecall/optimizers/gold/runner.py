"""Running a program along the gold path of each example, and reading the gold steps back (SFT, ``source="gold"``).

Each example runs once inside ``gold_path(override_for(example))``: every role call the override answers is recorded
as a step with ``meta["gold"] = True`` whose ``(messages, completion)`` pair is a training sample exactly as the role
sees it at inference (:mod:`rolecall.programs.core.gold`).

Example:
    >>> runs = gold_trajectories(OPERA(retriever, lm=SchemaLM()), world.train)   # doctest: +SKIP
    >>> samples = [s for _, pred in runs for s in gold_steps(pred.trajectory, roles=["analysis"])]  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

import dspy

from rolecall.data.types import Example
from rolecall.optimizers.gold.opera import opera_gold
from rolecall.programs.core.gold import Override, gold_path
from rolecall.programs.core.parallel import parallel_map
from rolecall.programs.core.program import Program
from rolecall.programs.core.trajectory import Step, Trajectory

__all__ = ["gold_trajectories", "gold_steps"]

logger = logging.getLogger(__name__)


def _run_one(program: Program, example: Example, override_for: Callable[[Example], Override]) -> dspy.Prediction:
    """``program(question=...)`` along ``example``'s gold path; an exception becomes an ``error`` event step."""
    try:
        with gold_path(override_for(example)):
            prediction = program(question=example.question)
    except Exception as e:  # one broken example must not stop the collection
        logger.warning("gold path of example %s failed: %s: %s", example.id, type(e).__name__, e, exc_info=True)
        return Program.failed(Trajectory(question=example.question), e)
    errors = [s.error for s in prediction.trajectory.steps if s.kind == "event" and s.role == "error"]
    if errors:  # the program's own guard caught it (a bad override included)
        logger.warning("gold path of example %s failed: %s", example.id, errors[0])
    return prediction


def gold_trajectories(
    program: Program,
    examples: Sequence[Example],
    override_for: Callable[[Example], Override] = opera_gold,
    *,
    num_threads: int = 1,
    show_progress: bool = False,
) -> list[tuple[Example, dspy.Prediction]]:
    """Run ``program`` on each example with the example's gold override installed; never raises.

    Args:
        program: the program whose roles are answered by the override (its LM answers any call the override leaves).
        examples: examples with gold decompositions.
        override_for: ``example -> override`` (default :func:`opera_gold`; bind a corpus with ``functools.partial``).
        num_threads: examples run at once (threads keep the override, which is a context variable, per example).
        show_progress: a tqdm bar over the examples.

    Returns:
        ``(example, prediction)`` in the order of ``examples``; a failed example's prediction has an empty answer and
        an ``error`` event step in its trajectory.
    """
    if num_threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads!r}")
    bar = None
    if show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(examples), desc="gold path", unit="q")

    def run(example: Example) -> tuple[Example, dspy.Prediction]:
        prediction = _run_one(program, example, override_for)
        if bar is not None:
            bar.update(1)
        return example, prediction

    try:
        return parallel_map(run, list(examples), max_workers=num_threads)
    finally:
        if bar is not None:
            bar.close()


def gold_steps(trajectory: Trajectory, roles: Iterable[str] | None = None) -> list[Step]:
    """The role steps of ``trajectory`` recorded from gold outputs (``meta["gold"]``), of ``roles`` when given.

    Example:
        >>> t = Trajectory()
        >>> _ = t.add(Step(kind="role", role="plan", meta={"gold": True}))
        >>> _ = t.add(Step(kind="role", role="analysis"))
        >>> [s.role for s in gold_steps(t)], gold_steps(t, roles=["analysis"])
        (['plan'], [])
    """
    wanted = None if roles is None else set(roles)
    return [
        s for s in trajectory.steps if s.kind == "role" and s.meta.get("gold") and (wanted is None or s.role in wanted)
    ]
