"""Team options: the paper's defaults, range and cross-field checks with messages naming the value, CLI parsing."""

from __future__ import annotations

import pytest

from rolecall.errors import ConfigError
from rolecall.programs.core.options import parse_option
from rolecall.programs.team.options import CascadedOptions, HierarchicalOptions, TeamOptions
from rolecall.programs.team.program import CascadedTeam, HierarchicalTeam


def test_defaults_are_the_papers():
    cascaded, hierarchical = CascadedOptions(), HierarchicalOptions()
    assert (cascaded.top_k, cascaded.max_steps, cascaded.answer_candidates) == (3, 5, 1)
    assert (hierarchical.max_steps, hierarchical.max_rounds) == (12, 5)
    assert cascaded.parameter_sharing == hierarchical.parameter_sharing == "shared"
    assert CascadedTeam.Options is CascadedOptions and HierarchicalTeam.Options is HierarchicalOptions
    assert issubclass(CascadedOptions, TeamOptions) and issubclass(HierarchicalOptions, TeamOptions)
    assert not hasattr(CascadedOptions(), "max_rounds")  # the cascade has no Leader


def test_options_are_mirrored_and_recorded():
    team = HierarchicalTeam(max_rounds=2, top_k=4)
    assert (team.max_rounds, team.top_k) == (2, 4) and team.options == HierarchicalOptions(max_rounds=2, top_k=4)
    assert team.config()["options"]["max_rounds"] == 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"top_k": 0}, "option top_k must be an int >= 1, got 0"),
        ({"max_steps": 0}, "option max_steps must be an int >= 1, got 0"),
        ({"max_rounds": 0}, "option max_rounds must be an int >= 1, got 0"),
        ({"max_subtasks": 0}, "option max_subtasks must be"),
        ({"max_searcher_turns": 0}, "option max_searcher_turns must be"),
        ({"answer_candidates": 0}, "option answer_candidates must be an int >= 1, got 0"),
        ({"parameter_sharing": "none"}, "option parameter_sharing must be one of 'shared', 'per_role', got 'none'"),
        ({"shared_adapter_name": ""}, "option shared_adapter_name must be a non-empty string, got ''"),
        ({"shared_adapter_name": None}, "option shared_adapter_name must be a str"),
        ({"max_passage_chars": 10}, "option max_passage_chars must be an int >= 20, got 10"),
        ({"max_report_chars": 10}, "option max_report_chars must be"),
        (
            {"max_passage_chars": 500, "max_notes_chars": 400},
            r"option max_notes_chars \(400\) must be >= max_passage_chars \(500\)",
        ),
        ({"no_such_option": 3}, "HierarchicalTeam has no option 'no_such_option'; its options are: top_k"),
        ({"demos": "best"}, "demos must be 'auto'"),
    ],
)
def test_bad_options_raise_config_error_naming_the_value(options, message):
    with pytest.raises(ConfigError, match=message):
        HierarchicalTeam(**options)


def test_the_cascade_has_no_hierarchy_options():
    with pytest.raises(ConfigError, match="CascadedTeam has no option 'max_rounds'"):
        CascadedTeam(max_rounds=2)


def test_cli_values_parse_against_the_options():
    assert parse_option(HierarchicalOptions, "max_rounds", "3") == 3
    assert parse_option(HierarchicalOptions, "parameter_sharing", "per_role") == "per_role"
    with pytest.raises(ConfigError, match="parameter_sharing must be one of 'shared', 'per_role'"):
        parse_option(HierarchicalOptions, "parameter_sharing", "both")
    with pytest.raises(ConfigError, match="unknown option 'max_rounds'"):
        parse_option(CascadedOptions, "max_rounds", "3")
