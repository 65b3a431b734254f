"""Adding a system and an optimizer is one registration each: a toy program and a toy optimizer registered here are
listed by ``rolecall programs``, get generated ``--help`` and flags, are checked before a model loads, and compile
through the CLI with real gradient steps on a tiny model."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass

import pytest

from rolecall.cli import main
from rolecall.optimizers.core.base import RunConfig, Stage, StepContext, WeightOptimizer
from rolecall.optimizers.core.config import TrainerConfig
from rolecall.optimizers.core.sample import TrainingSample
from rolecall.optimizers.registry import OptimizerEntry, register_optimizer, unregister_optimizer
from rolecall.programs.baselines import SingleStepRAG
from rolecall.programs.core.options import option
from rolecall.programs.registry import System, register_system, unregister_system


class ToyRAG(SingleStepRAG):
    """A toy system: single-step RAG under its own name."""


@dataclass(kw_only=True)
class ToyConfig(RunConfig):
    """Settings of the toy optimizer."""

    toy_steps: int = option(2, low=1)
    """Optimizer steps of the toy's one stage."""
    toy_learning_rate: float = option(1e-2, low=1e-8, high=1.0)
    """AdamW learning rate of the toy's updates."""


class ToyOptimizer(WeightOptimizer):
    """Teaches the answer role to say 'Toy' after any question: one NLL stage of ``toy_steps`` steps."""

    def __init__(self, config: ToyConfig | None = None, **fields) -> None:
        self.toy_config = ToyConfig.merged(config, fields)
        super().__init__(self.toy_config.loop_config("sequential"))

    def stages(self, student, trainset):
        cfg = self.toy_config
        trainer = TrainerConfig(loss="nll", learning_rate=cfg.toy_learning_rate, micro_batch_size=1,
                                gradient_accumulation_steps=1)  # fmt: skip
        return [Stage(name="answer", adapter=student.roles["answer"].lm.adapter, steps=cfg.toy_steps, trainer=trainer)]

    def collect(self, ctx: StepContext):
        backend = self.backend_of_student
        [example] = ctx.take(self.trainset, 1)
        prompt = backend.encode_messages([{"role": "user", "content": example.question}])
        completion = list(backend.tokenizer("Toy", add_special_tokens=False)["input_ids"]) + [backend.eos_token_ids[0]]
        return [TrainingSample(role="answer", adapter=ctx.stage.adapter, prompt_ids=prompt, completion_ids=completion)]

    def compile(self, student, *, trainset, valset=None, **kw):
        self.trainset, self.backend_of_student = list(trainset), student.lm.backend
        return super().compile(student, trainset=trainset, valset=valset, **kw)


@pytest.fixture
def toy_registered(monkeypatch):
    module = types.ModuleType("toy_rolecall_system")
    module.ToyRAG, module.ToyConfig, module.ToyOptimizer = ToyRAG, ToyConfig, ToyOptimizer
    monkeypatch.setitem(sys.modules, "toy_rolecall_system", module)
    register_optimizer(OptimizerEntry(name="toy_opt", optimizer="toy_rolecall_system:ToyOptimizer",
                                      config="toy_rolecall_system:ToyConfig", summary="the toy: says Toy"))  # fmt: skip
    register_system(System(name="toy_rag", program="toy_rolecall_system:ToyRAG", optimizers=("toy_opt",)))
    yield
    unregister_system("toy_rag")
    unregister_optimizer("toy_opt")


def test_a_registered_toy_is_listed_and_its_settings_are_flags(toy_registered, capsys):
    assert main(["programs"]) == 0
    listing = capsys.readouterr().out
    assert "toy_rag" in listing and "toy_opt" in listing and "applies to: toy_rag" in listing
    with pytest.raises(SystemExit) as exit_info:
        main(["compile", "--program", "toy_rag", "--optimizer", "toy_opt", "--help"])
    assert exit_info.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the help lines
    assert "toy_opt settings (ToyConfig)" in shown
    assert "--toy-steps N" in shown and "Optimizer steps of the toy's one stage. [int >= 1; default: 2]" in shown
    assert "--group-size N" not in shown  # another optimizer's setting is accepted, not listed


def test_a_bad_toy_setting_or_program_fails_in_one_line_before_a_model_loads(toy_registered, monkeypatch, capsys):
    monkeypatch.setattr("rolecall.lm.local.LocalLM", lambda *a, **k: pytest.fail("model loaded"))
    argv = ["compile", "--program", "toy_rag", "--optimizer", "toy_opt", "--toy-steps", "0", "--out", "x"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err == "rolecall compile: error: --toy-steps 0: option toy_steps must be an int >= 1, got 0"
    assert main(["compile", "--program", "opera", "--optimizer", "toy_opt", "--out", "x"]) == 1
    assert "--optimizer toy_opt applies to toy_rag, not 'opera'" in capsys.readouterr().err


def test_the_toy_compiles_through_the_cli_with_real_updates(toy_registered, tmp_path, tiny_model, smollm_tokenizer,
                                                            capsys):  # fmt: skip
    model_dir, out = tmp_path / "tiny", tmp_path / "toy"
    tiny_model.save_pretrained(model_dir)
    smollm_tokenizer.save_pretrained(model_dir)
    argv = ["compile", "--program", "toy_rag", "--optimizer", "toy_opt", "--toy-steps", "3", "--limit", "4",
            "--model", str(model_dir), "--out", str(out), "--no-progress", "--num-threads", "2"]  # fmt: skip
    assert main(argv) == 0
    assert "toy_rag compiled with toy_opt on 4 synthetic questions" in capsys.readouterr().out
    records = [json.loads(line) for line in (out / "toy_opt" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3] and all(r["loss/total"] > 0 for r in records)
    settings = json.loads((out / "compile_config.json").read_text())["settings"]
    assert settings["optimizers"]["toy_opt"]["toy_steps"] == 3
    assert json.loads((out / "program.json").read_text())["program"].endswith(".ToyRAG")
    from safetensors.torch import load_file  # the LoRA B matrices start at zero: trained, they are not

    (weights,) = (out / "adapters").rglob("*.safetensors")
    assert any(t.abs().sum() > 0 for name, t in load_file(str(weights)).items() if "lora_B" in name)
