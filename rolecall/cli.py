"""The ``rolecall`` command.

Subcommands:

* ``rolecall demo``: the main job: prompt-only OPERA, SFT training, OPERA again (see :mod:`rolecall.demo`).
* ``rolecall compile``: train a program's role adapters (SFT) and save the compiled program.
* ``rolecall eval``: build a dataset, its closed corpus, a retriever, the local LM and a registered program, evaluate
  the program (:func:`rolecall.evaluation.evaluate`) and print the summary table.
* ``rolecall serve``: serve the LM and LoRA adapters over an OpenAI-compatible HTTP API (see :mod:`rolecall.serve`).
* ``rolecall tune``: search an optimizer's config fields (reward weights, ...) against dev EM with optuna; the best
  trial's config feeds ``rolecall compile --config`` (see :mod:`rolecall.tuning`).

Example::

    rolecall eval --program single_step_rag --dataset synthetic --limit 20 --threads 16
    rolecall eval --program opera --dataset hotpotqa --retriever dense --k 5 --out runs/opera-hotpot
    rolecall eval --program opera --dataset hotpotqa --out runs/opera-hotpot --resume    # continue a killed run
    rolecall eval --load runs/opera-sft --dataset synthetic                               # a saved, trained program
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rolecall.data.corpus import DEV_SUBSET_FILES, dev_subset_path
from rolecall.demo import DemoConfig
from rolecall.errors import ConfigError, RolecallError
from rolecall.programs.registry import (
    get_program_class,
    option_names,
    parse_program_options,
    program_names,
    saved_program,
)
from rolecall.utils.logs import quiet_repeated_warnings

__all__ = ["main", "build_parser"]

logger = logging.getLogger("rolecall.cli")

DATASET_CHOICES = ("synthetic", "hotpotqa", "2wiki", "musique", "flashrag")

# Default files of the real dev subsets, relative to the working directory (a checkout beside shared/data).
DEFAULT_DATA_PATHS: dict[str, Path] = {name: dev_subset_path(name) for name in DEV_SUBSET_FILES}


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the hand-wrapped description and examples (defaults are written into each help string)."""


# ---------------------------------------------------------------------------------------------------------- parser
def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="log more: -v for INFO, -vv for DEBUG (default WARNING)"
    )


def _add_eval_parser(sub: Any) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a program on a dataset (EM, F1, steps, tokens, latency) and write per-question records",
        description="Evaluate a registered program on a dataset with a closed corpus.\n\n"
        "Writes OUT/records.jsonl (one line per finished question, so --resume continues a killed run),\n"
        "OUT/summary.json and OUT/config.json, then prints the summary table.",
        epilog="examples:\n"
        "  rolecall eval --program single_step_rag --dataset synthetic --limit 20 --threads 16\n"
        "  rolecall eval --program opera --dataset musique --retriever dense --out runs/opera-musique\n"
        "  rolecall eval --program opera --dataset musique --out runs/opera-musique --resume\n"
        "  rolecall eval --load runs/opera-compiled --dataset synthetic --limit 50",
        formatter_class=_HelpFormatter,
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--program", choices=program_names(), help="the program to evaluate (prompt-only)")
    which.add_argument(
        "--load",
        type=Path,
        default=None,
        metavar="DIR",
        help="evaluate a saved (compiled) program: the directory Program.save wrote, adapters included",
    )
    data = p.add_argument_group("data")
    data.add_argument(
        "--dataset", default="synthetic", choices=DATASET_CHOICES, help="the benchmark (default: %(default)s)"
    )
    data.add_argument(
        "--data-path",
        type=Path,
        default=None,
        metavar="FILE",
        help="the dataset file (hotpotqa / 2wiki / musique default to their dev subsets under ../shared/data; "
        "required for flashrag)",
    )
    data.add_argument(
        "--corpus-path",
        type=Path,
        default=None,
        metavar="FILE",
        help="a JSONL corpus ({id, contents} or {id, title, text}) to retrieve over instead of the dataset's closed "
        "corpus; for flashrag it defaults to corpus.jsonl beside --data-path",
    )
    data.add_argument(
        "--corpus-level",
        default="paragraph",
        choices=("paragraph", "sentence"),
        help="unit of the closed corpus built from hotpotqa / 2wiki / musique files (default: %(default)s)",
    )
    data.add_argument(
        "--split",
        default=None,
        choices=("train", "dev", "test", "all"),
        help="which questions: the synthetic world's split (default: test); for hotpotqa / 2wiki / musique, train and "
        "test are the 80%% / 20%% of a stable hash of the question id (what `rolecall compile` trains on / holds out), "
        "all (the default) the whole file",
    )
    data.add_argument("--seed", type=int, default=0, help="seed of the synthetic world (default: %(default)s)")
    data.add_argument("--limit", type=int, default=None, metavar="N", help="evaluate only the first N examples")
    model = p.add_argument_group("retriever and model")
    model.add_argument(
        "--retriever",
        default="bm25",
        choices=("bm25", "dense", "colbert"),
        help="retriever over the corpus; colbert reads --index (default: %(default)s)",
    )
    model.add_argument(
        "--index",
        type=Path,
        default=None,
        metavar="DIR",
        help="a ColBERT index saved by `rolecall index` (with --retriever colbert; without it an untrained ColBERT "
        "indexes the corpus, which takes minutes)",
    )
    model.add_argument(
        "--k",
        type=int,
        default=5,
        help="passages per retrieval call: the retriever's default k, and the program's top_k option "
        "when it has one (default: %(default)s)",
    )
    model.add_argument(
        "--model",
        default=None,
        metavar="NAME_OR_PATH",
        help="LM name or local path (default: the embedded SmolLM2-135M-Instruct)",
    )
    model.add_argument(
        "--max-tokens",
        type=int,
        default=256,
        metavar="N",
        help="completion budget of each LM call (default: %(default)s)",
    )
    model.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        metavar="T",
        help="sampling temperature, 0 = greedy (default: %(default)s)",
    )
    model.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a program option, checked against the program's options before anything loads and parsed by its "
        "type (e.g. -o max_steps=4 -o use_rewrite=false -o k_schedule=5,10 -o demo_policy=never); repeatable",
    )
    run = p.add_argument_group("run")
    run.add_argument(
        "--threads",
        type=int,
        default=8,
        metavar="N",
        help="worker threads; their LM calls are batched together (default: %(default)s)",
    )
    run.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="output directory (default: runs/<timestamp>-eval-<program>)",
    )
    run.add_argument("--resume", action="store_true", help="skip questions already in OUT/records.jsonl")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _add_common(p)
    p.set_defaults(func=_cmd_eval)


def _add_demo_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="the main job: prompt-only OPERA -> SFT -> SFT + MAPGRPO, each evaluated (embedded model, CPU)",
        description="Build the synthetic world, evaluate prompt-only OPERA on held-out questions, compile it with\n"
        "SFT on gold-path targets within a wall-clock budget (the trained roles run without demos), evaluate it,\n"
        "train it further with MAPGRPO (paper Eq. 11) within --rl-minutes, evaluate it again and print the\n"
        "three-column table (about 25 minutes on 2 CPU cores with the defaults).\n\n"
        "Writes OUT/before, OUT/after_sft and OUT/after (per-question records with trajectories), OUT/sft\n"
        "(metrics.jsonl, checkpoints, loss.png), OUT/mapgrpo (metrics.jsonl, checkpoints), OUT/training_curve.png\n"
        "(reward per stage), OUT/program (the trained program), OUT/table.md and OUT/results.json.\n\n"
        "Examples:\n  rolecall demo --optimizer sft --eval-questions 16 --budget-minutes 5   # SFT only, quicker\n"
        "  rolecall demo --rl-minutes 12",
        formatter_class=_HelpFormatter,
    )
    p.add_argument("--seed", type=int, default=DemoConfig.seed,
                   help="seed of the synthetic world and of training (default %(default)s)")  # fmt: skip
    p.add_argument("--eval-questions", type=int, default=DemoConfig.eval_questions,
                   help="held-out test questions (default %(default)s)")  # fmt: skip
    p.add_argument("--optimizer", default=DemoConfig.optimizer, choices=("sft,mapgrpo", "sft", "mapgrpo"),
                   metavar="CHAIN", help="the compile: sft,mapgrpo (the ladder: SFT, then MAPGRPO), sft (SFT only) or "
                   "mapgrpo (MAPGRPO from the untrained roles) (default: %(default)s)")  # fmt: skip
    p.add_argument("--rl-minutes", type=float, default=DemoConfig.rl_minutes,
                   help="MAPGRPO budget after SFT in the sft,mapgrpo ladder (default %(default)s)")  # fmt: skip
    p.add_argument("--budget-minutes", type=float, default=DemoConfig.budget_minutes,
                   help="training wall-clock budget (default %(default)s)")  # fmt: skip
    p.add_argument("--lr-schedule", default=DemoConfig.lr_schedule, choices=("constant", "linear"),
                   help="SFT learning-rate schedule (default %(default)s: the short budget trains too few steps "
                   "to decay over)")  # fmt: skip
    p.add_argument("--group-size", type=int, default=DemoConfig.group_size,
                   help="MAPGRPO group size G, c_best included (default %(default)s)")  # fmt: skip
    p.add_argument("--threads", type=int, default=DemoConfig.threads,
                   help="concurrent questions; LM calls batch (default %(default)s)")  # fmt: skip
    p.add_argument("--model", default=None, help="LM name or local path (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--out", type=Path, default=None, help="run directory (default runs/<timestamp>)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_common(p)
    p.set_defaults(func=_cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    """The ``rolecall`` argument parser with every subcommand."""
    from rolecall import __version__

    parser = argparse.ArgumentParser(
        prog="rolecall",
        description="rolecall: trained multi-agent retrieval-augmented multi-hop QA programs.",
        epilog="Run `rolecall <command> --help` for a command's options.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rolecall {__version__}")
    sub = parser.add_subparsers(dest="command", title="commands", metavar="<command>")
    _add_eval_parser(sub)
    from rolecall.cli_compile import add_compile_parser

    add_compile_parser(sub)
    from rolecall.cli_index import add_index_parser

    add_index_parser(sub)
    _add_demo_parser(sub)
    from rolecall.cli_serve import add_serve_parser

    add_serve_parser(sub)
    from rolecall.cli_tune import add_tune_parser

    add_tune_parser(sub)
    from rolecall.cli_compare import add_compare_parser

    add_compare_parser(sub)
    return parser


# --------------------------------------------------------------------------------------------------------- helpers
def _check_eval_args(args: argparse.Namespace) -> None:
    for name in ("threads", "k", "max_tokens"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {args.limit}")
    if args.resume and args.out is None:
        raise ConfigError("--resume needs --out DIR, the directory of the run to continue")
    if args.load is not None and args.option:
        raise ConfigError("--load evaluates a saved program with its saved options; -o cannot change them")


def _existing(path: Path, what: str) -> Path:
    if not path.is_file():
        raise ConfigError(f"{what} {path} does not exist (working directory: {Path.cwd()}); pass an existing file")
    return path


def _load_data(args: argparse.Namespace) -> tuple[list[Any], list[Any]]:
    """The examples to evaluate and the corpus to retrieve over."""
    from rolecall.data.corpus import build_corpus, load_dataset
    from rolecall.data.flashrag import load_flashrag_corpus

    corpus_path = args.corpus_path
    corpus: list[Any] | None = None
    if args.dataset == "synthetic":
        from rolecall.data.synthetic import synthetic_world

        world = synthetic_world(seed=args.seed)
        split = args.split or "test"
        if split == "all":
            examples = [e for name in ("train", "dev", "test") for e in world.splits[name]]
        else:
            examples = world.splits[split]
        corpus = world.corpus
    elif args.dataset == "flashrag":
        if args.data_path is None:
            raise ConfigError("--dataset flashrag needs --data-path (a FlashRAG {id, question, golden_answers} JSONL)")
        path = _existing(args.data_path, "--data-path")
        examples = _split_of(load_dataset("flashrag", path), args.split or "all", "flashrag")
        corpus_path = corpus_path or path.parent / "corpus.jsonl"
    else:
        path = _existing(args.data_path or DEFAULT_DATA_PATHS[args.dataset], "--data-path")
        examples = _split_of(load_dataset(args.dataset, path), args.split or "all", args.dataset)
        if corpus_path is None:
            corpus = build_corpus(args.dataset, path, level=args.corpus_level)
    if corpus_path is not None:
        corpus = load_flashrag_corpus(_existing(corpus_path, "corpus file (--corpus-path)"))
    if args.limit is not None:
        examples = examples[: args.limit]
    logger.info("dataset %s: %d examples, corpus of %d documents", args.dataset, len(examples), len(corpus))
    return list(examples), list(corpus)


def _split_of(examples: list[Any], split: str, dataset: str) -> list[Any]:
    """``train`` / ``test``: the 80% / 20% hash split of a real dataset (``rolecall.data.hash_split``); ``all``."""
    from rolecall.data import hash_split

    if split == "all":
        return list(examples)
    if split == "dev":
        raise ConfigError(f"--split dev exists only for the synthetic world; {dataset} has train, test (80/20) and all")
    train, test = hash_split(examples, fraction=0.8)
    return train if split == "train" else test


def _build_retriever(kind: str, corpus: list[Any], k: int, index: Path | None = None) -> Any:
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


# -------------------------------------------------------------------------------------------------------- commands
def _cmd_eval(args: argparse.Namespace) -> int:
    """``rolecall eval``: build everything, evaluate, print the summary table."""
    import dspy

    from rolecall.evaluation import evaluate, format_summary
    from rolecall.lm.embedded import DEFAULT_LM
    from rolecall.lm.local import LocalLM
    from rolecall.programs.registry import build_program

    _check_eval_args(args)
    if args.load is not None:  # fail on a missing or foreign directory before loading anything
        args.program, program_cls = saved_program(args.load)
        options: dict[str, Any] = {}
    else:
        program_cls = get_program_class(args.program)  # fail on a broken registry entry before loading anything
        options = parse_program_options(args.program, args.option)
    out = args.out or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-eval-{args.program}"
    examples, corpus = _load_data(args)
    # A program class may declare `uses_retriever = False` (closed-book baselines): then no index is built.
    retriever = (
        _build_retriever(args.retriever, corpus, args.k, args.index)
        if getattr(program_cls, "uses_retriever", True)
        else None
    )
    lm = LocalLM(args.model or DEFAULT_LM, temperature=args.temperature, max_tokens=args.max_tokens)
    if args.load is not None:
        program = program_cls.load(args.load, retriever=retriever, lm=lm)
    else:
        if "top_k" not in options and "top_k" in option_names(program_cls):
            options["top_k"] = args.k
        program = build_program(args.program, retriever, lm, **options)

    out.mkdir(parents=True, exist_ok=True)
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}
    config_path = out / "config.json"
    if not (args.resume and config_path.exists()):
        config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    with dspy.context(lm=lm):
        result = evaluate(
            program,
            examples,
            num_threads=args.threads,
            output_dir=out,
            show_progress=not args.no_progress,
            resume=args.resume,
        )
    print(f"{args.program} on {args.dataset} ({len(examples)} questions, {args.retriever} k={args.k})")
    print(format_summary(result.summary))
    print(f"records: {out / 'records.jsonl'}\nsummary: {out / 'summary.json'}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    """``rolecall demo``: prompt-only OPERA -> SFT (or MAPGRPO) -> OPERA, with the before/after table."""
    from rolecall.demo import run_demo

    if args.eval_questions < 1 or args.budget_minutes <= 0 or args.threads < 1 or args.rl_minutes <= 0:
        raise ConfigError("--eval-questions and --threads must be >= 1, --budget-minutes and --rl-minutes > 0")
    config = DemoConfig(
        seed=args.seed,
        eval_questions=args.eval_questions,
        optimizer=args.optimizer,
        budget_minutes=args.budget_minutes,
        rl_minutes=args.rl_minutes,
        lr_schedule=args.lr_schedule,
        group_size=args.group_size,
        threads=args.threads,
        out=args.out,
        model=args.model,
        show_progress=not args.no_progress,
    )
    budget = f"{config.optimizer.upper()} budget {config.budget_minutes:g} min"
    if config.optimizer == "sft,mapgrpo":
        budget = f"SFT budget {config.budget_minutes:g} min, then MAPGRPO {config.rl_minutes:g} min"
    print(f"rolecall demo: OPERA on the synthetic world, {config.eval_questions} held-out questions, {budget}")
    results = run_demo(config)
    print()
    print(results["table"])
    print(f"\ntraining: {results['train_seconds'] / 60:.1f} min; run directory: {results['run_dir']}")
    if results.get("loss_curve"):
        print(f"loss curve: {results['loss_curve']}")
    if results["training_curve"] and results["training_curve"] != results.get("loss_curve"):
        print(f"reward curves: {results['training_curve']}")
    return 0


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    root = logging.getLogger()
    if root.handlers:  # an embedding application (or pytest) configured logging already: theirs wins
        return
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    # The handler filters too, because some libraries set their own logger to DEBUG at import (bm25s does).
    for handler in root.handlers:
        handler.setLevel(level)
    if verbosity <= 0:  # -v shows every repeat of DSPy's per-call truncation warning
        import dspy  # noqa: F401  (importing DSPy creates the 'dspy' log handler the filter must reach)

        quiet_repeated_warnings(root)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rolecall`` console script.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 1 on a rolecall error (bad configuration, malformed data, a model that does not
        load), 2 on a usage error, 130 when interrupted.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    _configure_logging(args.verbose)
    try:
        return int(args.func(args))
    except RolecallError as err:
        print(f"rolecall {args.command}: error: {err}", file=sys.stderr)
        logger.debug("traceback", exc_info=True)
        return 1
    except KeyboardInterrupt:
        print("interrupted; finished questions are in records.jsonl (rerun with --resume)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
