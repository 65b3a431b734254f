"""Does it matter which thread trains? Generation after training steps run on the generating thread vs the main thread.

PyTorch's CPU thread pool (OpenMP) belongs to the thread that runs the work. Generation runs on the batcher's worker
thread; a trainer that runs forward and backward passes on the main thread gives the process a second pool, and once
there are more pool threads than cores, both pools stop spin-waiting at their barriers. ``AdapterTrainer`` therefore
runs its steps through ``ModelBackend.run_on_model_thread``. This script measures the difference, in one process and
in this order, because the second pool never goes away once made:

1. ``fresh``: generate a fixed batch of completions (the base model, greedy, so every round does the same work);
2. ``model thread``: ``--steps`` LoRA SFT steps through ``AdapterTrainer.step``, then the same generation;
3. ``main thread``: the same steps run directly on the main thread (what the trainer did before), then the same
   generation.

Reported: each round's generation seconds and ratio to ``fresh``, and the ratio of the training seconds.

Example:
    .venv/bin/python benchmarks/bench_model_thread.py --prompts 24 --steps 8
"""

from __future__ import annotations

import logging
import time
from typing import Any

from _common import bench_parser, write_results


def main() -> None:
    parser = bench_parser(__doc__, "bench_model_thread")
    parser.add_argument("--prompts", type=int, default=24, help="questions generated concurrently per round")
    parser.add_argument("--max-tokens", type=int, default=48, help="tokens generated per question (default 48)")
    parser.add_argument("--steps", type=int, default=8, help="SFT steps of 2 samples per training phase")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from rolecall.data.synthetic import synthetic_world
    from rolecall.lm import LocalLM
    from rolecall.lm.generation import GenerationRequest
    from rolecall.optimizers.core import AdapterTrainer, TrainerConfig, TrainingSample

    world = synthetic_world(seed=0)
    lm = LocalLM()
    backend, tok = lm.backend, lm.tokenizer
    questions = world.test[: args.prompts]
    prompts = [backend.encode_messages([{"role": "user", "content": q.question}]) for q in questions]
    samples = [
        TrainingSample(role="answer", adapter="answer", prompt_ids=p,
                       completion_ids=tok(q.answers[0], add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
        for p, q in zip(prompts, questions, strict=True)
    ]  # fmt: skip
    requests = [GenerationRequest(prompt_ids=p, max_tokens=args.max_tokens, temperature=0.0) for p in prompts]
    trainer = AdapterTrainer(lm.for_role("answer"), "answer", TrainerConfig(learning_rate=1e-5, micro_batch_size=2,
                                                                            gradient_accumulation_steps=1))  # fmt: skip
    batch = [samples[i % len(samples)] for i in range(2 * args.steps)]

    def generation() -> tuple[float, int]:
        started = time.perf_counter()
        outs = backend.generate(requests)  # the base model: the same work in every round
        return time.perf_counter() - started, sum(len(o[0].token_ids) for o in outs)

    def timed(fn: Any) -> float:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started

    generation()  # warm-up: allocator, prefix cache
    rounds: dict[str, dict[str, float]] = {}
    seconds, tokens = generation()
    rounds["fresh"] = {"generate_s": seconds, "tokens": tokens}
    train_s = timed(lambda: trainer.step(batch))
    seconds, tokens = generation()
    rounds["model thread"] = {"train_s": train_s, "generate_s": seconds, "tokens": tokens}
    chunks = [batch[i : i + 2] for i in range(0, len(batch), 2)]
    train_s = timed(lambda: trainer._train(chunks))  # the old path: the steps on the calling (main) thread
    seconds, tokens = generation()
    rounds["main thread"] = {"train_s": train_s, "generate_s": seconds, "tokens": tokens}
    fresh = rounds["fresh"]["generate_s"]
    for name, r in rounds.items():
        r["generate_vs_fresh"] = r["generate_s"] / fresh
        print(f"{name:13s} generate {r['generate_s']:6.1f}s ({r['generate_vs_fresh']:.2f}x fresh, {r['tokens']} tokens)"
              + (f"  train {r['train_s']:.1f}s" if "train_s" in r else ""))  # fmt: skip
    ratios = {
        "generation_after_main_thread_training_vs_model_thread": rounds["main thread"]["generate_s"]
        / rounds["model thread"]["generate_s"],
        "main_thread_training_vs_model_thread": rounds["main thread"]["train_s"] / rounds["model thread"]["train_s"],
    }
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}x")
    out = write_results({"rounds": rounds, "ratios": ratios}, args)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
