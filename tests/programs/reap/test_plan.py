"""REAP's task plan and rule-based Plan Updater: substitution, forks, repairs, lineage facts and the plan view the
Re-Planner sees."""

from __future__ import annotations

import re

from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.reap.plan import TaskPlan, plan_view_line
from rolecall.signatures.reap import FactTuple, SubTask


def tasks(*questions: str) -> list[SubTask]:
    return [
        SubTask(id=i, question=q, deps=sorted({int(d) for d in re.findall(r"#(\d+)", q)}))
        for i, q in enumerate(questions, start=1)
    ]


def test_plan_updater_substitutes_answers_into_dependents():
    p = TaskPlan(tasks("Who directed X?", "Where was #1 born?", "Who made Y?"))
    assert [n.uid for n in p.ready()] == ["1", "3"]
    trajectory = Trajectory()
    assert p.resolve(p.nodes["1"], "Ada Quell", trajectory, iteration=1) == ["2"]
    assert [n.question for n in p.ready()] == ["Where was Ada Quell born?", "Who made Y?"]
    assert trajectory.steps[0].role == "plan_update" and trajectory.steps[0].meta["substituted_into"] == ["2"]


def test_plan_updater_forks_single_dependency_chains_and_joins_for_multi_dependency_tasks():
    p = TaskPlan(
        tasks("Which countries border X?", "What is the capital of #1?", "How big is #2?", "Compare #3 and #1")
    )
    trajectory = Trajectory()
    touched = p.resolve(p.nodes["1"], "Aland; Borv", trajectory)
    assert list(p.nodes) == ["1", "2@1.1", "3@1.1", "4@1.1", "2@1.2", "3@1.2", "4@1.2"]
    assert set(touched) == {"2@1.1", "4@1.1", "2@1.2", "4@1.2"}
    assert [n.question for n in p.ready()] == ["What is the capital of Aland?", "What is the capital of Borv?"]
    assert p.nodes["3@1.2"].sources == {2: "2@1.2"} and p.nodes["4@1.1"].sources == {3: "3@1.1", 1: "1"}
    assert p.nodes["4@1.1"].values == {1: "Aland, Borv"}  # the comparison sees both answers, in its own branch
    fork = [s for s in trajectory.steps if s.role == "fork"][0]
    assert fork.meta["answers"] == ["Aland", "Borv"] and fork.meta["branches"] == ["1.1", "1.2"]
    # a task that needs two earlier answers is not forked; it gets the joined list
    p = TaskPlan(tasks("Members of band X?", "Members of band Y?", "Who is in both #1 and #2?"))
    p.resolve(p.nodes["1"], "A; B")
    assert list(p.nodes) == ["1", "2", "3"] and p.nodes["3"].values == {1: "A, B"}


def test_fork_is_capped_by_max_branches_and_facts_stay_on_their_branch():
    p = TaskPlan(tasks("Which films?", "When was #1 released?"), max_branches=2)
    trajectory = Trajectory()
    p.resolve(p.nodes["1"], "F1; F2; F3", trajectory)
    assert [n.uid for n in p.ready()] == ["2@1.1", "2@1.2"]
    truncated = [s for s in trajectory.steps if s.role == "fork_truncated"][0]
    assert truncated.error and truncated.meta["dropped"] == ["F3"]
    p.nodes["1"].facts.append(FactTuple(statement="Films F1, F2, F3.", answer="F1; F2; F3", level="DirectAnswer"))
    p.nodes["2@1.1"].facts.append(FactTuple(statement="F1 came out in 1950.", answer="1950", level="DirectAnswer"))
    assert [f.statement for f in p.lineage_facts(p.nodes["2@1.2"], 4)] == ["Films F1, F2, F3."]
    assert [f.statement for f in p.lineage_facts(p.nodes["2@1.1"], 1)] == ["F1 came out in 1950."]


def test_plan_repairs_edit_replace_and_give_up():
    p = TaskPlan(tasks("Who directed X?", "Where was #1 born?", "Who made Y?"))
    pruned, injected = p.replace(p.nodes["1"], tasks("Who is X's director?", "Who is #1's agent?"))
    assert pruned == ["1", "2"] and injected == ["4", "5"]
    assert p.nodes["5"].task.question == "Who is #4's agent?" and p.nodes["5"].sources == {4: "4"}
    assert [n.uid for n in p.ready()] == ["3", "4"] and p.nodes["2"].status == "pruned"
    p.edit(p.nodes["3"], "Which studio made the film Y?")
    assert p.nodes["3"].question == "Which studio made the film Y?" and p.nodes["3"].repairs == 1
    p.give_up(p.nodes["4"], Trajectory())
    assert p.nodes["5"].question == "Who is [Who is X's director]'s agent?" and p.nodes["4"].status == "failed"
    p.resolve(p.nodes["3"], "unknown")  # a null answer leaves the sub-task unanswered
    assert p.nodes["3"].status == "failed" and p.finished is False and [n.uid for n in p.ready()] == ["5"]


def test_view_shows_every_node_with_its_status_and_answer():
    p = TaskPlan(tasks("Who directed X?", "Which studio made Y?", "Where was #1 born?", "Did #1 work for #2?"))
    p.resolve(p.nodes["1"], "Ada Quell")
    p.give_up(p.nodes["2"])
    assert p.view(p.nodes["3"]).splitlines() == [
        "1. Who directed X? [done: Ada Quell]",
        "2. Which studio made Y? [failed]",
        "3. Where was Ada Quell born? [current]",
        "4. Did Ada Quell work for [Which studio made Y]? [pending]",
    ]
    p.replace(p.nodes["3"], tasks("Where does Ada Quell live?"))
    assert p.view().splitlines()[2:] == [
        "3. Where was Ada Quell born? [pruned]",
        "4. Did Ada Quell work for [Which studio made Y]? [pending]",
        "5. Where does Ada Quell live? [pending]",
    ]
    assert plan_view_line("2@1.1", "When was Film A released?", "done", "1950") == (
        "2@1.1. When was Film A released? [done: 1950]"
    )
