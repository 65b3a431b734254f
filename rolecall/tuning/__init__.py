"""Hyperparameter search over weight-optimizer configs (reward weights and other fields) against a dev-set score,
with optuna: TPE or a grid (simplex groups of weights sampled on the simplex), pruning from intermediate dev scores,
an SQLite study that resumes after a kill, the best trial's config for ``rolecall compile --config``, and plots."""

from rolecall.tuning import config_file, objective, plots, results, run, space, study
from rolecall.tuning.config_file import *  # noqa: F403
from rolecall.tuning.objective import *  # noqa: F403
from rolecall.tuning.plots import *  # noqa: F403
from rolecall.tuning.results import *  # noqa: F403
from rolecall.tuning.run import *  # noqa: F403
from rolecall.tuning.space import *  # noqa: F403
from rolecall.tuning.study import *  # noqa: F403

__all__ = [
    *config_file.__all__,
    *objective.__all__,
    *plots.__all__,
    *results.__all__,
    *run.__all__,
    *space.__all__,
    *study.__all__,
]
