"""SearchR1Agent with scripted LMs: the search / information / answer loop, per-turn meta and format flags, the tag
parser, the turn budget and forced answer, ablation flags, failures, demos, save / load and BootstrapFewShot."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import dspy
import pytest
from dspy.utils.dummies import DummyLM

from rolecall.data.synthetic import synthetic_world
from rolecall.errors import ConfigError
from rolecall.programs.baselines.search_r1 import SearchR1Agent
from rolecall.programs.baselines.search_r1_actions import FORCE_ANSWER_NOTE, INVALID_ACTION_NOTE, NO_SEARCHES_YET
from rolecall.retrievers.base import Passage
from rolecall.retrievers.bm25 import BM25
from rolecall.utils import SchemaLM, ScriptedTextLM


def turn(action: str, reasoning: str = "think") -> dict:
    return {"reasoning": reasoning, "action": action}


def metas(pred, key):
    return [s.meta[key] for s in pred.trajectory.role_steps("agent")]


# ---------------------------------------------------------------------------------------------------- the loop
def test_search_then_answer_inserts_information(retriever):
    lm = DummyLM([turn("<search>alpha</search>", "find alpha"), turn("<answer>Varn</answer>")])
    pred = SearchR1Agent(retriever, lm=lm, demos=None)(question="Where was Ada born?")
    assert pred.answer == "Varn" and pred.searches == 1 and pred.format_valid
    assert retriever.calls == [("alpha", 3)]
    assert [(s.kind, s.role) for s in pred.trajectory.steps] == [
        ("role", "agent"),
        ("retrieval", "retrieve"),
        ("role", "agent"),
    ]
    first, second = pred.trajectory.role_steps("agent")
    assert first.inputs["interaction"] == NO_SEARCHES_YET
    assert second.inputs["interaction"] == (
        "<think>find alpha</think>\n<search>alpha</search>\n<information>[1] Title 0 | Some text number 0.\n"
        "[2] Title 1 | Some text number 1.\n[3] Title 2 | Some text number 2.</information>"
    )
    assert first.meta == {
        "turn": 0,
        "action": "search",
        "valid_action": True,
        "format_error": None,
        "forced": False,
        "query": "alpha",
    }
    assert second.meta["action"] == "answer" and second.meta["answer"] == "Varn" and second.meta["turn"] == 1
    assert pred.trajectory.retrievals()[0].meta["turn"] == 0
    assert pred.interaction == second.inputs["interaction"]


def test_invalid_actions_are_flagged_and_the_agent_is_told(retriever):
    lm = DummyLM([turn("I am not sure"), turn("ok <search>beta"), turn("<answer>B</answer>")])
    pred = SearchR1Agent(retriever, lm=lm, demos=None)(question="q?")
    assert pred.answer == "B" and not pred.format_valid
    assert metas(pred, "action") == ["invalid", "search", "answer"]
    assert metas(pred, "valid_action") == [False, False, True]
    assert metas(pred, "format_error")[:2] == ["action field: no <search> or <answer> tag", "unclosed action tag"]
    assert retriever.calls == [("beta", 3)]  # the sloppy search still ran
    second = pred.trajectory.role_steps("agent")[1]
    assert INVALID_ACTION_NOTE in second.inputs["interaction"]


def test_tags_are_recovered_from_an_unparseable_completion(retriever):
    # each turn is two LM calls: ChatAdapter's, then DSPy's JSON-adapter fallback after the parse failure
    lm = ScriptedTextLM(["<search>gamma</search>", "no json", "Sure. <answer>G</answer>", "no json"])
    pred = SearchR1Agent(retriever, lm=lm, demos=None)(question="q?")
    first = pred.trajectory.role_steps("agent")[0]
    assert len(first.meta["attempts"]) == 2
    assert first.error and first.meta["action"] == "search" and first.meta["valid_action"] is False
    assert "output did not parse" in first.meta["format_error"]
    assert retriever.calls == [("gamma", 3)] and pred.answer == "G"


def test_the_salvaged_action_field_wins_over_a_stray_tag(retriever):
    """A completion without its reasoning section fails to parse; the tag inside its ``action`` section is used
    (before, the first tag anywhere in the completion was: here the stray search)."""
    completion = "I could <search>wrong</search>\n\n[[ ## action ## ]]\n<answer>X</answer>\n\n[[ ## completed ## ]]"
    pred = SearchR1Agent(retriever, lm=ScriptedTextLM([completion, "no json"]), demos=None)(question="q?")
    step = pred.trajectory.role_steps("agent")[0]
    assert step.error and step.meta["salvaged"]["action"] == "<answer>X</answer>"
    assert pred.answer == "X" and retriever.calls == [] and step.meta["valid_action"] is False


def test_strict_format_treats_sloppy_actions_as_invalid(retriever):
    lm = DummyLM([turn("ok <search>beta"), turn("<answer>B</answer>")])
    pred = SearchR1Agent(retriever, lm=lm, demos=None, strict_format=True)(question="q?")
    assert metas(pred, "action") == ["invalid", "answer"] and retriever.calls == []
    assert pred.answer == "B"
    lm = ScriptedTextLM(["<search>gamma</search>"])
    pred = SearchR1Agent(retriever, lm=lm, demos=None, strict_format=True, max_turns=1)(question="q?")
    assert retriever.calls == [] and metas(pred, "action") == ["invalid", "invalid"]


def test_turn_budget_then_forced_answer(retriever):
    lm = DummyLM([turn(f"<search>q{i}</search>") for i in range(2)] + [turn("<answer>Late</answer>")])
    pred = SearchR1Agent(retriever, lm=lm, demos=None, max_turns=2)(question="q?")
    assert pred.answer == "Late" and pred.searches == 2 and len(retriever.calls) == 2
    budget = [s for s in pred.trajectory.steps if s.role == "budget_exhausted"]
    assert len(budget) == 1 and budget[0].error and budget[0].meta["max_turns"] == 2
    forced = pred.trajectory.role_steps("agent")[-1]
    assert forced.meta["forced"] is True and forced.meta["turn"] == 2
    assert forced.inputs["interaction"].endswith(FORCE_ANSWER_NOTE)
    assert pred.trajectory.steps.index(budget[0]) < pred.trajectory.steps.index(forced)


def test_a_search_in_the_forced_turn_gives_no_answer(retriever):
    lm = DummyLM([turn("<search>a</search>"), turn("<search>b</search>")])
    pred = SearchR1Agent(retriever, lm=lm, demos=None, max_turns=1)(question="q?")
    assert pred.answer == "" and len(retriever.calls) == 1
    forced = pred.trajectory.role_steps("agent")[-1]
    assert forced.meta["action"] == "invalid" and forced.meta["valid_action"] is False
    assert pred.trajectory.steps[-1].role == "no_answer" and pred.trajectory.steps[-1].error


def test_force_answer_off(retriever):
    lm = DummyLM([turn("<search>a</search>")])
    pred = SearchR1Agent(retriever, lm=lm, demos=None, max_turns=1, force_answer=False)(question="q?")
    assert pred.answer == "" and len(pred.trajectory.role_steps("agent")) == 1
    assert pred.trajectory.steps[-1].role == "budget_exhausted"


def test_show_reasoning_off_hides_think_blocks(retriever):
    lm = DummyLM([turn("<search>a</search>", "secret plan"), turn("<answer>A</answer>")])
    pred = SearchR1Agent(retriever, lm=lm, demos=None, show_reasoning=False)(question="q?")
    interaction = pred.trajectory.role_steps("agent")[1].inputs["interaction"]
    assert interaction.startswith("<search>a</search>\n<information>") and "secret plan" not in interaction
    demos = SearchR1Agent(retriever, show_reasoning=False).roles["agent"].demos
    assert all("<think>" not in d.interaction for d in demos)


def test_failing_and_empty_retrieval(make_retriever):
    lm = DummyLM([turn("<search>a</search>"), turn("<answer>A</answer>")])
    pred = SearchR1Agent(make_retriever(error=RuntimeError("no index")), lm=lm, demos=None)(question="q?")
    assert "no index" in pred.trajectory.retrievals()[0].error and pred.answer == "A"
    assert "<information>(no passages)</information>" in pred.interaction
    lm = DummyLM([turn("<search>a</search>"), turn("<answer>A</answer>")])
    pred = SearchR1Agent(make_retriever(lambda q, k: []), lm=lm, demos=None)(question="q?")
    assert pred.trajectory.retrievals()[0].error == "empty retrieval"


def test_garbage_and_failing_lm_never_raise(retriever):
    pred = SearchR1Agent(retriever, lm=ScriptedTextLM(["the the the"]), demos=None, max_turns=2)(question="q?")
    assert pred.answer == "" and pred.trajectory.parse_rate() == 0.0 and not pred.format_valid
    assert len(pred.trajectory.role_steps("agent")) == 3 and retriever.calls == []

    class Boom(DummyLM):
        def __call__(self, *args, **kwargs):
            raise RuntimeError("no model")

    pred = SearchR1Agent(retriever, lm=Boom([]), demos=None)(question="q?")
    assert pred.answer == "" and all(s.error for s in pred.trajectory.role_steps())
    broken = SearchR1Agent(retriever, lm=Boom([]), demos=None)
    broken._act = None  # an unexpected bug inside forward becomes an error step
    pred = broken(question="q?")
    assert pred.answer == "" and pred.trajectory.steps[-1].role == "error"


def test_trajectories_are_thread_safe(make_retriever):
    answers = {}
    for i in range(8):
        answers[f"Who is person {i}?\n\n[[ ## interaction ## ]]\n{NO_SEARCHES_YET}"] = turn(
            f"<search>alpha-{i}</search>"
        )
        answers[f"about alpha-{i}"] = turn(f"<answer>ans{i}</answer>")
    retriever = make_retriever(lambda q, k: [Passage(f"id-{q}", q, f"about {q}")])
    program = SearchR1Agent(retriever, lm=DummyLM(answers), demos=None)
    with ThreadPoolExecutor(8) as pool:
        preds = list(pool.map(lambda i: program(question=f"Who is person {i}?"), range(8)))
    for i, pred in enumerate(preds):
        assert pred.answer == f"ans{i}" and pred.trajectory.retrieved_ids == [f"id-alpha-{i}"]


# ---------------------------------------------------------------------------------------------------- options
def test_options_are_validated(retriever):
    assert len(SearchR1Agent(retriever).roles["agent"].demos) == 3
    assert not SearchR1Agent(retriever, demos=None).roles["agent"].demos
    assert list(SearchR1Agent(retriever).roles) == ["agent"]
    with pytest.raises(ConfigError):
        SearchR1Agent(retriever, demos={"react": []})
    with pytest.raises(ConfigError):
        SearchR1Agent(retriever, demos=[])
    with pytest.raises(ConfigError):
        SearchR1Agent(retriever, max_turns=0)
    with pytest.raises(ConfigError):
        SearchR1Agent(retriever, top_k=0)
    with pytest.raises(ConfigError, match="option strict_format must be a bool"):
        SearchR1Agent(retriever, strict_format="yes")  # accepted silently before the options dataclass


def test_save_load_round_trip(retriever, tmp_path):
    program = SearchR1Agent(retriever, top_k=2, max_turns=3, strict_format=True, show_reasoning=False)
    program.save(tmp_path)
    loaded = SearchR1Agent.load(tmp_path, retriever=retriever)
    assert loaded.config() == program.config()
    assert (loaded.top_k, loaded.max_turns, loaded.strict_format, loaded.show_reasoning) == (2, 3, True, False)
    assert [d.action for d in loaded.roles["agent"].demos] == [d.action for d in program.roles["agent"].demos]
    assert loaded.roles["agent"].signature.instructions == program.roles["agent"].signature.instructions


def test_bootstrap_fewshot_compiles_search_r1():
    world = synthetic_world(seed=5, n_train=10, n_dev=2, n_test=2)
    lm = SchemaLM(world.train[0].answer)
    program = SearchR1Agent(BM25(world.corpus), lm=lm, max_turns=2)
    trainset = [e.to_dspy() for e in world.train[:3]]
    with dspy.context(lm=lm):
        optimizer = dspy.BootstrapFewShot(
            metric=lambda e, p, t=None: True, max_bootstrapped_demos=1, max_labeled_demos=0, max_rounds=1
        )
        compiled = optimizer.compile(program, trainset=trainset)
        pred = compiled(question=world.test[0].question)
    assert isinstance(pred.answer, str) and pred.trajectory.role_steps("agent")
    assert set(compiled.roles) == {"agent"} and len(compiled.roles["agent"].demos) == 1
