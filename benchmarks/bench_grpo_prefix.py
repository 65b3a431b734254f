"""A GRPO update whose group completions share one prompt encoding vs the packed batch, on the embedded model.

A MAPGRPO step trains on G - 1 completions of each input's prompt. Packed, every row re-encodes the prompt (OPERA's
demo-free analysis prompt is ~250 tokens; a completion ~30); shared, the prompt is encoded once per micro-batch and
its KV cache repeated over the rows (``TrainerConfig.share_prompt_prefix``, gradients flowing through the shared
pass). This bench builds ``--groups`` groups of ``--group-size`` samples from OPERA's gold-path prompts of the role
(demo-free, as after SFT) with the gold completion and sampled ones, and times ``AdapterTrainer.step`` on them with
both settings in alternation (``--rounds`` each, two fresh adapters, one process), checking that both give the same
loss. Writes ``benchmarks/results/bench_grpo_prefix.json``.

Example:
    .venv/bin/python benchmarks/bench_grpo_prefix.py --rounds 3
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

from _common import bench_parser, write_results


def main() -> None:
    parser = bench_parser(__doc__, "bench_grpo_prefix")
    parser.add_argument("--role", default="analysis", choices=("plan", "analysis", "rewrite"), help="OPERA role")
    parser.add_argument("--groups", type=int, default=4, help="groups (prompts) per step (default 4)")
    parser.add_argument("--group-size", type=int, default=3, help="completions per prompt (default 3: G - 1 of 4)")
    parser.add_argument("--micro-batch", type=int, default=3, help="samples per forward pass (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="timed steps per setting (default 3)")
    args = parser.parse_args()

    from rolecall.data.synthetic import synthetic_world
    from rolecall.lm import LocalLM
    from rolecall.lm.generation import GenerationRequest
    from rolecall.optimizers.core import AdapterTrainer, TrainerConfig
    from rolecall.optimizers.sft import SFT
    from rolecall.programs.registry import build_program
    from rolecall.retrievers.bm25 import BM25

    world = synthetic_world(seed=0)
    lm = LocalLM()
    program = build_program("opera", BM25(world.corpus), lm)
    collector = SFT(roles=(args.role,), show_progress=False, num_threads=8)
    gold = collector._collect_samples(program, list(world.train[:40]), set(program.adapter_roles()))[args.role]
    gold = gold[: args.groups]
    backend = lm.backend
    # each group: the gold completion plus G-1 sampled ones of the same prompt, advantages of both signs
    requests = [GenerationRequest(prompt_ids=s.prompt_ids, n=args.group_size - 1, temperature=1.0, max_tokens=48,
                                  seed=1000 * i) for i, s in enumerate(gold)]  # fmt: skip
    sampled = backend.generate(requests)
    samples = []
    for g, (sample, completions) in enumerate(zip(gold, sampled, strict=True)):
        rows = [sample.completion_ids] + [c.token_ids for c in completions]
        for i, ids in enumerate(rows[: args.group_size]):
            samples.append(dataclasses.replace(sample, completion_ids=list(ids), loss_mask=None,
                                               advantage=(1.0 if i == 0 else -0.5) * (1 + g % 2)))  # fmt: skip
    prompt_tokens = sum(len(s.prompt_ids) for s in samples)
    completion_tokens = sum(len(s.completion_ids) for s in samples)
    trainers = {}
    for shared in (False, True):
        config = TrainerConfig(loss="grpo", loss_type="dapo", learning_rate=1e-5, kl_beta=0.0,
                               micro_batch_size=args.micro_batch, gradient_accumulation_steps=len(samples),
                               share_prompt_prefix=shared)  # fmt: skip
        trainers[shared] = AdapterTrainer(backend, f"{args.role}_{'shared' if shared else 'packed'}", config)
    times: dict[bool, list[float]] = {False: [], True: []}
    losses: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for shared in (False, True):
            batch = [dataclasses.replace(s, adapter=trainers[shared].adapter) for s in samples]
            started = time.perf_counter()
            metrics = trainers[shared].step(batch)
            times[shared].append(time.perf_counter() - started)
            losses[shared].append(metrics["loss/total"])
    packed, shared = statistics.median(times[False]), statistics.median(times[True])
    results: dict[str, Any] = {
        "role": args.role,
        "samples": len(samples),
        "groups": len(gold),
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "packed_step_s": times[False],
        "shared_step_s": times[True],
        "speedup": packed / shared,
        "first_step_loss": {"packed": losses[False][0], "shared": losses[True][0]},
    }
    print(f"{len(samples)} samples ({prompt_tokens} prompt / {completion_tokens} completion tokens): packed "
          f"{packed:.1f} s vs shared prompt {shared:.1f} s per step: {packed / shared:.2f}x; first-step loss "
          f"{losses[False][0]:.5f} vs {losses[True][0]:.5f}")  # fmt: skip
    out = write_results(results, args)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
