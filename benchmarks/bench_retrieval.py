"""Retrieval speed and recall on the HotpotQA distractor closed corpus: rolecall BM25 and dense vs rank_bm25.

The corpus is the union of every question's ``context`` paragraphs (de-duplicated by title and text); the gold
paragraphs of a question are its context paragraphs whose title appears in ``supporting_facts``. All three retrievers
run in the same process on the same corpus and queries:

    .venv/bin/python benchmarks/bench_retrieval.py              # all 600 questions, ~6k paragraphs
    .venv/bin/python benchmarks/bench_retrieval.py --limit 100 --skip-dense

It reports index build time, batch queries per second and recall@k of the gold paragraphs (the fraction of a question's
gold paragraph ids among its top k, averaged over questions), prints the rolecall-BM25 / rank_bm25 throughput ratio and
writes everything to ``benchmarks/results/bench_retrieval.json``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from rolecall.data.corpus import build_corpus
from rolecall.data.hotpotqa import iter_paragraphs, load_hotpotqa
from rolecall.data.types import Document
from rolecall.evaluation.metrics import recall_at_k
from rolecall.retrievers import BM25, DenseRetriever

from _common import REPO, bench_parser, write_results

DEFAULT_DATA = REPO / ".." / "shared" / "data" / "hotpotqa" / "hotpot_dev_distractor_600.jsonl"


def load_closed_corpus(path: Path, limit: int | None) -> tuple[list[Document], list[str], list[set[str]]]:
    """(corpus, questions, gold paragraph ids per question) via rolecall's HotpotQA loader and corpus builder."""
    examples = load_hotpotqa(path, limit=limit)
    corpus = build_corpus("hotpotqa", path)
    if limit is not None:  # keep only the paragraphs of the questions kept, as a smaller closed corpus
        keep = {p.id for p in islice(iter_paragraphs(path), limit * 10)}
        corpus = [d for d in corpus if d.id in keep]
    return corpus, [e.question for e in examples], [set(e.supporting_ids) for e in examples]


def mean_recall(ranked: Sequence[Sequence[str]], gold: Sequence[set[str]], k: int) -> float:
    """Mean over questions of :func:`rolecall.evaluation.metrics.recall_at_k`."""
    return float(np.mean([recall_at_k(list(r), list(g), k) for r, g in zip(ranked, gold, strict=True)]))


def timed(fn: Callable[[], Any], repeat: int = 1) -> tuple[Any, float]:
    """Run ``fn`` ``repeat`` times; return its last result and the fastest wall time in seconds."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return result, best


class RankBM25Baseline:
    """rank_bm25's BM25Okapi over the same tokens as rolecall's BM25 (bm25s tokenizer, English stopwords)."""

    def __init__(self, corpus: Sequence[Document]) -> None:
        import bm25s
        from rank_bm25 import BM25Okapi

        self.ids = [d.id for d in corpus]
        tokens = bm25s.tokenize(
            [f"{d.title} {d.text}" for d in corpus], stopwords="en", return_ids=False, show_progress=False
        )
        self.bm25 = BM25Okapi(tokens, k1=1.5, b=0.75)

    def retrieve_ids(self, queries: Sequence[str], k: int) -> list[list[str]]:
        import bm25s

        tokens = bm25s.tokenize(list(queries), stopwords="en", return_ids=False, show_progress=False)
        out = []
        for q in tokens:
            scores = self.bm25.get_scores(q)  # (N,)
            top = np.argpartition(-scores, k)[:k]
            out.append([self.ids[i] for i in top[np.argsort(-scores[top])]])
        return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    corpus, questions, gold = load_closed_corpus(Path(args.data), args.limit)
    print(f"corpus: {len(corpus)} paragraphs, {len(questions)} questions, k={args.k}")
    rows: dict[str, dict[str, float]] = {}

    def measure(name: str, build: Callable[[], Any], search: Callable[[Any], list[list[str]]], repeat: int) -> None:
        retriever, build_s = timed(build)
        ranked, query_s = timed(lambda: search(retriever), repeat=repeat)
        rows[name] = {
            "build_s": build_s,
            "query_s": query_s,
            "qps": len(questions) / query_s,
            f"recall@{args.k}": mean_recall(ranked, gold, args.k),
        }
        print(f"  {name}: done ({build_s:.2f}s build, {query_s:.3f}s for {len(questions)} queries)")

    def ids_of(retriever: Any) -> list[list[str]]:
        return [[p.id for p in hits] for hits in retriever.retrieve_batch(questions, k=args.k)]

    measure("rank_bm25 (BM25Okapi)", lambda: RankBM25Baseline(corpus), lambda r: r.retrieve_ids(questions, args.k), 1)
    measure("rolecall BM25 (bm25s)", lambda: BM25(corpus), ids_of, args.repeat)
    if not args.skip_dense:
        build = lambda: DenseRetriever(corpus, encoder=args.encoder, device="cpu", batch_size=args.batch_size)  # noqa: E731
        measure("rolecall dense (MiniLM, flat)", build, ids_of, 1)

    ratio = rows["rolecall BM25 (bm25s)"]["qps"] / rows["rank_bm25 (BM25Okapi)"]["qps"]
    header = f"{'retriever':32} {'build s':>9} {'query s':>9} {'q/s':>10} {'recall@' + str(args.k):>10}"
    print("\n" + header + "\n" + "-" * len(header))
    for name, r in rows.items():
        print(f"{name:32} {r['build_s']:9.2f} {r['query_s']:9.3f} {r['qps']:10.1f} {r[f'recall@{args.k}']:10.3f}")
    print(f"\nrolecall BM25 q/s / rank_bm25 q/s = {ratio:.1f}x")
    return {
        "dataset": str(Path(args.data).name),
        "n_docs": len(corpus),
        "n_queries": len(questions),
        "k": args.k,
        "results": rows,
        "bm25_qps_ratio_vs_rank_bm25": ratio,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_parser(__doc__, "bench_retrieval")
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="HotpotQA distractor JSONL (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N questions (and their paragraphs)")
    parser.add_argument("--k", type=int, default=5, help="passages per query; recall is measured at k (default 5)")
    parser.add_argument("--repeat", type=int, default=3, help="BM25 query passes; the fastest counts (default 3)")
    parser.add_argument("--skip-dense", action="store_true", help="skip the dense retriever (no MiniLM encoding)")
    parser.add_argument("--encoder", default="embedded:all-minilm-l6-v2", help="dense encoder (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=64, help="dense encoder batch size (default 64)")
    args = parser.parse_args(argv)
    if not Path(args.data).is_file():
        parser.error(f"{args.data} not found; pass --data PATH to a HotpotQA distractor JSONL file")
    results = run(args)
    print(f"wrote {write_results(results, args)}")


if __name__ == "__main__":
    main()
