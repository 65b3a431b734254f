"""MAPGRPO end to end on a tiny random Llama: stages run in order, adapters change, logs and checkpoints resume."""

from __future__ import annotations

import json

import pytest
import torch

from rolecall.data.synthetic import synthetic_world
from rolecall.errors import ConfigError
from rolecall.lm import LocalLM
from rolecall.optimizers import MAPGRPO, MAPGRPOConfig
from rolecall.optimizers.core.checkpoint import latest_checkpoint
from rolecall.optimizers.core.trainer import AdapterTrainer
from rolecall.programs import OPERA
from rolecall.retrievers.bm25 import BM25


@pytest.fixture(scope="module")
def world():
    return synthetic_world(seed=3, n_train=40, n_dev=10, n_test=10)


def _program(world, tiny_model, tokenizer):
    lm = LocalLM(tiny_model, tokenizer=tokenizer, max_tokens=12)
    return OPERA(BM25(world.corpus), lm=lm, max_steps=2, max_rewrites=1), lm


def _config(tmp_path, **kw):
    base = dict(
        stages=("plan", "analysis", "rewrite"),
        group_size=3,
        steps={"plan": 1, "analysis": 1, "rewrite": 1},
        inputs_per_step=2,
        collect_questions=3,
        learning_rate={"plan": 1e-2, "analysis": 1e-2, "rewrite": 1e-2},
        max_completion_length=12,
        num_threads=3,
        output_dir=tmp_path / "run",
        show_progress=False,
    )
    base.update(kw)
    return MAPGRPOConfig(**base)


def _adapter_weights(lm, role):
    return {n: p.detach().clone() for n, p in lm.hf_model.named_parameters() if f".{role}." in n}


def test_compile_trains_every_role_and_logs(world, tiny_model, smollm_tokenizer, tmp_path):
    program, lm = _program(world, tiny_model, smollm_tokenizer)
    assert "synthesis" in program.roles  # OPERA's default final synthesis: a role MAPGRPO does not train
    before = {r: _adapter_weights(lm, r) for r in ("plan", "analysis", "rewrite", "synthesis")}
    assert before["synthesis"]
    # a random model's samples never parse, so their groups are all-equal and skipped: the expert's gradient
    # (off-policy guidance) is what moves the adapters here
    compiled = program.compile(optimizer=MAPGRPO(_config(tmp_path, expert_gradient=True)), trainset=world.train)
    assert compiled is program
    for role in ("plan", "analysis", "rewrite"):
        after = _adapter_weights(lm, role)
        assert any(not torch.equal(after[n], before[role][n]) for n in after), f"{role} adapter did not change"
    after = _adapter_weights(lm, "synthesis")
    assert all(torch.equal(after[n], before["synthesis"][n]) for n in after), "the untrained synthesis adapter changed"
    assert not (tmp_path / "run" / "adapters" / "synthesis").exists()
    log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in log] == ["plan", "analysis", "rewrite"]
    assert all(r["time/generate"] > 0 and r["time/score"] > 0 and r["time/update"] > 0 for r in log)
    for record in log:
        assert all(
            k in record for k in ("reward/mean", "reward/std", "kl/mean", "clip/frac", "loss/policy", "grad/norm")
        )
        assert all(v == v for v in record.values() if isinstance(v, float))  # no NaN
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "completed" and summary["steps"] == {"plan": 1, "analysis": 1, "rewrite": 1}
    for role in ("plan", "analysis", "rewrite"):
        assert (tmp_path / "run" / "adapters" / role / "adapter_config.json").is_file()
    # the trained program still answers every question without raising
    assert isinstance(program(question=world.test[0].question).answer, str)


def test_killed_run_resumes_from_checkpoint(world, tiny_model, smollm_tokenizer, tmp_path, monkeypatch):
    program, lm = _program(world, tiny_model, smollm_tokenizer)
    cfg = _config(tmp_path, stages=("plan", "analysis"), steps={"plan": 2, "analysis": 1}, expert_gradient=True)
    real_step = AdapterTrainer.step
    calls = {"n": 0}

    def dying_step(self, samples):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed")  # the process dies during the second optimizer step
        return real_step(self, samples)

    monkeypatch.setattr(AdapterTrainer, "step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        program.compile(optimizer=MAPGRPO(cfg), trainset=world.train)
    state = json.loads((latest_checkpoint(tmp_path / "run" / "checkpoints") / "state.json").read_text())
    assert state["global_step"] == 1 and state["steps"] == {"plan": 1}
    monkeypatch.setattr(AdapterTrainer, "step", real_step)
    resumed = MAPGRPO(_config(tmp_path, stages=("plan", "analysis"), steps={"plan": 2, "analysis": 1}, resume=True,
                              expert_gradient=True))  # fmt: skip
    program.compile(optimizer=resumed, trainset=world.train)
    log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["step"]) for r in log] == [("plan", 1), ("plan", 2), ("analysis", 1)]
    assert [(r["stage"], r["step"]) for r in resumed.history] == [("plan", 2), ("analysis", 1)]


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="group_size"):
        MAPGRPOConfig(group_size=1)
    with pytest.raises(ConfigError, match="output_dir"):
        MAPGRPOConfig(resume=True)
    with pytest.raises(ConfigError, match="steps"):
        MAPGRPOConfig(stages=("plan", "judge"))
    with pytest.raises(ConfigError, match="expert"):
        MAPGRPOConfig(expert="oracle")


def test_requires_adapter_views(world):
    import dspy

    program = OPERA(BM25(world.corpus), lm=dspy.utils.DummyLM([{"sub_goals": "[]"}]))
    with pytest.raises(ConfigError, match="LocalLM"):
        MAPGRPO(stages=("plan",), steps={"plan": 1}).compile(program, trainset=world.train)


def test_time_budget_bounds_the_compile(world, tiny_model, smollm_tokenizer, tmp_path):
    """With a spent budget the first stage still takes its one step, later stages are skipped, nothing raises."""
    program, _ = _program(world, tiny_model, smollm_tokenizer)
    cfg = _config(tmp_path, steps={"plan": 3, "analysis": 3, "rewrite": 3}, time_budget_minutes=1e-5)
    optimizer = MAPGRPO(cfg)
    program.compile(optimizer=optimizer, trainset=world.train)
    assert [(r["stage"], r["step"]) for r in optimizer.history] == [("plan", 1)]
