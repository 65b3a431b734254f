"""Checkpoints on the tiny random Llama: an unchanged adapter or trainer state is hard-linked from the previous
checkpoint, not written again, and still restores exactly; checkpoints of the older one-file layout still load."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from rolecall.lm import LocalLM
from rolecall.optimizers.core.checkpoint import load_checkpoint, rng_state, save_checkpoint
from rolecall.optimizers.core.config import TrainerConfig
from rolecall.optimizers.core.sample import TrainingSample
from rolecall.optimizers.core.trainer import AdapterTrainer


@pytest.fixture
def lm(tiny_model, smollm_tokenizer):
    return LocalLM(tiny_model, tokenizer=smollm_tokenizer)


def train_step(lm: LocalLM, trainer: AdapterTrainer, answer: str) -> None:
    tok = lm.backend.tokenizer
    prompt = lm.backend.encode_messages([{"role": "user", "content": "Capital of France?"}])
    sample = TrainingSample(role=trainer.adapter, adapter=trainer.adapter, prompt_ids=prompt,
                            completion_ids=tok(answer, add_special_tokens=False)["input_ids"])  # fmt: skip
    trainer.step([sample, sample])


def lora_state(lm: LocalLM, adapter: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in lm.hf_model.named_parameters() if f".{adapter}." in n}


def test_unchanged_parts_are_linked_from_the_previous_checkpoint_and_restore_exactly(lm, tmp_path):
    config = TrainerConfig(learning_rate=1e-2, micro_batch_size=2, gradient_accumulation_steps=1)
    trainers = {"s-plan": AdapterTrainer(lm, "plan", config), "s/answer": AdapterTrainer(lm, "answer", config)}
    train_step(lm, trainers["s-plan"], "Paris")
    train_step(lm, trainers["s/answer"], "Lyon")
    root = tmp_path / "checkpoints"
    kw = dict(backend=lm.backend, adapters=["answer", "plan"], trainers=trainers, keep=2)
    first = save_checkpoint(root, 2, state={"global_step": 2}, **kw)
    train_step(lm, trainers["s-plan"], "Paris!")  # only the plan adapter and its trainer change
    second = save_checkpoint(root, 3, state={"global_step": 3}, fresh_adapters={"plan"}, fresh_trainers={"s-plan"},
                             **kw)  # fmt: skip

    def inode(path):
        return path.stat().st_ino

    weights = "adapter_model.safetensors"
    assert inode(second / "adapters" / "answer" / weights) == inode(first / "adapters" / "answer" / weights)
    assert inode(second / "adapters" / "plan" / weights) != inode(first / "adapters" / "plan" / weights)
    assert inode(second / "trainers" / "s%2Fanswer.pt") == inode(first / "trainers" / "s%2Fanswer.pt")
    assert inode(second / "trainers" / "s-plan.pt") != inode(first / "trainers" / "s-plan.pt")

    expected = {a: lora_state(lm, a) for a in ("plan", "answer")}
    moments = copy.deepcopy({k: t.state_dict() for k, t in trainers.items()})  # AdamW updates in place
    train_step(lm, trainers["s-plan"], "Rome")  # move away from the checkpoint, then restore it
    train_step(lm, trainers["s/answer"], "Rome")
    checkpoint = load_checkpoint(root)
    assert checkpoint.path == second and checkpoint.adapters == ["answer", "plan"]
    assert set(checkpoint.trainers) == {"s-plan", "s/answer"}  # the file names are unquoted back
    checkpoint.restore(lm.backend)
    for adapter, tensors in expected.items():
        restored = lora_state(lm, adapter)
        assert restored.keys() == tensors.keys()
        for name, value in tensors.items():
            torch.testing.assert_close(restored[name], value, rtol=0, atol=0, msg=name)
    for name, saved in moments.items():
        assert saved["optimizer"]["state"].keys() == checkpoint.trainers[name]["optimizer"]["state"].keys()
        for key, state in saved["optimizer"]["state"].items():
            torch.testing.assert_close(checkpoint.trainers[name]["optimizer"]["state"][key]["exp_avg"],
                                       state["exp_avg"])  # fmt: skip


def test_a_checkpoint_of_the_one_file_layout_still_loads(lm, tmp_path):
    trainer = AdapterTrainer(lm, "plan", TrainerConfig(learning_rate=1e-2, micro_batch_size=2))
    train_step(lm, trainer, "Paris")
    path = tmp_path / "checkpoints" / "step-00000001"
    lm.backend.save_adapter("plan", path / "adapters" / "plan")
    generator = random.Random(5)
    torch.save({"trainers": {"plan": trainer.state_dict()}, "rng": rng_state(generator)}, path / "trainers.pt")
    (path / "state.json").write_text('{"global_step": 1}')
    checkpoint = load_checkpoint(tmp_path / "checkpoints")
    assert checkpoint.state == {"global_step": 1} and set(checkpoint.trainers) == {"plan"}
    assert checkpoint.rng["generator"] == generator.getstate()


def test_a_checkpoint_missing_its_rng_file_is_a_clear_error(lm, tmp_path):
    trainer = AdapterTrainer(lm, "plan", TrainerConfig(learning_rate=1e-2, micro_batch_size=2))
    path = save_checkpoint(tmp_path, 1, backend=lm.backend, adapters=["plan"], trainers={"plan": trainer},
                           state={"global_step": 1})  # fmt: skip
    (path / "rng.pt").unlink()
    from rolecall.errors import ConfigError

    with pytest.raises(ConfigError, match="unreadable.*delete it"):
        load_checkpoint(tmp_path)
