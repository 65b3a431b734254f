"""REAP with scripted LMs: the rule-based Plan Updater (substitution, forks, repairs), the Planner-Extractor loop
and its routing by fact level, the Re-Planner's actions, the ablation flag, budgets, malformed output, demos,
save / load and BootstrapFewShot."""

from __future__ import annotations

import re
import threading
import typing

import dspy
import pytest
from dspy.utils.dummies import DummyLM

from rolecall.errors import ConfigError
from rolecall.programs.core.demo_source import HANDWRITTEN_CORPUS, HANDWRITTEN_EXAMPLES
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.reap.demos import reap_demos
from rolecall.programs.reap.plan import TaskPlan
from rolecall.programs.reap.program import REAP
from rolecall.retrievers.base import Passage
from rolecall.signatures.reap import ExtractStructuredFact, FactTuple, RepairPlan, SubTask
from rolecall.utils import SchemaLM, ScriptedTextLM

FAILED = {
    "evidence": "none",
    "reasoning": "nothing here",
    "statement": "unknown",
    "answer": "unknown",
    "level": "Failed",
}


def plan(*lines: str) -> dict:
    return {"plan": list(lines)}


def fact(answer: str, level: str = "DirectAnswer", statement: str | None = None) -> dict:
    statement = statement or f"The answer is {answer}."
    return {
        "evidence": "a sentence",
        "reasoning": "it says so",
        "statement": statement,
        "answer": answer,
        "level": level,
    }


def repair(action: str, answer: str = "none", *sub_questions: str) -> dict:
    return {"action": action, "answer": answer, "sub_questions": list(sub_questions)}


def events(pred, name: str | None = None) -> list:
    return [s for s in pred.trajectory.steps if s.kind == "event" and (name is None or s.role == name)]


def tasks(*questions: str) -> list[SubTask]:
    return [
        SubTask(id=i, question=q, deps=sorted({int(d) for d in re.findall(r"#(\d+)", q)}))
        for i, q in enumerate(questions, start=1)
    ]


# ---------------------------------------------------------------------------------------------------------------- plan
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


# ---------------------------------------------------------------------------------------------------------------- loop
def test_chain_substitutes_answers_and_conditions_on_earlier_facts(retriever):
    lm = DummyLM(
        [
            plan("1. Who directed Film X? (deps: none)", "2. Where was #1 born? (deps: 1)"),
            fact("Ada Quell", statement="Film X was directed by Ada Quell."),
            fact("Varn"),
            {"answer": "Varn"},
        ]
    )
    pred = REAP(retriever, lm=lm, demos=None, parallel=False)(question="Where was the director of Film X born?")
    assert pred.answer == "Varn" and pred.iterations == 2
    assert retriever.calls == [("Who directed Film X?", 5), ("Where was Ada Quell born?", 5)]
    assert [s.role for s in pred.trajectory.role_steps()] == ["decomposer", "extractor", "extractor", "synthesizer"]
    extractor = pred.trajectory.role_steps("extractor")
    assert extractor[0].inputs["known_facts"] == "none"
    assert extractor[1].inputs["known_facts"] == "- Film X was directed by Ada Quell."
    assert extractor[1].inputs["sub_question"] == "Where was Ada Quell born?"
    assert extractor[1].meta.items() >= {"sub_task": "2", "branch": "", "iteration": 2, "attempt": 0}.items()
    assert pred.trajectory.retrievals()[1].meta["sub_task"] == "2"
    assert [e.meta["substituted_into"] for e in events(pred, "plan_update")] == [["2"], []]
    synth = pred.trajectory.role_steps("synthesizer")[0]
    assert synth.inputs["facts"] == "Who directed Film X? -> Ada Quell\nWhere was Ada Quell born? -> Varn"
    assert pred.plan == ["1. Who directed Film X? (deps: none)", "2. Where was #1 born? (deps: 1)"]
    assert [(s["sub_task"], s["status"], s["answer"]) for s in pred.sub_tasks] == [
        ("1", "done", "Ada Quell"),
        ("2", "done", "Varn"),
    ]
    assert (
        pred.facts[0]["statement"] == "Film X was directed by Ada Quell." and pred.facts[1]["level"] == "DirectAnswer"
    )


def test_several_answers_fork_branches_that_run_concurrently(make_retriever):
    threads = []

    def fn(q, k):
        threads.append((q, threading.get_ident()))
        return [Passage(f"d-{q}", q, q)]

    lm = DummyLM(
        {
            "## facts ## ]]": {"answer": "1950 and 1960"},
            "## sub_question ## ]]\nWhich films did Ada Quell direct?": fact("Film A; Film B"),
            "## sub_question ## ]]\nWhen was Film A released?": fact("1950"),
            "## sub_question ## ]]\nWhen was Film B released?": fact("1960"),
            "## question ## ]]\nWhen were": plan("1. Which films did Ada Quell direct?", "2. When was #1 released?"),
        }
    )
    pred = REAP(make_retriever(fn), lm=lm, demos=None)(question="When were Ada Quell's films released?")
    assert pred.answer == "1950 and 1960" and pred.iterations == 2
    assert [s["sub_task"] for s in pred.sub_tasks] == ["1", "2@1.1", "2@1.2"]
    fork = events(pred, "fork")[0]
    assert fork.meta["branches"] == ["1.1", "1.2"] and fork.meta["iteration"] == 1
    branch_steps = pred.trajectory.role_steps("extractor")[1:]
    assert [(s.meta["branch"], s.meta["iteration"]) for s in branch_steps] == [("1.1", 2), ("1.2", 2)]
    main = threading.get_ident()
    assert {q for q, t in threads if t != main} == {"When was Film A released?", "When was Film B released?"}
    facts = pred.trajectory.role_steps("synthesizer")[0].inputs["facts"]
    assert "When was Film A released? -> 1950" in facts and "When was Film B released? -> 1960" in facts


def test_replanner_sufficient_resolves_a_partial_clue(retriever):
    lm = DummyLM(
        [
            plan("1. Who directed Film X?", "2. Where was #1 born?"),
            fact("unknown", "PartialClue", "Film X is an Ada Quell picture."),
            repair("sufficient", "Ada Quell"),
            fact("Varn"),
            {"answer": "Varn"},
        ]
    )
    pred = REAP(retriever, lm=lm, demos=None, parallel=False)(question="Where was the director of Film X born?")
    assert pred.answer == "Varn" and retriever.calls[1][0] == "Where was Ada Quell born?"
    step = pred.trajectory.role_steps("replanner")[0]
    assert step.inputs["fact"].startswith("level: PartialClue; statement: Film X is an Ada Quell picture.")
    assert step.inputs["later_steps"] == "2. Where was #1 born?" and step.meta["sub_task"] == "1"
    assert events(pred, "replan")[0].meta["action"] == "sufficient"


def test_replanner_edit_asks_the_sub_task_again(retriever):
    lm = DummyLM(
        [
            plan("1. Where was she born?"),
            FAILED,
            repair("edit", "none", "Where was Ada Quell born?"),
            fact("Varn"),
            {"answer": "Varn"},
        ]
    )
    pred = REAP(retriever, lm=lm, demos=None, parallel=False)(question="Where was Ada Quell born?")
    assert pred.answer == "Varn"
    assert [q for q, _ in retriever.calls] == ["Where was she born?", "Where was Ada Quell born?"]
    assert [s.meta["attempt"] for s in pred.trajectory.role_steps("extractor")] == [0, 1]
    assert pred.sub_tasks[0]["repairs"] == 1 and events(pred, "replan")[0].meta["query"] == "Where was Ada Quell born?"


def test_replanner_replace_prunes_the_branch_and_injects_sub_tasks(retriever):
    lm = DummyLM(
        [
            plan("1. Who is the father-in-law of Kranra?", "2. Where was #1 born?"),
            fact("unknown", "PartialClue", "Kranra is married to Graestor."),
            repair("replace", "none", "1. Who is the spouse of Kranra? (deps: none)", "2. Who is the father of #1?"),
            fact("Graestor"),
            fact("Yeidrard"),
            {"answer": "Yeidrard"},
        ]
    )
    pred = REAP(retriever, lm=lm, demos=None, parallel=False)(question="Who is the father-in-law of Kranra?")
    assert pred.answer == "Yeidrard"
    replan = events(pred, "replan")[0]
    assert replan.meta["pruned"] == ["1", "2"] and replan.meta["injected"] == ["3", "4"]
    assert [q for q, _ in retriever.calls][1:] == ["Who is the spouse of Kranra?", "Who is the father of Graestor?"]
    assert [(s["sub_task"], s["status"]) for s in pred.sub_tasks] == [
        ("1", "pruned"),
        ("2", "pruned"),
        ("3", "done"),
        ("4", "done"),
    ]


def test_unusable_repairs_fall_back_to_the_rule_based_updater(retriever):
    lm = DummyLM(
        [plan("1. a?", "2. b?"), FAILED, FAILED, repair("replace"), repair("edit", "none", "b?"), {"answer": "x"}]
    )
    pred = REAP(retriever, lm=lm, demos=None, parallel=False)(question="q?")
    reasons = [e.meta["reason"] for e in events(pred, "fallback")]
    assert reasons == ["replace_without_sub_tasks", "edit_without_change"]
    assert [s["status"] for s in pred.sub_tasks] == ["failed", "failed"]


def test_without_replanner_partial_facts_are_kept_and_failures_given_up(retriever):
    lm = DummyLM(
        [
            plan("1. Who directed Film X?", "2. Which studio made Film Y?", "3. Did #1 work for #2?"),
            fact("Ada Quell", "PartialClue"),
            {**FAILED, "answer": "Some Studio"},  # a Failed fact's answer is not kept
            fact("yes"),
            {"answer": "yes"},
        ]
    )
    program = REAP(retriever, lm=lm, demos=None, use_replanner=False, parallel=False)
    assert list(program.roles) == ["decomposer", "extractor", "synthesizer"]
    pred = program(question="Did the director of Film X work for the studio of Film Y?")
    assert pred.answer == "yes"
    assert retriever.calls[2][0] == "Did Ada Quell work for [Which studio made Film Y]?"
    assert [(e.meta["reason"], e.meta["answer"]) for e in events(pred, "fallback")] == [
        ("no_replanner", "Ada Quell"),
        ("no_replanner", None),
    ]
    assert [e.error is not None for e in events(pred, "plan_update")] == [False, True, False]


def test_max_iterations_stops_the_loop(retriever):
    lm = DummyLM([plan("1. a?", "2. b #1?", "3. c #2?"), fact("A"), fact("B"), {"answer": "B"}])
    pred = REAP(retriever, lm=lm, demos=None, max_iterations=2, parallel=False)(question="abc?")
    budget = events(pred, "budget_exhausted")
    assert len(budget) == 1 and budget[0].error and budget[0].meta["pending"] == ["3"]
    assert pred.iterations == 2 and pred.answer == "B" and len(pred.trajectory.role_steps("extractor")) == 2


def test_five_iterations_by_default_and_repair_limit(retriever):
    edits = [x for i in range(5) for x in (FAILED, repair("edit", "none", f"query {i}?"))]
    pred = REAP(retriever, lm=DummyLM([plan("1. q?"), *edits, {"answer": "x"}]), demos=None, max_repairs=9)(
        question="q?"
    )
    assert pred.iterations == 5 and len(pred.trajectory.role_steps("extractor")) == 5
    assert len(events(pred, "budget_exhausted")) == 1
    lm = DummyLM([plan("1. q?"), FAILED, repair("edit", "none", "again?"), FAILED, {"answer": "x"}])
    pred = REAP(retriever, lm=lm, demos=None, max_repairs=1)(question="q?")
    assert len(pred.trajectory.role_steps("replanner")) == 1
    assert events(pred, "fallback")[0].meta["reason"] == "repair_limit" and not events(pred, "budget_exhausted")


def test_malformed_plan_falls_back_to_the_question(retriever):
    lm = DummyLM([{"nonsense": "x"}, {"nonsense": "y"}, fact("Varn"), {"answer": "Varn"}])
    pred = REAP(retriever, lm=lm, demos=None)(question="Where was Ada born?")
    assert pred.answer == "Varn" and retriever.calls[0][0] == "Where was Ada born?"
    assert pred.trajectory.role_steps("decomposer")[0].error.startswith("parse error")
    assert events(pred, "plan_fallback")[0].meta["reason"] == "plan unparseable"


def test_fields_are_salvaged_from_completions_the_adapter_rejects(retriever):
    texts = [
        "[[ ## plan ## ]]\n1. Who directed Film X? (deps: none)\n2. Where was #1 born? (deps: 1)\n\n"
        "[[ ## completed ## ]]",
        "[[ ## evidence ## ]]\nx\n\n[[ ## statement ## ]]\nAda Quell made it.\n\n[[ ## answer ## ]]\nAda Quell\n\n"
        "[[ ## level ## ]]\ndirect answer\n\n[[ ## completed ## ]]",
        "[[ ## level ## ]]\nFailed\n\n[[ ## completed ## ]]",
        "[[ ## action ## ]]\nSufficient\n\n[[ ## answer ## ]]\nVarn\n\n[[ ## completed ## ]]",
        "[[ ## answer ## ]]\nVarn\n\n[[ ## completed ## ]]",
    ]
    adapter = dspy.ChatAdapter(use_json_adapter_fallback=False)
    pred = REAP(retriever, lm=ScriptedTextLM(texts), demos=None, adapter=adapter)(question="Where?")
    assert pred.answer == "Varn" and retriever.calls[1][0] == "Where was Ada Quell born?"
    assert [e.meta["role"] for e in events(pred, "salvaged")] == ["decomposer", "extractor", "replanner"]
    assert pred.trajectory.parse_rate() == 0.2  # the salvaged calls still count as parse failures
    assert [s["answer"] for s in pred.sub_tasks] == ["Ada Quell", "Varn"]


def test_failing_lm_and_retriever_never_raise(make_retriever):
    class Boom(DummyLM):
        def __call__(self, *args, **kwargs):
            raise RuntimeError("no model")

    pred = REAP(make_retriever(error=RuntimeError("no index")), lm=Boom([]), demos=None)(question="q?")
    assert pred.answer == "" and pred.trajectory.errors and events(pred, "answer_fallback")
    assert any("no index" in (s.error or "") for s in pred.trajectory.retrievals())
    assert events(pred, "fallback")[0].meta["reason"] == "replanner_unusable"
    broken = REAP(make_retriever(), lm=Boom([]), demos=None)
    broken._decompose = None  # an unexpected bug inside forward becomes an error step
    pred = broken(question="q?")
    assert pred.answer == "" and pred.trajectory.steps[-1].role == "error"


def test_empty_retrieval_is_recorded(make_retriever):
    lm = DummyLM([plan("1. q?"), fact("A"), {"answer": "A"}])
    pred = REAP(make_retriever(lambda q, k: []), lm=lm, demos=None)(question="q?")
    assert pred.trajectory.retrievals()[0].error == "empty retrieval" and pred.answer == "A"
    assert pred.trajectory.role_steps("extractor")[0].inputs["passages"] == "(no passages)"


# ---------------------------------------------------------------------------------------------------------------- setup
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


def test_custom_demos_and_option_validation():
    custom = {"decomposer": [dspy.Example(question="q", plan=["1. q"]).with_inputs("question")]}
    program = REAP(demos=custom)
    assert len(program.decomposer.demos) == 1 and program.extractor.demos == []
    with pytest.raises(ConfigError, match="unknown REAP roles"):
        REAP(demos={"planner": []})
    with pytest.raises(ConfigError):
        REAP(demos="best")
    for bad in ({"top_k": 0}, {"max_iterations": 0}, {"max_repairs": -1}, {"max_passage_chars": 10}):
        with pytest.raises(ConfigError):
            REAP(demos=None, **bad)


def test_save_load_round_trip(tmp_path, retriever):
    program = REAP(retriever, top_k=4, max_iterations=3, use_replanner=False, parallel=False)
    program.save(tmp_path / "reap")
    loaded = REAP.load(tmp_path / "reap", retriever=retriever)
    assert (loaded.top_k, loaded.max_iterations, loaded.use_replanner, loaded.parallel) == (4, 3, False, False)
    assert list(loaded.roles) == ["decomposer", "extractor", "synthesizer"] and loaded.retriever is retriever
    for role, predictor in program.roles.items():
        assert [d.toDict() for d in loaded.roles[role].demos] == [d.toDict() for d in predictor.demos]
        assert loaded.roles[role].demos[0].inputs().keys() == predictor.demos[0].inputs().keys()


def test_bootstrap_few_shot_compiles_reap(retriever):
    lm = SchemaLM("Varn")
    program = REAP(retriever, lm=lm, demos=None)
    trainset = [
        dspy.Example(question=f"Where was person {i} born?", answer="Varn").with_inputs("question") for i in range(2)
    ]

    def metric(example, pred, trace=None):
        return example.answer == pred.answer

    with dspy.context(lm=lm):
        optimizer = dspy.BootstrapFewShot(metric=metric, max_bootstrapped_demos=2, max_labeled_demos=0)
        compiled = program.compile(optimizer, trainset=trainset)
        assert compiled(question="Where was person 9 born?").answer == "Varn"
    assert isinstance(compiled, REAP) and compiled is not program and set(compiled.roles) == set(program.roles)
    assert len(compiled.decomposer.demos) == 2 and len(compiled.extractor.demos) == 2
    assert compiled.role_lm("extractor") is lm
