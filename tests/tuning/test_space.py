"""The search space: simplex groups sampled on the simplex (TPE and random), the grid enumerating the simplex through
optuna's GridSampler, and the command-line forms of params and simplex groups."""

from __future__ import annotations

import math
import random

import optuna
import pytest

from rolecall.errors import ConfigError
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

PLAN = Simplex("plan_weights", ("logic", "feasibility", "execution", "efficiency", "placeholder"))


@pytest.fixture(autouse=True)
def _quiet_optuna():
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_stick_breaking_by_hand():
    """k = 3, u = (0.75, 0.5): b_0 = 1 - (1 - 0.75) ** (1/2) = 0.5, w_0 = 0.5; b_1 = 1 - 0.5 ** 1 = 0.5, w_1 = 0.25;
    w_2 = the rest, 0.25. The ends of u reach the simplex's vertices."""
    assert stick_breaking([0.75, 0.5]) == pytest.approx([0.5, 0.25, 0.25])
    assert stick_breaking([0.0, 0.0]) == [0.0, 0.0, 1.0] and stick_breaking([1.0, 0.3]) == [1.0, 0.0, 0.0]
    assert stick_breaking([0.5], total=0.2) == pytest.approx([0.1, 0.1])
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        stick_breaking([1.5])


def test_stick_breaking_of_uniform_numbers_is_uniform_on_the_simplex():
    """Dirichlet(1, 1, 1, 1): each weight has mean 1/4 and variance (1/4)(3/4)/5 = 0.0375."""
    rng = random.Random(0)
    draws = [stick_breaking([rng.random() for _ in range(3)]) for _ in range(20000)]
    assert all(math.isclose(sum(w), 1.0, rel_tol=1e-12) and min(w) >= 0 for w in draws)
    for i in range(4):
        column = [w[i] for w in draws]
        mean = sum(column) / len(column)
        variance = sum((x - mean) ** 2 for x in column) / len(column)
        assert mean == pytest.approx(0.25, abs=0.01) and variance == pytest.approx(0.0375, abs=0.003)


@pytest.mark.parametrize("sampler", [optuna.samplers.TPESampler(seed=0, n_startup_trials=5),
                                     optuna.samplers.RandomSampler(seed=0)])  # fmt: skip
def test_a_simplex_group_sampled_by_a_study_always_sums_to_its_total(sampler):
    space = SearchSpace(params=(FloatParam("learning_rate", 1e-4, 1e-2, log=True),),
                        simplexes=(PLAN, Simplex("", ("alpha", "beta"), total=0.2)))  # fmt: skip
    seen = []

    def objective(trial):
        values = space.suggest(trial)
        seen.append(values)
        return values["plan_weights.execution"] - values["alpha"]  # TPE is drawn toward a corner: still on it

    optuna.create_study(sampler=sampler, direction="maximize").optimize(objective, n_trials=25)
    for values in seen:
        plan = [values[k] for k in PLAN.keys]
        assert math.isclose(sum(plan), 1.0, rel_tol=1e-12) and min(plan) >= 0
        assert math.isclose(values["alpha"] + values["beta"], 0.2, rel_tol=1e-12)
        assert 1e-4 <= values["learning_rate"] <= 1e-2
    assert len({values["plan_weights.logic"] for values in seen}) == len(seen)  # really searched


def test_the_simplex_grid_is_every_point_of_the_simplex_on_the_step():
    points = simplex_grid(3, 0.1)
    assert len(points) == math.comb(10 + 2, 2) == 66 and len(set(points)) == 66
    assert all(math.isclose(sum(p), 1.0) and all(w >= 0 for w in p) for p in points)
    assert {(1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (0.3, 0.3, 0.4)} <= set(points)
    assert all(round(w * 10) == pytest.approx(w * 10) for p in points for w in p)
    assert simplex_grid(2, 0.05, total=0.2) == [(0.0, 0.2), (0.05, 0.15), (0.1, 0.1), (0.15, 0.05), (0.2, 0.0)]
    with pytest.raises(ConfigError, match="whole number of steps"):
        simplex_grid(3, 0.3)


def test_grid_mode_visits_each_grid_point_once_through_optunas_grid_sampler():
    space = SearchSpace(params=(IntParam("max_steps", 1, 2), CategoricalParam("lr_schedule", ("constant", "linear"))),
                        simplexes=(Simplex("rewrite_weights", ("retrieval", "format")),), grid_step=0.25)  # fmt: skip
    assert space.grid_size() == 2 * 2 * 5
    study = optuna.create_study(sampler=optuna.samplers.GridSampler(space.grid(), seed=0))
    seen = []
    study.optimize(lambda t: seen.append(space.suggest(t, grid=True)) or 0.0, n_trials=100)  # stops when exhausted
    assert len(seen) == 20
    keys = {(v["max_steps"], v["lr_schedule"], v["rewrite_weights.retrieval"], v["rewrite_weights.format"])
            for v in seen}  # fmt: skip
    assert len(keys) == 20 and all(math.isclose(r + f, 1.0) for *_, r, f in keys)
    assert {(r, f) for *_, r, f in keys} == set(simplex_grid(2, 0.25))


def test_grid_mode_needs_a_step_for_float_params():
    with pytest.raises(ConfigError, match="needs a step for float param learning_rate"):
        SearchSpace(params=(FloatParam("learning_rate", 1e-4, 1e-2, log=True),)).grid()
    assert SearchSpace(params=(FloatParam("beta", 0.0, 0.2, step=0.1),)).grid() == {"beta": [0.0, 0.1, 0.2]}


def test_corners_put_params_at_their_ends_and_weights_at_the_centre():
    space = SearchSpace(params=(FloatParam("lr", 0.1, 0.3), CategoricalParam("loss", ("grpo", "dapo"))),
                        simplexes=(Simplex("w", ("a", "b")),))  # fmt: skip
    low, high = space.corners()
    assert low == {"lr": 0.1, "loss": "grpo", "w.a": 0.5, "w.b": 0.5}
    assert high == {"lr": 0.3, "loss": "dapo", "w.a": 0.5, "w.b": 0.5}


def test_parse_param_and_parse_simplex():
    assert parse_param("learning_rate=float:1e-4:1e-2:log") == FloatParam("learning_rate", 1e-4, 1e-2, log=True)
    assert parse_param("beta=float:0:1:step=0.25") == FloatParam("beta", 0.0, 1.0, step=0.25)
    assert parse_param("max_steps=int:1:9:step=2") == IntParam("max_steps", 1, 9, step=2)
    assert parse_param("expert_gradient=cat:true,false").choices == (True, False)
    assert parse_param("mapgrpo.loss_type=cat:grpo,dapo").name == "mapgrpo.loss_type"
    assert parse_simplex("plan_weights=logic,execution").keys == ("plan_weights.logic", "plan_weights.execution")
    assert parse_simplex("mapgrpo.rewrite_weights=retrieval,format").keys[0] == "mapgrpo.rewrite_weights.retrieval"
    assert parse_simplex("alpha,beta@0.2") == Simplex("", ("alpha", "beta"), total=0.2)


@pytest.mark.parametrize("spec, message", [
    ("learning_rate", "use NAME=float"),
    ("lr=float:1", "LOW, HIGH and step must be floats"),
    ("lr=float:1:0", "needs finite low < high"),
    ("lr=float:0:1:log", "a log scale needs low > 0"),
    ("lr=float:0:1:fast", "unknown flag"),
    ("steps=int:a:b", "must be ints"),
])  # fmt: skip
def test_bad_params_say_what_is_wrong(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_param(spec)


def test_bad_simplex_groups_and_repeated_fields_fail():
    with pytest.raises(ConfigError, match="at least two fields"):
        parse_simplex("plan_weights=logic")
    with pytest.raises(ConfigError, match="more than once"):
        SearchSpace(params=(FloatParam("w.a", 0, 1),), simplexes=(Simplex("w", ("a", "b")),))
    with pytest.raises(ConfigError, match="empty"):
        SearchSpace()


def test_unstick_inverts_stick_breaking():
    rng = random.Random(0)
    for k in (2, 3, 5):
        for _ in range(20):
            u = [rng.random() for _ in range(k - 1)]
            weights = stick_breaking(u, total=2.0)
            assert unstick(weights, total=2.0) == pytest.approx(u, abs=1e-9)
    assert unstick([1.0, 0.0, 0.0]) == [1.0, 0.0]  # the stick is used up: the rest's shares are 0
    with pytest.raises(ConfigError, match=r"sum to 1 \(they sum to 0.9\)"):
        unstick([0.5, 0.4])


def test_trial_params_enqueue_a_point_that_the_study_suggests_back():
    """The defaults trial: ``trial_params`` of some field values, enqueued, is suggested back as those values."""
    space = SearchSpace(params=(FloatParam("alpha", 0.0, 0.5), CategoricalParam("loss_type", ("grpo", "dapo"))),
                        simplexes=(PLAN,))  # fmt: skip
    values = {"alpha": 0.1, "loss_type": "dapo", "plan_weights.logic": 0.3, "plan_weights.feasibility": 0.2,
              "plan_weights.execution": 0.3, "plan_weights.efficiency": 0.1,
              "plan_weights.placeholder": 0.1}  # fmt: skip
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    study.enqueue_trial(space.trial_params(values))
    suggested = space.suggest(study.ask())
    assert suggested.pop("loss_type") == "dapo"
    assert suggested == pytest.approx({k: v for k, v in values.items() if k != "loss_type"})
    grid = SearchSpace(simplexes=(Simplex("", ("a", "b")),), grid_step=0.25)
    assert grid.trial_params({"a": 0.25, "b": 0.75}, grid=True) == {"a+b": "0.25,0.75"}
    with pytest.raises(ConfigError, match="not a point of its grid"):
        grid.trial_params({"a": 0.1, "b": 0.9}, grid=True)
    with pytest.raises(ConfigError, match=r"alpha = 0.9 is outside the searched range \[0, 0.5\]"):
        space.trial_params({**values, "alpha": 0.9})
    with pytest.raises(ConfigError, match="not one of the searched choices"):
        space.trial_params({**values, "loss_type": "sft"})
    with pytest.raises(ConfigError, match=r"no value for the searched fields \['alpha'\]"):
        space.trial_params({k: v for k, v in values.items() if k != "alpha"})
