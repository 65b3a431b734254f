"""One ``AdapterTrainer.step`` on fixed samples, per loss, saved as a PEFT adapter by the main process.

``test_distributed.py`` launches it under two CPU processes (gloo)::

    CUDA_VISIBLE_DEVICES= HF_HUB_OFFLINE=1 .venv/bin/accelerate launch --multi_gpu --num_processes 2 \\
        --num_machines 1 --mixed_precision no --dynamo_backend no --main_process_port 0 \\
        tests/optimizers/core/dist_step_script.py OUT nll grpo dpo loop

and imports it to run the same step in one process. Everything is built deterministically: the tiny Llama
(``tests/conftest.py``), the adapter (seeded LoRA A, seeded non-zero LoRA B so that step one moves A too) and the
samples (a mix of prompt and completion lengths; GRPO: three groups of three completions). The second process
passes other samples on purpose: the main process's samples define the step.

Writes ``OUT/<loss>/`` (the adapter) and ``OUT/<loss>.json`` (the step's metrics, the world size and the largest
weight difference between the processes). ``loop`` instead of a loss runs :class:`ToyLoop`, the weight-optimizer
loop, into ``OUT/loop/``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import torch

from rolecall.lm import LocalLM
from rolecall.optimizers.core import (
    AdapterTrainer,
    Stage,
    StepContext,
    TrainerConfig,
    TrainingSample,
    WeightOptimizer,
    WeightOptimizerConfig,
    distributed,
)

ADAPTER = "plan"
QUESTIONS = ["2+2?", "Capital of France?", "Who wrote the novel that the film Zopor Orchard is based on?"]
ANSWERS = ["four", "Paris", "It was written by Margaret Lindqvist in 1931, two years before the film.", "blue",
           "cold", "The river Danube flows through ten countries.", "no", "Seven", "A long winding road"]  # fmt: skip
CONFIGS = {
    "nll": dict(loss="nll"),
    "grpo": dict(loss="grpo", loss_type="dapo", kl_beta=0.04),
    "dpo": dict(loss="dpo", beta=0.1),
}
"""The losses tested. Each trains on nine samples, eight per optimizer step (``micro_batch_size=2``,
``gradient_accumulation_steps=4``): two optimizer steps, the second with one sample, so one process's shard is empty."""


def _make_tiny_llama(tokenizer: Any) -> Any:
    conftest = Path(__file__).resolve().parents[2] / "conftest.py"
    spec = importlib.util.spec_from_file_location("_rolecall_tests_conftest", conftest)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_tiny_llama(tokenizer, seed=0)


def tokenizer() -> Any:
    from transformers import AutoTokenizer

    from rolecall.lm.embedded import embedded_lm_path

    return AutoTokenizer.from_pretrained(str(embedded_lm_path()))


class ToyLoop(WeightOptimizer):
    """The weight-optimizer loop over one NLL stage: three steps of four of the fixed samples, a linear lr decay,
    a (never reached) time budget, a checkpoint per step, ``metrics.jsonl`` and ``summary.json``."""

    def stages(self, student: Any, trainset: Any) -> list[Stage]:
        trainer = TrainerConfig(learning_rate=1e-2, lr_schedule="linear", micro_batch_size=2,
                                gradient_accumulation_steps=2)  # fmt: skip
        return [Stage(name=ADAPTER, adapter=ADAPTER, steps=3, trainer=trainer, roles=(ADAPTER,))]

    def setup(self, student: Any, trainset: Any, stages: list[Stage]) -> None:
        self.pool = samples(student, "nll")

    def collect(self, ctx: StepContext) -> list[TrainingSample]:
        return ctx.take(self.pool, 4)


def model(tok: Any) -> LocalLM:
    """The same tiny Llama with the same adapter in every process."""
    lm = LocalLM(_make_tiny_llama(tok), tokenizer=tok, max_tokens=4, device="cpu")  # as the gloo processes
    torch.manual_seed(1)
    lm.for_role(ADAPTER)  # LoRA A from the seeded RNG
    torch.manual_seed(2)
    with torch.no_grad():  # a non-identity adapter: LoRA acts on the prompts, and A gets a gradient at once
        for name, p in lm.hf_model.named_parameters():
            if f".{ADAPTER}." in name and "lora_B" in name:
                p.normal_(0, 0.05)
    return lm


def build(loss: str, tok: Any) -> tuple[LocalLM, AdapterTrainer, list[TrainingSample]]:
    """The same model, adapter, trainer and samples in every process."""
    lm = model(tok)
    config = TrainerConfig(**CONFIGS[loss], learning_rate=1e-2, micro_batch_size=2, gradient_accumulation_steps=4)
    return lm, AdapterTrainer(lm, ADAPTER, config), samples(lm, loss)


def run_loop(out: Path, tok: Any) -> WeightOptimizer:
    """:class:`ToyLoop` from a fresh start, writing into ``out``."""
    config = WeightOptimizerConfig(output_dir=str(out), time_budget_minutes=10.0, show_progress=False, seed=3)
    optimizer = ToyLoop(config)
    optimizer.compile(model(tok), trainset=[])
    return optimizer


def samples(lm: LocalLM, loss: str) -> list[TrainingSample]:
    tok = lm.tokenizer
    out = []
    for i, answer in enumerate(ANSWERS):
        question = QUESTIONS[i // 3 if loss == "grpo" else i % 3]  # GRPO: groups of three completions of a prompt
        prompt = lm.backend.encode_messages([{"role": "user", "content": question}])
        completion = tok(f"[[ ## answer ## ]]\n{answer}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        extra: dict[str, Any] = {}
        if loss == "grpo":
            extra["advantage"] = [1.0, -0.5, -0.5, 0.8, 0.4, -1.2, 1.5, -1.0, -0.5][i]
        if loss == "dpo":
            wrong = ANSWERS[(i + 4) % len(ANSWERS)]
            extra["rejected_ids"] = tok(f"[[ ## answer ## ]]\n{wrong}", add_special_tokens=False)["input_ids"]
        if i == 4:
            extra["loss_mask"] = [1] * (len(completion) - 2) + [0, 1]
        out.append(TrainingSample(role="qa", adapter=ADAPTER, prompt_ids=prompt, completion_ids=completion, **extra))
    return out


def lora_params(lm: LocalLM) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in lm.hf_model.named_parameters() if f".{ADAPTER}." in n and "lora_" in n}


def run(loss: str, out: Path, tok: Any) -> dict[str, float]:
    """Builds everything, takes one ``step`` and saves the adapter and the metrics (main process)."""
    lm, trainer, step_samples = build(loss, tok)
    if not distributed.is_main_process():
        step_samples = step_samples[:3][::-1]  # ignored: the main process's samples are broadcast
    metrics = trainer.step(step_samples)
    flat = torch.cat([p.reshape(-1) for p in lora_params(lm).values()])
    main = flat.clone()
    distributed.broadcast_parameters([main])
    spread = distributed.sum_over_processes({"max_abs_diff": float((flat - main).abs().max())})["max_abs_diff"]
    if distributed.is_main_process():
        lm.backend.save_adapter(ADAPTER, out / loss)
        report = {**metrics, "world_size": distributed.world_size(), "processes/max_abs_diff": spread}
        (out / f"{loss}.json").write_text(json.dumps(report, indent=1))
    return metrics


def main(argv: list[str]) -> None:
    out, losses = Path(argv[0]), argv[1:] or list(CONFIGS)
    world = distributed.setup()
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer()
    for loss in losses:
        if loss == "loop":
            run_loop(out / "loop", tok)
        else:
            run(loss, out, tok)
    distributed.barrier()
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
