"""Program base: roles, per-role LMs, recorded role calls (messages, completions, errors, usage), retrieval steps,
thread-safe recording, compile delegation, deepcopy and save / load."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import dspy
import pytest
from dspy.utils.dummies import DummyLM

from rolecall.errors import ConfigError, ModelLoadError
from rolecall.programs import Program, Trajectory, format_passages
from rolecall.programs.core.options import ProgramOptions, option
from rolecall.retrievers.base import Passage


@dataclass(kw_only=True)
class QAOptions(ProgramOptions):
    tag: str = "x"
    """A label (checks that options survive save / load)."""
    retries: int = option(1, low=0, high=3)
    """Unused; has a range."""


class QA(Program):
    """A two-role toy program: ``qa`` (Predict) and ``think`` (ChainOfThought)."""

    Options = QAOptions
    ROLES = ("qa", "think")

    def _build_roles(self) -> None:
        self.qa = dspy.Predict("question -> answer")
        self.think = dspy.ChainOfThought("question -> answer")

    def default_demos(self) -> dict[str, list[dspy.Example]]:
        return {"qa": [dspy.Example(question="built-in q", answer="built-in a").with_inputs("question")]}

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        if question == "explode":
            raise RuntimeError("boom inside _run")
        pred = self.call_role("qa", trajectory, question=question)
        return dspy.Prediction(answer=pred.answer if pred else "", trajectory=trajectory)


class FakeLocal:
    """Stands in for a LocalLM's adapter views: ``for_role(name)`` gives one DummyLM per adapter name."""

    def __init__(self, answer: str = "a"):
        self.views: dict[str, DummyLM] = {}
        self.answer = answer

    def for_role(self, name):
        if name not in self.views:
            view = DummyLM([{"answer": self.answer}] * 20)
            view.adapter = name
            self.views[name] = view
        return self.views[name]


def test_roles_are_named_after_attributes():
    program = QA()
    assert list(program.roles) == ["qa", "think"]
    assert all(isinstance(p, dspy.Predict) for p in program.roles.values())
    assert program.roles["think"] is program.think.predict


def test_lm_is_bound_to_every_role_and_set_role_lm_overrides():
    shared, special = DummyLM([{"answer": "shared"}]), DummyLM([{"answer": "special"}])
    program = QA(lm=shared)
    assert all(program.role_lm(r) is shared for r in program.roles)
    program.set_role_lm("qa", special)
    assert program.role_lm("qa") is special and program.role_lm("think") is shared
    assert program(question="q").answer == "special"
    with pytest.raises(ConfigError, match="no role 'nope'"):
        program.set_role_lm("nope", special)


def test_bind_role_adapters_gives_each_role_its_view():
    program, local = QA(), FakeLocal()
    program.bind_role_adapters(local)
    assert sorted(local.views) == ["qa", "think"]
    assert program.role_lm("qa") is local.views["qa"]
    with pytest.raises(ConfigError):
        program.bind_role_adapters(DummyLM([]))


def test_call_role_records_messages_completion_outputs_and_usage():
    program = QA(lm=DummyLM([{"answer": "Paris"}]))
    trajectory = Trajectory(question="Capital of France?")
    pred = program.call_role("qa", trajectory, question="Capital of France?")
    assert pred.answer == "Paris"
    (step,) = trajectory.steps
    assert step.kind == "role" and step.role == "qa" and step.ok
    assert step.inputs == {"question": "Capital of France?"}
    assert step.outputs == {"answer": "Paris"}
    assert step.messages[0]["role"] == "system" and "Capital of France?" in step.messages[-1]["content"]
    assert "[[ ## answer ## ]]" in step.completion and "Paris" in step.completion
    assert step.usage["lm_calls"] == 1 and step.seconds > 0


def test_call_role_records_parse_errors_and_fallback_attempts():
    lm = DummyLM([{"wrong_field": "x"}, {"wrong_field": "y"}])
    program = QA(lm=lm)
    trajectory = Trajectory()
    assert program.call_role("qa", trajectory, question="q") is None
    (step,) = trajectory.steps
    assert step.error.startswith("parse error")
    # ChatAdapter fell back to JSONAdapter: both attempts are kept
    assert step.usage["lm_calls"] == 2 and len(step.meta["attempts"]) == 2
    assert trajectory.parse_rate("qa") == 0.0
    assert "call_failed" not in step.meta  # the LM answered: not a failed call


def test_call_role_records_lm_exceptions():
    class Boom(DummyLM):
        def __call__(self, *args, **kwargs):
            raise RuntimeError("server down")

    program = QA(lm=Boom([]))
    trajectory = Trajectory()
    assert program.call_role("qa", trajectory, question="q") is None
    assert "server down" in trajectory.steps[0].error
    assert trajectory.steps[0].meta["call_failed"] is True  # the evaluation counts it as an error


def test_recording_is_thread_safe():
    questions = [f"question number {i} ?" for i in range(8)]
    lm = DummyLM({q: {"answer": f"answer-{i}"} for i, q in enumerate(questions)})
    program = QA(lm=lm)
    with ThreadPoolExecutor(8) as pool:
        preds = list(pool.map(lambda q: program(question=q), questions))
    for i, (q, pred) in enumerate(zip(questions, preds, strict=True)):
        (step,) = pred.trajectory.steps
        assert pred.answer == f"answer-{i}"
        assert q in step.messages[-1]["content"]
        others = [o for o in questions if o != q]
        assert not any(o in m["content"] for o in others for m in step.messages)
        assert f"answer-{i}" in step.completion and step.usage["lm_calls"] == 1


def test_retrieve_records_ids_and_failures(make_retriever):
    program = QA(make_retriever())
    trajectory = Trajectory()
    passages = program.retrieve(trajectory, "query", 3)
    assert [p.id for p in passages] == ["p0", "p1", "p2"]
    assert trajectory.steps[-1].outputs == {
        "passage_ids": ["p0", "p1", "p2"],
        "titles": ["Title 0", "Title 1", "Title 2"],
    }
    assert trajectory.steps[-1].inputs == {"query": "query", "k": 3}

    program.retriever = make_retriever(error=RuntimeError("index gone"))
    assert program.retrieve(trajectory, "query", 3) == []
    assert "index gone" in trajectory.steps[-1].error

    program.retriever = make_retriever(lambda q, k: [])
    assert program.retrieve(trajectory, "query", 3) == []
    assert trajectory.steps[-1].error == "empty retrieval"

    program.retriever = None
    assert program.retrieve(trajectory, "query", 3) == []
    assert trajectory.steps[-1].error == "no retriever"
    assert trajectory.retrieved_ids == ["p0", "p1", "p2"]


def test_format_passages_truncates_each_and_in_total():
    long = Passage("a", "T", "word " * 200)
    text = format_passages([long, long, long], max_chars=100, max_total_chars=250)
    lines = text.splitlines()
    assert len(lines) == 2 and all(len(line) <= 105 for line in lines) and lines[0].startswith("[1] T | word")
    assert format_passages([]) == "(no passages)"
    assert format_passages(["plain"]) == "[1] plain"


def test_compile_delegates_and_passes_valset_only_when_given():
    calls = []

    class Optimizer:
        def compile(self, student, **kwargs):
            calls.append(kwargs)
            return student

    program = QA()
    assert program.compile(Optimizer(), trainset=[1]) is program
    program.compile(Optimizer(), trainset=[1], valset=[2], extra=3)
    assert calls == [{"trainset": [1]}, {"trainset": [1], "valset": [2], "extra": 3}]


def test_deepcopy_copies_predictors_but_shares_lm_and_retriever(retriever):
    lm = DummyLM([])
    program = QA(retriever, lm=lm)
    clone = copy.deepcopy(program)
    assert clone.retriever is retriever and clone.role_lm("qa") is lm
    assert clone.qa is not program.qa
    reset = program.reset_copy()  # what BootstrapFewShot does: predictor LMs cleared, the binding survives
    assert reset.qa.lm is None and reset.role_lm("qa") is lm


def test_save_load_round_trip(tmp_path):
    demo = dspy.Example(question="q1", answer="a1").with_inputs("question")
    program = QA(demos={"qa": [demo]}, tag="saved")
    program.qa.signature = program.qa.signature.with_instructions("Answer tersely.")
    program.save(tmp_path / "prog")
    loaded = QA.load(tmp_path / "prog")
    assert loaded.options.tag == "saved" and loaded.tag == "saved"
    assert [d.toDict() for d in loaded.qa.demos] == [{"question": "q1", "answer": "a1"}]
    assert loaded.qa.signature.instructions == "Answer tersely."
    assert '"lm": null' in (tmp_path / "prog" / "program.json").read_text()
    with pytest.raises(ModelLoadError):
        QA.load(tmp_path / "missing")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "program.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        QA.load(tmp_path / "bad")


# ---------------------------------------------------------------------------------------------------- options
def test_options_are_validated_with_the_name_the_value_and_the_range():
    assert QA(retries=3).retries == 3
    with pytest.raises(ConfigError, match=r"option retries must be an int in \[0, 3\], got 4"):
        QA(retries=4)
    with pytest.raises(ConfigError, match="option tag must be a str, got 5"):
        QA(tag=5)
    with pytest.raises(ConfigError, match="QA has no option 'nope'; its options are: tag, retries"):
        QA(nope=1)


# ---------------------------------------------------------------------------------------------------- forward
def test_forward_turns_an_exception_into_a_recorded_failure():
    pred = QA(lm=DummyLM([{"answer": "a"}]))(question="explode")
    assert pred.answer == ""
    (step,) = pred.trajectory.steps
    assert step.kind == "event" and step.role == "error" and "boom inside _run" in step.error


# ---------------------------------------------------------------------------------------------------- demos
def test_auto_demos_come_from_the_default_demos_hook_and_unknown_roles_fail():
    assert [d.question for d in QA().qa.demos] == ["built-in q"]
    assert QA(demos=None).qa.demos == []
    with pytest.raises(ConfigError, match="demos for unknown roles \\['nope'\\]"):
        QA(demos={"nope": []})
    with pytest.raises(ConfigError, match="demos must be 'auto', None or a dict"):
        QA(demos="all")


def test_demo_policy_never_and_until_trained():
    assert QA(demo_policy="never").qa.demos == []
    assert QA(demo_policy={"qa": "never"}).qa.demos == []
    program = QA()  # until_trained by default
    assert program.qa.demos and not program.runs_demo_free("qa")
    assert program.mark_trained("qa") == ["qa"]
    assert program.qa.demos == [] and program.runs_demo_free("qa")
    program.set_demos({"qa": [dspy.Example(question="x", answer="y")]})  # a trained role stays demo-free
    assert program.qa.demos == []
    kept = QA(demo_policy="always")
    assert kept.mark_trained("qa") == [] and kept.qa.demos
    with pytest.raises(ConfigError, match="demo_policy for 'qa' must be one of"):
        QA(demo_policy={"qa": "sometimes"})
    with pytest.raises(ConfigError, match="no adapter 'nope'"):
        program.mark_trained("nope")


def test_demo_free_adapters_survive_save_and_load(tmp_path):
    program = QA(adapter_groups={"shared": ["qa", "think"]})
    program.mark_trained("shared")
    program.save(tmp_path / "prog")
    loaded = QA.load(tmp_path / "prog")
    assert loaded.demo_free_adapters == {"shared"} and loaded.qa.demos == []
    assert loaded.adapter_groups == {"shared": ["qa", "think"]}


def test_a_demo_free_role_sends_a_shorter_prompt():
    with_demos = QA(lm=DummyLM([{"answer": "a"}] * 2))
    trained = QA(lm=DummyLM([{"answer": "a"}] * 2))
    trained.mark_trained("qa")
    long = with_demos(question="q").trajectory.steps[0].messages
    short = trained(question="q").trajectory.steps[0].messages
    assert len(short) < len(long)  # the demo's user/assistant turns are gone
    assert "built-in q" in str(long) and "built-in q" not in str(short)


def test_a_trained_role_gets_the_short_prompt_and_parses_the_same_sections(tmp_path):
    from rolecall.programs.core.trained_prompt import TrainedChatAdapter

    untrained = QA(lm=DummyLM([{"answer": "a"}] * 2), demo_policy="never")
    trained = QA(lm=DummyLM([{"answer": "Varn"}] * 2))
    trained.mark_trained("qa")
    assert untrained.role_adapter("qa") is None and isinstance(trained.role_adapter("qa"), TrainedChatAdapter)
    full = untrained(question="q").trajectory.steps[0].messages
    pred = trained(question="q")
    short = pred.trajectory.steps[0].messages
    assert pred.answer == "Varn"  # the completion is parsed as ChatAdapter parses it
    assert [m["role"] for m in short] == ["system", "user"] == [m["role"] for m in full]
    assert short[0]["content"] == trained.qa.signature.instructions.strip()
    assert short[1]["content"] == "[[ ## question ## ]]\nq"
    assert "Your input fields are" in full[0]["content"] and "Respond with" in full[1]["content"]
    assert len(str(short)) < len(str(full)) / 2
    assert QA(trained_prompt="full").role_adapter("qa") is None
    kept = QA(trained_prompt="full")
    kept.mark_trained("qa")
    assert kept.role_adapter("qa") is None  # "full": the trained role keeps ChatAdapter's whole prompt
    with pytest.raises(ConfigError, match="trained_prompt must be 'compact' or 'full', got 'tiny'"):
        QA(trained_prompt="tiny")


def test_the_trained_prompt_setting_survives_save_and_older_saves_load_with_full_prompts(tmp_path):
    import json

    program = QA(trained_prompt="full")
    program.mark_trained("qa")
    program.save(tmp_path / "prog")
    assert QA.load(tmp_path / "prog").trained_prompt == "full"
    state = json.loads((tmp_path / "prog" / "program.json").read_text())
    del state["config"]["trained_prompt"]  # saved before short trained prompts existed: trained on full ones
    (tmp_path / "prog" / "program.json").write_text(json.dumps(state))
    assert QA.load(tmp_path / "prog").role_adapter("qa") is None


# ---------------------------------------------------------------------------------------------------- adapter groups
def test_adapter_groups_bind_several_roles_to_one_adapter_and_steps_record_it():
    local = FakeLocal()
    program = QA(lm=local, adapter_groups={"team": ["qa", "think"]})
    program.lm = local
    program.bind_role_adapters(local)
    assert sorted(local.views) == ["team"]
    assert program.role_lm("qa") is program.role_lm("think") is local.views["team"]
    assert program.adapter_name("qa") == "team" and program.adapter_roles() == {"team": ["qa", "think"]}
    step = program(question="q").trajectory.steps[0]
    assert step.role == "qa" and step.adapter == "team"

    solo = QA(adapter_groups={})
    solo.bind_role_adapters(local)
    assert solo.adapter_name("think") == "think" and "think" in local.views
    with pytest.raises(ConfigError, match="unknown roles \\['nope'\\]"):
        QA(adapter_groups={"g": ["nope"]})
    with pytest.raises(ConfigError, match="in two adapter groups"):
        QA(adapter_groups={"a": ["qa"], "b": ["qa"]})


# ---------------------------------------------------------------------------------------------------- salvage
def test_a_failed_parse_keeps_the_salvaged_fields_and_returns_them_on_request():
    program = QA(lm=DummyLM([{"answer": "Varn"}] * 4), demos=None)  # never writes the level field
    program.qa.signature = dspy.Signature("question -> answer, level: int")
    trajectory = Trajectory()
    assert program.call_role("qa", trajectory, question="q") is None
    assert trajectory.steps[-1].meta["salvaged"] == {"answer": "Varn"}
    pred = program.call_role("qa", trajectory, question="q", salvage=True)
    assert pred.answer == "Varn" and pred.get("level") is None
    assert trajectory.steps[-1].error.startswith("parse error")


# ---------------------------------------------------------------------------------------------------- gold path
def test_a_gold_path_records_the_adapter_formatted_pair_without_calling_the_lm():
    from rolecall.programs.core.gold import gold_path

    lm = DummyLM([{"answer": "from the lm"}] * 3)
    program = QA(lm=lm)
    seen = []

    def gold(program, role, inputs, trajectory):
        seen.append((role, inputs))
        return {"answer": "Paris"}

    with gold_path(gold):
        pred = program(question="Capital of France?")
    assert pred.answer == "Paris" and seen == [("qa", {"question": "Capital of France?"})]
    (step,) = pred.trajectory.steps
    assert step.meta["gold"] and step.ok and step.outputs == {"answer": "Paris"} and step.adapter == "qa"
    assert step.completion == "[[ ## answer ## ]]\nParis\n\n[[ ## completed ## ]]"
    live = program(question="Capital of France?")  # outside the block the LM answers, with the same messages
    assert live.answer == "from the lm" and live.trajectory.steps[0].messages == step.messages
    program.mark_trained("qa")
    with gold_path(gold):
        demo_free = program(question="Capital of France?").trajectory.steps[0]
    assert len(demo_free.messages) < len(step.messages)  # a demo-free role's gold pair has no demos
    with gold_path(lambda *args: None):  # None: the LM answers
        assert program(question="q").answer == "from the lm"
    with gold_path(lambda *args: {}), pytest.raises(ValueError, match="lack the fields"):
        program.call_role("qa", Trajectory(), question="q")
