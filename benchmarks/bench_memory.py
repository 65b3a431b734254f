"""Resident memory of a long continuous-batching run under each ``ROLECALL_MALLOC_TUNE`` policy: off, trim, mmap.

A continuous batcher allocates KV-cache buffers of ever different sizes (rows x cached tokens change at every
admission); freed on the heap, they leave holes glibc does not return to the system, so a CPU decoding process creeps
up over minutes (see ``rolecall/lm/memory.py``). ``trim`` (the default) has the batcher call ``malloc_trim(0)`` every
2 s; ``mmap`` sends every allocation of 4 MiB or more to its own mapping; ``off`` is the baseline. The same request
stream goes through the embedded SmolLM2-135M-Instruct in a fresh interpreter per policy (malloc settings are
process-wide and cannot be undone), the policies alternating when ``--rounds`` > 1:

    .venv/bin/python benchmarks/bench_memory.py                     # 192 requests, 32 threads, one round
    .venv/bin/python benchmarks/bench_memory.py --requests 64 --rounds 2 --variants off trim

Requests are chat prompts of 2 to 14 synthetic-world passages (about 150 to 1,400 tokens) with completion budgets of
8 to 96 tokens, greedy, submitted by many threads as multi-role programs do. It prints peak and mean resident memory
and completion tokens/s of each run, then each policy's memory ratios (off / policy: higher is better) and speed ratio
(policy / off: 1.0 is no cost), and writes ``benchmarks/results/bench_memory.json``.

``--workload sft`` measures training instead: in one fresh interpreter each, a plain inference run (prompt-only OPERA
on ``--questions`` synthetic test questions, the baseline) and an SFT compile of OPERA with three role adapters (plan,
analysis, synthesis; ``--sft-steps`` steps each on gold-path samples), both under the default malloc policy. It writes
each run's peak resident memory and their ratio to ``benchmarks/results/bench_memory_sft.json``:

    .venv/bin/python benchmarks/bench_memory.py --workload sft --sft-steps 4
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from _common import bench_parser, write_results

VARIANTS = ("off", "trim", "mmap")  # ROLECALL_MALLOC_TUNE values; "off" is the baseline


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One variant's run in this interpreter; returns its measurements."""
    from rolecall.data.synthetic import synthetic_world
    from rolecall.lm.backend import ModelBackend
    from rolecall.lm.generation import GenerationRequest
    from rolecall.lm.memory import resident_bytes

    backend = ModelBackend("embedded:smollm2-135m-instruct", max_batch_rows=args.threads)
    passages = [f"{d.title} | {d.text}" for d in synthetic_world(seed=0).corpus]
    rng = random.Random(args.seed)
    requests = []
    for i in range(args.requests):
        shown = "\n".join(f"[{j + 1}] {p}" for j, p in enumerate(rng.sample(passages, rng.randint(2, 14))))
        messages = [
            {"role": "system", "content": f"You answer questions from passages. Request {i}."},
            {"role": "user", "content": f"Passages:\n{shown}\n\nQuestion: which places are named above?"},
        ]
        requests.append(
            GenerationRequest(prompt_ids=backend.encode_messages(messages), max_tokens=rng.randint(8, 96), n=1)
        )
    backend.batcher.generate(GenerationRequest(prompt_ids=requests[0].prompt_ids[:16], max_tokens=2))  # warm-up

    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(args.sample_s):
            samples.append(resident_bytes().get("rss", 0))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.threads) as pool:
        completions = list(pool.map(lambda r: backend.batcher.generate(r)[0], requests))
    wall = time.perf_counter() - t0
    stop.set()
    sampler.join()
    tokens = sum(c.completion_tokens for c in completions)
    mem = resident_bytes()
    backend.batcher.close()
    return {
        "wall_s": wall,
        "completion_tokens": tokens,
        "tokens_per_s": tokens / wall,
        "prompt_tokens": sum(len(r.prompt_ids) for r in requests),
        "peak_rss_mb": mem.get("peak", 0) / 2**20,
        "final_rss_mb": mem.get("rss", 0) / 2**20,
        "mean_rss_mb": (sum(samples) / len(samples) / 2**20) if samples else None,
    }


def child_sft(args: argparse.Namespace) -> dict[str, Any]:
    """One run of the SFT workload in this interpreter: ``--phase infer`` (the baseline) or ``--phase train``."""
    from rolecall.data.synthetic import synthetic_world
    from rolecall.evaluation import evaluate
    from rolecall.lm import LocalLM
    from rolecall.lm.memory import resident_bytes
    from rolecall.optimizers.sft import SFT
    from rolecall.programs import OPERA
    from rolecall.retrievers.bm25 import BM25

    world = synthetic_world(seed=args.seed)
    program = OPERA(BM25(world.corpus), lm=LocalLM())
    t0 = time.perf_counter()
    if args.phase == "infer":
        evaluate(program, world.test[: args.questions], num_threads=args.threads, show_progress=False)
    else:
        sft = SFT(roles=("plan", "analysis", "synthesis"), epochs=50.0, max_steps=args.sft_steps,
                  num_threads=args.threads, show_progress=False)  # fmt: skip
        program.compile(optimizer=sft, trainset=world.train[: args.questions * 4])
    mem = resident_bytes()
    return {"phase": args.phase, "wall_s": time.perf_counter() - t0, "peak_rss_mb": mem.get("peak", 0) / 2**20}


def run_sft(args: argparse.Namespace) -> dict[str, Any]:
    """The inference baseline and the SFT compile, each in a fresh interpreter; their peaks and ratio."""
    runs = {}
    for phase in ("infer", "train"):
        cmd = [sys.executable, __file__, "--child", "--workload", "sft", "--phase", phase, "--threads",
               str(args.threads), "--questions", str(args.questions), "--sft-steps", str(args.sft_steps)]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"{phase} run failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
        runs[phase] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"  {phase:<5} peak {runs[phase]['peak_rss_mb']:7.0f} MiB  ({runs[phase]['wall_s']:.0f} s)", flush=True)
    return {
        "runs": runs,
        "sft_peak_gib": runs["train"]["peak_rss_mb"] / 1024,
        "sft_over_inference_peak": runs["train"]["peak_rss_mb"] / runs["infer"]["peak_rss_mb"],
        "target_gib": 4.0,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run each variant ``rounds`` times, alternating, each in a fresh interpreter; returns the measurements."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.variants}
    cmd = [sys.executable, __file__, "--child", "--requests", str(args.requests), "--threads", str(args.threads)]
    cmd += ["--seed", str(args.seed), "--sample-s", str(args.sample_s)]
    for r in range(args.rounds):
        for name in args.variants:
            env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
            env["ROLECALL_MALLOC_TUNE"] = name
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                raise RuntimeError(f"{name} run failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
            m = json.loads(out.stdout.strip().splitlines()[-1])
            runs[name].append(m)
            print(
                f"  round {r + 1} {name:<5} peak {m['peak_rss_mb']:7.0f} MiB  mean {m['mean_rss_mb'] or 0:7.0f} MiB  "
                f"{m['tokens_per_s']:6.1f} tok/s  ({m['wall_s']:.0f} s)",
                flush=True,
            )

    def best(name: str, key: str, fn=min) -> float:
        return fn(m[key] for m in runs[name])

    results: dict[str, Any] = {"runs": runs}
    if "off" in runs:
        for name in runs.keys() - {"off"}:
            results[name] = {
                "peak_rss_ratio": best("off", "peak_rss_mb") / best(name, "peak_rss_mb"),
                "mean_rss_ratio": best("off", "mean_rss_mb") / best(name, "mean_rss_mb"),
                "speed_ratio": best(name, "tokens_per_s", max) / best("off", "tokens_per_s", max),
            }
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_parser(__doc__, "bench_memory")
    parser.add_argument("--requests", type=int, default=192, help="requests per run (default 192)")
    parser.add_argument("--threads", type=int, default=32, help="concurrent requests and batch rows (default 32)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating runs of each variant (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="request-stream seed (default 0)")
    parser.add_argument(
        "--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), help="ROLECALL_MALLOC_TUNE values to run"
    )
    parser.add_argument("--sample-s", type=float, default=0.5, help="seconds between memory samples (default 0.5)")
    parser.add_argument("--workload", choices=("decode", "sft"), default="decode", help="what to measure")
    parser.add_argument("--questions", type=int, default=16, help="sft workload: inference questions (default 16)")
    parser.add_argument("--sft-steps", type=int, default=4, help="sft workload: steps per adapter (default 4)")
    parser.add_argument("--phase", choices=("infer", "train"), default="infer", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child_sft(args) if args.workload == "sft" else child(args)))
        return
    if args.workload == "sft":
        if args.out.name == "bench_memory.json":  # the default: keep the decode results beside it
            args.out = args.out.with_name("bench_memory_sft.json")
        print(f"bench_memory --workload sft: OPERA, {args.questions} questions, {args.sft_steps} SFT steps/adapter")
        results = run_sft(args)
        print(f"SFT peak {results['sft_peak_gib']:.2f} GiB, {results['sft_over_inference_peak']:.2f}x inference")
        print(f"wrote {write_results(results, args)}")
        return
    print(f"bench_memory: {args.requests} requests, {args.threads} threads, {args.rounds} round(s), SmolLM2-135M")
    results = run(args)
    for name in args.variants:
        if name != "off" and name in results:
            r = results[name]
            print(
                f"{name}: off / {name} peak RSS {r['peak_rss_ratio']:.2f}x, mean RSS {r['mean_rss_ratio']:.2f}x; "
                f"{name} / off tokens/s {r['speed_ratio']:.2f}x"
            )
    print(f"wrote {write_results(results, args)}")


if __name__ == "__main__":
    main()
