"""Options dataclasses: generic type and range checks, and parsing the CLI's KEY=VALUE strings by type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from rolecall.errors import ConfigError
from rolecall.programs.core.options import PassageOptions, option, parse_option


@dataclass(kw_only=True)
class Demo(PassageOptions):
    top_k: int = option(5, low=1)
    rate: float = option(0.5, low=0.0, high=1.0)
    use_rewrite: bool = True
    mode: Literal["fast", "slow"] = "fast"
    schedule: tuple[int, ...] = (5, 10)
    label: str | None = None


def test_defaults_and_lists_become_tuples():
    options = Demo(schedule=[1, 2])
    assert options.schedule == (1, 2) and options.to_dict()["schedule"] == [1, 2]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"top_k": 0}, "option top_k must be an int >= 1, got 0"),
        ({"top_k": True}, "option top_k must be an int >= 1, got True"),
        ({"rate": 2.0}, r"option rate must be a float in \[0.0, 1.0\], got 2.0"),
        ({"use_rewrite": "maybe"}, "option use_rewrite must be a bool, got 'maybe'"),
        ({"mode": "medium"}, "option mode must be one of 'fast', 'slow', got 'medium'"),
        ({"schedule": (1, "x")}, "option schedule must be a list of int"),
        ({"max_passage_chars": 500, "max_context_chars": 400}, "max_context_chars \\(400\\) must be >= max_passage"),
    ],
)
def test_bad_values_name_the_option_the_value_and_the_range(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Demo(**kwargs)


def test_unknown_names_list_the_options():
    with pytest.raises(ConfigError, match="Demo has no option 'nope'; its options are: max_passage_chars"):
        Demo.from_kwargs("Demo", {"nope": 1})


@pytest.mark.parametrize(
    "key, raw, value",
    [
        ("top_k", "3", 3),
        ("rate", "0.25", 0.25),
        ("use_rewrite", "no", False),
        ("use_rewrite", "TRUE", True),
        ("mode", "slow", "slow"),
        ("schedule", "5,10,15", (5, 10, 15)),
        ("schedule", "[1, 2]", (1, 2)),
        ("label", "none", None),
        ("label", "abc", "abc"),
    ],
)
def test_parse_option_by_type(key, raw, value):
    assert parse_option(Demo, key, raw) == value


@pytest.mark.parametrize(
    "key, raw, message",
    [
        ("use_rewrite", "maybe", "option use_rewrite='maybe' is not valid: use_rewrite must be a bool"),
        ("top_k", "three", "option top_k='three' is not valid: top_k must be an int"),
        ("mode", "medium", "must be one of 'fast', 'slow'"),
        ("nope", "1", "unknown option 'nope'; the options are: max_passage_chars"),
    ],
)
def test_parse_option_errors(key, raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_option(Demo, key, raw)
