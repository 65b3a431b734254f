"""D2Plan with scripted LMs: plan, purified search loop, refinement (and its rule fallback), revision after K failed
searches, the M budget, ablation flags, malformed outputs, the SPlanRL facts, the global context every Reasoner call
sees, the Reasoner's adapter group, options, save/load and BootstrapFewShot."""

from __future__ import annotations

import dspy
import pytest
from dspy.adapters.chat_adapter import ChatAdapter, FieldInfoWithName
from dspy.utils.dummies import DummyLM

from rolecall.errors import ConfigError
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.d2plan.facts import D2PlanFacts, Refinement, d2plan_facts
from rolecall.programs.d2plan.program import REASONER_ROLES, D2Plan, D2PlanOptions
from rolecall.retrievers.base import Passage
from rolecall.utils.dummies import SchemaLM, ScriptedTextLM

GARBAGE = {"nonsense": "x"}
IRRELEVANT = {"relevant": "no", "information": "passages about a band"}


def plan(*subs: str) -> dict:
    return {"complexity": "multi-hop" if len(subs) > 1 else "single-hop", "plan": list(subs)}


def search(query: str) -> dict:
    return {"action": "search", "query": query, "answer": "unknown"}


def answer(text: str) -> dict:
    return {"action": "answer", "query": "none", "answer": text}


def relevant(information: str) -> dict:
    return {"relevant": "yes", "information": information}


def events(pred) -> list[str]:
    return [s.role for s in pred.trajectory.steps if s.kind == "event"]


def two_hop_script() -> list[dict]:
    return [
        plan("Who directed Film X?", "Where was #A_1 born?"),
        search("Film X director"),
        relevant("Film X was directed by Ada Quell."),
        answer("Ada Quell"),
        {"refined": "Where was Ada Quell born?"},
        search("Ada Quell"),
        relevant("Ada Quell was born in Varn."),
        answer("Varn"),
        {"answer": "Varn"},
    ]


def test_plan_search_purify_refine_answer(retriever):
    pred = D2Plan(retriever, lm=DummyLM(two_hop_script()), demos=None)(question="Where was the director of X born?")
    assert pred.answer == "Varn"
    assert retriever.calls == [("Film X director", 5), ("Ada Quell", 5)]
    roles = [s.role for s in pred.trajectory.role_steps()]
    assert roles == ["reasoner_plan"] + ["reasoner_step", "purifier", "reasoner_step"] + ["reasoner_refine"] + [
        "reasoner_step",
        "purifier",
        "reasoner_step",
        "reasoner_answer",
    ]
    steps = pred.trajectory.role_steps("reasoner_step")
    assert steps[0].inputs == {
        "question": "Where was the director of X born?",
        "context": "1. Who directed Film X?\n2. Where was #A_1 born?",
        "sub_question": "Who directed Film X?",
        "notes": "(none yet)",
    }
    assert steps[1].inputs["notes"] == "[1] relevant: Film X was directed by Ada Quell."
    assert steps[2].inputs["sub_question"] == "Where was Ada Quell born?"
    assert [s.meta["sub_question"] for s in steps] == [1, 1, 2, 2]
    purifier = pred.trajectory.role_steps("purifier")[0]
    assert purifier.inputs["passages"].startswith("[1] Title 0 | Some text number 0.")
    refine = pred.trajectory.role_steps("reasoner_refine")[0]
    solved_first = "1. Who directed Film X? -> Ada Quell (Film X was directed by Ada Quell.)"
    assert refine.inputs == {
        "question": "Where was the director of X born?",
        "context": f"{solved_first}\n2. Where was #A_1 born?",
        "sub_question": "Where was #A_1 born?",
    }
    assert steps[2].inputs["context"] == f"{solved_first}\n2. Where was #A_1 born?"
    assert pred.trajectory.role_steps("reasoner_answer")[0].inputs["context"] == (
        f"{solved_first}\n2. Where was Ada Quell born? -> Varn (Ada Quell was born in Varn.)"
    )
    assert pred.plan == ["Who directed Film X?", "Where was #A_1 born?"] and pred.complexity == "multi-hop"
    assert [(s["sub_question"], s["answer"], s["status"]) for s in pred.sub_questions] == [
        ("Who directed Film X?", "Ada Quell", "solved"),
        ("Where was Ada Quell born?", "Varn", "solved"),
    ]
    facts = d2plan_facts(pred.trajectory)
    assert facts == D2PlanFacts(
        plan_size=2,
        is_multi_hop=True,
        tags_well_formed=True,
        refinements=[Refinement(2, True, False, False, None, "Where was Ada Quell born?")],
        purifier_relevant=[True, True],
        searches_per_sub_question=[1, 1],
        dependent_sub_questions=[2],
    )
    assert facts.every_dependent_refined and not facts.revised


def test_single_hop_is_not_decomposed_and_answers_without_the_answer_role(retriever):
    lm = DummyLM([plan("Where was Ada born?"), search("Ada"), relevant("Ada was born in Varn."), answer("Varn")])
    pred = D2Plan(retriever, lm=lm, demos=None)(question="Where was Ada Quell born?")
    assert pred.answer == "Varn" and pred.plan == [
        "Where was Ada Quell born?"
    ]  # the question itself, not the rewording
    assert [s.role for s in pred.trajectory.role_steps()] == ["reasoner_plan", "reasoner_step", "purifier"] + [
        "reasoner_step"
    ]
    facts = d2plan_facts(pred.trajectory)
    assert (facts.plan_size, facts.is_multi_hop, facts.refinements, facts.dependent_sub_questions) == (1, False, [], [])
    assert facts.every_dependent_refined


def test_k_failed_searches_trigger_one_revision(retriever):
    lm = DummyLM(
        [
            plan("Who directed X?", "Where was #A_1 born?"),
            *[item for q in ("x1", "x2", "x3") for item in (search(q), IRRELEVANT)],
            {"plan": ["Who made the film X?", "Where was #A_1 born?"]},
            search("film X maker"),
            relevant("X was made by Ada."),
            answer("Ada"),
            {"refined": "Where was Ada born?"},
            search("Ada"),
            relevant("Ada was born in Varn."),
            answer("Varn"),
            {"answer": "Varn"},
        ]
    )
    pred = D2Plan(retriever, lm=lm, demos=None)(question="Where was the director of X born?")
    assert pred.answer == "Varn"
    assert [q for q, _ in retriever.calls] == ["x1", "x2", "x3", "film X maker", "Ada"]
    revise = pred.trajectory.role_steps("reasoner_revise")[0]
    assert revise.inputs["failed"] == "Who directed X?"
    assert revise.inputs["context"] == "1. Who directed X?\n2. Where was #A_1 born?"  # nothing solved yet
    assert revise.inputs["failure"].startswith("3 searches found nothing relevant, only passages about a band")
    failed = next(s for s in pred.trajectory.steps if s.role == "sub_question_failed")
    assert failed.error and failed.meta["trigger"] == "failed_sub_question"
    facts = d2plan_facts(pred.trajectory)
    assert facts.revised and len(facts.revisions) == 1
    revision = facts.revisions[0]
    assert (revision.sub_question, revision.trigger, revision.applied) == (1, "failed_sub_question", True)
    assert revision.plan_before == ["Who directed X?", "Where was #A_1 born?"]
    assert revision.plan_after == ["Who made the film X?", "Where was #A_1 born?"]
    assert facts.first_query_after_revision == "film X maker"
    assert facts.first_query_after_revision_ids == ["p0", "p1", "p2", "p3", "p4"]
    assert facts.searches_per_sub_question == [3, 1, 1]
    assert facts.purifier_relevant == [False, False, False, True, True]
    assert facts.plan_size == 2 and facts.tags_well_formed and facts.every_dependent_refined
    assert [s["status"] for s in pred.sub_questions] == ["failed", "solved", "solved"]


def test_revision_budget_then_dependents_are_skipped(retriever):
    lm = DummyLM(
        [
            plan("Who directed X?", "Where was #A_1 born?"),
            search("x1"),
            IRRELEVANT,
            {"plan": ["Who made X?", "Where was #A_1 born?"]},
            search("y1"),
            IRRELEVANT,
            # fails again (K = 1 search, irrelevant): M = 1 revision is spent
            {"answer": "unknown"},
        ]
    )
    pred = D2Plan(retriever, lm=lm, demos=None, max_searches=1)(question="Where was the director of X born?")
    assert pred.answer == ""
    assert len(pred.trajectory.role_steps("reasoner_revise")) == 1
    assert [q for q, _ in retriever.calls] == ["x1", "y1"]
    skipped = next(s for s in pred.trajectory.steps if s.role == "sub_question_skipped")
    assert skipped.error and skipped.meta["blocked_by"] == [1]
    assert events(pred)[-1] == "answer_fallback"
    assert [s["status"] for s in pred.sub_questions] == ["failed", "failed", "skipped"]
    assert d2plan_facts(pred.trajectory).dependent_sub_questions == []  # a skipped sub-question is not scored


def test_relevant_evidence_without_an_answer_is_another_trigger(retriever):
    lm = DummyLM([plan("q?"), search("a"), relevant("fact"), search("b"), {"plan": []}])
    pred = D2Plan(retriever, lm=lm, demos=None, max_searches=1)(question="q?")
    assert pred.answer == ""
    revision = d2plan_facts(pred.trajectory).revisions[0]
    assert revision.trigger == "unanswered_sub_question" and not revision.applied
    assert pred.trajectory.role_steps("reasoner_revise")[0].inputs["failure"] == "1 searches found fact, but no answer"
    assert not d2plan_facts(pred.trajectory).tags_well_formed  # an empty revised plan is malformed
    assert d2plan_facts(pred.trajectory).first_query_after_revision is None


@pytest.mark.parametrize(
    ("refine", "text", "reason", "placeholder_after"),
    [
        (GARBAGE, "Where was Ada born?", "unparseable", True),
        ({"refined": "Where was #A_1 born?"}, "Where was Ada born?", "placeholder_left", True),
        ({"refined": "Where was he born?"}, "Where was Ada born?", "answer_missing", False),
        ({"refined": "Where was Ada born, in which town?"}, "Where was Ada born, in which town?", None, False),
    ],
)
def test_failed_refinements_fall_back_to_the_rule(retriever, refine, text, reason, placeholder_after):
    script = [plan("Who is it?", "Where was #A_1 born?"), search("it"), relevant("It is Ada."), answer("Ada"), refine]
    if refine is GARBAGE:
        script.append(GARBAGE)  # ChatAdapter retries a parse failure once with the JSON adapter
    lm = DummyLM([*script, search("Ada"), relevant("Ada was born in Varn."), answer("Varn"), {"answer": "Varn"}])
    pred = D2Plan(retriever, lm=lm, demos=None)(question="Where was it born?")
    assert pred.answer == "Varn"
    assert pred.trajectory.role_steps("reasoner_step")[2].inputs["sub_question"] == text
    refinement = d2plan_facts(pred.trajectory).refinements[0]
    assert (refinement.reason, refinement.has_placeholder_after, refinement.rule_filled) == (
        reason,
        placeholder_after,
        reason is not None,
    )
    assert d2plan_facts(pred.trajectory).every_dependent_refined == (reason is None)


def test_without_plan_adaptation_placeholders_are_filled_by_rule_and_nothing_is_revised(retriever):
    lm = DummyLM(
        [
            plan("Who is it?", "Where was #A_1 born?"),
            search("it"),
            relevant("It is Ada."),
            answer("Ada"),
            search("Ada"),
            IRRELEVANT,
            search("Ada again"),
            IRRELEVANT,
            search("Ada once more"),
            IRRELEVANT,  # K irrelevant searches: failed, and without adaptation nothing is revised
            {"answer": "Varn"},
        ]
    )
    program = D2Plan(retriever, lm=lm, demos=None, use_plan_adaptation=False)
    assert list(program.roles) == ["reasoner_plan", "reasoner_step", "reasoner_answer", "purifier"]
    pred = program(question="Where was it born?")
    assert pred.answer == "Varn"
    assert pred.trajectory.role_steps("reasoner_step")[2].inputs["sub_question"] == "Where was Ada born?"
    assert "placeholder_filled" in events(pred) and "revision" not in events(pred)
    facts = d2plan_facts(pred.trajectory)
    assert facts.refinements == [] and facts.revisions == [] and not facts.every_dependent_refined
    assert facts.searches_per_sub_question == [1, 3]


def test_without_purifier_raw_passages_reach_the_reasoner(retriever):
    lm = DummyLM([plan("Where was Ada born?"), search("Ada"), search("Ada Quell"), answer("Varn")])
    program = D2Plan(retriever, lm=lm, demos=None, use_purifier=False, top_k=2)
    assert "purifier" not in program.roles
    pred = program(question="Where was Ada born?")
    assert pred.answer == "Varn" and retriever.calls == [("Ada", 2), ("Ada Quell", 2)]
    notes = pred.trajectory.role_steps("reasoner_step")[2].inputs["notes"]
    assert notes == (
        "Search 1:\n[1] Title 0 | Some text number 0.\n[2] Title 1 | Some text number 1.\n"
        "Search 2:\n[1] Title 0 | Some text number 0.\n[2] Title 1 | Some text number 1."
    )
    facts = d2plan_facts(pred.trajectory)
    assert facts.purifier_relevant == [] and facts.tags_well_formed


def test_malformed_outputs_finish_within_the_budgets(retriever):
    pred = D2Plan(retriever, lm=DummyLM([GARBAGE] * 60), demos=None)(question="Where was Ada Quell born?")
    assert pred.answer == ""
    trajectory = pred.trajectory
    assert trajectory.role_steps("reasoner_plan")[0].error.startswith("parse error")
    assert len(trajectory.retrievals()) == 3 and len(trajectory.role_steps("reasoner_step")) == 4  # K and K + 1
    assert [q for q, _ in retriever.calls] == ["Where was Ada Quell born?", "Ada Quell", "Where was Ada Quell born?"]
    revision = next(s for s in trajectory.steps if s.role == "revision")
    assert revision.error == "revision unparseable" and not revision.meta["applied"]
    facts = d2plan_facts(trajectory)
    assert not facts.tags_well_formed and facts.purifier_relevant == [None, None, None]
    assert facts.plan_size == 1 and not facts.is_multi_hop


def test_random_text_never_raises(retriever):
    lm = ScriptedTextLM(["", "[[ ## action ## ]]\nsearch", "[[ ## plan ## ]]\n[1, 2", "complexity: multi-hop"])
    pred = D2Plan(retriever, lm=lm, demos=None)(question="q?")
    assert isinstance(pred.answer, str) and pred.trajectory.errors


def test_inconsistent_or_empty_plans(retriever):
    lm = DummyLM([{"complexity": "single-hop", "plan": ["a?", "b?"]}, answer("A")])
    pred = D2Plan(retriever, lm=lm, demos=None)(question="q?")
    assert pred.plan == ["q?"] and pred.answer == "A" and "malformed_output" in events(pred)
    lm = DummyLM([{"complexity": "multi-hop", "plan": []}, answer("A")])
    pred = D2Plan(retriever, lm=lm, demos=None)(question="q?")
    plan_event = next(s for s in pred.trajectory.steps if s.role == "plan")
    assert plan_event.meta["source"] == "fallback" and plan_event.meta["plan"] == ["q?"]


def test_long_and_looping_plans_are_cut(retriever):
    looping = plan("a?", "b #A_1?", "b #A_1?", "b #A_1?")
    pred = D2Plan(retriever, lm=DummyLM([looping] + [answer("x")] * 20), demos=None)(question="q?")
    assert pred.plan == ["a?", "b #A_1?"]
    # a repeat inside the plan, and a last item cut by the token budget: references move to the kept positions
    repeated = plan("Who is the director?", "Who is the director?", "Where was #A_2 born?", "Where was #A_2 bo")
    pred = D2Plan(retriever, lm=DummyLM([repeated] + [answer("x")] * 20), demos=None)(question="q?")
    assert pred.plan == ["Who is the director?", "Where was #A_1 born?"]
    long = plan(*[f"s{i}?" for i in range(8)])
    pred = D2Plan(retriever, lm=DummyLM([long] + [answer("x")] * 40), demos=None, max_sub_questions=3)(question="q?")
    assert pred.plan == ["s0?", "s1?", "s2?"] and "plan_truncated" in events(pred)


def test_empty_and_failing_retrieval(make_retriever):
    lm = DummyLM([plan("q?"), search("a"), answer("A")])
    pred = D2Plan(make_retriever(lambda q, k: []), lm=lm, demos=None)(question="q?")
    assert pred.answer == "A" and pred.trajectory.retrievals()[0].error == "empty retrieval"
    assert pred.trajectory.role_steps("purifier") == []  # nothing to purify: no LM call
    assert pred.trajectory.role_steps("reasoner_step")[1].inputs["notes"] == (
        "[1] not relevant: the search returned no passages"
    )

    class Boom(DummyLM):
        def __call__(self, *args, **kwargs):
            raise RuntimeError("no model")

    pred = D2Plan(make_retriever(error=RuntimeError("no index")), lm=Boom([]), demos=None)(question="q?")
    assert pred.answer == "" and any("no index" in (s.error or "") for s in pred.trajectory.retrievals())
    broken = D2Plan(make_retriever(), lm=Boom([]), demos=None)
    broken._plan = None  # an unexpected bug inside forward becomes an error step
    pred = broken(question="q?")
    assert pred.answer == "" and pred.trajectory.steps[-1].role == "error"
    assert not d2plan_facts(pred.trajectory).tags_well_formed


def test_facts_survive_a_json_round_trip(retriever):
    pred = D2Plan(retriever, lm=DummyLM(two_hop_script()), demos=None)(question="q?")
    rebuilt = Trajectory.from_dict(pred.trajectory.to_dict())
    assert d2plan_facts(rebuilt) == d2plan_facts(pred.trajectory)
    assert d2plan_facts(Trajectory()) == D2PlanFacts()


def test_every_reasoner_call_sees_the_question_the_plan_and_the_solved_answers_with_evidence(retriever):
    """The paper's global context C: after sub-question 1 is solved, the Reasoner's step, refine, revise and answer
    calls all see q, the current plan and a_1 with its evidence (the old code gave step and refine neither q nor the
    plan, and no call saw evidence)."""
    question = "Where was the director of Film X born?"
    lm = DummyLM(
        [
            plan("Who directed Film X?", "Where was #A_1 born?"),
            search("Film X director"),
            relevant("Film X was directed by Ada Quell."),
            answer("Ada Quell"),
            {"refined": "Where was Ada Quell born?"},
            search("Ada Quell birthplace"),
            IRRELEVANT,  # K = 1 irrelevant search: sub-question 2 failed, one revision
            {"plan": ["In which city was #A_1 born?"]},
            {"refined": "In which city was Ada Quell born?"},
            search("Ada Quell"),
            relevant("Ada Quell was born in Varn."),
            answer("Varn"),
            {"answer": "Varn"},
        ]
    )
    pred = D2Plan(retriever, lm=lm, demos=None, max_searches=1)(question=question)
    assert pred.answer == "Varn"
    evidence = "1. Who directed Film X? -> Ada Quell (Film X was directed by Ada Quell.)"
    reasoner = [s for s in pred.trajectory.role_steps() if s.role != "purifier"]
    calls = reasoner[[s.role for s in reasoner].index("reasoner_refine") :]  # everything after a_1 is known
    assert [s.role for s in calls] == [
        "reasoner_refine",
        "reasoner_step",
        "reasoner_revise",
        "reasoner_refine",
        "reasoner_step",
        "reasoner_step",
        "reasoner_answer",
    ]
    for step in calls:
        assert step.inputs["question"] == question, step.role
        assert step.inputs["context"].startswith(evidence), step.role  # the solved sub-answer and its evidence
    assert calls[0].inputs["context"] == f"{evidence}\n2. Where was #A_1 born?"  # the plan, as planned
    assert calls[3].inputs["context"] == f"{evidence}\n2. In which city was #A_1 born?"  # the revised plan
    assert (
        calls[-1].inputs["context"]
        == f"{evidence}\n2. In which city was Ada Quell born? -> Varn (Ada Quell was born in Varn.)"
    )


class AdapterView(DummyLM):
    """A scripted LM standing for one LoRA adapter view: ``adapter`` holds the adapter's name, as on a LocalLM view
    (DummyLM keeps its output format there, so it formats with a ChatAdapter of its own)."""

    def __init__(self, answers: list[dict], name: str) -> None:
        super().__init__(answers)
        self.adapter = name

    def _format_answer_fields(self, values: dict) -> str:
        fields = {FieldInfoWithName(name=k, info=dspy.OutputField()): v for k, v in values.items()}
        return ChatAdapter().format_field_with_value(fields)


class FakeLocalLM:
    """Stands in for a LocalLM: ``for_role(name)`` gives a distinct scripted view per adapter name."""

    def __init__(self, scripts: dict[str, list[dict]]) -> None:
        self.scripts: dict[str, list[dict]] = scripts
        self.views: dict[str, AdapterView] = {}

    def for_role(self, name: str) -> AdapterView:
        self.views[name] = AdapterView(self.scripts.get(name, []), name)
        return self.views[name]


def test_the_reasoner_roles_share_one_adapter_and_the_purifier_has_its_own(retriever):
    program = D2Plan(retriever, demos=None)
    assert program.adapter_groups == {"reasoner": list(REASONER_ROLES)}
    assert program.adapter_roles() == {"reasoner": list(REASONER_ROLES), "purifier": ["purifier"]}
    reasoner = [s for s in two_hop_script() if "relevant" not in s]
    purifier = [s for s in two_hop_script() if "relevant" in s]
    local = FakeLocalLM({"reasoner": reasoner, "purifier": purifier})
    program.bind_role_adapters(local)
    assert sorted(local.views) == ["purifier", "reasoner"]  # one view per adapter, not per role
    assert all(program.role_lm(role) is local.views["reasoner"] for role in REASONER_ROLES)
    assert program.role_lm("purifier") is local.views["purifier"]
    pred = program(question="Where was the director of X born?")
    assert pred.answer == "Varn"
    assert {(s.role, s.adapter) for s in pred.trajectory.role_steps()} == {
        ("reasoner_plan", "reasoner"),
        ("reasoner_step", "reasoner"),
        ("reasoner_refine", "reasoner"),
        ("reasoner_answer", "reasoner"),
        ("purifier", "purifier"),
    }
    assert len(pred.trajectory.role_steps(adapter="purifier")) == 2
    # an ablation keeps the group for the roles it has; adapter_groups={} gives one adapter per role
    assert D2Plan(demos=None, use_purifier=False, use_plan_adaptation=False).adapter_roles() == {
        "reasoner": ["reasoner_plan", "reasoner_step", "reasoner_answer"]
    }
    per_role = FakeLocalLM({})
    D2Plan(demos=None, adapter_groups={}).bind_role_adapters(per_role)
    assert sorted(per_role.views) == sorted(D2Plan.ROLES)


def test_options_are_validated():
    for bad in ({"max_searches": 0}, {"top_k": 0}, {"max_revisions": -1}, {"max_passage_chars": 10}):
        with pytest.raises(ConfigError):
            D2Plan(demos=None, **bad)
    with pytest.raises(ConfigError, match="max_context_chars"):
        D2Plan(demos=None, max_passage_chars=500, max_context_chars=400)
    with pytest.raises(ConfigError, match="use_purifier"):
        D2Plan(demos=None, use_purifier="maybe")
    with pytest.raises(ConfigError, match="no option 'max_search'"):
        D2Plan(demos=None, max_search=2)
    defaults = D2PlanOptions()
    assert (defaults.top_k, defaults.max_searches, defaults.max_revisions, defaults.max_sub_questions) == (5, 3, 1, 5)
    assert (defaults.max_passage_chars, defaults.max_context_chars) == (300, 1200)
    assert defaults.use_purifier and defaults.use_plan_adaptation
    with pytest.raises(ConfigError, match="demos must be"):
        D2Plan(demos="none")
    with pytest.raises(ConfigError, match="unknown roles"):
        D2Plan(demos={"reasoner_plan": [], "planner": []})


def test_save_load_round_trip(tmp_path, retriever):
    program = D2Plan(retriever, top_k=3, max_searches=2, max_revisions=0, use_purifier=False)
    program.save(tmp_path / "d2plan")
    loaded = D2Plan.load(tmp_path / "d2plan", retriever=retriever)
    assert (loaded.top_k, loaded.max_searches, loaded.max_revisions, loaded.use_purifier) == (3, 2, 0, False)
    assert list(loaded.roles) == list(program.roles) and loaded.retriever is retriever
    assert loaded.lm_kwargs == program.lm_kwargs and loaded.adapter_groups == {"reasoner": list(REASONER_ROLES)}
    for role, predictor in program.roles.items():
        assert [d.toDict() for d in loaded.roles[role].demos] == [d.toDict() for d in predictor.demos]
        assert loaded.roles[role].demos[0].inputs().keys() == predictor.demos[0].inputs().keys()


def test_bootstrap_few_shot_compiles_d2plan(make_retriever):
    retriever = make_retriever(lambda q, k: [Passage("d1", "Ada Quell", "Ada Quell was born in Varn.")])
    lm = SchemaLM("Varn")  # answers "single-hop", "search", "yes": K searches, a revision, then the answer role
    trainset = [
        dspy.Example(question=f"Where was person {i} born?", answer="Varn").with_inputs("question") for i in (1, 2)
    ]
    program = D2Plan(retriever, lm=lm, demos=None)

    def metric(example, pred, trace=None):
        return example.answer == pred.answer

    compiled = program.compile(
        dspy.BootstrapFewShot(metric=metric, max_bootstrapped_demos=1, max_labeled_demos=0), trainset=trainset
    )
    assert isinstance(compiled, D2Plan) and compiled is not program
    assert len(compiled.reasoner_plan.demos) == 1 and len(compiled.purifier.demos) == 1
    assert compiled.role_lm("reasoner_step") is lm and compiled.retriever is retriever
    assert compiled(question="Where was person 3 born?").answer == "Varn"


@pytest.mark.slow
def test_real_embedded_model_runs_the_reasoner_on_one_adapter_with_the_global_context():
    """One 2-hop synthetic question on SmolLM2-135M (K = 1, no revision): the run finishes without an error step, the
    Reasoner calls share the ``reasoner`` LoRA adapter, the Purifier has its own, and each step prompt holds q and C."""
    torch = pytest.importorskip("torch")
    from rolecall.data.synthetic import synthetic_world
    from rolecall.errors import ModelLoadError
    from rolecall.retrievers.bm25 import BM25

    try:
        from rolecall.lm import LocalLM

        lm = LocalLM(max_tokens=64)
    except (ImportError, ModelLoadError) as e:
        pytest.skip(f"embedded model unavailable: {e}")
    world = synthetic_world(seed=0)
    no_fallback = dspy.ChatAdapter(use_json_adapter_fallback=False)  # no JSON retry: keeps this near a minute
    program = D2Plan(
        BM25(world.corpus), lm=lm, max_searches=1, max_revisions=0, max_sub_questions=2, adapter=no_fallback
    )
    question = next(e.question for e in world.test if e.hops == 2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pred = program(question=question)
    finally:
        torch.set_num_threads(threads)
    trajectory = pred.trajectory
    assert isinstance(pred.answer, str) and not [s for s in trajectory.steps if s.role == "error"]
    assert {s.adapter for s in trajectory.role_steps() if s.role != "purifier"} == {"reasoner"}
    assert {s.adapter for s in trajectory.role_steps("purifier")} <= {"purifier"}
    for step in trajectory.role_steps("reasoner_step"):
        assert step.inputs["question"] == question and step.inputs["context"].startswith("1. ")
        assert "[[ ## context ## ]]" in step.messages[-1]["content"]
