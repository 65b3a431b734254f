"""Running a study to a number of finished trials, resuming where a killed run stopped, and writing its results.

``n_trials`` counts the study's finished (COMPLETE or PRUNED) trials, those of earlier runs included: a study killed
after 7 of 20 trials runs 13 more when started again on the same SQLite file, the killed trial's parameters first.

Example:
    >>> study = open_study(out / "study.db", sampler=make_sampler(space), pruner=make_pruner())  # doctest: +SKIP
    >>> result = tune(Objective(...), study, n_trials=20, output_dir=out)                      # doctest: +SKIP
    >>> result.best_config                                                                       # doctest: +SKIP
    {'sft': {'learning_rate': 0.0017, 'epochs': 1.5}}
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

from rolecall.errors import ConfigError
from rolecall.tuning.results import best_trial, write_results
from rolecall.tuning.study import finished_trials

__all__ = ["TuneResult", "tune"]

logger = logging.getLogger(__name__)


@dataclass
class TuneResult:
    """What :func:`tune` returns."""

    study: optuna.Study
    ran: int
    """Trials this call ran to their end (finished or failed)."""
    finished: int
    """Finished trials of the study, earlier runs included."""
    best_value: float | None
    best_config: dict[str, Any] | None
    """``{optimizer: fields}`` of the best trial (None while none completed)."""
    written: dict[str, Path] = field(default_factory=dict)
    """``trials``, ``best_config`` and ``plots`` paths, when ``output_dir`` was given."""


def tune(
    objective: Callable[[optuna.Trial], float],
    study: optuna.Study,
    *,
    n_trials: int,
    timeout_s: float | None = None,
    output_dir: str | Path | None = None,
    plots: bool = True,
    defaults: Mapping[str, Any] | None = None,
) -> TuneResult:
    """Runs trials until the study has ``n_trials`` finished ones (or ``timeout_s`` passes, or a grid is done).

    Args:
        objective: ``objective(trial) -> score`` (usually an :class:`~rolecall.tuning.objective.Objective`).
        study: The study, from :func:`~rolecall.tuning.study.open_study`.
        n_trials: Finished trials the study should have, earlier runs' included.
        timeout_s: Stop starting trials after this many seconds (None: no limit).
        output_dir: Where ``trials.json``, ``best_config.json`` and ``plots/`` go (None: nothing written).
        plots: Draw the plots (:mod:`rolecall.tuning.plots`).
        defaults: The Optuna parameters of the optimizer's defaults (:meth:`SearchSpace.trial_params` of
            :meth:`Objective.default_values`): a new study runs them as its first trial, marked ``defaults``, so the
            best trial is compared with the paper's values on the same dev questions. Ignored when the study already
            has trials.

    Raises:
        ConfigError: If ``n_trials`` < 1 or ``timeout_s`` <= 0.
    """
    if n_trials < 1:
        raise ConfigError(f"n_trials must be >= 1; got {n_trials}")
    if timeout_s is not None and not timeout_s > 0:
        raise ConfigError(f"timeout_s must be > 0 seconds or None; got {timeout_s}")
    if defaults is not None and not study.get_trials(deepcopy=False):
        study.enqueue_trial(dict(defaults), user_attrs={"defaults": True})
    before = _ended(study)
    remaining = n_trials - len(finished_trials(study))
    if remaining > 0:
        logger.info("study %r: running %d trials", study.study_name, remaining)
        # gc after each trial frees its optimizers and trainers (AdamW states) before the next one
        study.optimize(objective, n_trials=remaining, timeout=timeout_s, gc_after_trial=True)
    else:
        logger.info("study %r already has %d finished trials", study.study_name, n_trials - remaining)
    best = best_trial(study)
    result = TuneResult(
        study=study,
        ran=_ended(study) - before,
        finished=len(finished_trials(study)),
        best_value=None if best is None else best.value,
        best_config=None if best is None else best.user_attrs.get("config"),
    )
    if output_dir is not None:
        result.written = write_results(study, output_dir, plots=plots)
    return result


def _ended(study: optuna.Study) -> int:
    """Trials that ran to their end (COMPLETE, PRUNED or FAIL); queued (WAITING) and RUNNING ones do not count."""
    return sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))
