"""The run settings every weight optimizer's config shares (:class:`RunConfig`), and the loop settings the
:class:`~rolecall.optimizers.core.base.WeightOptimizer` runs with (:class:`WeightOptimizerConfig`).

Every optimizer's config is a ``@dataclass(kw_only=True)`` subclass of :class:`RunConfig`: its fields are typed, each
documented by its docstring (the text ``rolecall compile --optimizer X --help`` shows), ranges are declared next to
the field with :func:`~rolecall.programs.core.options.option`, and a bad value raises one
:class:`~rolecall.errors.ConfigError` line naming the field, the value and what is allowed. Time budgets are in
minutes everywhere (every field named ``*_minutes`` must be > 0 or None), and no number may be nan or infinite.

Example:
    >>> RunConfig(time_budget_minutes=0)
    Traceback (most recent call last):
    ...
    rolecall.errors.ConfigError: option time_budget_minutes must be > 0 minutes or None, got 0
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar, get_args

from rolecall.errors import ConfigError
from rolecall.optimizers.core.budget import Schedule
from rolecall.programs.core.options import ProgramOptions, option

__all__ = ["RunConfig", "WeightOptimizerConfig"]

RunConfigT = TypeVar("RunConfigT", bound="RunConfig")


@dataclass(kw_only=True)
class RunConfig(ProgramOptions):
    """Where a training run writes, how it starts, how many questions it runs at once and how long it may train."""

    output_dir: str | Path | None = None
    """Where ``metrics.jsonl``, checkpoints, ``summary.json`` and the final adapters go (None: nowhere, no resume).
    ``rolecall compile`` sets it from ``--out``."""
    seed: int = 0
    """Seeds Python, NumPy and torch at a fresh start, the input order and the samplers."""
    resume: bool = False
    """Continue a killed run from the last checkpoint in ``output_dir`` (False starts afresh and deletes old
    checkpoints). ``rolecall compile`` sets it from ``--resume``."""
    num_threads: int = option(8, low=1)
    """Questions (or runs) collected concurrently; their LM calls share batches."""
    time_budget_minutes: float | None = None
    """Wall-clock minutes of the training loop (collection excluded), split over the stages by measured step cost; a
    ceiling, reported in ``summary.json`` when hit (None: the planned steps alone decide)."""
    show_progress: bool = True
    """tqdm bars for collection and training (``rolecall compile --no-progress`` turns them off)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.output_dir, Path):
            self.output_dir = str(self.output_dir)
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value) and not f.name.endswith("_minutes"):
                raise ConfigError(f"option {f.name} must be a finite number, got {value!r}")
            if f.name.endswith("_minutes") and value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"option {f.name} must be > 0 minutes or None, got {value!r}")
        if self.resume and self.output_dir is None:
            raise ConfigError("option resume=True needs output_dir (where the checkpoints of the killed run are)")

    @classmethod
    def merged(cls: type[RunConfigT], config: RunConfig | None, overrides: Mapping[str, Any]) -> RunConfigT:
        """A config of this class: ``config``'s fields (None: the defaults) with ``overrides`` over them; an unknown
        name raises one :class:`~rolecall.errors.ConfigError` line naming the optimizer (``SFT has no option 'lr'``) and
        listing the fields (what an optimizer's
        ``__init__(config=None, **overrides)`` builds)."""
        base = {f.name: getattr(config, f.name) for f in fields(config)} if config is not None else {}
        return cls.from_kwargs(cls.__name__.removesuffix("Config"), {**base, **overrides})

    def loop_config(self, schedule: Schedule = "interleaved") -> WeightOptimizerConfig:
        """The :class:`~rolecall.optimizers.core.base.WeightOptimizer` loop settings these run settings describe."""
        return WeightOptimizerConfig(
            output_dir=self.output_dir,
            time_budget_minutes=self.time_budget_minutes,
            schedule=schedule,
            resume=self.resume,
            seed=self.seed,
            show_progress=self.show_progress,
        )


@dataclass(kw_only=True)
class WeightOptimizerConfig:
    """The loop settings of :class:`~rolecall.optimizers.core.base.WeightOptimizer`: an optimizer builds them from
    its :class:`RunConfig` with :meth:`RunConfig.loop_config`."""

    output_dir: str | None = None
    """Where metrics, checkpoints, ``summary.json`` and the final adapters go (None: nowhere, no resume)."""
    time_budget_minutes: float | None = None
    """Wall-clock minutes of the training loop, split over the stages by measured step cost (None: no limit)."""
    schedule: Schedule = "sequential"
    """``sequential``: stage after stage (MAPGRPO); ``interleaved``: the stages' steps in turn (SFT)."""
    resume: bool = False
    """Continue from the last checkpoint in ``output_dir`` (False starts afresh and deletes old checkpoints)."""
    keep_checkpoints: int = 1
    """How many of the newest checkpoints to keep."""
    seed: int = 0
    """Seeds Python, NumPy and torch at a fresh start, ``ctx.rng`` and the sample streams."""
    show_progress: bool = True
    """A tqdm bar over all stages' steps."""

    def __post_init__(self) -> None:
        if self.schedule not in get_args(Schedule):
            raise ConfigError(f"schedule={self.schedule!r}; valid options are {list(get_args(Schedule))}.")
        if self.keep_checkpoints < 1:
            raise ConfigError(f"keep_checkpoints must be >= 1; got {self.keep_checkpoints}.")
        if self.time_budget_minutes is not None and not self.time_budget_minutes > 0:
            raise ConfigError(f"time_budget_minutes must be > 0 minutes or None; got {self.time_budget_minutes}.")
        if self.resume and self.output_dir is None:
            raise ConfigError("resume=True needs output_dir (where the checkpoints are).")

    @property
    def time_budget_s(self) -> float | None:
        """The budget in the loop clock's seconds (None: no limit)."""
        return None if self.time_budget_minutes is None else 60.0 * self.time_budget_minutes
