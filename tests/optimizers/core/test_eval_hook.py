"""The weight-optimizer loop's evaluation hook on the tiny random Llama: when it is called, how it stops training,
and that evaluating does not change what training does."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest
import torch

from rolecall.errors import ConfigError
from rolecall.lm import LocalLM
from rolecall.optimizers.core.base import WeightOptimizerConfig
from rolecall.optimizers.core.eval_hook import EvalPoint, eval_due


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ToyNLL = _module("toy_base_for_hooks", Path(__file__).with_name("test_base.py")).ToyNLL
conftest = _module("rolecall_tests_conftest", Path(__file__).parents[2] / "conftest.py")


def lora(lm: LocalLM) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in lm.hf_model.named_parameters() if "lora_" in n}


def test_eval_due_at_stage_ends_and_every_n_steps():
    assert [eval_due(n, None, stage_done=n == 3) for n in (1, 2, 3)] == [False, False, True]
    assert [eval_due(n, 2, stage_done=False) for n in (1, 2, 3, 4)] == [False, True, False, True]


def test_the_hook_sees_each_stage_end_and_every_nth_step(smollm_tokenizer, tmp_path):
    lm = LocalLM(conftest.make_tiny_llama(smollm_tokenizer), tokenizer=smollm_tokenizer)
    points: list[EvalPoint] = []
    optimizer = ToyNLL(WeightOptimizerConfig(output_dir=str(tmp_path), show_progress=False), steps=(2, 3))
    optimizer.set_eval_hook(points.append, every=2)
    valset = ["held-out"]
    optimizer.compile(lm, trainset=[], valset=valset)
    seen = [(p.stage, p.step, p.global_step, p.stage_done) for p in points]
    assert seen == [("s0", 2, 2, True), ("s1", 2, 4, False), ("s1", 3, 5, True)]
    assert all(p.student is lm and p.valset is valset for p in points)
    assert optimizer.stop_reason == "completed"


def test_a_hook_returning_true_stops_training_and_says_so(smollm_tokenizer, tmp_path):
    lm = LocalLM(conftest.make_tiny_llama(smollm_tokenizer), tokenizer=smollm_tokenizer)
    optimizer = ToyNLL(WeightOptimizerConfig(output_dir=str(tmp_path), show_progress=False), steps=(2, 3))
    optimizer.set_eval_hook(lambda p: p.global_step >= 3, every=1)
    optimizer.compile(lm, trainset=[])
    assert len(optimizer.history) == 3 and optimizer.stop_reason == "eval_hook"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stop_reason"] == "eval_hook" and summary["steps"] == {"s0": 2, "s1": 1}
    assert "evaluation hook" in summary["stopped"]["s1"] and "s0" not in summary["stopped"]


def test_evaluating_does_not_change_training(smollm_tokenizer):
    """A hook that draws from the global RNGs (as sampling would) leaves the trained adapters bit-identical."""
    weights = []
    for hook in (None, lambda p: [random.random(), torch.rand(3)] and None):
        lm = LocalLM(conftest.make_tiny_llama(smollm_tokenizer), tokenizer=smollm_tokenizer)
        optimizer = ToyNLL(WeightOptimizerConfig(show_progress=False, seed=1), steps=(2, 2))
        optimizer.set_eval_hook(hook, every=1)
        optimizer.compile(lm, trainset=[])
        weights.append(lora(lm))
    assert weights[0].keys() == weights[1].keys() and weights[0]
    assert all(torch.equal(weights[0][n], weights[1][n]) for n in weights[0])


@pytest.mark.parametrize("every", [0, -1, 1.5, True])
def test_every_must_be_a_positive_integer(every):
    with pytest.raises(ConfigError, match="every"):
        ToyNLL(WeightOptimizerConfig(show_progress=False)).set_eval_hook(lambda p: None, every=every)


def test_the_time_budget_does_not_pay_for_evaluation(smollm_tokenizer):
    """A virtual clock: each step takes 0.5 s, each evaluation 100 s; a 6 s budget still trains all 4 steps."""
    now = [0.0]

    class Timed(ToyNLL):
        def generate(self, ctx, batch):
            now[0] += 0.5
            return super().generate(ctx, batch)

    def slow_hook(point: EvalPoint) -> None:
        now[0] += 100.0

    lm = LocalLM(conftest.make_tiny_llama(smollm_tokenizer), tokenizer=smollm_tokenizer)
    optimizer = Timed(WeightOptimizerConfig(time_budget_minutes=0.1, show_progress=False), steps=(2, 2))
    optimizer.clock = lambda: now[0]
    optimizer.set_eval_hook(slow_hook, every=1)
    optimizer.compile(lm, trainset=[])
    assert len(optimizer.history) == 4 and optimizer.stop_reason == "completed" and now[0] > 400
    assert optimizer.history[-1]["elapsed_s"] == pytest.approx(2.0)
