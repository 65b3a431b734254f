"""Throughput of LocalLM's request batcher: 32 concurrent ``dspy.Predict`` calls vs the same calls one at a time.

Both runs use the embedded SmolLM2-135M-Instruct, greedy decoding, no DSPy cache, the same 32 questions and the same
three demos (the 135M model needs them to follow ChatAdapter's format), in one process:

    .venv/bin/python benchmarks/bench_generation.py             # 32 calls, ChatAdapter
    .venv/bin/python benchmarks/bench_generation.py --calls 16 --dtype bfloat16

It prints completion tokens per second of both runs and their ratio (target on a 2-core CPU: >= 3), and writes the
numbers to ``benchmarks/results/bench_generation.json``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import dspy

from rolecall.lm import LocalLM

from _common import bench_parser, write_results

DEMOS = [
    dspy.Example(question="What is the capital of Italy?", answer="Rome").with_inputs("question"),
    dspy.Example(question="How many legs does a spider have?", answer="Eight").with_inputs("question"),
    dspy.Example(question="Who wrote Hamlet?", answer="William Shakespeare").with_inputs("question"),
]
SUBJECTS = [
    "France",
    "Japan",
    "Spain",
    "Canada",
    "Egypt",
    "Brazil",
    "Kenya",
    "Norway",
    "Chile",
    "India",
    "Peru",
    "Greece",
    "Mexico",
    "Poland",
    "Ghana",
    "Nepal",
]


def questions(n: int) -> list[str]:
    """``n`` short factual questions (two templates over a list of countries)."""
    qs = [f"What is the capital of {c}?" for c in SUBJECTS] + [f"Which continent is {c} in?" for c in SUBJECTS]
    return (qs * (n // len(qs) + 1))[:n]


def completion_tokens(lm: LocalLM, since: int) -> int:
    """Completion tokens recorded in the LM's history after entry ``since``."""
    return sum((h.get("usage") or {}).get("completion_tokens", 0) for h in lm.history[since:])


def run(args: argparse.Namespace) -> dict[str, Any]:
    lm = LocalLM(dtype=args.dtype, cache=False, max_tokens=args.max_tokens, max_batch_rows=args.calls)
    predict = dspy.Predict("question -> answer")
    predict.demos = DEMOS
    qs = questions(args.calls)

    def ask(q: str) -> str:
        with dspy.context(lm=lm):
            try:
                return predict(question=q).answer
            except Exception as exc:  # noqa: BLE001 - a parse failure still generated tokens; count them
                return f"<error: {type(exc).__name__}>"

    ask("What is the capital of Germany?")  # warm-up: kernels, tokenizer, first allocation
    results: dict[str, Any] = {}
    for mode in ("sequential", "concurrent"):
        start_hist = len(lm.history)
        t0 = time.perf_counter()
        if mode == "sequential":
            answers = [ask(q) for q in qs]
        else:
            with ThreadPoolExecutor(max_workers=args.calls) as pool:
                answers = list(pool.map(ask, qs))
        wall = time.perf_counter() - t0
        tokens = completion_tokens(lm, start_hist)
        results[mode] = {
            "wall_s": wall,
            "completion_tokens": tokens,
            "tokens_per_s": tokens / wall,
            "lm_calls": len(lm.history) - start_hist,
            "parsed": sum(not a.startswith("<error") for a in answers),
        }
        print(
            f"  {mode:<11} {wall:7.1f} s  {tokens:6d} tokens  {tokens / wall:7.1f} tok/s  "
            f"parsed {results[mode]['parsed']}/{len(qs)}"
        )
    stats = lm.backend.batcher.stats
    results["ratio"] = results["concurrent"]["tokens_per_s"] / results["sequential"]["tokens_per_s"]
    results["batcher"] = {"batches": stats.batches, "mean_rows": stats.mean_rows, "max_rows": stats.max_rows}
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_parser(__doc__, "bench_generation")
    parser.add_argument("--calls", type=int, default=32, help="number of dspy.Predict calls (default 32)")
    parser.add_argument("--max-tokens", type=int, default=48, help="completion budget per call (default 48)")
    parser.add_argument("--dtype", default="auto", help="model dtype: auto (fp32 on CPU), float32, bfloat16")
    args = parser.parse_args(argv)
    print(f"bench_generation: {args.calls} dspy.Predict calls, embedded SmolLM2-135M, dtype={args.dtype}")
    results = run(args)
    print(f"\nconcurrent / sequential tokens/s = {results['ratio']:.2f}x  (target >= 3)")
    print(f"batcher: {results['batcher']}")
    print(f"wrote {write_results(results, args)}")


if __name__ == "__main__":
    main()
