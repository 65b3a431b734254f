"""The team's built-in demos: every role with its fields, in the run-time prompt formats, cached as fresh copies."""

from __future__ import annotations

import dspy
import pytest

from rolecall.errors import ConfigError
from rolecall.programs.team.demos import default_team_demos
from rolecall.programs.team.program import CascadedTeam, HierarchicalTeam


def test_auto_demos_cover_every_role_with_its_fields():
    program = HierarchicalTeam()
    assert {role: len(p.demos) for role, p in program.roles.items()} == {"leader": 3, "searcher": 3, "answerer": 3}
    for predictor in program.roles.values():
        fields = set(predictor.signature.input_fields) | set(predictor.signature.output_fields)
        assert all(set(d.keys()) == fields for d in predictor.demos)
        assert all(len(str(d.toDict())) < 1200 for d in predictor.demos)
    leader = program.leader.demos
    assert {d.action for d in leader} == {"delegate", "answer"}
    assert any(len(d.subtasks) >= 2 for d in leader)  # a parallel wave
    assert any(d.action == "answer" and d.selected and "(unfinished)" in d.reports for d in leader)
    assert {d.action for d in program.searcher.demos} == {"search", "report"}
    assert list(CascadedTeam().roles) == ["searcher", "answerer"]
    with pytest.raises(ConfigError, match="unknown roles"):
        CascadedTeam(demos={"leader": leader})
    custom = {"answerer": [dspy.Example(question="q", reports="r", answer="a").with_inputs("question", "reports")]}
    program = CascadedTeam(demos=custom)
    assert len(program.answerer.demos) == 1 and program.searcher.demos == []


def test_default_demos_are_fresh_copies_and_skip_roles_the_team_lacks():
    first, second = default_team_demos(), default_team_demos()
    assert first is not second and first["leader"][0] is not second["leader"][0]
    first["leader"][0].action = "changed"
    assert default_team_demos()["leader"][0].action != "changed"
    assert set(CascadedTeam().default_demos()) == {"searcher", "answerer"}


def test_demo_policy_never_runs_zero_shot():
    program = HierarchicalTeam(demo_policy="never")
    assert all(p.demos == [] for p in program.roles.values())
