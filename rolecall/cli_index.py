"""``rolecall index``: build a ColBERT index over a dataset's closed corpus, optionally fine-tuning ColBERT first on the
train side's (question, gold passage, BM25 hard negative) triples, and save it for ``ColBERTRetriever.load``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from rolecall.cli_common import DEFAULT_DATA_PATHS, add_command, add_common, existing, split_of
from rolecall.errors import ConfigError

__all__ = ["add_index_parser", "cmd_index"]


_INDEX_HELP = "build (and optionally fine-tune) a ColBERT + PLAID index over a dataset's closed corpus and save it"
_INDEX_DESCRIPTION = (
    "Encode a dataset's closed corpus with ColBERT (the embedded MiniLM plus PyLate's projection) and\n"
    "index it with PLAID. With --fine-tune-minutes, ColBERT is first fine-tuned with PyLate's contrastive loss on\n"
    "(question, gold passage, BM25 hard negative) triples of the 80% train side of the hash split, so\n"
    "`rolecall eval --split test` stays held out.\n\n"
    "Writes OUT/config.json, OUT/corpus.jsonl, OUT/model/ and OUT/index/ (no pickle; load with\n"
    "rolecall.retrievers.ColBERTRetriever.load(OUT)) and OUT/training.json when it fine-tunes."
)
_INDEX_EPILOG = (
    "examples:\n"
    "  rolecall index --dataset musique --out runs/colbert-musique\n"
    "  rolecall index --dataset hotpotqa --fine-tune-minutes 10 --out runs/colbert-hotpotqa"
)


def add_index_parser(sub: Any) -> None:
    """Adds ``rolecall index`` to the subcommands ``sub``."""
    p = add_command(sub, "index", _INDEX_HELP, _INDEX_DESCRIPTION, _INDEX_EPILOG)
    p.add_argument(
        "--dataset", default="hotpotqa", choices=("hotpotqa", "2wiki", "musique"), help="default: %(default)s"
    )
    p.add_argument("--data-path", type=Path, default=None, metavar="FILE",
                   help="the hotpotqa / 2wiki / musique file (default: its subset in ../shared/data)")  # fmt: skip
    p.add_argument(
        "--corpus-level", default="paragraph", choices=("paragraph", "sentence"), help="default: %(default)s"
    )
    p.add_argument("--fine-tune-minutes", type=float, default=0.0, help="ColBERT fine-tuning budget (default: 0)")
    p.add_argument("--epochs", type=int, default=3, help="at most this many passes over the triples (default: 3)")
    p.add_argument("--batch-size", type=int, default=16, help="triples per training step (default: 16)")
    p.add_argument("--learning-rate", type=float, default=5e-5, help="AdamW learning rate (default: 5e-5)")
    p.add_argument("--index", default="auto", choices=("auto", "plaid", "exact"), help="default: %(default)s")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="where the index is saved")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    add_common(p)
    p.set_defaults(func=cmd_index)


def cmd_index(args: argparse.Namespace) -> int:
    """``rolecall index``: load the dataset, fine-tune ColBERT when asked, index the corpus, save."""
    from rolecall.data.corpus import build_corpus, load_dataset
    from rolecall.retrievers import BM25, ColBERTRetriever, ColBERTTrainConfig, fine_tune_colbert, hard_negative_triples
    from rolecall.retrievers.colbert import colbert_model

    if args.fine_tune_minutes < 0:
        raise ConfigError(f"--fine-tune-minutes must be >= 0, got {args.fine_tune_minutes}")
    path = existing(args.data_path or DEFAULT_DATA_PATHS[args.dataset], "--data-path")
    corpus = build_corpus(args.dataset, path, level=args.corpus_level)
    model = colbert_model()
    training: dict[str, Any] | None = None
    if args.fine_tune_minutes > 0:
        train = split_of(load_dataset(args.dataset, path), "train", args.dataset)
        triples = hard_negative_triples(train, BM25(corpus))
        config = ColBERTTrainConfig(
            learning_rate=args.learning_rate,
            batch_size=args.batch_size,
            epochs=args.epochs,
            max_minutes=args.fine_tune_minutes,
            show_progress=not args.no_progress,
        )
        metrics = fine_tune_colbert(model, triples, config)
        training = {"train_questions": len(train), "triples": len(triples), **metrics}
    start = time.perf_counter()
    retriever = ColBERTRetriever(corpus, model=model, index=args.index, show_progress=not args.no_progress)
    retriever.save(args.out)
    if training is not None:
        (Path(args.out) / "training.json").write_text(json.dumps(training, indent=2) + "\n", encoding="utf-8")
    print(
        f"indexed {len(corpus)} documents ({retriever.resolved_index}) in {time.perf_counter() - start:.0f}s"
        + (f" after {training['train/seconds'] / 60:.1f} min of fine-tuning" if training else "")
        + f"; saved to {args.out}"
    )
    return 0
