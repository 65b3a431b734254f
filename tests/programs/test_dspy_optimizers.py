"""DSPy's own prompt optimizers compile OPERA unchanged (interoperability)."""

from __future__ import annotations

import dspy
import pytest

from rolecall.data.synthetic import synthetic_world
from rolecall.evaluation.metrics import exact_match
from rolecall.programs import OPERA
from rolecall.retrievers.bm25 import BM25
from rolecall.utils import SchemaLM


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=5, n_train=30, n_dev=10, n_test=10)


def _metric(example, prediction, trace=None):
    return exact_match(str(prediction.answer or ""), list(example.answers))


def test_bootstrap_fewshot_compiles_opera(world):
    lm = SchemaLM(world.train[0].answer)
    program = OPERA(BM25(world.corpus), lm=lm)
    trainset = [e.to_dspy() for e in world.train[:6]]
    with dspy.context(lm=lm):
        compiled = dspy.BootstrapFewShot(metric=_metric, max_bootstrapped_demos=2, max_labeled_demos=2).compile(
            program, trainset=trainset
        )
        pred = compiled(question=world.test[0].question)
    assert pred.answer == world.train[0].answer
    assert set(compiled.roles) == set(program.roles)
    # the scripted LM answers the first training question right, so its trace became a demo of every role it ran
    for role in ("plan", "analysis", "synthesis"):
        assert any(getattr(d, "augmented", False) for d in compiled.roles[role].demos), role
    assert [s.role for s in pred.trajectory.role_steps()][:2] == ["plan", "analysis"]


def test_bootstrap_fewshot_takes_a_teacher_program_on_its_own_lm(world):
    # bench_compile's "--bfs-teacher sft": the traces come from another program (its own LM), the demos go to the
    # student, and the student keeps answering with its own LM
    student_lm, teacher_lm = SchemaLM("wrong"), SchemaLM(world.train[0].answer)
    student = OPERA(BM25(world.corpus), lm=student_lm)
    teacher = OPERA(BM25(world.corpus), lm=teacher_lm)
    trainset = [e.to_dspy() for e in world.train[:6]]
    optimizer = dspy.BootstrapFewShot(metric=_metric, max_bootstrapped_demos=1, max_labeled_demos=0, max_rounds=1)
    compiled = student.compile(optimizer=optimizer, trainset=trainset, teacher=teacher)
    assert teacher_lm.calls > 0
    for role in ("plan", "analysis", "synthesis"):
        demos = compiled.roles[role].demos
        assert demos and all(getattr(d, "augmented", False) for d in demos), role
    synthesis_demo = compiled.roles["synthesis"].demos[0]
    assert synthesis_demo.answer == world.train[0].answer  # the teacher's output, not the student's
    before = student_lm.calls
    pred = compiled(question=world.test[0].question)
    assert pred.answer == "wrong" and student_lm.calls > before


def test_miprov2_light_compiles_opera(world):
    lm = SchemaLM(world.train[0].answer)
    program = OPERA(BM25(world.corpus), lm=lm)
    trainset = [e.to_dspy() for e in world.train[:20]]
    valset = [e.to_dspy() for e in world.dev[:10]]
    with dspy.context(lm=lm):
        optimizer = dspy.MIPROv2(metric=_metric, auto="light", prompt_model=lm, task_model=lm, num_threads=2, seed=0)
        compiled = optimizer.compile(
            program, trainset=trainset, valset=valset, max_bootstrapped_demos=1, max_labeled_demos=1
        )
        pred = compiled(question=world.test[0].question)
    assert pred.answer == world.train[0].answer
    assert [s.role for s in pred.trajectory.role_steps()][0] == "plan"
    assert pred.trajectory.role_steps()[-1].role == "synthesis"
    # MIPROv2 ran its trials: each scored the candidate program on the valset
    scores = [t["full_eval_score"] for t in compiled.trial_logs.values() if "full_eval_score" in t]
    assert scores and all(0.0 <= s <= 100.0 for s in scores)
    assert lm.calls > len(valset) * len(scores)
