"""OPERA with DummyLM: options, placeholder filling, the rewrite loop and k schedule, the step budget, malformed
outputs, ablation flags, the final synthesis, thread-safe trajectories, demos, save / load and BootstrapFewShot; one
slow run on the real model."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import dspy
import pytest
from dspy.utils.dummies import DummyLM

from rolecall.errors import ConfigError
from rolecall.programs import OPERA
from rolecall.programs.core.memo import OnceMemo
from rolecall.programs.opera import OPERAOptions
from rolecall.retrievers.base import Passage

YES = {"sufficient": "yes", "confidence": "high", "missing_information": "none"}
NO = {"sufficient": "no", "answer": "unknown", "confidence": "low", "missing_information": "the birthplace"}


def plan(*sub_goals: str) -> dict:
    return {"sub_goals": list(sub_goals)}


def yes(answer: str) -> dict:
    return {**YES, "answer": answer}


def test_placeholders_are_filled_with_earlier_answers(retriever):
    lm = DummyLM([plan("Who directed Film X?", "Where was [person from step 1] born?"), yes("Ada Quell"), yes("Varn")])
    program = OPERA(retriever, lm=lm, demos=None, final_synthesis=False)
    pred = program(question="Where was the director of Film X born?")
    assert pred.answer == "Varn"
    assert [q for q, _ in retriever.calls] == ["Who directed Film X?", "Where was Ada Quell born?"]
    analysis = pred.trajectory.role_steps("analysis")
    assert analysis[1].inputs["sub_goal"] == "Where was Ada Quell born?"
    assert pred.sub_goals == [
        {"sub_goal": "Who directed Film X?", "answer": "Ada Quell"},
        {"sub_goal": "Where was Ada Quell born?", "answer": "Varn"},
    ]


def test_repeated_sub_goals_are_dropped_and_placeholders_renumbered(retriever):
    script = [plan("Who directed X?", "who directed X?", "Where was [person from step 2] born?"), yes("Ada"), yes("V")]
    pred = OPERA(retriever, lm=DummyLM(script), demos=None, final_synthesis=False)(question="q?")
    assert [q for q, _ in retriever.calls] == ["Who directed X?", "Where was Ada born?"]
    assert pred.answer == "V" and not any(s.role == "unresolved_placeholder" for s in pred.trajectory.steps)


def test_no_triggers_rewrite_and_the_k_schedule(retriever):
    lm = DummyLM([plan("Where was Ada Quell born?"), NO, {"query": "Ada Quell"}, NO, {"query": "Quell"}, yes("Varn")])
    program = OPERA(retriever, lm=lm, demos=None, final_synthesis=False)
    pred = program(question="Where was Ada Quell born?")
    assert pred.answer == "Varn"
    assert retriever.calls == [("Where was Ada Quell born?", 5), ("Ada Quell", 10), ("Quell", 15)]
    rewrites = pred.trajectory.role_steps("rewrite")
    assert len(rewrites) == 2 and rewrites[0].inputs["missing_information"] == "the birthplace"
    assert [s.meta["k"] for s in pred.trajectory.role_steps("analysis")] == [5, 10, 15]


def test_rewrites_stop_at_max_rewrites_and_custom_schedule(retriever):
    lm = DummyLM([plan("q?"), NO, {"query": "r1"}, NO])
    program = OPERA(retriever, lm=lm, demos=None, max_rewrites=1, k_schedule=(2, 4), final_synthesis=False)
    pred = program(question="q?")
    assert pred.answer == ""  # every attempt said no and gave no answer
    assert retriever.calls == [("q?", 2), ("r1", 4)]
    assert [s.role for s in pred.trajectory.steps if s.kind == "event"] == ["unresolved_sub_goal"]


def test_passages_not_shown_yet_come_first_after_a_rewrite(make_retriever):
    corpus = [Passage(f"d{i}", f"T{i}", f"text {i}") for i in range(15)]
    retriever = make_retriever(lambda q, k: corpus[:k])
    lm = DummyLM([plan("q?"), NO, {"query": "again"}, yes("A")])
    program = OPERA(retriever, lm=lm, demos=None, max_passage_chars=30, max_context_chars=60, final_synthesis=False)
    pred = program(question="q?")
    first, second = pred.trajectory.retrievals()
    assert first.meta["shown_ids"] == ["d0", "d1", "d2"]  # the 60-character budget cut d3 and d4 from the prompt
    shown = pred.trajectory.role_steps("analysis")[1].inputs["passages"]
    assert shown.startswith("[1] T3 | text 3")  # retrieved but never shown: d3 comes before the seen d0
    assert second.meta["shown_ids"][0] == "d3" and "d0" not in second.meta["shown_ids"]


def test_step_budget_exhaustion_is_recorded(retriever):
    lm = DummyLM([plan("a?", "b [x from step 1]?", "c [x from step 2]?"), yes("A"), yes("B")])
    program = OPERA(retriever, lm=lm, demos=None, max_steps=2, final_synthesis=False)
    pred = program(question="abc?")
    events = [s for s in pred.trajectory.steps if s.role == "budget_exhausted"]
    assert len(events) == 1 and events[0].error and events[0].meta["sub_goal"] == 3
    assert pred.answer == "B"  # the last sub-goal that ran
    assert len(pred.trajectory.role_steps("analysis")) == 2


def test_malformed_plan_falls_back_to_the_question(retriever):
    lm = DummyLM([{"nonsense": "x"}, {"nonsense": "y"}, yes("Varn")])
    pred = OPERA(retriever, lm=lm, demos=None, final_synthesis=False)(question="Where was Ada born?")
    assert pred.answer == "Varn"
    plan_step = pred.trajectory.role_steps("plan")[0]
    assert plan_step.error.startswith("parse error") and plan_step.completion is not None
    assert [s.role for s in pred.trajectory.steps if s.kind == "event"] == ["plan_fallback"]
    assert retriever.calls[0][0] == "Where was Ada born?"


def test_empty_plan_falls_back_to_the_question(retriever):
    lm = DummyLM([plan(), yes("Varn")])
    pred = OPERA(retriever, lm=lm, demos=None, final_synthesis=False)(question="Where?")
    assert pred.answer == "Varn"
    assert pred.trajectory.steps[1].role == "plan_fallback" and pred.trajectory.steps[1].meta["reason"] == "plan empty"


def test_malformed_analysis_and_rewrite_are_recorded_and_the_question_returns(retriever):
    garbage = {"nonsense": "x"}
    lm = DummyLM([plan("q?")] + [garbage] * 20)  # each failed call is tried again with DSPy's JSON fallback
    pred = OPERA(retriever, lm=lm, demos=None)(question="q?")
    assert pred.answer == ""
    assert pred.trajectory.parse_rate("analysis") == 0.0 and pred.trajectory.parse_rate("rewrite") == 0.0
    assert any(s.role == "rewrite_fallback" for s in pred.trajectory.steps)
    assert len(pred.trajectory.role_steps("analysis")) == 3
    assert pred.trajectory.steps[-1].role == "synthesis_fallback"  # an unparseable synthesis keeps the last answer


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
    assert list(OPERA(demos=None, use_plan_agent=False, use_rewrite=False).roles) == ["analysis", "synthesis"]
    lm = DummyLM([NO])
    program = OPERA(retriever, lm=lm, demos=None, use_plan_agent=False, use_rewrite=False, final_synthesis=False)
    assert list(program.roles) == ["analysis"]
    pred = program(question="Where was Ada born?")
    assert retriever.calls == [("Where was Ada born?", 5)]
    assert [s.role for s in pred.trajectory.role_steps()] == ["analysis"]
    assert list(OPERA(retriever, demos=None).roles) == ["plan", "analysis", "rewrite", "synthesis"]
    assert list(OPERA(retriever, demos=None, final_synthesis=False).roles) == ["plan", "analysis", "rewrite"]


def test_final_synthesis_is_the_default(retriever):
    """A comparison's answer is no sub-goal's answer: the default synthesis role gives it (paper deviation)."""
    script = [plan("When was A born?", "When was B born?"), yes("1870"), yes("1953"), {"answer": "A"}]
    program = OPERA(retriever, lm=DummyLM(script), demos=None)
    assert program.final_synthesis and "synthesis" in program.roles
    pred = program(question="Who was born first, A or B?")
    assert pred.answer == "A"
    synthesis = pred.trajectory.role_steps("synthesis")
    assert len(synthesis) == 1 and synthesis[0].outputs["answer"] == "A"
    assert synthesis[0].inputs["evidence"] == "When was A born? -> 1870\nWhen was B born? -> 1953"
    assert pred.trajectory.role_steps()[-1].role == "synthesis"


def test_without_final_synthesis_the_last_sub_goal_answers(retriever):
    script = [plan("When was A born?", "When was B born?"), yes("1870"), yes("1953"), {"answer": "A"}]
    program = OPERA(retriever, lm=DummyLM(script), demos=None, final_synthesis=False)
    assert "synthesis" not in program.roles
    pred = program(question="Who was born first, A or B?")
    assert pred.answer == "1953"
    assert [s.role for s in pred.trajectory.role_steps()] == ["plan", "analysis", "analysis"]


def test_synthesis_without_an_answer_falls_back_to_the_last_sub_goal(retriever):
    lm = DummyLM([plan("a?", "b?"), yes("1870"), yes("1953"), {"answer": "unknown"}])
    pred = OPERA(retriever, lm=lm, demos=None)(question="q?")
    assert pred.answer == "1953"
    assert pred.trajectory.steps[-1].role == "synthesis_fallback" and pred.trajectory.steps[-1].meta == {
        "reason": "no answer"
    }


def test_execute_plan_runs_the_executor_and_the_synthesis(retriever):
    program = OPERA(retriever, lm=DummyLM([yes("1870"), yes("1953"), {"answer": "A"}]), demos=None)
    pred = program.execute_plan("Who was born first?", ["When was A born?", " ", "When was B born?"])
    assert pred.answer == "A" and [s.role for s in pred.trajectory.role_steps()] == [
        "analysis",
        "analysis",
        "synthesis",
    ]
    broken = OPERA(retriever, lm=DummyLM([]), demos=None)
    broken._solve = None  # an unexpected bug inside execute_plan becomes an error step
    pred = broken.execute_plan("q?", ["a?"])
    assert pred.answer == "" and pred.trajectory.steps[-1].role == "error"


def test_rewrite_sees_the_passages_within_half_the_context(make_retriever):
    corpus = [Passage(f"d{i}", f"T{i}", "word " * 8) for i in range(5)]  # 48-character lines
    lm = DummyLM([plan("q?"), NO, {"query": "again"}, yes("A")])
    program = OPERA(make_retriever(lambda q, k: corpus[:k]), lm=lm, demos=None, max_context_chars=400)
    shown = program(question="q?").trajectory.role_steps("rewrite")[0].inputs["passages"]
    # whole numbered lines, one per passage, as in the rewrite demos (no passage cut in the middle)
    assert shown.splitlines() == [f"[{i + 1}] T{i} | " + " ".join(["word"] * 8) for i in range(4)]


def test_options_defaults_and_derived_k_schedule():
    options = OPERA(demos=None).options
    assert isinstance(options, OPERAOptions) and options.k_schedule == (5, 10, 15)
    assert (options.max_passage_chars, options.max_context_chars, options.final_synthesis) == (300, 900, True)
    program = OPERA(demos=None, top_k=3)
    assert program.k_schedule == (3, 6, 9) == program.options.k_schedule
    assert OPERA(demos=None, top_k=3, k_schedule=[2, 4]).k_schedule == (2, 4)  # a list becomes a tuple
    assert OPERA(demos=None).config()["options"]["k_schedule"] == [5, 10, 15]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"top_k": 0}, r"option top_k must be an int >= 1, got 0"),
        ({"max_rewrites": -1}, r"option max_rewrites must be an int >= 0, got -1"),
        ({"max_steps": 0}, r"option max_steps must be an int >= 1, got 0"),
        ({"max_sub_goals": 0}, r"option max_sub_goals must be an int >= 1, got 0"),
        ({"max_passage_chars": 10}, r"option max_passage_chars must be an int >= 20, got 10"),
        ({"max_passage_chars": 400, "max_context_chars": 300}, r"max_context_chars \(300\) must be >= max_passage"),
        ({"k_schedule": ()}, r"option k_schedule must be a non-empty list of ints >= 1, got \[\]"),
        ({"k_schedule": (5, 0)}, r"option k_schedule must be a non-empty list of ints >= 1, got \[5, 0\]"),
        ({"k_schedule": ("a",)}, r"option k_schedule must be a list of int or null"),
        ({"use_rewrite": "maybe"}, r"option use_rewrite must be a bool, got 'maybe'"),
        ({"final_synthesis": 1}, r"option final_synthesis must be a bool, got 1"),
        ({"top_k": 2.5}, r"option top_k must be an int >= 1, got 2.5"),
    ],
)
def test_bad_option_values_name_the_option_and_its_range(options, message):
    with pytest.raises(ConfigError, match=message):
        OPERA(demos=None, **options)


def test_unknown_option_lists_the_options():
    with pytest.raises(ConfigError, match=r"OPERA has no option 'no_such_option'; its options are: ") as err:
        OPERA(demos=None, no_such_option=3)
    for name in ("top_k", "k_schedule", "max_rewrites", "max_steps", "max_sub_goals", "max_passage_chars"):
        assert name in str(err.value)
    assert "use_plan_agent" in str(err.value) and "final_synthesis" in str(err.value)


def test_trajectories_are_thread_safe(retriever):
    answers = {}
    for i in range(8):  # DummyLM answers with the first key in the last message: the synthesis key first
        answers[f"-> final{i}"] = {"answer": f"syn{i}"}
    for i in range(8):
        answers[f"Who is person {i}?"] = plan(f"Find alpha-{i}", f"Then [entity from step 1] beta-{i}")
        answers[f"Find alpha-{i}\n"] = yes(f"ans{i}")
        answers[f"Then ans{i} beta-{i}\n"] = yes(f"final{i}")
    program = OPERA(retriever, lm=DummyLM(answers), demos=None)
    with ThreadPoolExecutor(8) as pool:
        preds = list(pool.map(lambda i: program(question=f"Who is person {i}?"), range(8)))
    for i, pred in enumerate(preds):
        assert pred.answer == f"syn{i}"
        steps = pred.trajectory.role_steps()
        assert [s.role for s in steps] == ["plan", "analysis", "analysis", "synthesis"] and all(s.ok for s in steps)
        own = (f"person {i}?", f"alpha-{i}\n", f"ans{i} beta-{i}")
        for step in steps:
            content = step.messages[-1]["content"]
            assert any(tag in content for tag in own)
            assert not any(f"person {j}?" in content or f"alpha-{j}\n" in content for j in range(8) if j != i)
        assert f"ans{i}" in steps[1].completion and f"final{i}" in steps[2].completion


def test_auto_demos_teach_the_placeholder_format():
    program = OPERA()
    assert {role: len(p.demos) for role, p in program.roles.items()} == {
        "plan": 3,
        "analysis": 3,
        "rewrite": 3,
        "synthesis": 3,
    }
    plans = [d.sub_goals for d in program.plan.demos]
    assert any("[entity from step 1]" in s for p in plans for s in p)
    assert {d.sufficient for d in program.analysis.demos} == {"yes", "no"}
    assert all(len(d.passages) < 700 for d in program.analysis.demos)
    custom = {"plan": [dspy.Example(question="q", sub_goals=["q"]).with_inputs("question")]}
    assert len(OPERA(demos=custom).plan.demos) == 1 and OPERA(demos=custom).analysis.demos == []
    ablated = OPERA(use_plan_agent=False, final_synthesis=False)  # demos of the removed roles are skipped
    assert list(ablated.roles) == ["analysis", "rewrite"] and len(ablated.rewrite.demos) == 3
    with pytest.raises(ConfigError, match="unknown roles"):
        OPERA(demos={"planner": []})


def test_save_load_round_trip(tmp_path, retriever):
    program = OPERA(retriever, max_rewrites=1, k_schedule=(3, 6), use_plan_agent=False)
    program.save(tmp_path / "opera")
    loaded = OPERA.load(tmp_path / "opera", retriever=retriever)
    assert loaded.k_schedule == (3, 6) and loaded.max_rewrites == 1 and not loaded.use_plan_agent
    assert list(loaded.roles) == ["analysis", "rewrite", "synthesis"]
    for role, predictor in program.roles.items():
        assert [d.toDict() for d in loaded.roles[role].demos] == [d.toDict() for d in predictor.demos]
        assert loaded.roles[role].demos[0].inputs().keys() == predictor.demos[0].inputs().keys()
    assert loaded.retriever is retriever


def test_bootstrap_few_shot_compiles_opera(retriever):
    trainset = [
        dspy.Example(question=f"Where was person {i} born?", answer="Varn").with_inputs("question") for i in range(2)
    ]
    responses = {}
    for i in range(2):  # DummyLM answers with the first key found in the last message: synthesis, analysis, plan
        responses[f"person {i} born? -> Varn"] = {"answer": "Varn"}
    for i in range(2):
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
    assert len(compiled.plan.demos) == 2 and len(compiled.analysis.demos) == 2 and len(compiled.synthesis.demos) == 2
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
    assert all(s.adapter == s.role for s in role_steps)

    program.save(tmp_path / "opera")
    assert (tmp_path / "opera" / "adapters" / "plan" / "adapter_config.json").is_file()
    loaded = OPERA.load(tmp_path / "opera", retriever=program.retriever, lm=lm)
    assert loaded.role_lm("analysis").adapter == "analysis"


def test_execute_plan_with_a_memo_solves_a_shared_sub_goal_once(retriever):
    """Two plans share "Who directed X?": with a memo its retrieval and analysis run once and both plans read its
    answer; without one, each plan solves it again. Answers are the same either way."""
    first = ["Who directed X?", "Where was [person from step 1] born?"]
    second = ["Who directed X?", "When was [person from step 1] born?"]
    script = [yes("Ada"), yes("Varn"), yes("1901")]
    program = OPERA(retriever, lm=DummyLM(script), demos=None, final_synthesis=False)
    memo = OnceMemo()
    shared = [program.execute_plan("q?", plan, memo=memo).answer for plan in (first, second)]
    assert shared == ["Varn", "1901"] and (memo.misses, memo.hits) == (3, 1)
    assert [q for q, _ in retriever.calls] == ["Who directed X?", "Where was Ada born?", "When was Ada born?"]
    retriever.calls.clear()
    program = OPERA(retriever, lm=DummyLM([yes("Ada"), yes("Varn"), yes("Ada"), yes("1901")]), demos=None,
                    final_synthesis=False)  # fmt: skip
    assert [program.execute_plan("q?", plan).answer for plan in (first, second)] == shared
    assert len(retriever.calls) == 4


def test_a_memoized_sub_goal_spends_the_rounds_it_took_from_the_budget(retriever):
    """The shared sub-goal took three rounds (two rewrites): the plan reusing it has one round left of four."""
    script = [NO, {"query": "X film"}, NO, {"query": "X director"}, yes("Ada"), yes("Varn")]
    program = OPERA(retriever, lm=DummyLM(script), demos=None, final_synthesis=False, max_steps=4)
    memo = OnceMemo()
    plan = ["Who directed X?", "Where was [p from step 1] born?"]
    assert program.execute_plan("q?", plan, memo=memo).answer == "Varn"
    pred = program.execute_plan("q?", ["Who directed X?", "Where was [p from step 1] born?", "Why?"], memo=memo)
    assert pred.answer == "Varn" and memo.hits == 2
    exhausted = [s for s in pred.trajectory.steps if s.role == "budget_exhausted"]
    assert len(exhausted) == 1 and exhausted[0].meta["sub_goal"] == 3
