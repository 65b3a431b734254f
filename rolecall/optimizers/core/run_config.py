"""The settings of the weight-optimizer loop (:class:`~rolecall.optimizers.core.base.WeightOptimizer`): where it
writes, its time budget, its schedule, resume, checkpoints kept and seeds; and :class:`LoopOptions`, the user-facing
subset an offline optimizer's config shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from rolecall.errors import ConfigError
from rolecall.optimizers.core.budget import Schedule
from rolecall.programs.core.options import ProgramOptions, option

__all__ = ["LoopOptions", "WeightOptimizerConfig"]


@dataclass(kw_only=True)
class WeightOptimizerConfig:
    """The loop settings every weight optimizer shares."""

    output_dir: str | None = None
    """Where metrics, checkpoints, ``summary.json`` and the final adapters go (None: nowhere, no resume)."""
    time_budget_s: float | None = None
    """Wall-clock seconds for the training loop, split over the stages by measured step cost (None: no limit)."""
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
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ConfigError(f"time_budget_s must be > 0 seconds or None; got {self.time_budget_s}.")
        if self.resume and self.output_dir is None:
            raise ConfigError("resume=True needs output_dir (where the checkpoints are).")


@dataclass(kw_only=True)
class LoopOptions(ProgramOptions):
    """The user-facing loop settings an offline optimizer's config shares (SFT, STRIDE-FT), checked like program
    options; :meth:`loop_config` turns them into the base's :class:`WeightOptimizerConfig`."""

    num_threads: int = option(8, low=1)
    """Questions (or runs) collected concurrently (their LM calls share batches)."""
    time_budget_minutes: float | None = None
    """Wall-clock minutes of the training loop (collection excluded; None: no limit)."""
    seed: int = 0
    """Shuffling of the samples and the seeds of a fresh start."""
    output_dir: str | None = None
    """Where ``samples.jsonl``, ``metrics.jsonl``, checkpoints and the adapters go (None: nowhere)."""
    resume: bool = False
    """Continue a killed run from the last checkpoint in ``output_dir`` (its collected samples are reused)."""
    show_progress: bool = True
    """tqdm bars for collection and training."""

    def loop_config(self, schedule: Schedule = "interleaved") -> WeightOptimizerConfig:
        """The :class:`WeightOptimizer` settings these options describe."""
        return WeightOptimizerConfig(
            output_dir=self.output_dir,
            time_budget_s=None if self.time_budget_minutes is None else 60 * self.time_budget_minutes,
            schedule=schedule,
            resume=self.resume,
            seed=self.seed,
            show_progress=self.show_progress,
        )
