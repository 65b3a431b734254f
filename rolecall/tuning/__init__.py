"""Hyperparameter search over weight-optimizer configs (reward weights and other fields) against a dev-set score,
with optuna: TPE or a grid (simplex groups of weights sampled on the simplex), pruning from intermediate dev scores,
an SQLite study that resumes after a kill, the best trial's config for ``rolecall compile --config``, and plots."""

from rolecall.tuning.config_file import (
    apply_config_file,
    apply_fields,
    config_sections,
    load_config_file,
    nest,
    optimizer_config,
    with_fields,
    write_config_file,
)
from rolecall.tuning.objective import Metric, Objective, reset_adapters
from rolecall.tuning.plots import PLOTS, save_plots
from rolecall.tuning.results import best_trial, summarize, write_results
from rolecall.tuning.run import TuneResult, tune
from rolecall.tuning.space import (
    CategoricalParam,
    FloatParam,
    IntParam,
    SearchSpace,
    Simplex,
    parse_param,
    parse_simplex,
    simplex_grid,
    stick_breaking,
    unstick,
)
from rolecall.tuning.study import PrunerName, SamplerName, finished_trials, make_pruner, make_sampler, open_study

__all__ = [
    # search space
    "SearchSpace",
    "FloatParam",
    "IntParam",
    "CategoricalParam",
    "Simplex",
    "parse_param",
    "parse_simplex",
    "simplex_grid",
    "stick_breaking",
    "unstick",
    # study
    "open_study",
    "make_sampler",
    "make_pruner",
    "finished_trials",
    "SamplerName",
    "PrunerName",
    # objective and run
    "Objective",
    "Metric",
    "reset_adapters",
    "tune",
    "TuneResult",
    # results
    "best_trial",
    "summarize",
    "write_results",
    "PLOTS",
    "save_plots",
    # config files
    "load_config_file",
    "write_config_file",
    "apply_config_file",
    "config_sections",
    "apply_fields",
    "nest",
    "optimizer_config",
    "with_fields",
]
