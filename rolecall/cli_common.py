"""What the ``rolecall`` subcommands share: dataset choices and default files, the help formatter, the common flags,
and the helpers that check a file, pick a split and build a retriever. Every ``cli_*`` module imports from here, and
:mod:`rolecall.cli` imports the ``cli_*`` modules, so no import runs in a circle.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from rolecall.data.corpus import DEV_SUBSET_FILES, dev_subset_path
from rolecall.errors import ConfigError

__all__ = [
    "DATASET_CHOICES",
    "DEFAULT_DATA_PATHS",
    "HelpFormatter",
    "add_command",
    "add_common",
    "build_retriever",
    "existing",
    "split_of",
]

logger = logging.getLogger("rolecall.cli")

DATASET_CHOICES = ("synthetic", "hotpotqa", "2wiki", "musique", "flashrag")

# Default files of the real dev subsets, relative to the working directory (a checkout beside shared/data).
DEFAULT_DATA_PATHS: dict[str, Path] = {name: dev_subset_path(name) for name in DEV_SUBSET_FILES}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the hand-wrapped description and examples (defaults are written into each help string)."""


def add_command(sub: Any, name: str, help: str, description: str, epilog: str | None = None) -> argparse.ArgumentParser:
    """Adds subcommand ``name`` to the subcommands ``sub``: its one-line ``help`` in ``rolecall --help``, its
    hand-wrapped ``description`` and ``epilog`` (examples) in ``rolecall NAME --help``."""
    return sub.add_parser(name, help=help, description=description, epilog=epilog, formatter_class=HelpFormatter)


def add_common(parser: argparse.ArgumentParser) -> None:
    """Add the flags every command takes (``-v``)."""
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log more: -v for INFO, -vv for DEBUG (default WARNING)"
    )


# --------------------------------------------------------------------------------------------------------- helpers
def existing(path: Path, what: str) -> Path:
    """``path`` when it is a file, else a :class:`ConfigError` naming it (``what``) and the working directory."""
    if not path.is_file():
        raise ConfigError(f"{what} {path} does not exist (working directory: {Path.cwd()}); pass an existing file")
    return path


def split_of(examples: list[Any], split: str, dataset: str) -> list[Any]:
    """``train`` / ``test``: the 80% / 20% hash split of a real dataset (``rolecall.data.hash_split``); ``all``."""
    from rolecall.data import hash_split

    if split == "all":
        return list(examples)
    if split == "dev":
        raise ConfigError(f"--split dev exists only for the synthetic world; {dataset} has train, test (80/20) and all")
    train, test = hash_split(examples, fraction=0.8)
    return train if split == "train" else test


def build_retriever(kind: str, corpus: list[Any], k: int, index: Path | None = None) -> Any:
    """The ``--retriever`` named ``kind`` over ``corpus`` (``colbert`` loads ``index`` when given)."""
    if kind == "colbert":
        from rolecall.retrievers.colbert import ColBERTRetriever

        if index is None:
            logger.warning("--retriever colbert without --index: indexing the corpus with an untrained ColBERT")
            return ColBERTRetriever(corpus, default_k=k)
        if not index.is_dir():
            raise ConfigError(f"--index {index} is not a directory; build one with: rolecall index --out {index}")
        retriever = ColBERTRetriever.load(index)
        retriever.default_k = k
        return retriever
    if kind == "dense":
        from rolecall.retrievers.dense import DenseRetriever

        return DenseRetriever(corpus, default_k=k)
    from rolecall.retrievers.bm25 import BM25

    return BM25(corpus, default_k=k)
