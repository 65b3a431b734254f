"""Nothing lost on the tiny random Llama: Ctrl-C stops the loop at a checkpoint that ``resume=True`` continues (a
second Ctrl-C stops at once, at the checkpoint before); a damaged newest checkpoint falls back to the intact one before
it; a full disk while checkpointing leaves no half checkpoint and the previous one intact."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from rolecall.lm import LocalLM
from rolecall.optimizers.core.base import Stage, StepContext, WeightOptimizer, WeightOptimizerConfig
from rolecall.optimizers.core.checkpoint import TrainingWriteError, load_checkpoint
from rolecall.optimizers.core.config import TrainerConfig
from rolecall.optimizers.core.interrupt import TrainingInterrupted
from rolecall.optimizers.core.sample import TrainingSample


class Toy(WeightOptimizer):
    """Two adapters trained with NLL on one fixed sample; ``on_step(global_step)`` runs inside each step's generate
    phase (where a test sends itself Ctrl-C)."""

    def __init__(self, config: WeightOptimizerConfig, on_step: Any = None) -> None:
        super().__init__(config)
        self.on_step = on_step

    def stages(self, student: Any, trainset: Any) -> list[Stage]:
        trainer = TrainerConfig(learning_rate=1e-2, micro_batch_size=1)
        return [Stage(name=a, adapter=a, steps=3, trainer=trainer, roles=(a,)) for a in ("plan", "answer")]

    def setup(self, student: Any, trainset: Any, stages: list[Stage]) -> None:
        prompt = student.backend.encode_messages([{"role": "user", "content": "Capital of France?"}])
        ids = student.tokenizer("Paris", add_special_tokens=False)["input_ids"]
        self.pool = {s.adapter: [TrainingSample(role=s.adapter, adapter=s.adapter, prompt_ids=prompt,
                                                completion_ids=ids)] for s in stages}  # fmt: skip

    def collect(self, ctx: StepContext) -> list[TrainingSample]:
        return ctx.take(self.pool[ctx.stage.adapter], 1)

    def generate(self, ctx: StepContext, batch: Any) -> Any:
        if self.on_step is not None:
            self.on_step(ctx.global_step + 1)
        return batch


@pytest.fixture
def lm(tiny_model, smollm_tokenizer):
    return LocalLM(tiny_model, tokenizer=smollm_tokenizer)


def config(out: Path, **kw: Any) -> WeightOptimizerConfig:
    return WeightOptimizerConfig(output_dir=str(out), show_progress=False, **kw)


def global_steps(out: Path) -> list[int]:
    return [json.loads(line)["global_step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def ctrl_c_at(step: int, times: int = 1) -> Any:
    def on_step(global_step: int) -> None:
        if global_step == step:
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGINT)

    return on_step


def test_ctrl_c_stops_after_the_running_step_and_resume_continues(lm, tmp_path):
    with pytest.raises(TrainingInterrupted) as caught:
        Toy(config(tmp_path), on_step=ctrl_c_at(2)).compile(lm, trainset=[])
    checkpoint = tmp_path / "checkpoints" / "step-00000002"
    assert caught.value.checkpoint == checkpoint and caught.value.global_step == 2  # step 2 finished and saved
    assert str(checkpoint) in str(caught.value) and not (tmp_path / "summary.json").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back
    resumed = Toy(config(tmp_path, resume=True))
    resumed.compile(lm, trainset=[])
    assert [r["global_step"] for r in resumed.history] == [3, 4, 5, 6]
    assert global_steps(tmp_path) == [1, 2, 3, 4, 5, 6] and resumed.steps == {"plan": 3, "answer": 3}
    assert json.loads((tmp_path / "summary.json").read_text())["stop_reason"] == "completed"


def test_a_second_ctrl_c_stops_at_once_at_the_checkpoint_before(lm, tmp_path):
    optimizer = Toy(config(tmp_path), on_step=ctrl_c_at(3, times=2))
    with pytest.raises(TrainingInterrupted) as caught:
        optimizer.compile(lm, trainset=[])
    assert caught.value.checkpoint == tmp_path / "checkpoints" / "step-00000002" and caught.value.global_step == 2
    assert optimizer.stop_reason == "interrupted" and global_steps(tmp_path) == [1, 2]


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(lm, tmp_path, caplog):
    Toy(config(tmp_path, keep_checkpoints=2)).compile(lm, trainset=[])
    newest = tmp_path / "checkpoints" / "step-00000006"
    damaged = newest / "trainers" / "answer.pt"
    damaged.unlink()  # a hard link to the previous checkpoint's file: write a new, truncated one
    damaged.write_bytes(b"PK\x03\x04 truncated")
    with caplog.at_level(logging.WARNING):
        checkpoint = load_checkpoint(tmp_path / "checkpoints")
    assert checkpoint.path == tmp_path / "checkpoints" / "step-00000005"
    assert str(damaged) in caplog.text and "step-00000005" in caplog.text


def test_a_full_disk_while_checkpointing_leaves_the_previous_checkpoint_intact(lm, tmp_path, monkeypatch):
    from rolecall.optimizers.core import checkpoint as checkpoint_module

    real_save, calls = checkpoint_module.torch.save, []

    def save(obj: Any, path: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(path)
        if len(calls) == 5:  # step 1 writes a trainer and the RNG file, step 2 the same: the 5th is step 3's
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module.torch, "save", save)
    with pytest.raises(TrainingWriteError) as caught:
        Toy(config(tmp_path)).compile(lm, trainset=[])
    message = str(caught.value)
    assert "No space left on device" in message and str(tmp_path / "checkpoints" / "step-00000003") in message
    assert "step-00000002 is intact" in message and isinstance(caught.value, OSError)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000002"]  # no temporary folder left
    monkeypatch.setattr(checkpoint_module.torch, "save", real_save)
    assert load_checkpoint(tmp_path / "checkpoints").state["global_step"] == 2
    Toy(config(tmp_path, resume=True)).compile(lm, trainset=[])
    assert global_steps(tmp_path) == [1, 2, 3, 4, 5, 6]


def test_a_full_disk_while_logging_metrics_is_one_clear_error(lm, tmp_path, monkeypatch):
    from rolecall.optimizers.core.metrics_log import MetricsLog

    def full(self: Any, record: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(MetricsLog, "append", full)
    with pytest.raises(TrainingWriteError, match=r"metrics.jsonl.*No space left on device.*no checkpoint was written"):
        Toy(config(tmp_path)).compile(lm, trainset=[])
