"""The built-in demo pattern and per-role demo policies."""

from __future__ import annotations

import dspy
import pytest

from rolecall.errors import ConfigError
from rolecall.programs.core.demos import built_in_demos, resolve_policies

BUILDS = []


def tiny_demos(examples, corpus, *, n=3):
    BUILDS.append(n)
    return {
        "answer": [dspy.Example(question=e.question, answer=e.answer).with_inputs("question") for e in examples[:n]]
    }


def test_built_in_demos_are_built_once_per_options_and_copied_each_call():
    default = built_in_demos(tiny_demos)
    first, second = default(n=2), default(n=2)
    assert len(first["answer"]) == 2 and BUILDS.count(2) == 1
    first["answer"][0].question = "edited"
    assert second["answer"][0].question != "edited" and default(n=2)["answer"][0].question != "edited"
    assert len(default()["answer"]) == 3


def test_resolve_policies():
    assert resolve_policies("never", ["a", "b"]) == {"a": "never", "b": "never"}
    assert resolve_policies({"a": "always", "*": "never"}, ["a", "b"]) == {"a": "always", "b": "never"}
    assert resolve_policies({"a": "always"}, ["a", "b"]) == {"a": "always", "b": "until_trained"}
    with pytest.raises(ConfigError, match="unknown roles"):
        resolve_policies({"c": "never"}, ["a"])
    with pytest.raises(ConfigError, match="must be one of"):
        resolve_policies("sometimes", ["a"])
