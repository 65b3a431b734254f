"""Opening (or resuming) a tuning study in an SQLite file, and its sampler and pruner.

Every trial's state, parameters, intermediate scores and config live in the SQLite file, written as they happen, so a
study killed with SIGKILL loses no finished trial: opening the same file again (``load_if_exists``) continues it. The
trial that was running when the process died is found through optuna's heartbeat: each running trial records one
every ``heartbeat_interval`` seconds, and a RUNNING trial whose heartbeat is older than ``grace_period`` is marked
FAIL and queued again with the same parameters (``RetryHeartbeatStaleTrialCallback``), so the next run retries it
first. A trial killed in the moment between its start and its first heartbeat has no heartbeat at all, which optuna
reads as "never started" and would leave RUNNING for ever; here it counts as dead once it started longer than
``grace_period`` ago. The check runs when the study is opened and before every trial, so several processes may share
one file.

Example:
    >>> study = open_study("runs/tune/study.db", sampler=make_sampler(space, "tpe"))   # doctest: +SKIP
    >>> study.optimize(objective, n_trials=20)                                           # doctest: +SKIP
"""

from __future__ import annotations

import datetime
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, get_args

import optuna

from rolecall.errors import ConfigError
from rolecall.tuning.space import SearchSpace

__all__ = ["PrunerName", "SamplerName", "finished_trials", "make_pruner", "make_sampler", "open_study"]

logger = logging.getLogger(__name__)

SamplerName = Literal["tpe", "grid", "random"]
"""``tpe``: optuna's Tree-structured Parzen Estimator (the default); ``grid``: every point of the grid (the paper's
validation grid search; simplex groups on a ``grid_step`` grid); ``random``: independent uniform draws."""

PrunerName = Literal["median", "threshold", "none"]
"""``median``: stop a trial whose intermediate score is below the median of earlier trials at the same step;
``threshold``: stop a trial whose intermediate score is below ``lower``; ``none``: never prune."""

FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


@contextmanager
def _experimental_ok() -> Iterator[None]:
    """Heartbeats and trial retries are marked experimental in optuna; they are what resuming relies on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


class _Storage(optuna.storages.RDBStorage):
    """optuna's SQLite storage, whose dead trials also include RUNNING trials that never recorded a heartbeat."""

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        stale = super()._get_stale_trial_ids(study_id)
        grace = datetime.timedelta(seconds=self.grace_period or 2 * (self.heartbeat_interval or 0))
        now = datetime.datetime.now()  # optuna stamps datetime_start with the local naive time
        running = self.get_all_trials(study_id, deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        for trial in running:
            if trial._trial_id in stale or trial.datetime_start is None or now - trial.datetime_start <= grace:
                continue
            if not self._has_heartbeat(trial._trial_id):
                logger.info("trial %d started %s and never recorded a heartbeat: taken for dead", trial.number,
                            trial.datetime_start.isoformat(timespec="seconds"))  # fmt: skip
                stale.append(trial._trial_id)
        return stale

    def _has_heartbeat(self, trial_id: int) -> bool:
        """Whether ``trial_id`` has a row in optuna's heartbeat table (read with the storage's own engine)."""
        import sqlalchemy

        with self.engine.connect() as db:
            query = sqlalchemy.text("SELECT COUNT(*) FROM trial_heartbeats WHERE trial_id = :trial_id")
            return bool(db.execute(query, {"trial_id": trial_id}).scalar())


def open_study(
    path: str | Path,
    *,
    study_name: str = "rolecall-tune",
    direction: Literal["maximize", "minimize"] = "maximize",
    sampler: optuna.samplers.BaseSampler | None = None,
    pruner: optuna.pruners.BasePruner | None = None,
    heartbeat_interval: int = 10,
    grace_period: int | None = None,
    max_retry: int | None = 1,
) -> optuna.Study:
    """Creates the study in the SQLite file ``path``, or loads it when it exists, and reclaims dead trials.

    Args:
        path: The SQLite file (created with its folder if missing).
        study_name: The study's name inside the file (one file may hold several studies).
        direction: Whether the score is maximized (dev EM) or minimized.
        sampler: How trials choose their parameters (:func:`make_sampler`; default TPE).
        pruner: When intermediate scores stop a trial (:func:`make_pruner`; default optuna's median pruner).
        heartbeat_interval: Seconds between a running trial's heartbeats.
        grace_period: Seconds without a heartbeat after which a RUNNING trial is taken for dead (default: twice the
            interval). Shorter than a live trial's heartbeat delay would fail a live trial. SQLite stamps heartbeats
            in whole seconds, so a dead trial is found between ``grace_period`` and ``grace_period + 1`` seconds
            after its last beat.
        max_retry: How many times a dead trial's parameters are queued again (None: without limit; 0: never).

    Raises:
        ConfigError: If an interval is not a positive integer, or the file holds the study with another direction.
    """
    for name, value in (("heartbeat_interval", heartbeat_interval), ("grace_period", grace_period)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name} must be a whole number of seconds >= 1; got {value!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _experimental_ok():
        storage = _Storage(
            f"sqlite:///{path.resolve()}",
            heartbeat_interval=heartbeat_interval,
            grace_period=grace_period,
            **_retry_callback(max_retry),
        )
        try:
            study = optuna.create_study(storage=storage, study_name=study_name, direction=direction, sampler=sampler,
                                        pruner=pruner, load_if_exists=True)  # fmt: skip
        except ValueError as err:  # e.g. a loaded study's direction differs
            raise ConfigError(f"study {study_name!r} in {path}: {err}") from err
        if study.direction != optuna.study.StudyDirection[direction.upper()]:
            raise ConfigError(f"study {study_name!r} in {path} was created to {study.direction.name.lower()}, not "
                              f"{direction}; use another --study-name or file")  # fmt: skip
        optuna.storages.fail_stale_trials(study)
    done = finished_trials(study)
    if done:
        logger.info("study %r in %s: resumed with %d finished trials", study_name, path, len(done))
    return study


def _retry_callback(max_retry: int | None) -> dict[str, Any]:
    """``RDBStorage``'s keyword that re-queues dead trials: optuna >= 4.9 calls it ``heartbeat_stale_trial_callback``
    (``RetryHeartbeatStaleTrialCallback``), earlier versions ``failed_trial_callback`` (``RetryFailedTrialCallback``).
    """
    if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback"):
        retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)
        return {"heartbeat_stale_trial_callback": retry}
    return {"failed_trial_callback": optuna.storages.RetryFailedTrialCallback(max_retry=max_retry)}


def finished_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The study's COMPLETE and PRUNED trials (what a resumed study keeps and counts toward its trials)."""
    return study.get_trials(deepcopy=False, states=FINISHED)


def make_sampler(space: SearchSpace, kind: SamplerName = "tpe", *, seed: int | None = 0) -> optuna.samplers.BaseSampler:
    """The sampler of a study over ``space``: TPE (default), the full grid of ``space`` or random search.

    Raises:
        ConfigError: If ``kind`` is unknown, or the grid cannot be built (a float param without a step).
    """
    if kind == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if kind == "grid":
        return optuna.samplers.GridSampler(space.grid(), seed=seed)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ConfigError(f"sampler {kind!r} is unknown; valid samplers are {list(get_args(SamplerName))}")


def make_pruner(
    kind: PrunerName = "median",
    *,
    lower: float | None = None,
    warmup_steps: int = 0,
    startup_trials: int = 2,
) -> optuna.pruners.BasePruner:
    """The pruner that stops hopeless trials from their intermediate dev scores.

    Args:
        kind: ``median``, ``threshold`` or ``none`` (:data:`PrunerName`).
        lower: ``threshold``: prune a trial whose score is below this.
        warmup_steps: No pruning before a trial reports at this (global optimizer) step.
        startup_trials: ``median``: no pruning until this many trials have finished.

    Raises:
        ConfigError: If ``kind`` is unknown, ``threshold`` has no ``lower``, or a count is negative.
    """
    if warmup_steps < 0 or startup_trials < 0:
        raise ConfigError(f"warmup_steps and startup_trials must be >= 0; got {warmup_steps}, {startup_trials}")
    if kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials, n_warmup_steps=warmup_steps)
    if kind == "threshold":
        if lower is None:
            raise ConfigError("the threshold pruner needs the score below which a trial stops (--prune-below X)")
        return optuna.pruners.ThresholdPruner(lower=lower, n_warmup_steps=warmup_steps)
    if kind == "none":
        return optuna.pruners.NopPruner()
    raise ConfigError(f"pruner {kind!r} is unknown; valid pruners are {list(get_args(PrunerName))}")
