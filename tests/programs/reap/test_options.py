"""REAP's options: defaults (the paper's budgets), declared ranges, cross-field checks and unknown names."""

from __future__ import annotations

import dataclasses

import pytest

from rolecall.errors import ConfigError
from rolecall.programs.core.options import parse_option
from rolecall.programs.reap.options import REAPOptions
from rolecall.programs.reap.program import REAP


def test_defaults_follow_the_paper():
    options = REAPOptions()
    assert (options.top_k, options.max_iterations, options.max_tasks_per_iteration) == (5, 5, 1)
    assert (options.max_passage_chars, options.max_context_chars) == (300, 1000)
    assert {f.name for f in dataclasses.fields(REAPOptions)} == {
        "top_k",
        "max_iterations",
        "max_tasks_per_iteration",
        "max_sub_tasks",
        "max_branches",
        "max_repairs",
        "max_known_facts",
        "max_passage_chars",
        "max_context_chars",
        "use_replanner",
        "parallel",
    }
    assert (
        REAP(demos=None).options == options and REAP(demos=None, max_tasks_per_iteration=3).max_tasks_per_iteration == 3
    )


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"top_k": 0}, "top_k must be an int >= 1, got 0"),
        ({"max_iterations": 0}, "max_iterations must be an int >= 1"),
        ({"max_tasks_per_iteration": 0}, "max_tasks_per_iteration must be an int >= 1"),
        ({"max_sub_tasks": 0}, "max_sub_tasks must be an int >= 1"),
        ({"max_branches": 0}, "max_branches must be an int >= 1"),
        ({"max_repairs": -1}, "max_repairs must be an int >= 0"),
        ({"max_known_facts": -1}, "max_known_facts must be an int >= 0"),
        ({"max_passage_chars": 10}, "max_passage_chars must be an int >= 20"),
        ({"max_passage_chars": 500, "max_context_chars": 400}, "max_context_chars \\(400\\) must be >= max_passage"),
        ({"use_replanner": "maybe"}, "use_replanner must be a bool"),
        ({"max_task_per_iteration": 2}, "REAP has no option 'max_task_per_iteration'"),
    ],
)
def test_bad_options_name_the_option_value_and_range(bad, message):
    with pytest.raises(ConfigError, match=message):
        REAP(demos=None, **bad)


def test_cli_values_parse_against_the_options():
    assert parse_option(REAPOptions, "max_tasks_per_iteration", "4") == 4
    assert parse_option(REAPOptions, "use_replanner", "no") is False
    with pytest.raises(ConfigError, match="max_iterations"):
        parse_option(REAPOptions, "max_iterations", "five")
