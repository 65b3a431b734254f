"""What the teams share: the Answerer's sampling arguments and the environment-step budget."""

from __future__ import annotations

from rolecall.programs.team.base import StepBudget, team_lm_kwargs


def test_team_lm_kwargs_sets_the_answerers_samples_without_touching_the_input():
    given = {"*": {"stop": ["x"]}, "answerer": {"max_tokens": 32}}
    out = team_lm_kwargs(given, 5)
    assert out == {"*": {"stop": ["x"]}, "answerer": {"max_tokens": 32, "n": 5, "temperature": 1.0}}
    assert given == {"*": {"stop": ["x"]}, "answerer": {"max_tokens": 32}}
    assert team_lm_kwargs({"answerer": {"n": 5, "temperature": 0.3}}, 1) == {"answerer": {"temperature": 0.3}}
    assert team_lm_kwargs({}, 2) == {"answerer": {"n": 2, "temperature": 1.0}}


def test_step_budget_counts_steps_from_one():
    budget = StepBudget(2)
    assert (budget.tick(), budget.tick(), budget.left, budget.used) == (1, 2, 0, 2)
