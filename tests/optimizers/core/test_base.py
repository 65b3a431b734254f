"""WeightOptimizer on the tiny random Llama: a run SIGKILLed after a checkpoint and resumed ends with the adapters of an
uninterrupted run; metrics.jsonl has one line per step with the phase timings; a short budget stops cleanly, split
over the stages, and says why."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from rolecall.lm import LocalLM
from rolecall.optimizers.core.base import Stage, StepContext, WeightOptimizer, WeightOptimizerConfig
from rolecall.optimizers.core.budget import check_budget, next_stage, stage_progress
from rolecall.optimizers.core.checkpoint import latest_checkpoint
from rolecall.optimizers.core.config import TrainerConfig
from rolecall.optimizers.core.sample import TrainingSample

HERE = Path(__file__).resolve()
REPO = HERE.parents[3]
PAIRS = [("2+2?", "four"), ("Capital of France?", "Paris"), ("Color of sky?", "blue"), ("Opposite of hot?", "cold"),
         ("Largest ocean?", "Pacific")]  # fmt: skip


class ToyNLL(WeightOptimizer):
    """Two adapters, each trained with NLL on fixed samples; the generate phase draws random weights from the global
    Python and torch RNGs (so the checkpointed RNG states matter) and optionally sleeps (a slow step)."""

    def __init__(self, config: WeightOptimizerConfig, *, steps: tuple[int, int] = (3, 3), sleep_s: float = 0.0):
        super().__init__(config)
        self.plan, self.sleep_s = steps, sleep_s

    def stages(self, student: Any, trainset: Any) -> list[Stage]:
        trainer = TrainerConfig(learning_rate=1e-2, micro_batch_size=2, gradient_accumulation_steps=1)
        return [Stage(name=f"s{i}", adapter=a, steps=n, trainer=trainer, roles=(a,))
                for i, (a, n) in enumerate(zip(("plan", "answer"), self.plan, strict=True))]  # fmt: skip

    def setup(self, student: Any, trainset: Any, stages: list[Stage]) -> None:
        tok = student.tokenizer
        self.pool = {}
        for stage in stages:
            self.pool[stage.name] = [
                TrainingSample(role=stage.adapter, adapter=stage.adapter,
                               prompt_ids=student.backend.encode_messages([{"role": "user", "content": q}]),
                               completion_ids=tok(f"{stage.adapter}: {a}", add_special_tokens=False)["input_ids"])
                for q, a in PAIRS
            ]  # fmt: skip

    def collect(self, ctx: StepContext) -> list[TrainingSample]:
        return ctx.take(self.pool[ctx.stage.name], 3)

    def generate(self, ctx: StepContext, batch: list[TrainingSample]) -> list[TrainingSample]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        jitter = torch.rand(len(batch)).tolist()
        return [dataclasses.replace(s, weight=0.5 + j + random.random()) for s, j in zip(batch, jitter, strict=True)]


def run_toy(out: str, *, resume: bool, sleep_s: float = 0.0, steps: tuple[int, int] = (3, 3)) -> None:
    """One toy run on a tiny Llama built with seed 0 (what the subprocesses call)."""
    from transformers import AutoTokenizer

    from rolecall.lm.embedded import embedded_lm_path

    torch.set_num_threads(1)
    spec = importlib.util.spec_from_file_location("rolecall_tests_conftest", REPO / "tests" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    tokenizer = AutoTokenizer.from_pretrained(str(embedded_lm_path()))
    lm = LocalLM(conftest.make_tiny_llama(tokenizer, seed=0), tokenizer=tokenizer)
    config = WeightOptimizerConfig(output_dir=out, resume=resume, show_progress=False, seed=3)
    ToyNLL(config, steps=steps, sleep_s=sleep_s).compile(lm, trainset=[])


def spawn(tmp_path: Path, out: Path, *, resume: bool, sleep_s: float = 0.0) -> subprocess.Popen:
    script = tmp_path / "run_toy.py"
    script.write_text(
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('toy_base', {str(HERE)!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "mod.run_toy(sys.argv[1], resume=sys.argv[2] == '1', sleep_s=float(sys.argv[3]))\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    args = [sys.executable, str(script), str(out), "1" if resume else "0", str(sleep_s)]
    return subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen, timeout: float = 240) -> None:
    output, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, output.decode(errors="replace")[-4000:]


def lora_tensors(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = {}
    for adapter in ("plan", "answer"):
        for key, value in load_file(str(out / "adapters" / adapter / "adapter_model.safetensors")).items():
            tensors[f"{adapter}/{key}"] = value
    return tensors


def test_resume_after_sigkill_equals_an_uninterrupted_run(tmp_path):
    full_out, killed_out = tmp_path / "full", tmp_path / "killed"
    full = spawn(tmp_path, full_out, resume=False)
    victim = spawn(tmp_path, killed_out, resume=False, sleep_s=0.5)
    kill_after = 4  # global steps: s0 has 3, so the kill lands inside s1, with both adapters trained
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and victim.poll() is None:
        latest = latest_checkpoint(killed_out / "checkpoints")
        if latest is not None and int(latest.name.split("-")[1]) >= kill_after:
            break
        time.sleep(0.02)
    assert victim.poll() is None, victim.communicate()[0].decode(errors="replace")[-4000:]
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=30)
    assert victim.returncode == -signal.SIGKILL
    checkpoint = latest_checkpoint(killed_out / "checkpoints")
    killed_at = json.loads((checkpoint / "state.json").read_text())["global_step"]
    assert kill_after <= killed_at < 6 and not (killed_out / "summary.json").exists()
    finish(spawn(tmp_path, killed_out, resume=True))
    finish(full)

    expected, resumed = lora_tensors(full_out), lora_tensors(killed_out)
    assert expected.keys() == resumed.keys() and len(expected) > 0
    for key in expected:
        torch.testing.assert_close(resumed[key], expected[key], rtol=1e-6, atol=1e-7, msg=key)
    assert any(bool(v.abs().sum()) for k, v in expected.items() if "lora_B" in k)  # the adapters did train
    lines = [json.loads(x) for x in (killed_out / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in lines] == [1, 2, 3, 4, 5, 6]
    full_lines = [json.loads(x) for x in (full_out / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(lines, full_lines, strict=True):
        assert math.isclose(a["loss/total"], b["loss/total"], rel_tol=1e-5), (a, b)
    summary = json.loads((killed_out / "summary.json").read_text())
    assert summary["stop_reason"] == "completed" and summary["steps"] == {"s0": 3, "s1": 3}


@pytest.fixture
def lm(tiny_model, smollm_tokenizer):
    return LocalLM(tiny_model, tokenizer=smollm_tokenizer)


def test_metrics_jsonl_has_one_line_per_step_with_phase_timings(lm, tmp_path):
    before = {n: p.detach().clone() for n, p in lm.hf_model.named_parameters()}  # the base (no adapters yet)
    optimizer = ToyNLL(WeightOptimizerConfig(output_dir=str(tmp_path), show_progress=False), steps=(2, 3))
    assert optimizer.compile(lm, trainset=[]) is lm
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["step"], r["global_step"]) for r in lines] == [
        ("s0", 1, 1), ("s0", 2, 2), ("s1", 1, 3), ("s1", 2, 4), ("s1", 3, 5)]  # fmt: skip
    for record in lines:
        phases = [record[f"time/{p}"] for p in ("collect", "generate", "execute", "score", "update")]
        assert all(t >= 0 for t in phases) and math.isclose(sum(phases), record["time/step"], rel_tol=1e-6)
        assert math.isfinite(record["loss/total"]) and record["train/samples"] == 3.0
    assert optimizer.history == lines and optimizer.stop_reason == "completed"
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000005"]  # keep_checkpoints=1
    saved = sorted(p.name for p in (tmp_path / "checkpoints" / "step-00000005" / "adapters").iterdir())
    assert saved == ["answer", "plan"]
    changed = {n for n, p in lm.hf_model.named_parameters() if n.endswith(".weight") and "lora_B" in n
               and bool(p.detach().abs().sum())}  # fmt: skip
    assert any(".plan." in n for n in changed) and any(".answer." in n for n in changed)
    base = {n.replace("base_model.model.", "").replace("base_layer.", ""): p for n, p in lm.hf_model.named_parameters()}
    assert all(torch.equal(base[n], p) for n, p in before.items() if n in base)  # the base weights stay frozen


def test_a_short_budget_stops_cleanly_split_over_the_stages(lm, tmp_path):
    # a virtual clock that only the toy's generate phase advances (0.5 s a step): the split is exact, whatever the load
    now = [0.0]
    config = WeightOptimizerConfig(output_dir=str(tmp_path), time_budget_minutes=0.1, show_progress=False)
    optimizer = ToyNLL(config, steps=(10, 30))
    optimizer.clock = lambda: now[0]
    optimizer.generate = lambda ctx, batch: (now.__setitem__(0, now[0] + 0.5), batch)[1]
    optimizer.compile(lm, trainset=[])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert optimizer.stop_reason == summary["stop_reason"] == "time_budget"
    # 12 steps fit: s0 gets 6 s * 10/40 = 1.5 s (3 steps), s1 the 4.5 s left (9 steps): the same 30% of each stage
    assert summary["steps"] == {"s0": 3, "s1": 9} and summary["elapsed_s"] == 6.0
    assert set(summary["stopped"]) == {"s0", "s1"} and all("budget" in why for why in summary["stopped"].values())
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["time/generate"] for r in lines] == [0.5] * 12 and all(r["time/update"] == 0.0 for r in lines)
    last = json.loads((latest_checkpoint(tmp_path / "checkpoints") / "state.json").read_text())
    assert last["global_step"] == 12 and "s1" not in last["stopped"]  # s1's stop came after the last save


def simulate(planned: dict[str, int], cost: dict[str, float], budget: float, schedule: str) -> dict[str, Any]:
    """The loop's budget decisions with fixed step costs (no model): what each stage gets."""
    state: dict[str, Any] = {"steps": {}, "costs": {}, "elapsed_s": 0.0, "allotments": {}, "stopped": {}}
    order = []
    while (name := next_stage(planned, state, schedule)) is not None:
        if (why := check_budget(name, planned, state, budget, schedule)) is not None:
            state["stopped"][name] = why
            continue
        order.append(name)
        state["steps"][name] = state["steps"].get(name, 0) + 1
        seconds, count = state["costs"].get(name, [0.0, 0])
        state["costs"][name] = [seconds + cost[name], count + 1]
        state["elapsed_s"] += cost[name]
    return {"steps": state["steps"], "order": order, "stopped": state["stopped"], "elapsed": state["elapsed_s"]}


def test_the_budget_is_split_by_measured_cost():
    # room for half the work: each sequential stage gets half its steps; nothing runs past the budget
    run = simulate({"a": 4, "b": 8}, {"a": 1.0, "b": 1.0}, budget=6.0, schedule="sequential")
    assert run["steps"] == {"a": 2, "b": 4} and run["elapsed"] <= 6.0 and set(run["stopped"]) == {"a", "b"}
    # a stage's measured cost sets its share against the stages after it: b's 2 s steps make c's estimate 1.5 s
    run = simulate({"a": 2, "b": 4, "c": 4}, {"a": 1.0, "b": 2.0, "c": 2.0}, budget=10.0, schedule="sequential")
    assert run["steps"] == {"a": 2, "b": 2, "c": 2} and run["elapsed"] <= 10.0
    # interleaved (SFT's round-robin) keeps the fraction done equal; a budget that fits everything changes nothing
    run = simulate({"a": 2, "b": 4}, {"a": 1.0, "b": 1.0}, budget=4.0, schedule="interleaved")
    assert run["order"] == ["a", "b", "b", "a"] and run["steps"] == {"a": 2, "b": 2}
    assert simulate({"a": 3, "b": 3}, {"a": 1.0, "b": 2.0}, budget=100.0, schedule="sequential")["stopped"] == {}


def test_stage_progress_is_the_larger_of_steps_done_and_time_spent():
    state: dict[str, Any] = {"steps": {"a": 2, "b": 0}, "costs": {"a": [2.0, 2]}, "elapsed_s": 2.0,
                             "allotments": {}, "stopped": {}}  # fmt: skip
    assert stage_progress("a", {"a": 8, "b": 8}, state, None, "interleaved") == 0.25  # no budget: steps only
    assert stage_progress("a", {"a": 8, "b": 8}, state, 4.0, "interleaved") == 0.5  # half the budget spent
    state["elapsed_s"] = 9.0
    assert stage_progress("a", {"a": 8, "b": 8}, state, 4.0, "interleaved") == 1.0  # clamped
    # sequential: the time spent in the stage against its share (a: 8 of 16 remaining unit-cost steps of 10 s -> 5 s)
    state = {"steps": {"a": 1}, "costs": {"a": [1.0, 1]}, "elapsed_s": 3.0, "stopped": {},
             "allotments": {"a": {"start_s": 2.0, "budget_s": 10.0, "remaining": {"a": 8, "b": 8}}}}  # fmt: skip
    assert stage_progress("a", {"a": 8, "b": 8}, state, 10.0, "sequential") == pytest.approx(1 / 5)


def test_a_linear_schedule_lowers_the_learning_rate_every_step(lm, tmp_path):
    class Linear(ToyNLL):
        def stages(self, student: Any, trainset: Any) -> list[Stage]:
            return [dataclasses.replace(s, trainer=dataclasses.replace(s.trainer, lr_schedule="linear"))
                    for s in super().stages(student, trainset)]  # fmt: skip

    optimizer = Linear(WeightOptimizerConfig(show_progress=False), steps=(4, 2))
    optimizer.compile(lm, trainset=[])
    lrs = [(r["stage"], r["lr"]) for r in optimizer.history]
    assert lrs == [("s0", pytest.approx(1e-2 * f)) for f in (1, 0.75, 0.5, 0.25)] + [
        ("s1", pytest.approx(1e-2)), ("s1", pytest.approx(5e-3))]  # fmt: skip
    constant = ToyNLL(WeightOptimizerConfig(show_progress=False), steps=(2, 1))
    constant.compile(lm, trainset=[])
    assert [r["lr"] for r in constant.history] == [pytest.approx(1e-2)] * 3
