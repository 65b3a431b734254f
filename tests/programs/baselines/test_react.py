"""ReActAgent with scripted LMs: DSPy's ReAct loop with recorded role calls and searches, max_iters, malformed output,
bad tool arguments, failing retrieval, thread safety, demos, save / load and BootstrapFewShot."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import dspy
import pytest
from dspy.clients.engines.dummy_engine import DummyEngine
from dspy.lm15 import Message, Response, TextPart, Usage
from dspy.utils.dummies import DummyLM

from rolecall.data.synthetic import synthetic_world
from rolecall.errors import ConfigError
from rolecall.programs.baselines.react import ReActAgent
from rolecall.retrievers.base import Passage
from rolecall.retrievers.bm25 import BM25
from rolecall.retrievers.tool import NO_PASSAGES
from rolecall.signatures.baselines import REACT_HISTORY_FIELD
from rolecall.utils import SchemaLM


def act(tool: str, thought: str = "think", **args: str) -> dict:
    return {"next_thought": thought, "next_tool_name": tool, "next_tool_args": args}


def extract(answer: str) -> dict:
    return {"reasoning": "so", "answer": answer}


class FnLM(DummyLM):
    """A DummyLM whose completion is ``fn(last user message)`` (thread-safe; for prompt-dependent answers)."""

    def __init__(self, fn):
        super().__init__([])
        owner = self

        class _Engine(DummyEngine):
            def _complete_messages(self, messages):
                text = fn(messages[-1]["content"])
                return Response(
                    id=None,
                    model="dummy",
                    message=Message.assistant([TextPart(text)]),
                    finish_reason="stop",
                    usage=Usage(input_tokens=0, output_tokens=0, total_tokens=0),
                )

        self._engine_spec = _Engine(owner)


def chat(**fields) -> str:
    body = "".join(f"[[ ## {k} ## ]]\n{v}\n\n" for k, v in fields.items())
    return body + "[[ ## completed ## ]]"


def test_roles_are_dspy_react_predictors(retriever):
    program = ReActAgent(retriever, demos=None, top_k=4)
    assert list(program.roles) == ["react", "extract"]
    react = program.roles["react"].signature
    assert list(react.input_fields) == ["question", REACT_HISTORY_FIELD]
    assert list(react.output_fields) == ["next_thought", "next_tool_name", "next_tool_args"]
    assert "(1) search" in react.instructions and "top 4 passages" in react.instructions
    assert "(2) finish" in react.instructions
    extract_sig = program.roles["extract"].signature
    assert list(extract_sig.input_fields) == ["question", REACT_HISTORY_FIELD]
    assert list(extract_sig.output_fields) == ["reasoning", "answer"]


def test_loop_records_every_call_and_search(retriever):
    lm = DummyLM([act("search", query="alpha"), act("search", query="beta"), act("finish"), extract("Varn")])
    pred = ReActAgent(retriever, lm=lm, demos=None)(question="Where was Ada born?")
    assert pred.answer == "Varn"
    assert retriever.calls == [("alpha", 3), ("beta", 3)]
    kinds = [(s.kind, s.role) for s in pred.trajectory.steps]
    assert kinds == [
        ("role", "react"),
        ("retrieval", "retrieve"),
        ("role", "react"),
        ("retrieval", "retrieve"),
        ("role", "react"),
        ("role", "extract"),
    ]
    reacts = pred.trajectory.role_steps("react")
    assert [s.meta["iteration"] for s in reacts] == [0, 1, 2]
    assert [s.meta["tool_name"] for s in reacts] == ["search", "search", "finish"]
    assert reacts[0].meta["tool_args"] == {"query": "alpha"}
    assert [s.meta["iteration"] for s in pred.trajectory.retrievals()] == [0, 1]
    # the second turn sees the first observation, the exact messages are recorded
    assert reacts[0].inputs[REACT_HISTORY_FIELD] == ""
    assert "[[ ## observation_0 ## ]]\n[1] Title 0 | Some text number 0." in reacts[1].inputs[REACT_HISTORY_FIELD]
    assert "observation_0" in reacts[1].messages[-1]["content"] and reacts[1].completion
    assert "observation_1" in pred.trajectory.role_steps("extract")[0].inputs[REACT_HISTORY_FIELD]
    assert pred.react_steps["tool_args_1"] == {"query": "beta"}
    assert not [s for s in pred.trajectory.steps if s.kind == "event"]


def test_observations_are_cut_to_the_passage_limits(make_retriever):
    long = [Passage(f"d{i}", f"T{i}", "word " * 100) for i in range(3)]
    lm = DummyLM([act("search", query="q"), act("finish"), extract("A")])
    program = ReActAgent(make_retriever(lambda q, k: long[:k]), lm=lm, demos=None, max_passage_chars=50)
    pred = program(question="q?")
    observation = pred.react_steps["observation_0"]
    assert observation.startswith("[1] T0 | word") and all(len(line) <= 55 for line in observation.splitlines())


def test_max_iters_stops_the_loop_and_the_answer_is_still_extracted(retriever):
    lm = DummyLM([act("search", query="a"), act("search", query="b"), extract("B")])
    pred = ReActAgent(retriever, lm=lm, demos=None, max_iters=2)(question="q?")
    assert pred.answer == "B"
    assert len(pred.trajectory.role_steps("react")) == 2 and len(retriever.calls) == 2
    events = [s for s in pred.trajectory.steps if s.kind == "event"]
    assert [e.role for e in events] == ["budget_exhausted"] and events[0].error and events[0].meta["max_iters"] == 2


def test_unparseable_react_output_ends_the_loop_with_a_recorded_error(retriever):
    lm = DummyLM([act("search", query="a"), {"nonsense": "x"}, {"nonsense": "y"}, extract("A")])
    pred = ReActAgent(retriever, lm=lm, demos=None)(question="q?")
    assert pred.answer == "A"
    reacts = pred.trajectory.role_steps("react")
    assert len(reacts) == 2 and reacts[1].error.startswith("parse error") and reacts[1].meta["iteration"] == 1
    fallback = [s for s in pred.trajectory.steps if s.role == "fallback"]
    assert fallback and fallback[0].meta == {"reason": "react output unparseable", "iteration": 1}
    assert pred.trajectory.steps[-1].role == "extract"


def test_unknown_tool_name_is_a_parse_failure(retriever):
    lm = DummyLM([act("lookup", query="a"), {"nonsense": "y"}, extract("A")])
    pred = ReActAgent(retriever, lm=lm, demos=None)(question="q?")
    assert pred.trajectory.role_steps("react")[0].error and retriever.calls == []
    assert pred.answer == "A"


def test_bad_tool_arguments_become_an_error_observation(retriever):
    lm = DummyLM([act("search", q="a"), act("finish"), extract("A")])
    pred = ReActAgent(retriever, lm=lm, demos=None)(question="q?")
    assert retriever.calls == []
    tool_errors = [s for s in pred.trajectory.steps if s.role == "tool_error"]
    assert len(tool_errors) == 1 and tool_errors[0].error and tool_errors[0].meta["iteration"] == 0
    assert pred.react_steps["observation_0"].startswith("Execution error in search")
    assert pred.answer == "A"


def test_failing_and_empty_retrieval_are_recorded(make_retriever):
    lm = DummyLM([act("search", query="a"), act("finish"), extract("")])
    pred = ReActAgent(make_retriever(error=RuntimeError("no index")), lm=lm, demos=None)(question="q?")
    assert "no index" in pred.trajectory.retrievals()[0].error
    assert pred.react_steps["observation_0"] == NO_PASSAGES and pred.answer == ""
    lm = DummyLM([act("search", query=""), act("finish"), extract("A")])
    pred = ReActAgent(make_retriever(lambda q, k: []), lm=lm, demos=None)(question="q?")
    assert pred.trajectory.retrievals()[0].error == "empty query"


def test_garbage_and_failing_lm_never_raise(retriever):
    pred = ReActAgent(retriever, lm=DummyLM([{"nonsense": "x"}] * 6), demos=None)(question="q?")
    assert pred.answer == "" and pred.trajectory.parse_rate() == 0.0
    assert [s.role for s in pred.trajectory.role_steps()] == ["react", "extract"]

    class Boom(DummyLM):
        def __call__(self, *args, **kwargs):
            raise RuntimeError("no model")

    pred = ReActAgent(retriever, lm=Boom([]), demos=None)(question="q?")
    assert pred.answer == "" and all(s.error for s in pred.trajectory.role_steps())
    broken = ReActAgent(retriever, lm=Boom([]), demos=None)
    broken._search_tool = None  # an unexpected bug inside forward becomes an error step
    pred = broken(question="q?")
    assert pred.answer == "" and pred.trajectory.steps[-1].role == "error"


def test_adapter_option_is_used(retriever):
    lm = DummyLM([act("finish"), extract("A")], adapter=dspy.JSONAdapter())
    pred = ReActAgent(retriever, lm=lm, demos=None, adapter=dspy.JSONAdapter())(question="q?")
    assert pred.answer == "A" and pred.trajectory.parse_rate() == 1.0


def test_trajectories_are_thread_safe(make_retriever):
    def respond(prompt: str) -> str:
        n = prompt.split("Who is person ", 1)[1].split("?", 1)[0]
        if "next_thought" not in prompt:
            return chat(reasoning="r", answer=f"ans{n}")
        if "observation_0" in prompt:
            return chat(next_thought="done", next_tool_name="finish", next_tool_args="{}")
        return chat(next_thought="go", next_tool_name="search", next_tool_args=f'{{"query": "alpha-{n}"}}')

    retriever = make_retriever(lambda q, k: [Passage(f"id-{q}", q, f"about {q}")])
    program = ReActAgent(retriever, lm=FnLM(respond), demos=None)
    with ThreadPoolExecutor(8) as pool:
        preds = list(pool.map(lambda i: program(question=f"Who is person {i}?"), range(8)))
    for i, pred in enumerate(preds):
        assert pred.answer == f"ans{i}"
        assert pred.trajectory.retrieved_ids == [f"id-alpha-{i}"]
        assert len(pred.trajectory.steps) == 4


def test_program_uses_auto_demos_and_validates_options(retriever):
    program = ReActAgent(retriever)
    assert len(program.roles["react"].demos) == 3 and len(program.roles["extract"].demos) == 3
    assert all(not p.demos for p in ReActAgent(retriever, demos=None).roles.values())
    with pytest.raises(ConfigError):
        ReActAgent(retriever, demos={"planner": []})
    with pytest.raises(ConfigError):
        ReActAgent(retriever, demos="some")
    with pytest.raises(ConfigError):
        ReActAgent(retriever, max_iters=0)
    with pytest.raises(ConfigError):
        ReActAgent(retriever, max_passage_chars=500, max_context_chars=100)
    with pytest.raises(ConfigError, match="ReActAgent has no option 'max_turns'"):
        ReActAgent(retriever, max_turns=3)  # a TypeError before the options dataclass


def test_save_load_round_trip(retriever, tmp_path):
    program = ReActAgent(retriever, top_k=2, max_iters=3, max_passage_chars=100, max_context_chars=300)
    program.save(tmp_path)
    loaded = ReActAgent.load(tmp_path, retriever=retriever)
    assert loaded.config() == program.config() and loaded.max_iters == 3 and loaded.top_k == 2
    for role, predictor in program.roles.items():
        assert len(loaded.roles[role].demos) == len(predictor.demos)
        assert loaded.roles[role].signature.instructions == predictor.signature.instructions
    assert loaded.roles["react"].demos[0].next_tool_args == {}
    lm = DummyLM([act("search", query="a"), act("finish"), extract("A")])
    loaded.set_role_lm("react", lm)
    loaded.set_role_lm("extract", lm)
    assert loaded(question="q?").answer == "A"


def test_bootstrap_fewshot_compiles_react():
    world = synthetic_world(seed=5, n_train=10, n_dev=2, n_test=2)
    lm = SchemaLM(world.train[0].answer)
    program = ReActAgent(BM25(world.corpus), lm=lm, max_iters=2)
    trainset = [e.to_dspy() for e in world.train[:3]]
    with dspy.context(lm=lm):
        optimizer = dspy.BootstrapFewShot(
            metric=lambda e, p, t=None: True, max_bootstrapped_demos=1, max_labeled_demos=0, max_rounds=1
        )
        compiled = optimizer.compile(program, trainset=trainset)
        pred = compiled(question=world.test[0].question)
    assert isinstance(pred.answer, str) and pred.trajectory.role_steps("react")
    assert set(compiled.roles) == {"react", "extract"}
    assert len(compiled.roles["react"].demos) == 1 and REACT_HISTORY_FIELD in compiled.roles["react"].demos[0]
