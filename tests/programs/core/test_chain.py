"""``Program.compile`` with a chain: each optimizer gets the examples, valset and arguments its ``compile`` takes."""

from __future__ import annotations

import copy

import dspy
import pytest

from rolecall.data.synthetic import synthetic_world
from rolecall.errors import ConfigError
from rolecall.optimizers.core.base import WeightOptimizer
from rolecall.programs.core.chain import examples_for, is_weight_optimizer
from rolecall.programs.registry import build_program
from rolecall.utils import SchemaLM


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=3, n_train=4, n_dev=1, n_test=1)


class _Recorder:
    """A DSPy-style optimizer that records what its compile was given (SIMBA's signature: no valset)."""

    def __init__(self) -> None:
        self.seen: dict = {}

    def compile(self, student, *, trainset, seed=0):
        self.seen = {"trainset": trainset, "seed": seed}
        return copy.deepcopy(student)


class _RecordingWeightOptimizer(WeightOptimizer):
    """A rolecall weight optimizer that records what it was given and trains nothing."""

    def compile(self, student, *, trainset, valset=None, **kw):
        self.seen = {"trainset": trainset, "valset": valset, **kw}
        return student


def test_chain_gives_each_optimizer_the_examples_and_arguments_it_takes(world):
    program = build_program("no_retrieval_cot", None, SchemaLM("x"))
    train, dev = world.train[:2], world.dev[:1]
    prompt, weights = _Recorder(), _RecordingWeightOptimizer()
    assert is_weight_optimizer(weights) and not is_weight_optimizer(prompt)
    result = program.compile([prompt, weights], trainset=train, valset=dev, seed=3)
    # the DSPy-style step got dspy.Examples and its seed, no valset; the weight optimizer got the rolecall Examples
    assert all(isinstance(e, dspy.Example) and set(e.inputs().keys()) == {"question"} for e in prompt.seen["trainset"])
    assert prompt.seen["seed"] == 3
    assert weights.seen["trainset"] == list(train) and weights.seen["valset"] == list(dev)
    assert isinstance(result, type(program)) and result is not program
    assert examples_for(prompt, None) is None and examples_for(prompt, [1]) == [1]
    # dspy.Examples reach a weight optimizer unchanged (SFT rejects them: it needs the rolecall gold decompositions)
    as_dspy = [e.to_dspy() for e in train]
    program.compile([_Recorder(), weights], trainset=as_dspy)
    assert weights.seen["trainset"] == as_dspy


def test_chain_rejects_unknown_arguments_before_running_and_a_non_program_between_steps(world):
    program = build_program("no_retrieval_cot", None, SchemaLM("x"))
    first = _Recorder()
    with pytest.raises(ConfigError, match=r"\['typo'\], which no optimizer's compile takes"):
        program.compile([first, _Recorder()], trainset=world.train[:1], typo=1)
    assert first.seen == {}  # nothing ran

    class ReturnsNothing:
        def compile(self, student, *, trainset):
            return None

    with pytest.raises(ConfigError, match="returned a NoneType, not a rolecall Program"):
        program.compile([ReturnsNothing(), _Recorder()], trainset=world.train[:1])
    with pytest.raises(ConfigError, match="at least one optimizer"):
        program.compile([], trainset=world.train[:1])
