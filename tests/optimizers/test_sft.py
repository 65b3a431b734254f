"""SFT on a tiny random Llama: gold-path samples per adapter, real NLL updates, demo-free compiled roles, errors."""

from __future__ import annotations

import json

import pytest
import torch

from rolecall.data.synthetic import synthetic_world
from rolecall.errors import ConfigError
from rolecall.lm import LocalLM
from rolecall.optimizers.sft import SFT
from rolecall.programs import OPERA, REAP, SingleStepRAG
from rolecall.retrievers.bm25 import BM25


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=0, n_train=6, n_dev=2, n_test=2)


@pytest.fixture
def lm(tiny_model, smollm_tokenizer):
    return LocalLM(tiny_model, tokenizer=smollm_tokenizer, max_tokens=4)


def lora(lm: LocalLM, adapter: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in lm.hf_model.named_parameters() if f".{adapter}." in n and "lora_" in n}


def test_gold_sft_trains_every_opera_adapter_on_demo_free_prompts(world, lm, tmp_path):
    program = OPERA(BM25(world.corpus), lm=lm)
    assert all(p.demos for p in program.roles.values())
    before = {a: lora(lm, a) for a in program.adapter_roles()}
    sft = SFT(epochs=1, learning_rate=1e-2, output_dir=str(tmp_path), show_progress=False, num_threads=2)
    compiled = program.compile(optimizer=sft, trainset=world.train)
    assert compiled is program and program.demo_free_adapters == {"plan", "analysis", "rewrite", "synthesis"}
    assert all(p.demos == [] for p in program.roles.values())  # the compiled roles run without demos
    trained = {r["adapter"] for r in sft.history}
    assert {"plan", "analysis", "synthesis"} <= trained
    for adapter in trained:  # real gradient updates changed the adapter's weights
        after = lora(lm, adapter)
        assert any(not torch.equal(before[adapter][n], after[n]) for n in after), adapter
    assert all(r["loss/total"] > 0 and r["tokens/loss"] > 0 for r in sft.history)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len(sft.history) and json.loads(lines[0])["adapter"] in trained
    assert (tmp_path / "loss.png").stat().st_size > 0


def test_an_adapter_group_trains_as_one_adapter_on_all_its_roles_samples(world, lm):
    program = REAP(BM25(world.corpus), lm=lm)  # decomposer + replanner share "planner"
    sft = SFT(epochs=1, show_progress=False, num_threads=2)
    program.compile(optimizer=sft, trainset=world.train)
    trained = {r["adapter"] for r in sft.history}
    assert "planner" in trained and "decomposer" not in trained and "replanner" not in trained
    assert {"planner", "extractor", "synthesizer"} <= program.demo_free_adapters
    assert program.decomposer.demos == [] and program.replanner.demos == []


def test_max_steps_and_role_selection(world, lm):
    program = OPERA(BM25(world.corpus), lm=lm)
    sft = SFT(epochs=5, max_steps=1, roles=("plan",), show_progress=False)
    program.compile(optimizer=sft, trainset=world.train)
    assert [(r["adapter"], r["step"]) for r in sft.history] == [("plan", 1)]
    assert program.demo_free_adapters == {"plan"} and program.plan.demos == [] and program.analysis.demos


def test_errors_name_the_fix(world, lm):
    with pytest.raises(ConfigError, match="option epochs must be a float >= 0.01"):
        SFT(epochs=0)
    with pytest.raises(ConfigError, match="SFT has no option 'lr'"):
        SFT(lr=1e-3)
    with pytest.raises(
        ConfigError,
        match="gold-path builders for CascadedTeam, D2Plan, HierarchicalTeam, OPERA, REAP, STRIDE, not SingleStepRAG",
    ):
        SingleStepRAG(BM25(world.corpus), lm=lm).compile(optimizer=SFT(show_progress=False), trainset=world.train)
    with pytest.raises(ConfigError, match="rolecall.data.Example"):
        OPERA(BM25(world.corpus), lm=lm).compile(optimizer=SFT(), trainset=[e.to_dspy() for e in world.train])
    with pytest.raises(ConfigError, match="lm=LocalLM"):
        OPERA(BM25(world.corpus)).compile(optimizer=SFT(), trainset=world.train)
