"""D2Plan's built-in demos: every role covered, the fields of its signature, and the global context C in each
Reasoner demo after planning (the plan with the earlier gold steps solved, with their evidence)."""

from __future__ import annotations

from rolecall.programs.core.demo_source import HANDWRITTEN_CORPUS, HANDWRITTEN_EXAMPLES
from rolecall.programs.d2plan.demos import d2plan_demos, default_d2plan_demos
from rolecall.programs.d2plan.program import D2Plan


def test_auto_demos_cover_every_role():
    program = D2Plan()
    assert {role: len(p.demos) for role, p in program.roles.items()} == {
        "reasoner_plan": 3,
        "reasoner_step": 3,
        "reasoner_refine": 3,
        "reasoner_revise": 3,
        "reasoner_answer": 3,
        "purifier": 3,
    }
    for role, predictor in program.roles.items():
        fields = set(predictor.signature.input_fields) | set(predictor.signature.output_fields)
        assert all(set(d.toDict()) == fields for d in predictor.demos), role
        assert all(set(d.inputs().toDict()) == set(predictor.signature.input_fields) for d in predictor.demos), role
    plans = program.reasoner_plan.demos
    assert {d.complexity for d in plans} == {"single-hop", "multi-hop"}
    assert any("#A_1" in s for d in plans for s in d.plan)
    assert {d.action for d in program.reasoner_step.demos} == {"search", "answer"}
    assert {d.relevant for d in program.purifier.demos} == {"yes", "no"}
    assert all("#A_" not in d.refined and "#A_" in d.sub_question for d in program.reasoner_refine.demos)
    assert all(len(d.passages) < 700 for d in program.purifier.demos)
    assert program.reasoner_plan.demos[0] is not D2Plan().reasoner_plan.demos[0]  # fresh copies per program
    assert list(D2Plan(use_purifier=False, use_plan_adaptation=False).roles) == [
        "reasoner_plan",
        "reasoner_step",
        "reasoner_answer",
    ]


def test_reasoner_demos_show_the_global_context():
    demos = d2plan_demos(HANDWRITTEN_EXAMPLES, HANDWRITTEN_CORPUS, n=3)
    refine = demos["reasoner_refine"][0]  # "In which country is Varn?" solved, "What is the language of #A_1?" next
    assert refine.question == "What is the official language of the country in which the city of Varn lies?"
    assert refine.context == (
        "1. In which country is the city of Varn located? -> Ostria (Varn is a city in the country of Ostria, on the "
        "river Melk.)\n2. What is the official language of #A_1?"
    )
    answer = demos["reasoner_answer"][0]
    assert answer.context.count(" -> ") == 2 and "Its official language is Ostrian." in answer.context
    for demo in demos["reasoner_step"] + demos["reasoner_refine"] + demos["reasoner_revise"]:
        assert demo.question and demo.context.startswith("1. "), demo
    revise = demos["reasoner_revise"][0]
    assert revise.context == f"1. {revise.failed}" and revise.plan[-1].endswith("#A_1?")
    for demo in demos["reasoner_step"] + demos["reasoner_answer"]:  # a solved step always shows its evidence
        assert all(line.endswith(")") for line in demo.context.splitlines() if " -> " in line)


def test_default_demos_are_cached_fresh_copies():
    first, second = default_d2plan_demos(), default_d2plan_demos()
    assert first["reasoner_step"][0] is not second["reasoner_step"][0]
    assert first["reasoner_step"][0].toDict() == second["reasoner_step"][0].toDict()
    assert len(default_d2plan_demos(n=1)["reasoner_plan"]) == 1
