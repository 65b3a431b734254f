"""role_lm_overrides: per-role sampling settings for the rollouts, the program's own lm_kwargs restored after."""

from __future__ import annotations

import doctest

import pytest

from rolecall.optimizers.core import role_sampling
from rolecall.optimizers.core.role_sampling import role_lm_overrides


class _Program:
    def __init__(self) -> None:
        self.lm_kwargs = {"*": {"stop": ["x"]}, "plan": {"max_tokens": 64}}


def test_overrides_merge_for_the_duration_and_are_undone_even_after_an_error():
    program = _Program()
    before = {"*": {"stop": ["x"]}, "plan": {"max_tokens": 64}}
    with pytest.raises(RuntimeError), role_lm_overrides(program, {"plan": {"temperature": 1.0}, "new": {"top_p": 0.9}}):
        assert program.lm_kwargs["plan"] == {"max_tokens": 64, "temperature": 1.0}
        assert program.lm_kwargs["new"] == {"top_p": 0.9}
        raise RuntimeError("a rollout failed")
    assert program.lm_kwargs == before


def test_docstring_example_runs():
    assert doctest.testmod(role_sampling).failed == 0
