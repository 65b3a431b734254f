"""Every registered program on the real embedded model (slow): it finishes every question without raising.

Two held-out synthetic questions per program, run concurrently so their LM calls batch. What the 135M model answers
is not asserted (it is mostly wrong); that the program survives whatever it writes, and records it, is.
"""

from __future__ import annotations

import dspy
import pytest

from rolecall.data.synthetic import synthetic_world
from rolecall.evaluation import evaluate
from rolecall.programs.registry import PROGRAMS, build_program, get_program_class
from rolecall.retrievers.bm25 import BM25

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=0)


@pytest.fixture(scope="module")
def bm25(world):
    return BM25(world.corpus)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_finishes_every_question_on_the_embedded_model(name, world, bm25, embedded_lm):
    cls = get_program_class(name)
    program = build_program(name, bm25 if getattr(cls, "uses_retriever", True) else None, embedded_lm)
    questions = world.test[:2]
    with dspy.context(lm=embedded_lm):
        result = evaluate(program, questions, num_threads=2, show_progress=False)
    assert len(result.records) == len(questions)
    for record in result.records:
        assert record.error is None, f"{name} raised: {record.error}"
        assert isinstance(record.prediction, str)
        assert record.lm_calls >= 1 and record.trajectory is not None
