"""MultiAgent-OPD teams with scripted LMs: Searcher ReAct turns, Leader waves (concurrent Searchers), step / round /
turn limits, fallbacks on malformed output, C_tool, the Answerer's candidate vote, shared vs per-role adapter groups,
save / load and BootstrapFewShot."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dspy
import pytest
from dspy.lm15 import Message, Response, TextPart, Usage
from dspy.utils.dummies import DummyLM

from rolecall.errors import ConfigError
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.programs.team.program import CascadedTeam, HierarchicalTeam, tool_steps
from rolecall.signatures.team import ROLE_PROMPTS
from rolecall.utils import SchemaLM

Script = Callable[[dict[str, str]], Any]
_INPUT = re.compile(r"\[\[ ## (\w+) ## \]\]\n(.*?)(?=\n\n\[\[ ## |\n\nRespond with|\Z)", re.DOTALL)


class _ScriptEngine:
    """Answers each call with ``scripts[role](inputs)``: a dict of output fields, or a raw completion string."""

    def __init__(self, scripts: dict[str, Script]) -> None:
        self.scripts = scripts
        self.calls: list[tuple[str, dict[str, str]]] = []
        self._lock = threading.Lock()

    def complete(self, request: Any) -> Response:
        system = request.system if isinstance(request.system, str) else "".join(p.text for p in request.system or ())
        role = next(r for r, prompt in ROLE_PROMPTS.items() if prompt in system)
        inputs = dict(_INPUT.findall(request.messages[-1].text or ""))
        with self._lock:
            self.calls.append((role, inputs))
        out = self.scripts[role](inputs)
        text = out if isinstance(out, str) else "".join(f"[[ ## {k} ## ]]\n{_value(v)}\n\n" for k, v in out.items())
        return Response(
            id=None,
            model=request.model,
            message=Message.assistant([TextPart(text + "[[ ## completed ## ]]")]),
            finish_reason="stop",
            usage=Usage(input_tokens=0, output_tokens=0, total_tokens=0),
        )

    def stream(self, request: Any):
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


def _value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


class ScriptLM(dspy.LM):
    """A scripted LM that dispatches on the role prompt of the call and reads the call's input fields."""

    def __init__(self, **scripts: Script) -> None:
        self.engine_impl = _ScriptEngine(scripts)
        super().__init__("dummy/script", engine=self.engine_impl, cache=False, num_retries=0)

    def roles_called(self) -> list[str]:
        return [role for role, _ in self.engine_impl.calls]


def delegate(*subtasks: str) -> dict:
    return {"action": "delegate", "subtasks": list(subtasks), "selected": []}


def answer_with(*numbers: int) -> dict:
    return {"action": "answer", "subtasks": [], "selected": list(numbers)}


def search(query: str) -> dict:
    return {"action": "search", "content": query}


def report(text: str) -> dict:
    return {"action": "report", "content": text}


def search_then_report(inputs: dict[str, str]) -> dict:
    """Search the subtask's last word first, report once the notes hold a search."""
    if inputs["notes"] == "none yet":
        return search(inputs["subtask"].rstrip("?").split()[-1])
    return report(f"found {inputs['subtask'].rstrip('?').split()[-1]}")


def _events(pred: dspy.Prediction) -> list[str]:
    return [s.role for s in pred.trajectory.steps if s.kind == "event"]


# ---------------------------------------------------------------------------------------------------- cascaded


def test_cascaded_searcher_searches_reports_and_answerer_answers(retriever):
    def searcher(inputs):
        return search("Ada Quell") if inputs["notes"] == "none yet" else report("Varn (from Ada Quell)")

    lm = ScriptLM(searcher=searcher, answerer=lambda i: {"answer": "Varn"})
    program = CascadedTeam(retriever, lm=lm, demos=None)
    pred = program(question="Where was Ada Quell born?")
    assert pred.answer == "Varn" and pred.report == "Varn (from Ada Quell)"
    assert retriever.calls == [("Ada Quell", 3)]  # top_k defaults to the paper's 3 passages
    steps = pred.trajectory.steps
    assert [(s.kind, s.role) for s in steps] == [
        ("role", "searcher"),
        ("retrieval", "retrieve"),
        ("role", "searcher"),
        ("role", "answerer"),
    ]
    assert steps[0].inputs == {"subtask": "Where was Ada Quell born?", "notes": "none yet"}  # the question itself
    assert steps[2].inputs["notes"].startswith("Search 1: Ada Quell\n[1] Title 0 | Some text number 0.")
    assert [(s.meta["searcher"], s.meta["turn"], s.meta["wave"], s.meta["env_step"]) for s in steps[:3]] == [
        (1, 0, 1, 1),
        (1, 0, 1, 1),
        (1, 1, 1, 2),
    ]
    assert steps[0].meta["action"] == "search" and steps[2].meta["action"] == "report"
    assert steps[3].inputs["reports"] == "[1] Where was Ada Quell born? -> Varn (from Ada Quell)"
    assert pred.tool_steps == 1 and pred.env_steps == 2 and pred.candidates == ["Varn"]


@pytest.mark.parametrize("max_steps", [5, 2])
def test_cascaded_step_budget_forces_a_report(retriever, max_steps):
    lm = ScriptLM(searcher=lambda i: search("again"), answerer=lambda i: {"answer": "x"})
    pred = CascadedTeam(retriever, lm=lm, demos=None, max_steps=max_steps)(question="q?")
    assert len(retriever.calls) == max_steps and pred.env_steps == max_steps and pred.tool_steps == max_steps
    (event,) = [s for s in pred.trajectory.steps if s.role == "budget_exhausted"]
    assert event.error and event.meta["searchers"] == [1]
    assert pred.report.startswith("(unfinished) Title 0: Some text number 0.")
    assert pred.trajectory.role_steps()[-1].role == "answerer" and pred.answer == "x"


# ---------------------------------------------------------------------------------------------------- hierarchical


def test_leader_runs_waves_and_hands_selected_reports_to_the_answerer(retriever):
    def leader(inputs):
        if inputs["reports"] == "none yet":
            return delegate("Who directed Film X?")
        if "[2]" not in inputs["reports"]:
            return delegate("Where was Ada Quell born?")
        return answer_with(2)

    def searcher(inputs):
        if inputs["notes"] == "none yet":
            return search("Film X" if "Film X" in inputs["subtask"] else "Ada Quell")
        return report("Ada Quell (from Film X)" if "Film X" in inputs["subtask"] else "Varn (from Ada Quell)")

    lm = ScriptLM(leader=leader, searcher=searcher, answerer=lambda i: {"answer": "Varn"})
    pred = HierarchicalTeam(retriever, lm=lm, demos=None)(question="Where was the director of Film X born?")
    assert pred.answer == "Varn"
    assert lm.roles_called() == [
        "leader",
        "searcher",
        "searcher",
        "leader",
        "searcher",
        "searcher",
        "leader",
        "answerer",
    ]
    assert [q for q, _ in retriever.calls] == ["Film X", "Ada Quell"]
    leaders = pred.trajectory.role_steps("leader")
    assert leaders[1].inputs["reports"] == "[1] Who directed Film X? -> Ada Quell (from Film X)"
    assert [(s.meta["round"], s.meta["env_step"], s.meta["action"]) for s in leaders] == [
        (1, 1, "delegate"),
        (2, 4, "delegate"),
        (3, 7, "answer"),
    ]
    answerer = pred.trajectory.role_steps("answerer")[0]
    assert answerer.inputs["reports"] == "[2] Where was Ada Quell born? -> Varn (from Ada Quell)"
    assert pred.selected == [2] and pred.rounds == 2 and pred.env_steps == 7 and pred.tool_steps == 2
    assert [(r["index"], r["wave"], r["forced"]) for r in pred.reports] == [(1, 1, False), (2, 2, False)]
    searchers = pred.trajectory.role_steps("searcher")
    assert [(s.meta["searcher"], s.meta["wave"], s.meta["turn"]) for s in searchers] == [
        (1, 1, 0),
        (1, 1, 1),
        (2, 2, 0),
        (2, 2, 1),
    ]
    retrievals = pred.trajectory.retrievals()  # recorded by the Searchers' search loops, with the turn's meta
    assert [{k: s.meta[k] for k in ("searcher", "turn", "wave", "env_step", "fallback")} for s in retrievals] == [
        {"searcher": 1, "turn": 0, "wave": 1, "env_step": 2, "fallback": False},
        {"searcher": 2, "turn": 0, "wave": 2, "env_step": 5, "fallback": False},
    ]


def test_searchers_of_a_wave_run_concurrently_and_share_environment_steps(retriever):
    barrier = threading.Barrier(2, timeout=20)

    def searcher(inputs):
        if inputs["notes"] == "none yet":
            barrier.wait()  # both first turns must be in flight at once, or this times out
            return search(inputs["subtask"])
        return report(f"done {inputs['subtask']}")

    lm = ScriptLM(
        leader=lambda i: delegate("alpha", "beta") if i["reports"] == "none yet" else answer_with(1, 2),
        searcher=searcher,
        answerer=lambda i: {"answer": "ok"},
    )
    pred = HierarchicalTeam(retriever, lm=lm, demos=None)(question="q?")
    searchers = pred.trajectory.role_steps("searcher")
    assert all(s.ok for s in searchers) and len(searchers) == 4
    # steps join the trajectory in Searcher order within each environment step
    assert [(s.meta["env_step"], s.meta["searcher"]) for s in searchers] == [(2, 1), (2, 2), (3, 1), (3, 2)]
    assert sorted(q for q, _ in retriever.calls) == ["alpha", "beta"]
    assert pred.tool_steps == 1  # two searches in one environment step count once (C_tool)
    assert pred.env_steps == 4 and pred.answer == "ok"


def test_rounds_are_limited_and_a_late_delegation_hands_over_every_report(retriever):
    lm = ScriptLM(leader=lambda i: delegate("more?"), searcher=search_then_report, answerer=lambda i: {"answer": "a"})
    pred = HierarchicalTeam(retriever, lm=lm, demos=None, max_rounds=2)(question="q?")
    assert lm.roles_called().count("leader") == 3 and pred.rounds == 2
    event = next(s for s in pred.trajectory.steps if s.role == "round_limit")
    assert event.error and event.meta["max_rounds"] == 2
    assert pred.selected == [1, 2]
    assert pred.trajectory.role_steps("answerer")[0].inputs["reports"].count("\n") == 1  # both reports


def test_step_budget_stops_searchers_and_the_leader(retriever):
    lm = ScriptLM(
        leader=lambda i: delegate("a?"), searcher=lambda i: search("again"), answerer=lambda i: {"answer": ""}
    )
    pred = HierarchicalTeam(retriever, lm=lm, demos=None, max_steps=3)(question="q?")
    assert len(retriever.calls) == 2 and pred.env_steps == 3
    exhausted = [s for s in pred.trajectory.steps if s.role == "budget_exhausted"]
    assert len(exhausted) == 2 and all(s.error for s in exhausted)  # inside the wave, then before Leader round 2
    assert exhausted[1].meta["round"] == 2
    assert pred.reports[0]["forced"] and pred.selected == [1]
    assert pred.trajectory.role_steps()[-1].role == "answerer" and pred.answer == ""


def test_searcher_turn_limit_and_subtask_truncation(retriever):
    lm = ScriptLM(
        leader=lambda i: delegate("a", "b", "c", "d") if i["reports"] == "none yet" else answer_with(1),
        searcher=lambda i: search("again"),
        answerer=lambda i: {"answer": "z"},
    )
    pred = HierarchicalTeam(retriever, lm=lm, demos=None, max_subtasks=2, max_searcher_turns=2)(question="q?")
    truncated = next(s for s in pred.trajectory.steps if s.role == "subtasks_truncated")
    assert truncated.meta == {"round": 1, "planned": 4, "kept": 2}
    (limit,) = [s for s in pred.trajectory.steps if s.role == "searcher_turn_limit"]  # one event for the wave
    assert limit.error and limit.meta["searchers"] == [1, 2] and "budget_exhausted" not in _events(pred)
    assert [r["searches"] for r in pred.reports] == [2, 2] and all(r["forced"] for r in pred.reports)
    assert len(retriever.calls) == 4 and [r["subtask"] for r in pred.reports] == ["a", "b"]
    assert pred.selected == [1]


def test_malformed_leader_output_falls_back(retriever):
    lm = ScriptLM(leader=lambda i: "I think we should search.", searcher=search_then_report, answerer=lambda i: {})
    pred = HierarchicalTeam(retriever, lm=lm, demos=None)(question="Where is Varn?")
    leaders = pred.trajectory.role_steps("leader")
    assert len(leaders) == 2 and all(s.error.startswith("parse error") for s in leaders)
    assert [s.meta["action"] for s in leaders] == ["delegate", "answer"] and not leaders[0].meta["valid"]
    fallbacks = [s for s in pred.trajectory.steps if s.role == "fallback"]
    assert [s.meta["replaced_by"] for s in fallbacks] == ["delegate", "answer"]
    assert pred.trajectory.role_steps("searcher")[0].inputs["subtask"] == "Where is Varn?"  # the question itself
    assert pred.selected == [1] and pred.answer == ""  # the Answerer's output did not parse either
    assert pred.trajectory.role_steps("answerer")[0].error


def test_invalid_selection_and_empty_delegation_fall_back(retriever):
    def leader(inputs):
        return (
            {"action": "delegate", "subtasks": [], "selected": []}
            if inputs["reports"] == "none yet"
            else answer_with(9)
        )

    lm = ScriptLM(leader=leader, searcher=search_then_report, answerer=lambda i: {"answer": "a"})
    pred = HierarchicalTeam(retriever, lm=lm, demos=None)(question="q?")
    reasons = [s.meta["reason"] for s in pred.trajectory.steps if s.role == "fallback"]
    assert reasons == ["delegate without subtasks", "no valid selection"]
    assert all(s.error for s in pred.trajectory.steps if s.role == "fallback")  # parsed but unusable
    assert pred.selected == [1] and pred.answer == "a"


def test_malformed_searcher_output_falls_back_and_is_not_a_tool_step(retriever):
    lm = ScriptLM(searcher=lambda i: "no idea", answerer=lambda i: {"answer": "a"})
    pred = CascadedTeam(retriever, lm=lm, demos=None)(question="Where is Varn?")
    first, second = pred.trajectory.role_steps("searcher")
    assert first.error and first.meta["action"] == "search" and not first.meta["valid"]
    assert retriever.calls == [("Where is Varn?", 3)]  # the subtask stands in for the query
    assert pred.trajectory.retrievals()[0].meta["fallback"]
    assert second.meta["action"] == "report" and pred.report.startswith("(unfinished) Title 0")
    assert pred.tool_steps == 0 and pred.env_steps == 2


def test_failing_lm_and_retriever_never_raise(make_retriever):
    class Boom(DummyLM):
        def __call__(self, *args, **kwargs):
            raise RuntimeError("no model")

    for cls in (CascadedTeam, HierarchicalTeam):
        pred = cls(make_retriever(error=RuntimeError("no index")), lm=Boom([]), demos=None)(question="q?")
        assert pred.answer == "" and pred.trajectory.errors
        assert any("no index" in (s.error or "") for s in pred.trajectory.retrievals())
    broken = HierarchicalTeam(make_retriever(), lm=Boom([]), demos=None)
    broken._lead = None  # an unexpected bug inside forward becomes an error step
    pred = broken(question="q?")
    assert pred.answer == "" and pred.trajectory.steps[-1].role == "error"


def test_empty_retrieval_is_recorded(make_retriever):
    lm = ScriptLM(searcher=search_then_report, answerer=lambda i: {"answer": "a"})
    pred = CascadedTeam(make_retriever(lambda q, k: []), lm=lm, demos=None)(question="Where is Varn?")
    assert pred.trajectory.retrievals()[0].error == "empty retrieval"
    assert "Search 1: Varn\n(no passages)" in pred.trajectory.role_steps("searcher")[1].inputs["notes"]


def test_team_runs_are_thread_safe(retriever):
    def leader(inputs):
        tag = re.search(r"person (\d)", inputs["question"]).group(1)
        return delegate(f"alpha-{tag}") if inputs["reports"] == "none yet" else answer_with(1)

    lm = ScriptLM(leader=leader, searcher=search_then_report, answerer=lambda i: {"answer": i["reports"][-7:]})
    program = HierarchicalTeam(retriever, lm=lm, demos=None)
    with ThreadPoolExecutor(4) as pool:
        preds = list(pool.map(lambda i: program(question=f"Who is person {i}?"), range(4)))
    for i, pred in enumerate(preds):
        assert pred.answer == f"alpha-{i}"
        assert all(
            f"person {i}" in s.messages[-1]["content"] or f"alpha-{i}" in s.messages[-1]["content"]
            for s in pred.trajectory.role_steps()
        )


# ---------------------------------------------------------------------------------------------------- Answerer, C_tool


def test_answer_candidates_are_sampled_and_voted(retriever):
    answers = iter(["Varn", "Lyon", "varn.", "Lyon", "unknown"])
    lm = ScriptLM(searcher=search_then_report, answerer=lambda i: {"answer": next(answers)})
    program = CascadedTeam(retriever, lm=lm, demos=None, answer_candidates=5)
    assert program.lm_kwargs["answerer"] == {"max_tokens": 32, "n": 5, "temperature": 1.0}
    pred = program(question="Where is Varn?")
    assert pred.answer == "Varn" and pred.candidates == ["Varn", "Lyon", "varn.", "Lyon", "unknown"]
    step = pred.trajectory.role_steps("answerer")[0]
    assert step.meta["votes"] == {"varn": 2, "lyon": 2} and step.meta["chosen"] == "Varn"  # tie: the first wins
    assert len(step.meta["completions"]) == 5


def test_one_malformed_candidate_does_not_lose_the_others(retriever):
    answers = iter(
        ["[[ ## answer ## ]]\nLyon\n\n", "garbage", "[[ ## answer ## ]]\nVarn\n\n", "[[ ## answer ## ]]\nVarn\n\n"]
    )
    lm = ScriptLM(searcher=search_then_report, answerer=lambda i: next(answers, "garbage"))
    no_json_retry = dspy.ChatAdapter(use_json_adapter_fallback=False)
    pred = CascadedTeam(retriever, lm=lm, demos=None, answer_candidates=4, adapter=no_json_retry)(question="q?")
    assert pred.trajectory.role_steps("answerer")[0].error  # DSPy rejects the whole n-sample call
    assert pred.candidates == ["Lyon", None, "Varn", "Varn"] and pred.answer == "Varn"
    assert "candidates_recovered" in _events(pred)


def test_malformed_candidates_are_read_section_by_section(retriever):
    """A sample whose header lost its spaces, or that adds a stray field, still gives its answer; repeats stay
    votes."""
    answers = iter(
        [
            "[[## answer ##]]\nVarn",
            "[[ ## answer ## ]]\nLyon\n\n[[ ## note ## ]]\nx",
            "garbage",
            "[[## answer ##]]\nVarn",
        ]
    )
    lm = ScriptLM(searcher=search_then_report, answerer=lambda i: next(answers, "garbage"))
    no_json_retry = dspy.ChatAdapter(use_json_adapter_fallback=False)
    pred = CascadedTeam(retriever, lm=lm, demos=None, answer_candidates=4, adapter=no_json_retry)(question="q?")
    assert pred.candidates == ["Varn", "Lyon", None, "Varn"] and pred.answer == "Varn"
    (event,) = [s for s in pred.trajectory.steps if s.role == "candidates_recovered"]
    assert event.meta == {"parsed": 3, "total": 4}


class _OneSampleCallsLM(ScriptLM):
    """Answers n > 1 as n separate one-sample LM calls, as LocalLM does (each recorded as an attempt of its own)."""

    def __call__(self, prompt: Any = None, *, messages: Any = None, **kwargs: Any) -> Any:
        n = kwargs.pop("n", None) or 1
        call = super().__call__  # (zero-argument super() does not work inside a comprehension before Python 3.12)
        return [out for _ in range(n) for out in call(prompt, messages=messages, n=1, **kwargs)]


def test_malformed_candidates_from_one_sample_calls_are_all_recovered(retriever):
    """With n one-sample calls (LocalLM) and every sample malformed for ChatAdapter, each of the n attempts holds one
    candidate: all n are read, not only the first attempt's; the JSON fallback's calls (other messages) are not."""
    answers = iter(["[[## answer ##]]\nVarn", "[[## answer ##]]\nLyon", "garbage", "[[## answer ##]]\nVarn"])
    lm = _OneSampleCallsLM(searcher=search_then_report, answerer=lambda i: next(answers, "garbage"))
    pred = CascadedTeam(retriever, lm=lm, demos=None, answer_candidates=4)(question="q?")
    assert pred.candidates == ["Varn", "Lyon", None, "Varn"] and pred.answer == "Varn"


def test_answerer_sampling_keeps_a_given_temperature_and_drops_n_for_one_candidate():
    team = CascadedTeam(lm_kwargs={"answerer": {"temperature": 0.7, "n": 9}}, answer_candidates=3)
    assert team.lm_kwargs == {"answerer": {"temperature": 0.7, "n": 3}}
    assert CascadedTeam(lm_kwargs={"answerer": {"n": 9}}).lm_kwargs == {"answerer": {}}
    assert HierarchicalTeam().lm_kwargs == {
        "*": {"stop": ["[[ ## completed ## ]]"]},
        "leader": {"max_tokens": 96},
        "searcher": {"max_tokens": 64},
        "answerer": {"max_tokens": 32},
    }


def test_tool_steps_counts_environment_steps_with_a_valid_search():
    t = Trajectory()
    for env_step, action, valid in [
        (1, "search", True),
        (1, "search", True),
        (2, "report", True),
        (3, "search", False),
    ]:
        t.add(Step("role", "searcher", meta={"env_step": env_step, "action": action, "valid": valid}))
    t.add(Step("role", "leader", meta={"env_step": 4, "action": "delegate", "valid": True}))
    assert tool_steps(t) == 1


# ---------------------------------------------------------------------------------------------------- adapters


def test_non_local_lms_are_shared_in_both_modes(retriever):
    lm = SchemaLM("x")
    for mode in ("shared", "per_role"):
        program = HierarchicalTeam(retriever, lm=lm, parameter_sharing=mode)
        assert all(program.role_lm(role) is lm for role in program.roles)


def test_parameter_sharing_chooses_the_default_adapter_groups():
    assert HierarchicalTeam().adapter_groups == {"team": ["leader", "searcher", "answerer"]}
    assert CascadedTeam(shared_adapter_name="teacher").adapter_groups == {"teacher": ["searcher", "answerer"]}
    per_role = HierarchicalTeam(parameter_sharing="per_role")
    assert per_role.adapter_groups == {} and per_role.adapter_roles() == {r: [r] for r in per_role.ROLES}
    custom = HierarchicalTeam(adapter_groups={"talk": ["leader", "answerer"]})  # an explicit grouping wins
    assert custom.adapter_roles() == {"talk": ["leader", "answerer"], "searcher": ["searcher"]}
    with pytest.raises(ConfigError, match="unknown roles"):
        CascadedTeam(adapter_groups={"team": ["leader", "searcher"]})


def test_shared_mode_binds_one_adapter_and_survives_save_load(retriever, tiny_model, smollm_tokenizer, tmp_path):
    from rolecall.lm import LocalLM

    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=4)
    shared = HierarchicalTeam(retriever, lm=lm, demos=None)
    assert {shared.role_lm(r).adapter for r in shared.roles} == {"team"}
    per_role = HierarchicalTeam(retriever, lm=lm, demos=None, parameter_sharing="per_role")
    assert {r: per_role.role_lm(r).adapter for r in per_role.roles} == {
        r: r for r in ("leader", "searcher", "answerer")
    }
    teacher = CascadedTeam(retriever, lm=lm, demos=None, shared_adapter_name="teacher")
    assert {teacher.role_lm(r).adapter for r in teacher.roles} == {"teacher"}

    pred = CascadedTeam(retriever, lm=lm, demos=None, max_steps=1)(question="q?")
    assert {s.adapter for s in pred.trajectory.role_steps()} == {"team"}  # every role call ran on the one adapter

    shared.save(tmp_path / "team")
    assert [p.name for p in (tmp_path / "team" / "adapters").iterdir()] == ["team"]  # saved once for the group
    loaded = HierarchicalTeam.load(tmp_path / "team", retriever=retriever, lm=lm)
    assert {loaded.role_lm(r).adapter for r in loaded.roles} == {"team"}
    assert loaded.adapter_groups == {"team": ["leader", "searcher", "answerer"]}
    teacher.save(tmp_path / "teacher")
    loaded = CascadedTeam.load(tmp_path / "teacher", retriever=retriever, lm=lm)
    assert {loaded.role_lm(r).adapter for r in loaded.roles} == {"teacher"} and loaded.shared_adapter_name == "teacher"


# ---------------------------------------------------------------------------------------------------- persistence


def test_save_load_round_trip_keeps_options_and_demos(tmp_path, retriever):
    program = HierarchicalTeam(
        retriever, max_rounds=2, max_subtasks=1, answer_candidates=3, parameter_sharing="per_role"
    )
    program.save(tmp_path / "h")
    loaded = HierarchicalTeam.load(tmp_path / "h", retriever=retriever)
    assert (loaded.max_rounds, loaded.max_subtasks, loaded.answer_candidates) == (2, 1, 3)
    assert loaded.parameter_sharing == "per_role" and loaded.config() == program.config()
    assert loaded.lm_kwargs["answerer"]["n"] == 3
    for role, predictor in program.roles.items():
        assert [d.toDict() for d in loaded.roles[role].demos] == [d.toDict() for d in predictor.demos]
    cascaded = CascadedTeam(retriever, max_steps=3, top_k=2)
    cascaded.save(tmp_path / "c")
    loaded = CascadedTeam.load(tmp_path / "c", retriever=retriever)
    assert (loaded.max_steps, loaded.top_k) == (3, 2) and loaded.retriever is retriever


def test_bootstrap_few_shot_compiles_the_hierarchy(retriever):
    def leader(inputs):
        return delegate(f"find {inputs['question']}") if inputs["reports"] == "none yet" else answer_with(1)

    lm = ScriptLM(leader=leader, searcher=search_then_report, answerer=lambda i: {"answer": "Varn"})
    trainset = [dspy.Example(question=f"Where is place {i}?", answer="Varn").with_inputs("question") for i in range(2)]
    program = HierarchicalTeam(retriever, lm=lm, demos=None)
    compiled = program.compile(
        dspy.BootstrapFewShot(
            metric=lambda e, p, trace=None: e.answer == p.answer, max_bootstrapped_demos=2, max_labeled_demos=0
        ),
        trainset=trainset,
    )
    assert isinstance(compiled, HierarchicalTeam) and compiled is not program
    assert all(len(p.demos) >= 1 for p in compiled.roles.values())
    assert compiled.role_lm("leader") is lm and compiled.retriever is retriever
    assert compiled(question="Where is place 7?").answer == "Varn"


def test_bootstrap_few_shot_compiles_the_cascade_with_schema_lm(retriever):
    lm = SchemaLM("Varn")
    trainset = [dspy.Example(question=f"Where is place {i}?", answer="Varn").with_inputs("question") for i in range(2)]
    with dspy.context(lm=lm):
        compiled = dspy.BootstrapFewShot(
            metric=lambda e, p, trace=None: e.answer == p.answer, max_bootstrapped_demos=1, max_labeled_demos=0
        ).compile(CascadedTeam(retriever, lm=lm), trainset=trainset)
    assert set(compiled.roles) == {"searcher", "answerer"} and lm.calls > 0
    assert compiled(question="Where is place 3?").answer == "Varn"


@pytest.mark.slow
def test_cascade_runs_on_the_embedded_model_with_one_shared_adapter(retriever, embedded_lm):
    """The real SmolLM2-135M with the built-in demos: the run finishes within its budget, every role call ran on the
    one shared adapter, and every Searcher turn carries the meta the OPD rewards read."""
    team = CascadedTeam(retriever, lm=embedded_lm, max_steps=2, shared_adapter_name="team-slow-test")
    pred = team(question="Where was the founder of Morrow Books born?")
    assert isinstance(pred.answer, str) and pred.env_steps <= 2 and not [s for s in _events(pred) if s == "error"]
    assert {s.adapter for s in pred.trajectory.role_steps()} == {"team-slow-test"}
    turns = pred.trajectory.role_steps("searcher")
    assert turns and all({"searcher", "turn", "wave", "env_step", "action", "valid"} <= set(s.meta) for s in turns)
    assert pred.trajectory.role_steps()[-1].role == "answerer"
