"""SFT on a tiny random Llama: gold-path samples per adapter, real NLL updates, demo-free compiled roles, errors."""

from __future__ import annotations

import json

import pytest
import torch

from rolecall.data.synthetic import synthetic_world
from rolecall.errors import ConfigError
from rolecall.lm import LocalLM
from rolecall.optimizers.sft import SFT
from rolecall.programs import OPERA, REAP, IRCoT, SingleStepRAG
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
    trained = {r["adapter"] for r in sft.history}
    assert {"plan", "analysis", "synthesis"} <= trained
    assert compiled is program and program.demo_free_adapters == trained
    for role, predictor in program.roles.items():  # trained roles run without demos; one without a target keeps them
        assert (predictor.demos == []) == (role in trained), role
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
        match="gold-path builders for CascadedTeam, D2Plan, HierarchicalTeam, NoRetrievalCoT, OPERA, REAP, "
        "STRIDE, SearchR1Agent, SingleStepRAG, not IRCoT",
    ):
        IRCoT(BM25(world.corpus), lm=lm).compile(optimizer=SFT(show_progress=False), trainset=world.train)
    with pytest.raises(ConfigError, match="rolecall.data.Example"):
        OPERA(BM25(world.corpus), lm=lm).compile(optimizer=SFT(), trainset=[e.to_dspy() for e in world.train])
    with pytest.raises(ConfigError, match="lm=LocalLM"):
        OPERA(BM25(world.corpus)).compile(optimizer=SFT(), trainset=world.train)


def _fresh_lm(smollm_tokenizer) -> LocalLM:
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("rolecall_tests_conftest", Path(__file__).parents[1] / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    return LocalLM(conftest.make_tiny_llama(smollm_tokenizer, seed=0), tokenizer=smollm_tokenizer, max_tokens=4)


def test_an_interrupted_sft_resumes_from_its_checkpoint_and_samples_to_the_uninterrupted_adapters(
    world, smollm_tokenizer, tmp_path, monkeypatch
):
    def run(out, *, resume=False, lm=None):
        lm = lm or _fresh_lm(smollm_tokenizer)
        program = OPERA(BM25(world.corpus), lm=lm)
        sft = SFT(epochs=1, max_steps=2, roles=("plan", "synthesis"), learning_rate=1e-2, micro_batch_size=2,
                  gradient_accumulation_steps=1, output_dir=str(out), resume=resume, show_progress=False)  # fmt: skip
        program.compile(optimizer=sft, trainset=world.train)
        return program, sft

    full, _ = run(tmp_path / "full")
    original_update = SFT.update
    calls = []

    def dies_on_the_third_step(self, ctx, samples, trainer):
        calls.append(ctx.global_step)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")
        return original_update(self, ctx, samples, trainer)

    monkeypatch.setattr(SFT, "update", dies_on_the_third_step)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "killed")
    monkeypatch.setattr(SFT, "update", original_update)
    assert (tmp_path / "killed" / "samples.jsonl").exists() and not (tmp_path / "killed" / "summary.json").exists()
    resumed, sft = run(tmp_path / "killed", resume=True)
    assert [r["global_step"] for r in sft.history] == [3, 4]  # only the steps the killed run had not done
    assert resumed.demo_free_adapters == full.demo_free_adapters == {"plan", "synthesis"}
    for adapter in ("plan", "synthesis"):
        expected, got = lora(full.lm, adapter), lora(resumed.lm, adapter)
        assert expected.keys() == got.keys() and expected
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


def test_self_sft_keeps_passing_runs_and_trains_them_on_short_demo_free_prompts(world, lm):
    from dspy.utils.dummies import DummyLM

    from rolecall.optimizers.sft import rerender

    every_field = {"sub_goals": '["Who founded Varn?"]', "sufficient": "yes", "answer": "Ostria",
                   "confidence": "high", "missing_information": "none", "query": "Varn"}  # fmt: skip
    teacher = DummyLM([every_field] * 200)  # writes a parseable output for every OPERA role
    program = OPERA(BM25(world.corpus), lm=lm)
    with pytest.raises(ConfigError, match="no run reached threshold=1.0"):
        program.compile(optimizer=SFT(source="self", tries=1, show_progress=False), trainset=world.train[:2])
    assert program.demo_free_adapters == set() and program.plan.demos  # a failed compile changes nothing
    sft = SFT(source="self", tries=1, threshold=0.0, epochs=1, max_steps=1, show_progress=False, num_threads=2)
    program.compile(optimizer=SFT(sft.sft_config, teacher=teacher), trainset=world.train[:2])
    assert program.demo_free_adapters == {"plan", "analysis", "synthesis"}  # no run called rewrite: it is untrained
    assert all(program.roles[r].demos == [] for r in ("plan", "analysis", "synthesis")) and program.rewrite.demos
    assert program.plan.lm is not teacher  # the student's adapters are bound again after collection
    trajectory = program(question=world.train[0].question).trajectory
    redone = rerender(program, trajectory)
    for old, new in zip(trajectory.steps, redone.steps, strict=True):
        if old.kind == "role" and old.ok:
            assert new.messages[0]["content"] == program.roles[old.role].signature.instructions.strip()
    with pytest.raises(ConfigError, match="pass source='self'"):
        SFT(teacher=lm)


def test_max_steps_may_cap_each_adapter_on_its_own(world, lm):
    program = OPERA(BM25(world.corpus), lm=lm)
    sft = SFT(epochs=5, max_steps={"plan": 2, "synthesis": 1}, roles=("plan", "synthesis"), show_progress=False)
    program.compile(optimizer=sft, trainset=world.train)
    assert sorted((r["adapter"], r["step"]) for r in sft.history) == [("plan", 1), ("plan", 2), ("synthesis", 1)]
    # the default linear schedule: plan's lr halves at its second of two steps; synthesis's one step runs at 2e-3
    assert sorted((r["adapter"], r["lr"]) for r in sft.history) == [
        ("plan", pytest.approx(1e-3)), ("plan", pytest.approx(2e-3)), ("synthesis", pytest.approx(2e-3))]  # fmt: skip
    with pytest.raises(ConfigError, match="max_steps"):
        SFT(max_steps={"plan": "many"})


def test_gold_sft_trains_single_step_rag_on_its_answer_role(world, lm):
    program = SingleStepRAG(BM25(world.corpus), lm=lm)
    sft = SFT(epochs=1, max_steps=1, show_progress=False, num_threads=2)
    program.compile(optimizer=sft, trainset=world.train)
    assert {r["adapter"] for r in sft.history} == set(program.adapter_roles()) and program.demo_free_adapters


def test_without_a_decomposition_only_opera_synthesis_trains_and_the_other_roles_keep_their_demos(world, lm):
    from dataclasses import replace

    without = [replace(e, decomposition=None) for e in world.train]  # HotpotQA: only the answer is gold
    program = OPERA(BM25(world.corpus), lm=lm)
    demos = {role: list(p.demos) for role, p in program.roles.items()}
    sft = SFT(epochs=1, max_steps=1, show_progress=False, num_threads=2)
    program.compile(optimizer=sft, trainset=without)
    assert {r["adapter"] for r in sft.history} == {"synthesis"}  # no sample from a call left to the LM
    assert program.demo_free_adapters == {"synthesis"} and program.synthesis.demos == []
    for role in ("plan", "analysis", "rewrite"):  # untrained: their demos are back for inference
        assert program.roles[role].demos == demos[role] and demos[role], role
    program.mark_trained("plan")  # as if an earlier compile had trained it: a later SFT with no plan target keeps it so
    program.compile(optimizer=SFT(epochs=1, max_steps=1, show_progress=False, num_threads=2), trainset=without)
    assert program.demo_free_adapters == {"plan", "synthesis"} and program.plan.demos == []


def test_sft_roles_trains_only_those_roles_and_names_an_unknown_one(world, lm):
    program = OPERA(BM25(world.corpus), lm=lm)
    sft = SFT(epochs=1, max_steps=1, roles=("synthesis",), show_progress=False, num_threads=2)
    program.compile(optimizer=sft, trainset=world.train)
    assert {r["adapter"] for r in sft.history} == {"synthesis"} and program.demo_free_adapters == {"synthesis"}
    assert program.plan.demos  # never marked trained, so the collection ran it with its demos too
    other = OPERA(BM25(world.corpus), lm=lm)
    with pytest.raises(ConfigError, match=r"no role 'planner'.*'plan', 'analysis'"):
        other.compile(optimizer=SFT(roles=("planner",), show_progress=False), trainset=world.train)
