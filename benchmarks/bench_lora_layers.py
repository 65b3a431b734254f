"""Cost of one SFT step with LoRA on every decoder layer against LoRA on the top half (the role-adapter default).

Both adapters sit on one embedded SmolLM2-135M-Instruct in one process and train on the same samples, their steps
alternating so machine noise hits both alike: 8 samples of ``--prompt-tokens`` + ``--completion-tokens`` (OPERA's
analysis role is about 360 + 52), completion-only NLL, micro-batches of 4. With the lower half frozen, autograd keeps
no activations for it and runs no backward pass through it. Prints the median step time of each and their ratio, and
writes ``benchmarks/results/bench_lora_layers.json``.

Example:
    .venv/bin/python benchmarks/bench_lora_layers.py --steps 3
"""

from __future__ import annotations

import random
import statistics
import time

from _common import bench_parser, write_results


def main() -> None:
    parser = bench_parser(__doc__, "bench_lora_layers")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per adapter (default 3), after one warm-up")
    parser.add_argument("--prompt-tokens", type=int, default=360, help="prompt tokens per sample (default 360)")
    parser.add_argument("--completion-tokens", type=int, default=52, help="completion tokens per sample (default 52)")
    args = parser.parse_args()

    from rolecall.lm import LocalLM, default_lora_config
    from rolecall.optimizers.core import AdapterTrainer, TrainerConfig, TrainingSample

    lm = LocalLM()
    backend = lm.backend
    layers = backend.model.config.num_hidden_layers
    variants = {"all_layers": default_lora_config(), "top_half": default_lora_config(layers)}
    config = TrainerConfig(loss="nll", learning_rate=2e-3, micro_batch_size=4, gradient_accumulation_steps=2)
    trainers = {}
    for name, lora in variants.items():
        backend.lora_config = lora  # the config the next new adapter gets
        trainers[name] = AdapterTrainer(backend, name, config)
    backend.lora_config = None
    rng = random.Random(0)
    vocab = len(backend.tokenizer)

    def samples(adapter: str) -> list[TrainingSample]:
        return [
            TrainingSample(
                role="analysis",
                adapter=adapter,
                prompt_ids=[rng.randrange(100, vocab) for _ in range(args.prompt_tokens)],
                completion_ids=[rng.randrange(100, vocab) for _ in range(args.completion_tokens)],
            )
            for _ in range(8)
        ]

    times: dict[str, list[float]] = {name: [] for name in trainers}
    for step in range(args.steps + 1):  # step 0 warms up
        for name, trainer in trainers.items():
            batch = samples(name)
            started = time.perf_counter()
            trainer.step(batch)
            if step:
                times[name].append(time.perf_counter() - started)
    median = {name: statistics.median(t) for name, t in times.items()}
    ratio = median["all_layers"] / median["top_half"]
    params = {name: sum(p.numel() for p in t.params) for name, t in trainers.items()}
    for name in trainers:
        print(f"{name:10s}  median step {median[name]:6.1f} s  ({params[name]:,} LoRA parameters)")
    print(f"all layers / top half: {ratio:.2f}x")
    out = write_results(
        {"step_seconds": times, "median_step_s": median, "all_over_top_half": ratio, "lora_parameters": params,
         "decoder_layers": layers},
        args,
    )  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
