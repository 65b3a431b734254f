"""REAP's multi-task SFT (``seeds/reap.txt``): one shared adapter learns the planning roles' merged data.

    D = ⋃_task D_task,  task ∈ {Decomposer, Re-Planner (, Plan Updater where an LM plays it)}
    L = Σ_(x, y) ∈ D  w_task(x) · NLL(y | x) / Σ tokens,   w_task = 1 by default

REAP's Plan Updater is rule-based here (:mod:`rolecall.programs.reap.plan`), so the merged tasks are the Decomposer's
and the Re-Planner's. The targets come from :class:`~rolecall.optimizers.sft.SFT`'s sources: the gold path
(``source="gold"``), or a teacher's (or the program's own) runs kept when they are correct (``source="self"``,
``threshold=1.0``), as the paper filters a strong model's trajectories. The baseline it is compared with is SFT with one
adapter per role on the same data (``REAP(..., adapter_groups={})`` and ``SFT(roles=PLANNING_ROLES)``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import dspy

from rolecall.errors import ConfigError
from rolecall.optimizers.core.stage import Stage
from rolecall.optimizers.sft import SFT, SFTConfig
from rolecall.programs.reap.program import REAP

__all__ = ["MultiTaskSFT", "PLANNING_ROLES"]

PLANNING_ROLES: tuple[str, ...] = ("decomposer", "replanner")
"""The REAP roles the paper's multi-task model plays (its LM-played planning tasks)."""


class MultiTaskSFT(SFT):
    """One ``multitask`` adapter trained on REAP's merged planning tasks, each weighted (see the module docstring).

    Args:
        config: SFT settings; ``multitask`` is forced on and ``roles`` defaults to :data:`PLANNING_ROLES`.
        task_weights: role -> weight of its samples in the loss (default 1 each; 0 keeps a task's samples without
            gradient).
        metric, teacher: as for :class:`~rolecall.optimizers.sft.SFT` (``source="self"``).
        **kw: SFT settings when no ``config`` is given.

    Example:
        >>> program = REAP(retriever, lm=LocalLM())                                                   # doctest: +SKIP
        >>> program.compile(optimizer=MultiTaskSFT(task_weights={"replanner": 2.0}), trainset=train)  # doctest: +SKIP
    """

    def __init__(
        self,
        config: SFTConfig | None = None,
        *,
        task_weights: Mapping[str, float] | None = None,
        metric: Any = None,
        teacher: dspy.LM | None = None,
        **kw: Any,
    ) -> None:
        config = SFTConfig.merged(config, {**kw, "multitask": True})
        config = dataclasses.replace(config, roles=config.roles or PLANNING_ROLES)
        super().__init__(config, metric=metric, teacher=teacher)
        weights = dict(task_weights or {})
        unknown = sorted(set(weights) - set(config.roles or ()))
        if unknown:
            raise ConfigError(f"task_weights names {unknown}, which are not trained tasks {list(config.roles or ())}")
        bad = {r: w for r, w in weights.items() if not (isinstance(w, (int, float)) and math.isfinite(w) and w >= 0)}
        if bad:
            raise ConfigError(f"task_weights must be finite numbers >= 0; got {bad}")
        self.task_weights = {role: float(weights.get(role, 1.0)) for role in config.roles or ()}

    def stages(self, student: Any, trainset: Sequence[Any]) -> list[Stage]:
        """SFT's stages on the merged adapter, each sample weighted by its task.

        Raises:
            ConfigError: the program is not REAP, or one of SFT's checks fails.
        """
        if not isinstance(student, REAP):
            raise ConfigError(f"MultiTaskSFT applies to the reap program; got {type(student).__name__}")
        missing = sorted(set(self.sft_config.roles or ()) - set(student.roles))
        if missing:
            raise ConfigError(f"MultiTaskSFT: this REAP has no role {missing} (an ablation removed it); drop it")
        stages = super().stages(student, trainset)
        for samples in self.samples.values():
            for sample in samples:
                sample.weight = self.task_weights.get(sample.role, 1.0)
        return stages
