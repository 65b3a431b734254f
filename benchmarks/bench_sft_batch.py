"""What an SFT role learns in a fixed CPU time at 8, 4 and 2 samples per optimizer step.

On 2 CPU cores the training budget, not the data, is what runs out: 15 minutes of 8-sample steps saw fewer than half
of OPERA's gold analysis samples once. This bench trains one fresh adapter per batch size on the same gold samples
(OPERA's role ``--role`` on ``--train-questions`` synthetic training questions, demo-free prompts, completion-only
NLL, AdamW at ``--learning-rate``) on one embedded SmolLM2-135M-Instruct in one process. The adapters take turns, the
one with the least training time so far stepping next, so machine noise hits them alike, until each has trained
``--seconds``. Each is then scored greedily on the same held-out prompts (gold-path prompts of the test questions): the
share whose parsed answer field (``--field``) equals the gold one. Writes ``benchmarks/results/bench_sft_batch.json``.

Example:
    .venv/bin/python benchmarks/bench_sft_batch.py --seconds 200
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

from _common import bench_parser, write_results

FIELDS = {"plan": "sub_goals", "analysis": "answer", "synthesis": "answer", "rewrite": "query"}


def main() -> None:
    parser = bench_parser(__doc__, "bench_sft_batch")
    parser.add_argument("--role", default="analysis", choices=sorted(FIELDS), help="OPERA role (default analysis)")
    parser.add_argument("--batch-sizes", default="8,4,2", help="samples per step to compare (default 8,4,2)")
    parser.add_argument("--seconds", type=float, default=200.0, help="training seconds per adapter (default 200)")
    parser.add_argument("--learning-rate", type=float, default=2e-3, help="AdamW learning rate (default 2e-3)")
    parser.add_argument("--train-questions", type=int, default=400, help="training questions (default 400)")
    parser.add_argument("--val-prompts", type=int, default=32, help="held-out prompts scored (default 32)")
    args = parser.parse_args()

    import dspy

    from rolecall.data.synthetic import synthetic_world
    from rolecall.lm import LocalLM
    from rolecall.lm.generation import GenerationRequest
    from rolecall.optimizers.core import AdapterTrainer, TrainerConfig
    from rolecall.optimizers.sft import SFT
    from rolecall.programs.registry import build_program
    from rolecall.retrievers.bm25 import BM25

    sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    world = synthetic_world(seed=0)
    lm = LocalLM()
    program = build_program("opera", BM25(world.corpus), lm)
    collector = SFT(roles=(args.role,), show_progress=False, num_threads=8)
    adapters = set(program.adapter_roles())
    train = collector._collect_samples(program, list(world.train[: args.train_questions]), adapters)[args.role]
    val = collector._collect_samples(program, list(world.test[:100]), adapters)[args.role][: args.val_prompts]
    random.Random(0).shuffle(train)
    backend = lm.backend
    tokenizer = backend.tokenizer
    signature = program.roles[args.role].signature
    chat = dspy.ChatAdapter()

    def field(text: str) -> Any:
        try:
            return chat.parse(signature, text).get(FIELDS[args.role])
        except Exception:  # an unparseable completion scores as wrong
            return None

    gold = [field(tokenizer.decode(s.completion_ids, skip_special_tokens=True)) for s in val]
    runs: dict[int, dict[str, Any]] = {}
    for size in sizes:
        config = TrainerConfig(loss="nll", learning_rate=args.learning_rate, micro_batch_size=size,
                               gradient_accumulation_steps=1)  # fmt: skip
        runs[size] = {"trainer": AdapterTrainer(backend, f"{args.role}_b{size}", config), "train_s": 0.0,
                      "steps": 0, "next": 0}  # fmt: skip
    while True:
        open_runs = [s for s in sizes if runs[s]["train_s"] < args.seconds]
        if not open_runs:
            break
        size = min(open_runs, key=lambda s: runs[s]["train_s"])
        run = runs[size]
        adapter = run["trainer"].adapter
        batch = [dataclasses.replace(train[(run["next"] + j) % len(train)], adapter=adapter) for j in range(size)]
        run["next"] += size
        started = time.perf_counter()
        run["trainer"].step(batch)
        run["train_s"] += time.perf_counter() - started
        run["steps"] += 1

    results: dict[str, Any] = {}
    max_tokens = program.MAX_TOKENS[args.role]
    for size in sizes:
        adapter = f"{args.role}_b{size}"
        requests = [GenerationRequest(prompt_ids=s.prompt_ids, max_tokens=max_tokens, adapter=adapter) for s in val]
        outputs = backend.generate(requests)
        predicted = [field(out[0].text) for out in outputs]
        correct = sum(p is not None and p == g for p, g in zip(predicted, gold, strict=True))
        run = runs[size]
        results[str(size)] = {
            "steps": run["steps"],
            "samples_seen": run["next"],
            "train_s": round(run["train_s"], 1),
            "seconds_per_sample": round(run["train_s"] / max(run["next"], 1), 3),
            "field_accuracy": correct / len(val),
            "parsed": sum(p is not None for p in predicted) / len(val),
        }
        print(f"batch {size}: {run['steps']} steps, {run['next']} samples in {run['train_s']:.0f} s -> "
              f"{correct}/{len(val)} held-out {FIELDS[args.role]} fields right")  # fmt: skip
    out = write_results(
        {"role": args.role, "field": FIELDS[args.role], "train_samples": len(train), "val_prompts": len(val),
         "learning_rate": args.learning_rate, "seconds_per_adapter": args.seconds, "by_batch_size": results},
        args,
    )  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
