"""Every registered program, driven the same way: scripted garbage, DSPy's BootstrapFewShot, save / load.

These tests iterate over :data:`rolecall.programs.registry.PROGRAMS`, so a newly registered program is covered without
a line here. A program must finish every question without raising, record what went wrong, and return an ``answer``
field (a string, possibly empty) whatever its LM says.
"""

from __future__ import annotations

import dspy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rolecall.data.synthetic import synthetic_world
from rolecall.evaluation.metrics import exact_match
from rolecall.programs.registry import PROGRAMS, build_program, get_program_class
from rolecall.retrievers.bm25 import BM25
from rolecall.utils import SchemaLM, ScriptedTextLM

NAMES = sorted(PROGRAMS)


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=3, n_train=20, n_dev=5, n_test=5)


@pytest.fixture(scope="module")
def bm25(world):
    return BM25(world.corpus)


def _build(name: str, retriever, lm, **options):
    cls = get_program_class(name)
    return build_program(name, retriever if getattr(cls, "uses_retriever", True) else None, lm, **options)


# Completions a broken or tiny model writes: free text, half-formed ChatAdapter headers, truncated JSON, tags.
_FRAGMENTS = st.sampled_from(
    [
        "",
        "[[ ## ",
        "[[ ## answer ## ]]",
        "[[ ## sub_goals ## ]]\n[1, 2",
        "[[ ## completed ## ]]",
        '{"answer": ',
        "<search>",
        "</answer>",
        "<answer></answer>",
        "#1 #2 [entity from step 9]",
        "\n\n",
        "yes",
        "Failed",
    ]
)
_GARBAGE = st.lists(st.one_of(st.text(max_size=80), _FRAGMENTS), min_size=1, max_size=4).map("".join)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(_GARBAGE, min_size=1, max_size=6))
def test_scripted_garbage_never_raises(name, texts, world, bm25):
    lm = ScriptedTextLM(texts)
    program = _build(name, bm25, lm)
    pred = program(question=world.test[0].question)
    assert isinstance(pred.answer, str)
    trajectory = pred.trajectory
    assert trajectory.role_steps(), f"{name} made no recorded role call"
    assert lm.calls >= len(trajectory.role_steps())


# The roles each program calls, in order, when every output is well formed (SchemaLM): the first and last role, and
# an ordered subsequence of the calls in between.
EXPECTED_ROLES = {
    "cascaded_team": ["searcher", "answerer"],
    "d2plan": ["reasoner_plan", "reasoner_step", "purifier", "reasoner_answer"],
    "hierarchical_team": ["leader", "searcher", "leader", "answerer"],
    "ircot": ["reason", "answer"],
    "iter_retgen": ["generate"],
    "no_retrieval_cot": ["answer"],
    "opera": ["plan", "analysis", "synthesis"],
    "react": ["react", "extract"],
    "reap": ["decomposer", "extractor", "synthesizer"],
    "search_r1": ["agent"],
    "self_ask": ["ask", "answer_followup", "ask"],
    "single_step_rag": ["answer"],
    "stride": ["meta_planner", "planner", "supervisor", "extractor", "reasoner"],
}


def _is_subsequence(wanted: list[str], calls: list[str]) -> bool:
    rest = iter(calls)
    return all(role in rest for role in wanted)


def test_every_program_has_an_expected_role_order():
    assert sorted(EXPECTED_ROLES) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_well_formed_outputs_give_the_expected_roles_in_order_and_the_answer(name, world, bm25):
    answer = world.train[0].answer
    pred = _build(name, bm25, SchemaLM(answer))(question=world.test[0].question)
    calls = [s.role for s in pred.trajectory.role_steps()]
    wanted = EXPECTED_ROLES[name]
    assert calls[0] == wanted[0] and calls[-1] == wanted[-1], calls
    assert _is_subsequence(wanted, calls), calls
    assert pred.answer == answer  # the scripted answer flows through to the program's answer
    assert all(s.ok for s in pred.trajectory.role_steps()), [s.error for s in pred.trajectory.errors]


@pytest.mark.parametrize("name", NAMES)
def test_pure_noise_is_recorded_as_failures(name, world, bm25):
    lm = ScriptedTextLM(["the the the", "I am not sure what you mean.", "42"])
    pred = _build(name, bm25, lm)(question=world.test[1].question)
    assert isinstance(pred.answer, str)
    errors = pred.trajectory.errors
    assert errors, f"{name} recorded no failure for unparseable output"
    assert any(s.kind == "role" for s in errors), f"{name}: no role call recorded its failure"


def _metric(example, prediction, trace=None):
    return exact_match(str(prediction.answer or ""), list(example.answers))


@pytest.mark.parametrize("name", NAMES)
def test_bootstrap_fewshot_compiles_every_program(name, world, bm25):
    lm = SchemaLM(world.train[0].answer)
    program = _build(name, bm25, lm)
    trainset = [e.to_dspy() for e in world.train[:4]]
    with dspy.context(lm=lm):
        optimizer = dspy.BootstrapFewShot(metric=_metric, max_bootstrapped_demos=1, max_labeled_demos=1, max_rounds=1)
        compiled = optimizer.compile(program, trainset=trainset)
        pred = compiled(question=world.test[0].question)
    assert isinstance(pred.answer, str)
    assert set(compiled.roles) == set(program.roles)
    assert lm.calls > 0
    # the scripted LM answers the first training question right, so its trace must have become a demo
    bootstrapped = [r for r, p in compiled.roles.items() for d in p.demos if getattr(d, "augmented", False)]
    assert bootstrapped, f"{name}: BootstrapFewShot bootstrapped no demo"


@pytest.mark.parametrize("name", NAMES)
def test_save_load_round_trip(name, world, bm25, tmp_path):
    lm = SchemaLM("x")
    program = _build(name, bm25, lm)
    program.save(tmp_path)
    cls = get_program_class(name)
    loaded = cls.load(tmp_path, retriever=bm25 if getattr(cls, "uses_retriever", True) else None, lm=lm)
    assert type(loaded) is type(program)
    assert list(loaded.roles) == list(program.roles)
    for role, predictor in program.roles.items():
        assert len(loaded.roles[role].demos) == len(predictor.demos), role
        assert loaded.roles[role].signature.instructions == predictor.signature.instructions
    assert loaded.config() == program.config()
    assert loaded.adapter_groups == program.adapter_groups
