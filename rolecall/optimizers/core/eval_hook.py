"""An evaluation hook for the weight-optimizer loop: intermediate scores during training, and an early stop.

:meth:`WeightOptimizer.set_eval_hook <rolecall.optimizers.core.base.WeightOptimizer.set_eval_hook>` registers a
callable ``hook(point) -> bool | None``. The loop calls it after a step (once that step's checkpoint is written) when
:func:`eval_due` says so: every ``every`` global steps, and after the last planned step of each stage. The hook
evaluates ``point.student`` as it likes (usually on ``point.valset``, the ``valset`` given to ``compile``) and
returns True to stop training: the loop then ends as after a spent budget, with ``stop_reason == "eval_hook"``.
Hyperparameter search prunes hopeless trials this way (:mod:`rolecall.tuning`).

The hook runs on freshly seeded global RNGs that the loop restores afterwards, so evaluating does not change what
training does next.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["EvalHook", "EvalPoint", "eval_due"]


@dataclass(frozen=True)
class EvalPoint:
    """Where the training loop stands when it calls the evaluation hook."""

    student: Any
    """The program being trained (its adapters as they are after this step)."""
    valset: Sequence[Any] | None
    """The ``valset`` given to ``compile`` (None when none was)."""
    stage: str
    """The stage that just stepped."""
    step: int
    """Steps of that stage done, this one included."""
    global_step: int
    """Steps of all stages done, this one included: a monotonic x-axis for the scores."""
    stage_done: bool
    """Whether the stage has just finished its planned steps."""


EvalHook = Callable[[EvalPoint], "bool | None"]
"""``hook(point) -> stop``: evaluate ``point.student``; a truthy return stops training."""


def eval_due(global_step: int, every: int | None, stage_done: bool) -> bool:
    """Whether the hook runs after this step: at the end of a stage, and every ``every`` global steps.

    Equivalent to ``stage_done or (every is not None and global_step % every == 0)``.

    Example:
        >>> [eval_due(n, 2, stage_done=n == 5) for n in range(1, 6)]
        [False, True, False, True, True]
    """
    return stage_done or (every is not None and global_step % every == 0)
