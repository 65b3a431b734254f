"""REAP with scripted LMs: the Planner-Extractor loop (one ready sub-task per iteration by default) and its routing by
fact level, the Re-Planner's actions and the whole plan it sees, the ablation flag, budgets, malformed output,
adapter groups, save / load and BootstrapFewShot."""

from __future__ import annotations

import threading

import dspy
import pytest
from dspy.adapters.chat_adapter import FieldInfoWithName
from dspy.utils.dummies import DummyLM

from rolecall.errors import ConfigError
from rolecall.programs.reap.program import REAP
from rolecall.retrievers.base import Passage
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
    program = REAP(make_retriever(fn), lm=lm, demos=None, max_tasks_per_iteration=4)
    pred = program(question="When were Ada Quell's films released?")
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


def test_one_ready_sub_task_per_iteration_by_default(make_retriever):
    threads = []

    def fn(q, k):
        threads.append(threading.get_ident())
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
    assert pred.answer == "1950 and 1960" and pred.iterations == 3  # the two forked branches take one iteration each
    steps = pred.trajectory.role_steps("extractor")
    assert [(s.meta["sub_task"], s.meta["iteration"]) for s in steps] == [("1", 1), ("2@1.1", 2), ("2@1.2", 3)]
    assert set(threads) == {threading.get_ident()}


def test_max_iterations_bounds_the_extractions(retriever):
    questions = [f"{i}. Who made film {i}?" for i in range(1, 9)]  # eight independent sub-tasks, all ready at once
    lm = DummyLM([plan(*questions), *[fact(f"A{i}") for i in range(1, 9)], {"answer": "x"}])
    pred = REAP(retriever, lm=lm, demos=None, max_sub_tasks=8, parallel=False)(question="Who made the films?")
    assert len(pred.trajectory.role_steps("extractor")) == 5 == pred.iterations
    assert events(pred, "budget_exhausted")[0].meta["pending"] == ["6", "7", "8"]
    lm = DummyLM([plan(*questions), *[fact(f"A{i}") for i in range(1, 9)], {"answer": "x"}])
    batched = REAP(retriever, lm=lm, demos=None, max_sub_tasks=8, max_tasks_per_iteration=4, parallel=False)
    pred = batched(question="Who made the films?")
    assert len(pred.trajectory.role_steps("extractor")) == 8 and pred.iterations == 2
    assert [s.meta["iteration"] for s in pred.trajectory.role_steps("extractor")] == [1] * 4 + [2] * 4


def test_replanner_sees_the_whole_plan(retriever):
    lm = DummyLM(
        [
            plan("1. Who directed Film X?", "2. Which studio made Film Y?", "3. Did #1 work for #2?"),
            fact("Ada Quell"),
            fact("unknown", "PartialClue", "Film Y was shot at Morrow Lot."),
            repair("sufficient", "Morrow Studios"),
            fact("yes"),
            {"answer": "yes"},
        ]
    )
    pred = REAP(retriever, lm=lm, demos=None)(question="Did the director of Film X work for the studio of Film Y?")
    assert pred.answer == "yes"
    (step,) = pred.trajectory.role_steps("replanner")
    assert step.inputs["sub_question"] == "Which studio made Film Y?"
    assert step.inputs["plan"].splitlines() == [
        "1. Who directed Film X? [done: Ada Quell]",  # not on the failing node's lineage, still shown
        "2. Which studio made Film Y? [current]",
        "3. Did Ada Quell work for #2? [pending]",
    ]
    assert retriever.calls[-1][0] == "Did Ada Quell work for Morrow Studios?"


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
    assert step.inputs["plan"] == "1. Who directed Film X? [current]\n2. Where was #1 born? [pending]"
    assert step.meta["sub_task"] == "1"
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
        [plan("1. a?", "2. b?"), FAILED, repair("replace"), FAILED, repair("edit", "none", "b?"), {"answer": "x"}]
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
def test_custom_demos_and_option_validation():
    custom = {"decomposer": [dspy.Example(question="q", plan=["1. q"]).with_inputs("question")]}
    program = REAP(demos=custom)
    assert len(program.decomposer.demos) == 1 and program.extractor.demos == []
    with pytest.raises(ConfigError, match="unknown roles"):
        REAP(demos={"planner": []})
    with pytest.raises(ConfigError):
        REAP(demos="best")
    for bad in ({"top_k": 0}, {"max_iterations": 0}, {"max_repairs": -1}, {"max_passage_chars": 10}):
        with pytest.raises(ConfigError):
            REAP(demos=None, **bad)
    assert REAP(use_replanner=False, demos={"replanner": []}).roles.keys() == {"decomposer", "extractor", "synthesizer"}


def test_decomposer_and_replanner_share_the_planner_adapter(retriever):
    class AdapterView(DummyLM):
        """A scripted LoRA adapter view: like a ``LocalLM`` view, its ``adapter`` attribute names its adapter (DummyLM
        keeps the ChatAdapter it formats answers with in that attribute, so it is held elsewhere here)."""

        def __init__(self, answers, adapter):
            super().__init__(answers)
            self.chat, self.adapter = self.adapter, adapter

        def _format_answer_fields(self, values):
            fields = {FieldInfoWithName(name=name, info=dspy.OutputField()): v for name, v in values.items()}
            return self.chat.format_field_with_value(fields)

    class FakeLocalLM:
        """A LocalLM stand-in: ``for_role(name)`` gives a scripted view whose ``adapter`` is ``name``."""

        def __init__(self, answers):
            self.answers, self.views = answers, {}

        def for_role(self, name):
            self.views[name] = AdapterView(self.answers, name)
            return self.views[name]

    local = FakeLocalLM(
        {
            "[current]": repair("sufficient", "Varn"),
            "## facts ## ]]": {"answer": "Varn"},
            "## passages ## ]]": fact("unknown", "PartialClue", "Ada Quell lived in Varn."),
            "## question ## ]]": plan("1. Where was Ada Quell born?"),
        }
    )
    program = REAP(retriever, demos=None)
    assert program.adapter_groups == {"planner": ["decomposer", "replanner"]}
    assert program.adapter_roles() == {
        "planner": ["decomposer", "replanner"],
        "extractor": ["extractor"],
        "synthesizer": ["synthesizer"],
    }
    program.bind_role_adapters(local)
    assert sorted(local.views) == ["extractor", "planner", "synthesizer"]
    assert program.role_lm("decomposer") is program.role_lm("replanner") is local.views["planner"]
    assert program.role_lm("extractor") is local.views["extractor"]
    pred = program(question="Where was Ada Quell born?")
    assert pred.answer == "Varn"
    assert [(s.role, s.adapter) for s in pred.trajectory.role_steps()] == [
        ("decomposer", "planner"),
        ("extractor", "extractor"),
        ("replanner", "planner"),
        ("synthesizer", "synthesizer"),
    ]
    per_role = REAP(retriever, demos=None, adapter_groups={})  # one adapter per role stays available
    assert per_role.adapter_name("replanner") == "replanner" and per_role.adapter_name("decomposer") == "decomposer"
    assert REAP(demos=None, use_replanner=False).adapter_roles()["planner"] == ["decomposer"]


@pytest.mark.slow
def test_a_local_lm_binds_one_planner_adapter_and_save_load_keeps_it(retriever, tiny_model, smollm_tokenizer, tmp_path):
    from rolecall.lm import LocalLM

    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=4)
    program = REAP(retriever, lm=lm, demos=None)
    adapters = {"decomposer": "planner", "extractor": "extractor", "replanner": "planner", "synthesizer": "synthesizer"}
    assert {r: program.role_lm(r).adapter for r in program.roles} == adapters
    assert program.role_lm("decomposer") is program.role_lm("replanner")
    program.save(tmp_path / "reap")
    assert sorted(p.name for p in (tmp_path / "reap" / "adapters").iterdir()) == ["extractor", "planner", "synthesizer"]
    loaded = REAP.load(tmp_path / "reap", retriever=retriever, lm=lm)
    assert {r: loaded.role_lm(r).adapter for r in loaded.roles} == adapters
    assert loaded.adapter_groups == {"planner": ["decomposer", "replanner"]}


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
