"""Data-parallel adapter updates: one ``AdapterTrainer.step`` under two CPU processes (``accelerate launch``, gloo)
equals the one-process step on the same samples; the process-group helpers are the identity in one process; only
the main process writes checkpoints and metrics."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rolecall.optimizers.core import distributed
from rolecall.optimizers.core.checkpoint import save_checkpoint
from rolecall.optimizers.core.metrics_log import MetricsLog

SCRIPT = Path(__file__).with_name("dist_step_script.py")
LOSSES = ("nll", "grpo", "dpo")
LOSS_METRIC = {"nll": "loss/nll", "grpo": "loss/policy", "dpo": "loss/dpo"}
TIMEOUT_S = 180


def _script():
    spec = importlib.util.spec_from_file_location("_dist_step_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _accelerate() -> str | None:
    beside = Path(sys.executable).with_name("accelerate")
    return str(beside) if beside.is_file() else shutil.which("accelerate")


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory) -> Path:
    """Runs the script under ``accelerate launch`` with 2 CPU processes (gloo) once; returns its output folder."""
    accelerate = _accelerate()
    if accelerate is None or not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("needs the `accelerate` launcher and torch.distributed with gloo")
    out = tmp_path_factory.mktemp("two_processes")
    # --multi_gpu: accelerate's torchrun launcher (its --cpu one starts several processes only through mpirun);
    # without a visible GPU the processes join with gloo (distributed.setup)
    command = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
               str(SCRIPT), str(out), *LOSSES, "loop"]  # fmt: skip
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"`{' '.join(command)}` ran past {TIMEOUT_S}s:\n{(exc.stderr or '')[-4000:]}")
    assert done.returncode == 0, f"`{' '.join(command)}` failed:\n{done.stdout[-2000:]}\n{done.stderr[-6000:]}"
    return out


@pytest.mark.parametrize("loss", LOSSES)
def test_a_two_process_step_equals_the_one_process_step(two_process_run, smollm_tokenizer, loss):
    from safetensors.torch import load_file

    script = _script()
    lm, trainer, samples = script.build(loss, smollm_tokenizer)
    init = script.lora_params(lm)
    metrics = trainer.step(samples)  # one process: no process group, today's code path
    one = script.lora_params(lm)

    two = load_file(str(two_process_run / loss / "adapter_model.safetensors"))
    report = json.loads((two_process_run / f"{loss}.json").read_text())
    assert report["world_size"] == 2
    assert report["processes/max_abs_diff"] == 0.0  # both processes hold bitwise the same adapter
    # PEFT saves "...q_proj.lora_A.weight" for the parameter "...q_proj.lora_A.plan.weight"
    two = {name.replace("lora_A.", "lora_A.plan.").replace("lora_B.", "lora_B.plan."): w for name, w in two.items()}
    assert sorted(two) == sorted(one)
    for name, weight in one.items():
        # the same gradient up to float summation order across the processes (AdamW's g / sqrt(v) keeps it small)
        torch.testing.assert_close(two[name], weight, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
        assert not torch.equal(two[name], init[name]), f"{name} did not move in the two-process step"
    for key in ("loss/total", "grad/norm", LOSS_METRIC[loss]):
        assert report[key] == pytest.approx(metrics[key], rel=1e-5), key  # the step's metrics, not the shard's
    for key in ("tokens/loss", "tokens/total", "train/samples", "train/optimizer_steps"):
        assert report[key] == metrics[key], key
    assert metrics["train/optimizer_steps"] == 2.0  # 9 samples, 8 per step: the second step leaves a rank no sample


def test_the_weight_optimizer_loop_under_two_processes_writes_once_and_trains_like_one(
    two_process_run, smollm_tokenizer, tmp_path
):
    from safetensors.torch import load_file

    threads = torch.get_num_threads()
    try:
        _script().run_loop(tmp_path, smollm_tokenizer)
    finally:
        torch.set_num_threads(threads)
    two_out = two_process_run / "loop"
    lines = [json.loads(x) for x in (two_out / "metrics.jsonl").read_text().splitlines()]
    one_lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in lines] == [1, 2, 3]  # one writer: no line twice
    for a, b in zip(lines, one_lines, strict=True):
        assert a["loss/total"] == pytest.approx(b["loss/total"], rel=1e-5) and a["lr"] == b["lr"]
    assert [p.name for p in (two_out / "checkpoints").iterdir()] == ["step-00000003"]
    assert json.loads((two_out / "summary.json").read_text())["steps"] == {"plan": 3}
    two = load_file(str(two_out / "adapters" / "plan" / "adapter_model.safetensors"))
    one = load_file(str(tmp_path / "adapters" / "plan" / "adapter_model.safetensors"))
    assert two.keys() == one.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_helpers_are_the_identity_in_one_process():
    assert distributed.setup() == distributed.world_size() == 1
    assert distributed.rank() == 0 and distributed.is_main_process()
    assert distributed.broadcast_object({"a": 1}) == {"a": 1}
    assert distributed.sum_over_processes({"tokens/loss": 3.0}) == {"tokens/loss": 3.0}
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    distributed.all_reduce_gradients([p])
    distributed.broadcast_parameters([p])
    distributed.barrier()
    assert torch.equal(p.grad, torch.full((3,), 2.0)) and torch.equal(p.detach(), torch.ones(3))


@pytest.mark.parametrize(("n", "world"), [(8, 2), (9, 2), (1, 2), (5, 3), (2, 4)])
def test_shards_are_contiguous_near_equal_and_cover_every_item(n, world):
    items = list(range(n))
    shards = [distributed.shard(items, r, world) for r in range(world)]
    assert [x for part in shards for x in part] == items
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert [len(s) for s in shards] == sorted((len(s) for s in shards), reverse=True)


def test_only_the_main_process_writes_checkpoints_and_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")  # a launched process before any process group: rank from the launcher
    assert not distributed.is_main_process()
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.append({"global_step": 1})
    path = save_checkpoint(tmp_path / "checkpoints", 1, backend=None, adapters=["plan"], trainers={}, state={})
    assert path == tmp_path / "checkpoints" / "step-00000001" and not (tmp_path / "checkpoints").exists()
    assert not log.path.exists()
    monkeypatch.setenv("RANK", "0")
    log.append({"global_step": 1})
    assert log.read() == [{"global_step": 1}]
