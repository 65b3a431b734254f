"""Running a question's independent sub-tasks concurrently, so their LM calls reach a ``LocalLM`` together and share
its batches, without losing ``dspy.context`` overrides or the order of the trajectory.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from rolecall.programs.core.trajectory import Trajectory

__all__ = ["parallel_map", "run_branches"]

T = TypeVar("T")
R = TypeVar("R")


def parallel_map(fn: Callable[[T], R], items: Sequence[T], *, max_workers: int | None = None) -> list[R]:
    """``[fn(x) for x in items]`` run on threads, each in a copy of the caller's context (DSPy settings included).

    Independent sub-tasks of one question (STRIDE's ready sub-questions, a Leader's wave of Searchers) run this way so
    their LM calls reach a ``LocalLM`` at the same time and are batched into one forward pass. A plain thread pool
    would lose ``dspy.context(...)`` overrides (the LM, callbacks, usage tracking), which live in context variables.
    Exceptions propagate from ``fn``, as in the list comprehension; results keep the order of ``items``.

    Example:
        >>> parallel_map(lambda x: x * x, [1, 2, 3])
        [1, 4, 9]
    """
    if len(items) <= 1 or max_workers == 1:
        return [fn(x) for x in items]
    contexts = [contextvars.copy_context() for _ in items]
    with ThreadPoolExecutor(max_workers=max_workers or len(items)) as pool:
        futures = [pool.submit(ctx.run, fn, x) for ctx, x in zip(contexts, items, strict=True)]
        return [f.result() for f in futures]


def run_branches(
    fn: Callable[[T, Trajectory], R],
    items: Sequence[T],
    trajectory: Trajectory,
    *,
    parallel: bool = True,
    max_workers: int | None = None,
) -> list[R]:
    """Run ``fn(item, branch_trajectory)`` for each item, concurrently unless ``parallel=False``, and append each
    branch's steps to ``trajectory`` in item order (never in completion order, so a run's trajectory is stable).

    Each branch records into its own :class:`Trajectory`, so concurrent branches never interleave their steps
    (REAP's forked sub-tasks, STRIDE's ready sub-questions, a Leader's wave of Searchers).

    Returns:
        ``fn``'s results in item order.

    Example:
        >>> t = Trajectory()
        >>> run_branches(lambda x, local: local.event(f"b{x}") and x * 10, [1, 2], t), [s.role for s in t.steps]
        ([10, 20], ['b1', 'b2'])
    """
    branches = [Trajectory(question=trajectory.question) for _ in items]
    pairs = list(zip(items, branches, strict=True))
    results = parallel_map(lambda pair: fn(*pair), pairs, max_workers=max_workers if parallel else 1)
    for branch in branches:
        for step in branch.steps:
            trajectory.add(step)
    return results
