"""OPERA with DummyLM: placeholder filling, the rewrite loop and k schedule, the step budget, malformed outputs,
ablation flags, thread-safe trajectories, demos, save / load and BootstrapFewShot; one slow run on the real model."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import dspy
import pytest
from dspy.utils.dummies import DummyLM

from rolecall.programs import OPERA
from rolecall.retrievers.base import Passage

YES = {"sufficient": "yes", "confidence": "high", "missing_information": "none"}
NO = {"sufficient": "no", "answer": "unknown", "confidence": "low", "missing_information": "the birthplace"}


def plan(*sub_goals: str) -> dict:
    return {"sub_goals": list(sub_goals)}


def yes(answer: str) -> dict:
    return {**YES, "answer": answer}


def test_placeholders_are_filled_with_earlier_answers(retriever):
    lm = DummyLM([plan("Who directed Film X?", "Where was [person from step 1] born?"), yes("Ada Quell"), yes("Varn")])
    program = OPERA(retriever, lm=lm, demos=None)
    pred = program(question="Where was the director of Film X born?")
    assert pred.answer == "Varn"
    assert [q for q, _ in retriever.calls] == ["Who directed Film X?", "Where was Ada Quell born?"]
    analysis = pred.trajectory.role_steps("analysis")
    assert analysis[1].inputs["sub_goal"] == "Where was Ada Quell born?"
    assert pred.sub_goals == [
        {"sub_goal": "Who directed Film X?", "answer": "Ada Quell"},
        {"sub_goal": "Where was Ada Quell born?", "answer": "Varn"},
    ]


def test_no_triggers_rewrite_and_the_k_schedule(retriever):
    lm = DummyLM([plan("Where was Ada Quell born?"), NO, {"query": "Ada Quell"}, NO, {"query": "Quell"}, yes("Varn")])
    program = OPERA(retriever, lm=lm, demos=None)
    pred = program(question="Where was Ada Quell born?")
    assert pred.answer == "Varn"
    assert retriever.calls == [("Where was Ada Quell born?", 5), ("Ada Quell", 10), ("Quell", 15)]
    rewrites = pred.trajectory.role_steps("rewrite")
    assert len(rewrites) == 2 and rewrites[0].inputs["missing_information"] == "the birthplace"
    assert [s.meta["k"] for s in pred.trajectory.role_steps("analysis")] == [5, 10, 15]


def test_rewrites_stop_at_max_rewrites_and_custom_schedule(retriever):
    lm = DummyLM([plan("q?"), NO, {"query": "r1"}, NO])
    program = OPERA(retriever, lm=lm, demos=None, max_rewrites=1, k_schedule=(2, 4))
    pred = program(question="q?")
    assert pred.answer == ""  # every attempt said no and gave no answer
    assert retriever.calls == [("q?", 2), ("r1", 4)]
    assert [s.role for s in pred.trajectory.steps if s.kind == "event"] == ["unresolved_sub_goal"]


def test_unseen_passages_are_shown_first_after_a_rewrite(make_retriever):
    corpus = [Passage(f"d{i}", f"T{i}", f"text {i}") for i in range(15)]
    retriever = make_retriever(lambda q, k: corpus[:k])
    lm = DummyLM([plan("q?"), NO, {"query": "again"}, yes("A")])
    pred = OPERA(retriever, lm=lm, demos=None, max_passage_chars=30, max_context_chars=60)(question="q?")
    second = pred.trajectory.role_steps("analysis")[1].inputs["passages"]
    assert second.startswith("[1] T5 | text 5")


def test_step_budget_exhaustion_is_recorded(retriever):
    lm = DummyLM([plan("a?", "b [x from step 1]?", "c [x from step 2]?"), yes("A"), yes("B")])
    program = OPERA(retriever, lm=lm, demos=None, max_steps=2)
    pred = program(question="abc?")
    events = [s for s in pred.trajectory.steps if s.role == "budget_exhausted"]
    assert len(events) == 1 and events[0].error and events[0].meta["sub_goal"] == 3
    assert pred.answer == "B"  # the last sub-goal that ran
    assert len(pred.trajectory.role_steps("analysis")) == 2


def test_malformed_plan_falls_back_to_the_question(retriever):
    lm = DummyLM([{"nonsense": "x"}, {"nonsense": "y"}, yes("Varn")])
    pred = OPERA(retriever, lm=lm, demos=None)(question="Where was Ada born?")
    assert pred.answer == "Varn"
    plan_step = pred.trajectory.role_steps("plan")[0]
    assert plan_step.error.startswith("parse error") and plan_step.completion is not None
    assert [s.role for s in pred.trajectory.steps if s.kind == "event"] == ["plan_fallback"]
    assert retriever.calls[0][0] == "Where was Ada born?"


def test_empty_plan_falls_back_to_the_question(retriever):
    lm = DummyLM([plan(), yes("Varn")])
    pred = OPERA(retriever, lm=lm, demos=None)(question="Where?")
    assert pred.answer == "Varn"
    assert pred.trajectory.steps[1].role == "plan_fallback" and pred.trajectory.steps[1].meta["reason"] == "plan empty"


def test_malformed_analysis_and_rewrite_are_recorded_and_the_question_returns(retriever):
    garbage = {"nonsense": "x"}
    lm = DummyLM([plan("q?")] + [garbage] * 10)
    pred = OPERA(retriever, lm=lm, demos=None)(question="q?")
    assert pred.answer == ""
    assert pred.trajectory.parse_rate("analysis") == 0.0 and pred.trajectory.parse_rate("rewrite") == 0.0
    assert any(s.role == "rewrite_fallback" for s in pred.trajectory.steps)
    assert len(pred.trajectory.role_steps("analysis")) == 3


def test_failing_lm_and_retriever_never_raise(make_retriever):
    class Boom(DummyLM):
        def __call__(self, *args, **kwargs):
            raise RuntimeError("no model")

    pred = OPERA(make_retriever(error=RuntimeError("no index")), lm=Boom([]), demos=None)(question="q?")
    assert pred.answer == "" and pred.trajectory.errors
    assert any("no index" in (s.error or "") for s in pred.trajectory.retrievals())

    broken = OPERA(make_retriever(), lm=Boom([]), demos=None)
    broken._plan = None  # an unexpected bug inside forward becomes an error step
    pred = broken(question="q?")
    assert pred.answer == "" and pred.trajectory.steps[-1].role == "error"


def test_empty_retrieval_is_recorded(make_retriever):
    lm = DummyLM([plan("q?"), yes("A")])
    pred = OPERA(make_retriever(lambda q, k: []), lm=lm, demos=None, use_rewrite=False)(question="q?")
    assert pred.trajectory.retrievals()[0].error == "empty retrieval"
    assert pred.trajectory.role_steps("analysis")[0].inputs["passages"] == "(no passages)"


def test_ablation_flags(retriever):
    program = OPERA(retriever, lm=DummyLM([NO]), demos=None, use_plan_agent=False, use_rewrite=False)
    assert list(program.roles) == ["analysis"]
    pred = program(question="Where was Ada born?")
    assert retriever.calls == [("Where was Ada born?", 5)]
    assert [s.role for s in pred.trajectory.role_steps()] == ["analysis"]
    assert list(OPERA(retriever, demos=None).roles) == ["plan", "analysis", "rewrite"]
    assert list(OPERA(retriever, demos=None, final_synthesis=True).roles)[-1] == "synthesis"


def test_final_synthesis(retriever):
    lm = DummyLM([plan("a?", "b?"), yes("1870"), yes("1953"), {"answer": "Gratho"}])
    pred = OPERA(retriever, lm=lm, demos=None, final_synthesis=True)(question="Who was born first?")
    assert pred.answer == "Gratho"
    assert pred.trajectory.role_steps("synthesis")[0].inputs["evidence"] == "a? -> 1870\nb? -> 1953"


def test_trajectories_are_thread_safe(retriever):
    answers = {}
    for i in range(8):
        answers[f"Who is person {i}?"] = plan(f"Find alpha-{i}", f"Then [entity from step 1] beta-{i}")
        answers[f"Find alpha-{i}\n"] = yes(f"ans{i}")
        answers[f"Then ans{i} beta-{i}\n"] = yes(f"final{i}")
    program = OPERA(retriever, lm=DummyLM(answers), demos=None)
    with ThreadPoolExecutor(8) as pool:
        preds = list(pool.map(lambda i: program(question=f"Who is person {i}?"), range(8)))
    for i, pred in enumerate(preds):
        assert pred.answer == f"final{i}"
        steps = pred.trajectory.role_steps()
        assert [s.role for s in steps] == ["plan", "analysis", "analysis"] and all(s.ok for s in steps)
        own = (f"person {i}?", f"alpha-{i}\n", f"ans{i} beta-{i}")
        for step in steps:
            content = step.messages[-1]["content"]
            assert any(tag in content for tag in own)
            assert not any(f"person {j}?" in content or f"alpha-{j}\n" in content for j in range(8) if j != i)
        assert f"ans{i}" in steps[1].completion and f"final{i}" in steps[2].completion


def test_auto_demos_teach_the_placeholder_format():
    program = OPERA()
    assert {role: len(p.demos) for role, p in program.roles.items()} == {"plan": 3, "analysis": 3, "rewrite": 3}
    plans = [d.sub_goals for d in program.plan.demos]
    assert any("[entity from step 1]" in s for p in plans for s in p)
    assert {d.sufficient for d in program.analysis.demos} == {"yes", "no"}
    assert all(len(d.passages) < 700 for d in program.analysis.demos)
    custom = {"plan": [dspy.Example(question="q", sub_goals=["q"]).with_inputs("question")]}
    assert len(OPERA(demos=custom).plan.demos) == 1 and OPERA(demos=custom).analysis.demos == []


def test_save_load_round_trip(tmp_path, retriever):
    program = OPERA(retriever, max_rewrites=1, k_schedule=(3, 6), use_plan_agent=False)
    program.save(tmp_path / "opera")
    loaded = OPERA.load(tmp_path / "opera", retriever=retriever)
    assert loaded.k_schedule == (3, 6) and loaded.max_rewrites == 1 and not loaded.use_plan_agent
    assert list(loaded.roles) == ["analysis", "rewrite"]
    for role, predictor in program.roles.items():
        assert [d.toDict() for d in loaded.roles[role].demos] == [d.toDict() for d in predictor.demos]
        assert loaded.roles[role].demos[0].inputs().keys() == predictor.demos[0].inputs().keys()
    assert loaded.retriever is retriever


def test_bootstrap_few_shot_compiles_opera(retriever):
    trainset = [
        dspy.Example(question=f"Where was person {i} born?", answer="Varn").with_inputs("question") for i in range(2)
    ]
    responses = {}
    for i in range(2):  # DummyLM answers with the first key found in the last message: analysis keys first
        responses[f"## sub_goal ## ]]\nWhere was person {i} born?"] = yes("Varn")
    for i in range(2):
        responses[f"Where was person {i} born?"] = plan(f"Where was person {i} born?")
    lm = DummyLM(responses)
    program = OPERA(retriever, lm=lm, demos=None)

    def metric(example, pred, trace=None):
        return example.answer == pred.answer

    compiled = program.compile(
        dspy.BootstrapFewShot(metric=metric, max_bootstrapped_demos=2, max_labeled_demos=0), trainset=trainset
    )
    assert isinstance(compiled, OPERA) and compiled is not program
    assert len(compiled.plan.demos) == 2 and len(compiled.analysis.demos) == 2
    assert compiled.role_lm("plan") is lm and compiled.retriever is retriever
    assert compiled(question="Where was person 1 born?").answer == "Varn"


@pytest.mark.slow
def test_real_embedded_model_runs_three_questions(tmp_path):
    """Three 2-hop synthetic questions on SmolLM2-135M (one LoRA adapter per role), then an adapter save / load."""
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
    # a small budget keeps this near a minute on two shared CPU cores: a plan and one analysis per question, no JSON
    # retry after a parse failure, and one torch thread (two threads on a loaded 2-core machine run ~10x slower)
    no_fallback = dspy.ChatAdapter(use_json_adapter_fallback=False)
    program = OPERA(BM25(world.corpus), lm=lm, use_rewrite=False, max_steps=1, adapter=no_fallback)
    questions = [e.question for e in world.test if e.hops == 2][:3]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with ThreadPoolExecutor(3) as pool:
            preds = list(pool.map(lambda q: program(question=q), questions))
    finally:
        torch.set_num_threads(threads)
    plan_steps = [s for p in preds for s in p.trajectory.role_steps("plan")]
    assert len(plan_steps) == 3 and sum(s.ok for s in plan_steps) > 0
    assert all(isinstance(p.answer, str) for p in preds)
    role_steps = [s for p in preds for s in p.trajectory.role_steps()]
    assert all(s.messages and s.completion is not None and s.usage["prompt_tokens"] > 0 for s in role_steps)
    assert all(s.meta.get("adapter") == s.role for s in role_steps)

    program.save(tmp_path / "opera")
    assert (tmp_path / "opera" / "adapters" / "plan" / "adapter_config.json").is_file()
    loaded = OPERA.load(tmp_path / "opera", retriever=program.retriever, lm=lm)
    assert loaded.role_lm("analysis").adapter == "analysis"
