"""Continuous vs static batching: the same multi-call program evaluation, in one process, with each batcher.

OPERA makes several sequential role calls per question (plan, then analysis and rewrite per sub-goal), and many
questions run at once on threads. Under static batching a call that arrives while a batch decodes waits for the whole
batch; under continuous batching it joins the running decode at the next step, and each role's prompt header (its
instructions and demos) is encoded once and kept in the prefix cache. Both runs use the embedded SmolLM2-135M-Instruct,
greedy decoding, no DSPy cache, the same held-out synthetic questions and the same thread count:

    .venv/bin/python benchmarks/bench_continuous.py                  # 16 questions, 16 threads
    .venv/bin/python benchmarks/bench_continuous.py --questions 32 --program single_step_rag

It prints wall time, completion tokens per second and EM of each run, the continuous / static throughput ratio
(target > 1.5 on a 2-core CPU), how many answers agree between the runs (greedy decoding: they should, up to
floating-point ties), and writes ``benchmarks/results/bench_continuous.json``.

Two more modes each take one later improvement out of the continuous batcher, to measure it against the default:

- ``continuous-copy``: every admission copies every running row's cache, as before newcomers were written in place
  into the running batch's free rows;
- ``continuous-sdpa``: decode steps attend over the whole padded batch width with transformers' SDPA, as before
  the row-wise decode attention (:mod:`rolecall.lm.attention`).

Both costs grow with the prompts, so measure them on a real dataset's closed corpus::

    .venv/bin/python benchmarks/bench_continuous.py --modes continuous-copy continuous --dataset hotpotqa \\
        --program ircot --questions 32 --threads 32 --out benchmarks/results/bench_continuous_inplace.json
    .venv/bin/python benchmarks/bench_continuous.py --modes continuous-sdpa continuous --dataset hotpotqa \\
        --program ircot --questions 32 --threads 32 --out benchmarks/results/bench_continuous_rowwise.json

Each ratio is the default ``continuous`` mode against another mode run in the same process.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dspy

from rolecall.data.corpus import DEV_SUBSET_FILES, build_corpus, dev_subset_path, load_dataset
from rolecall.data.synthetic import synthetic_world
from rolecall.evaluation import evaluate
from rolecall.lm import LocalLM
from rolecall.lm.attention import use_rowwise_attention
from rolecall.programs.registry import build_program
from rolecall.retrievers.bm25 import BM25

from _common import bench_parser, write_results

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
DATA_FILES: dict[str, Path] = {name: dev_subset_path(name, SHARED_DATA) for name in DEV_SUBSET_FILES}
# the modes compared with the default "continuous", and the suffix of their ratio keys in the results
RATIO_KEYS = {"static": "", "continuous-copy": "_in_place", "continuous-sdpa": "_rowwise"}


def load_questions(args: argparse.Namespace) -> tuple[list[Any], list[Any]]:
    """``--questions`` questions of ``--dataset`` and its closed corpus."""
    if args.dataset == "synthetic":
        world = synthetic_world(seed=args.seed)
        return list(world.test[: args.questions]), list(world.corpus)
    path = DATA_FILES[args.dataset]
    if not path.is_file():
        raise SystemExit(f"{path} not found: the real dev subsets live in ../shared/data beside the checkout")
    return list(load_dataset(args.dataset, path)[: args.questions]), list(build_corpus(args.dataset, path))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate the program once per batching mode on the same questions; returns the measurements."""
    questions, corpus = load_questions(args)
    retriever = BM25(corpus)
    results: dict[str, Any] = {"questions": len(questions), "program": args.program}
    answers: dict[str, list[str]] = {}
    for mode in args.modes:
        batching = "static" if mode == "static" else "continuous"
        lm = LocalLM(dtype=args.dtype, cache=False, batching=batching, max_batch_rows=args.max_batch_rows)
        if mode == "continuous-copy":
            lm.backend.batcher.in_place_merge = False
        if mode == "continuous-sdpa":
            use_rowwise_attention(lm.backend.model, enabled=False)
        program = build_program(args.program, retriever=retriever, lm=lm)
        with dspy.context(lm=lm):
            lm(messages=[{"role": "user", "content": "Hello"}], max_tokens=4)  # warm-up: kernels, first allocation
            t0 = time.perf_counter()
            res = evaluate(program, questions, num_threads=args.threads, show_progress=True)
            wall = time.perf_counter() - t0
        s = res.summary.to_dict()
        tokens = sum(r.completion_tokens or 0 for r in res.records)
        stats = lm.backend.batcher.stats
        results[mode] = {
            "wall_s": wall,
            "completion_tokens": tokens,
            "tokens_per_s": tokens / wall,
            "lm_calls": sum(r.lm_calls or 0 for r in res.records),
            "em": s["em"],
            "success_rate": s.get("success_rate"),
            "mean_rows_per_step": stats.mean_rows,
            "max_rows": stats.max_rows,
        }
        if batching == "continuous":
            results[mode]["merges"] = {"in_place": stats.in_place_merges, "copied": stats.copied_merges}
            cache = lm.backend.batcher.prefix_cache
            results[mode]["prefix_cache"] = {
                "hits": cache.hits,
                "misses": cache.misses,
                "reused_tokens": cache.reused_tokens,
                "entries": len(cache),
                "mb": cache.nbytes / 2**20,
            }
        answers[mode] = [r.prediction for r in res.records]
        print(
            f"  {mode:<10} {wall:7.1f} s  {tokens:6d} tokens  {tokens / wall:6.1f} tok/s  EM {s['em']:.3f}", flush=True
        )
        lm.backend.batcher.close()
    for mode, suffix in RATIO_KEYS.items():
        if mode in answers and "continuous" in answers:
            base, default = results[mode], results["continuous"]
            results[f"ratio{suffix}_tokens_per_s"] = default["tokens_per_s"] / base["tokens_per_s"]
            results[f"ratio{suffix}_wall"] = base["wall_s"] / default["wall_s"]
            same = sum(a == b for a, b in zip(answers[mode], answers["continuous"], strict=True))
            results[f"answers_agree{suffix}"] = f"{same}/{len(questions)}"
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_parser(__doc__, "bench_continuous")
    parser.add_argument("--questions", type=int, default=16, help="held-out synthetic questions (default 16)")
    parser.add_argument("--threads", type=int, default=16, help="concurrent questions (default 16)")
    parser.add_argument("--program", default="opera", help="registered program to evaluate (default opera)")
    parser.add_argument("--modes", nargs="+", default=["static", "continuous"], choices=["continuous", *RATIO_KEYS])
    parser.add_argument("--max-batch-rows", type=int, default=32, help="batcher row cap (default 32)")
    parser.add_argument("--dtype", default="auto", help="model dtype: auto, float32, bfloat16")
    parser.add_argument("--seed", type=int, default=0, help="synthetic world seed (default 0)")
    parser.add_argument(
        "--dataset",
        default="synthetic",
        choices=["synthetic", *DATA_FILES],
        help="questions and closed corpus: the synthetic world (default) or a dev subset from ../shared/data",
    )
    args = parser.parse_args(argv)
    print(f"bench_continuous: {args.program} on {args.questions} questions, {args.threads} threads, modes {args.modes}")
    results = run(args)
    if "ratio_tokens_per_s" in results:
        print(
            f"\ncontinuous / static: {results['ratio_tokens_per_s']:.2f}x tokens/s, {results['ratio_wall']:.2f}x "
            f"wall  (target > 1.5); answers agree {results['answers_agree']}"
        )
    print(f"wrote {write_results(results, args)}")


if __name__ == "__main__":
    main()
