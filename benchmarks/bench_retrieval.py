"""Retrieval speed and recall on the HotpotQA distractor closed corpus: rolecall BM25, dense and ColBERT vs rank_bm25.

The corpus is the union of every question's ``context`` paragraphs (de-duplicated by title and text); the gold
paragraphs of a question are its context paragraphs whose title appears in ``supporting_facts``. Questions are split
80/20 by a stable hash of their id (``rolecall.data.hash_split``, as ``rolecall eval --split``): ColBERT is fine-tuned
on (question, gold paragraph, BM25 hard negative) triples of the train side, and every retriever is measured on the
test side's questions, in the same process on the same corpus:

    .venv/bin/python benchmarks/bench_retrieval.py                   # ~6k paragraphs, 20% of 600 questions
    .venv/bin/python benchmarks/bench_retrieval.py --colbert-minutes 2 --limit 200
    .venv/bin/python benchmarks/bench_retrieval.py --skip-colbert --queries all --skip-dense   # the original rows

It reports index build time, batch queries per second and recall@k of the gold paragraphs (the fraction of a question's
gold paragraph ids among its top k, averaged over questions), prints the rolecall-BM25 / rank_bm25 throughput ratio and
writes everything, with ColBERT's training minutes and triple count, to ``benchmarks/results/bench_retrieval.json``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from rolecall.data import hash_split
from rolecall.data.corpus import build_corpus
from rolecall.data.hotpotqa import iter_paragraphs, load_hotpotqa
from rolecall.data.types import Document, Example
from rolecall.evaluation.metrics import recall_at_k
from rolecall.retrievers import (
    BM25,
    ColBERTRetriever,
    ColBERTTrainConfig,
    DenseRetriever,
    fine_tune_colbert,
    hard_negative_triples,
)
from rolecall.retrievers.colbert import colbert_model

from _common import REPO, bench_parser, write_results

DEFAULT_DATA = REPO / ".." / "shared" / "data" / "hotpotqa" / "hotpot_dev_distractor_600.jsonl"


def load_closed_corpus(path: Path, limit: int | None) -> tuple[list[Document], list[Example]]:
    """(corpus, examples) via rolecall's HotpotQA loader and corpus builder."""
    examples = load_hotpotqa(path, limit=limit)
    corpus = build_corpus("hotpotqa", path)
    if limit is not None:  # keep only the paragraphs of the questions kept, as a smaller closed corpus
        keep = {p.id for p in islice(iter_paragraphs(path), limit * 10)}
        corpus = [d for d in corpus if d.id in keep]
    return corpus, examples


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


def train_colbert(args: argparse.Namespace, corpus: list[Document], train: list[Example]) -> tuple[Any, dict[str, Any]]:
    """ColBERT from the embedded MiniLM fine-tuned on the train side's BM25 hard-negative triples, and its record."""
    triples = hard_negative_triples(train, BM25(corpus), depth=20)
    model = colbert_model(device="cpu")
    config = ColBERTTrainConfig(
        learning_rate=args.colbert_lr,
        batch_size=args.colbert_batch_size,
        epochs=args.colbert_epochs,
        max_minutes=args.colbert_minutes,
        show_progress=True,
    )
    print(f"  ColBERT: fine-tuning on {len(triples)} triples of {len(train)} questions, {args.colbert_minutes} min")
    metrics = fine_tune_colbert(model, triples, config)
    record = {
        "train_questions": len(train),
        "triples": len(triples),
        "budget_minutes": args.colbert_minutes,
        "training_minutes": metrics["train/seconds"] / 60,
        "steps": int(metrics["train/steps"]),
        "epochs": metrics["train/epochs"],
        "batch_size": args.colbert_batch_size,
        "learning_rate": args.colbert_lr,
        "loss_first": metrics["loss/first"],
        "loss_last": metrics["loss/last"],
        "loss_mean": metrics["loss/mean"],
    }
    return model, record


def run(args: argparse.Namespace) -> dict[str, Any]:
    corpus, examples = load_closed_corpus(Path(args.data), args.limit)
    train, test = hash_split(examples, fraction=0.8)
    evaluated = test if args.queries == "test" else examples
    questions, gold = [e.question for e in evaluated], [set(e.supporting_ids) for e in evaluated]
    print(f"corpus: {len(corpus)} paragraphs, {len(questions)} {args.queries} questions, k={args.k}")
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
    colbert: dict[str, Any] | None = None
    if not args.skip_colbert:
        kwargs = {"device": "cpu", "index": "plaid", "batch_size": args.batch_size // 2}
        if args.colbert_untuned:
            build = lambda: ColBERTRetriever(corpus, **kwargs)  # noqa: E731
            measure("rolecall ColBERT (MiniLM, PLAID, untrained)", build, ids_of, 1)
        model, colbert = train_colbert(args, corpus, train)
        build = lambda: ColBERTRetriever(corpus, model=model, **kwargs)  # noqa: E731
        measure("rolecall ColBERT (MiniLM, PLAID, fine-tuned)", build, ids_of, 1)

    ratio = rows["rolecall BM25 (bm25s)"]["qps"] / rows["rank_bm25 (BM25Okapi)"]["qps"]
    header = f"{'retriever':44} {'build s':>9} {'query s':>9} {'q/s':>10} {'recall@' + str(args.k):>10}"
    print("\n" + header + "\n" + "-" * len(header))
    for name, r in rows.items():
        print(f"{name:44} {r['build_s']:9.2f} {r['query_s']:9.3f} {r['qps']:10.1f} {r[f'recall@{args.k}']:10.3f}")
    print(f"\nrolecall BM25 q/s / rank_bm25 q/s = {ratio:.1f}x")
    if colbert is not None:
        print(
            f"ColBERT: {colbert['training_minutes']:.1f} min of training, {colbert['triples']} triples, "
            f"{colbert['steps']} steps ({colbert['epochs']:.2f} epochs), loss {colbert['loss_first']:.3f} -> "
            f"{colbert['loss_last']:.3f}"
        )
    results: dict[str, Any] = {
        "dataset": str(Path(args.data).name),
        "n_docs": len(corpus),
        "n_queries": len(questions),
        "queries": args.queries,
        "k": args.k,
        "results": rows,
        "bm25_qps_ratio_vs_rank_bm25": ratio,
    }
    if colbert is not None:
        results["colbert_training"] = colbert
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = bench_parser(__doc__, "bench_retrieval")
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="HotpotQA distractor JSONL (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N questions (and their paragraphs)")
    parser.add_argument("--k", type=int, default=5, help="passages per query; recall is measured at k (default 5)")
    parser.add_argument("--repeat", type=int, default=3, help="BM25 query passes; the fastest counts (default 3)")
    parser.add_argument("--skip-dense", action="store_true", help="skip the dense retriever (no MiniLM encoding)")
    parser.add_argument("--encoder", default="embedded:all-minilm-l6-v2", help="dense encoder (default: %(default)s)")
    parser.add_argument(
        "--batch-size", type=int, default=64, help="dense encoder batch size (default 64; ColBERT half)"
    )
    parser.add_argument(
        "--queries",
        choices=("test", "all"),
        default="test",
        help="questions measured: the test side of the 80/20 hash split (default) or all (needs --skip-colbert)",
    )
    parser.add_argument("--skip-colbert", action="store_true", help="skip ColBERT (no fine-tuning, no PLAID index)")
    parser.add_argument("--colbert-minutes", type=float, default=10.0, help="ColBERT fine-tuning budget (default 10)")
    parser.add_argument("--colbert-epochs", type=int, default=3, help="at most this many passes (default 3)")
    parser.add_argument("--colbert-batch-size", type=int, default=16, help="triples per step (default 16)")
    parser.add_argument("--colbert-lr", type=float, default=5e-5, help="AdamW learning rate (default 5e-5)")
    parser.add_argument(
        "--colbert-untuned", action="store_true", help="also measure ColBERT with its untrained projection"
    )
    args = parser.parse_args(argv)
    if not Path(args.data).is_file():
        parser.error(f"{args.data} not found; pass --data PATH to a HotpotQA distractor JSONL file")
    if args.queries == "all" and not args.skip_colbert:
        parser.error("--queries all measures ColBERT on its own training questions; add --skip-colbert")
    results = run(args)
    print(f"wrote {write_results(results, args)}")


if __name__ == "__main__":
    main()
