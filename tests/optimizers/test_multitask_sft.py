"""REAP's multi-task SFT: one shared adapter for the planning tasks, each weighted, and the pairing checks."""

from __future__ import annotations

import pytest
import torch

from rolecall.data.synthetic import synthetic_world
from rolecall.errors import ConfigError
from rolecall.lm import LocalLM
from rolecall.optimizers.multitask_sft import PLANNING_ROLES, MultiTaskSFT
from rolecall.optimizers.sft import SFT
from rolecall.programs import OPERA, REAP
from rolecall.retrievers.bm25 import BM25


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=0, n_train=6, n_dev=2, n_test=2)


@pytest.fixture
def lm(tiny_model, smollm_tokenizer):
    return LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=4)


def test_one_multitask_adapter_learns_the_planning_tasks_with_their_weights(world, lm):
    program = REAP(BM25(world.corpus), lm=lm)
    optimizer = MultiTaskSFT(task_weights={"decomposer": 0.5}, epochs=1, learning_rate=1e-2, show_progress=False,
                             num_threads=2)  # fmt: skip
    program.compile(optimizer=optimizer, trainset=world.train)
    assert program.adapter_groups == {"multitask": list(PLANNING_ROLES)}
    assert {r["adapter"] for r in optimizer.history} == {"multitask"}  # extractor and synthesizer untouched
    samples = optimizer.samples["multitask"]
    assert {s.role for s in samples} <= set(PLANNING_ROLES) and any(s.role == "decomposer" for s in samples)
    assert all(s.weight == (0.5 if s.role == "decomposer" else 1.0) for s in samples)
    trained = [p for n, p in lm.backend.model.named_parameters() if ".multitask." in n and "lora_B" in n]
    assert trained and any(torch.count_nonzero(p) for p in trained)  # lora_B starts at zero: it moved
    assert "multitask" in program.demo_free_adapters and program.decomposer.demos == []


def test_multitask_sft_matches_sft_samples_of_one_adapter_per_role(world, smollm_tokenizer, tiny_model):
    # the comparison the paper's claim needs: the same gold data, merged into one adapter or one per role
    lm = LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=4)
    merged = MultiTaskSFT(epochs=1, max_steps=1, show_progress=False, num_threads=2)
    REAP(BM25(world.corpus), lm=lm).compile(optimizer=merged, trainset=world.train)
    separate = SFT(roles=PLANNING_ROLES, epochs=1, max_steps=1, show_progress=False, num_threads=2)
    REAP(BM25(world.corpus), lm=lm, adapter_groups={}).compile(optimizer=separate, trainset=world.train)
    by_role = sorted((s.role, s.prompt_ids, s.completion_ids) for v in separate.samples.values() for s in v)
    assert by_role == sorted((s.role, s.prompt_ids, s.completion_ids) for s in merged.samples["multitask"])


def test_multitask_sft_errors_name_the_fix(world, lm):
    with pytest.raises(ConfigError, match="applies to the reap program"):
        OPERA(BM25(world.corpus), lm=lm).compile(optimizer=MultiTaskSFT(), trainset=world.train)
    with pytest.raises(ConfigError, match="not trained tasks"):
        MultiTaskSFT(task_weights={"synthesizer": 1.0})
    with pytest.raises(ConfigError, match=">= 0"):
        MultiTaskSFT(task_weights={"replanner": -1.0})
