"""REAP's built-in demos: every role, level and action covered, in the runtime formats (plan lines, the plan view)."""

from __future__ import annotations

import re
import typing

from rolecall.programs.core.demo_source import HANDWRITTEN_CORPUS, HANDWRITTEN_EXAMPLES
from rolecall.programs.reap.demos import default_reap_demos, reap_demos
from rolecall.programs.reap.program import REAP
from rolecall.signatures.reap import ExtractStructuredFact, RepairPlan


def test_auto_demos_cover_every_role_level_and_action():
    program = REAP()
    assert {role: len(p.demos) for role, p in program.roles.items()} == {
        "decomposer": 3,
        "extractor": 3,
        "replanner": 3,
        "synthesizer": 3,
    }
    for predictor in program.roles.values():
        fields = set(predictor.signature.input_fields) | set(predictor.signature.output_fields)
        assert all(set(d.toDict()) == fields for d in predictor.demos)
    lines = [line for d in program.decomposer.demos for line in d.plan]
    assert all(re.fullmatch(r"\d+\. .+ \(deps: (none|[\d, ]+)\)", line) for line in lines)
    assert any("#1" in line for line in lines)
    assert {d.level for d in program.extractor.demos} == set(
        typing.get_args(ExtractStructuredFact.output_fields["level"].annotation)
    )
    assert {d.action for d in program.replanner.demos} == set(
        typing.get_args(RepairPlan.output_fields["action"].annotation)
    )
    assert all(len(d.passages) < 700 for d in program.extractor.demos)
    assert "replanner" not in REAP(use_replanner=False).roles
    handwritten = reap_demos(HANDWRITTEN_EXAMPLES, HANDWRITTEN_CORPUS)
    assert all(len(v) == 3 for v in handwritten.values())


def test_replanner_demos_show_the_whole_plan_with_the_current_sub_task():
    demos = {d.action: d for d in default_reap_demos()["replanner"]}
    for demo in demos.values():
        lines = demo.plan.splitlines()
        assert all(re.fullmatch(r"\d+\. .+ \[(done: .+|current|pending|failed|pruned)\]", line) for line in lines)
        assert sum(line.endswith("[current]") for line in lines) == 1
        assert f". {demo.sub_question} [current]" in demo.plan  # the sub-question being repaired is marked
    # sufficient: a fresh plan, its later steps pending; edit: the first hop failed; replace: the undecomposed question
    assert "[pending]" in demos["sufficient"].plan
    assert demos["edit"].plan.splitlines()[0].endswith("[failed]")
    assert demos["replace"].plan == f"1. {demos['replace'].question} [current]"


def test_default_demos_are_cached_but_fresh_copies():
    first, second = default_reap_demos(), default_reap_demos()
    assert first is not second and first["replanner"][0] is not second["replanner"][0]
    assert [d.toDict() for d in first["replanner"]] == [d.toDict() for d in second["replanner"]]
