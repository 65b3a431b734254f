"""Reclaiming dead trials when a study file is opened again."""

from __future__ import annotations

import time

import optuna
import pytest

from rolecall.tuning.study import open_study


def _running(study: optuna.Study) -> optuna.trial.Trial:
    """A trial left RUNNING as a process killed right after it started leaves it: no heartbeat was ever recorded."""
    trial = study.ask()
    trial.suggest_float("x", 0.0, 1.0)
    return trial


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
@pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")  # ask() stands in for a killed optimize()
def test_a_trial_killed_before_its_first_heartbeat_is_failed_and_queued_again(tmp_path):
    path = tmp_path / "study.db"
    study = open_study(path, heartbeat_interval=1, grace_period=1)
    study.tell(study.ask(), 0.5)
    dead = _running(study)
    assert study.get_trials()[dead.number].state == optuna.trial.TrialState.RUNNING

    time.sleep(1.5)
    reopened = open_study(path, heartbeat_interval=1, grace_period=1)

    trials = reopened.get_trials()
    assert trials[0].state == optuna.trial.TrialState.COMPLETE and trials[0].value == 0.5
    assert trials[dead.number].state == optuna.trial.TrialState.FAIL
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == dead.number]
    assert len(retry) == 1 and retry[0].state == optuna.trial.TrialState.WAITING
    assert retry[0].params == trials[dead.number].params


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
@pytest.mark.filterwarnings("ignore:Heartbeat of storage:UserWarning")  # ask() stands in for a killed optimize()
def test_a_young_trial_without_a_heartbeat_is_left_running(tmp_path):
    """Within the grace period the trial may be alive, its heartbeat thread not yet started: it is not touched."""
    path = tmp_path / "study.db"
    study = open_study(path, heartbeat_interval=5, grace_period=60)
    trial = _running(study)

    reopened = open_study(path, heartbeat_interval=5, grace_period=60)

    assert reopened.get_trials()[trial.number].state == optuna.trial.TrialState.RUNNING
    assert len(reopened.get_trials()) == 1
