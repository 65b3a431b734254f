"""``rolecall eval``: build a dataset, its closed corpus, a retriever, the local LM and a program, evaluate the program
(:func:`rolecall.evaluation.evaluate`) and print the summary table.

Every flag, the run folder (:mod:`rolecall.cli_eval_run`) and a saved program's adapter files are checked before the
data or the model load. Real datasets are evaluated on their held-out ``test`` side by default: the 20% of the hash
split that ``rolecall compile`` does not train on.

Example::

    rolecall eval --program single_step_rag --dataset synthetic --limit 20 --threads 16
    rolecall eval --program opera --dataset hotpotqa --retriever dense --k 5 --out runs/opera-hotpot
    rolecall eval --program opera --dataset hotpotqa --out runs/opera-hotpot --resume    # continue a killed run
    rolecall eval --load runs/opera-sft --dataset synthetic                               # a saved, trained program
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from pathlib import Path
from typing import Any

from rolecall.cli_common import (
    DATASET_CHOICES,
    DEFAULT_DATA_PATHS,
    add_command,
    add_common,
    build_retriever,
    existing,
    split_of,
)
from rolecall.cli_eval_run import check_run_folder, max_tokens_advice, result_settings, start_run_folder
from rolecall.errors import ConfigError, RolecallError
from rolecall.lm.engines import add_engine_argument
from rolecall.programs.registry import (
    get_program_class,
    option_names,
    parse_program_options,
    program_names,
    saved_program,
)
from rolecall.utils.paths import check_out_folder

__all__ = ["add_eval_parser", "check_eval_args", "load_data", "cmd_eval"]

logger = logging.getLogger("rolecall.cli")

_SPLITS = {
    "train": "the 80% of the hash split `rolecall compile` trains on",
    "test": "the 20% of the hash split `rolecall compile` holds out",
    "all": "the whole file, the 80% `rolecall compile` trains on included",
}
_SYNTHETIC_SPLITS = {"all": "the synthetic world's train, dev and test questions"}


_EVAL_HELP = "evaluate a program on a dataset (EM, F1, steps, tokens, latency) and write per-question records"
_EVAL_DESCRIPTION = (
    "Evaluate a registered program on a dataset with a closed corpus.\n\n"
    "Writes OUT/records.jsonl (one line per finished question, so --resume continues a killed run),\n"
    "OUT/summary.json and OUT/config.json, then prints the summary table. Exits 1 when every question failed."
)
_EVAL_EPILOG = (
    "examples:\n"
    "  rolecall eval --program single_step_rag --dataset synthetic --limit 20 --threads 16\n"
    "  rolecall eval --program opera --dataset musique --retriever dense --out runs/opera-musique\n"
    "  rolecall eval --program opera --dataset musique --out runs/opera-musique --resume\n"
    "  rolecall eval --load runs/opera-compiled --dataset synthetic --limit 50"
)


def add_eval_parser(sub: Any) -> None:
    """Add the ``eval`` subcommand to ``sub`` (an ``argparse`` subparsers action)."""
    p = add_command(sub, "eval", _EVAL_HELP, _EVAL_DESCRIPTION, _EVAL_EPILOG)
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
        help="the dataset file (hotpotqa / 2wiki / musique default to their dev subsets under "
        "../shared/data; required for flashrag)",
    )
    data.add_argument(
        "--corpus-path",
        type=Path,
        default=None,
        metavar="FILE",
        help="a JSONL corpus ({id, contents} or {id, title, text}) to retrieve over instead of the "
        "dataset's closed corpus; for flashrag it defaults to corpus.jsonl beside --data-path",
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
        help="which questions, test (the default) for every dataset: the synthetic world's test split; "
        "for hotpotqa / 2wiki / musique / flashrag, train and test are the 80%% / 20%% of a stable hash "
        "of the question id (what `rolecall compile` trains on / holds out), all the whole file "
        "(training questions included)",
    )
    data.add_argument("--seed", type=int, default=0, help="seed of the synthetic world (default: %(default)s)")
    data.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="evaluate only the first N examples (of the split); may change on --resume",
    )
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
        help="a ColBERT index saved by `rolecall index` (with --retriever colbert; without it an "
        "untrained ColBERT indexes the corpus, which takes minutes)",
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
    add_engine_argument(model)
    model.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="completion budget of every LM call; by default each role has its own (opera's plan 128, "
        "synthesis 48, ...; 256 for a call without one), and N replaces them all",
    )
    model.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        metavar="T",
        help="sampling temperature in [0, 2], 0 = greedy (default: %(default)s)",
    )
    model.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a program option, checked against the program's options before anything loads and "
        "parsed by its type (e.g. -o max_steps=4 -o use_rewrite=false -o k_schedule=5,10 -o "
        "demo_policy=never); repeatable",
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
    again = run.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in OUT: skip the questions already in OUT/records.jsonl; refused when "
        "OUT/config.json records other settings (only --threads, --limit, --no-progress and -v may "
        "change)",
    )
    again.add_argument(
        "--overwrite",
        action="store_true",
        help="start again in an OUT that holds an earlier run's records (they are deleted)",
    )
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_common(p)
    p.set_defaults(func=cmd_eval)


def check_eval_args(args: argparse.Namespace) -> None:
    """Check the flags that need no file: ranges, finite numbers, combinations, and an ``--out`` that is not a file.

    Raises:
        ConfigError: the one-line message names the flag, the value and the fix.
    """
    for name in ("threads", "k", "max_tokens", "limit"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if not (math.isfinite(args.temperature) and 0 <= args.temperature <= 2):  # DSPy refuses every call outside it
        raise ConfigError(f"--temperature must be a number in [0, 2] (0 is greedy), got {args.temperature}")
    if args.resume and args.out is None:
        raise ConfigError("--resume needs --out DIR, the directory of the run to continue")
    if args.load is not None and args.option:
        raise ConfigError("--load evaluates a saved program with its saved options; -o cannot change them")
    if args.split == "dev" and args.dataset != "synthetic":
        raise ConfigError(f"--split dev exists only for the synthetic world; {args.dataset} has train, test and all")
    if args.out is not None:
        check_out_folder(args.out, "the run's records")


def load_data(args: argparse.Namespace, split: str) -> tuple[list[Any], list[Any]]:
    """The examples of ``split`` to evaluate (the first ``--limit``) and the corpus to retrieve over."""
    from rolecall.data.corpus import build_corpus, load_dataset
    from rolecall.data.flashrag import load_flashrag_corpus

    corpus_path = args.corpus_path
    corpus: list[Any] | None = None
    if args.dataset == "synthetic":
        from rolecall.data.synthetic import synthetic_world

        world = synthetic_world(seed=args.seed)
        names = ("train", "dev", "test") if split == "all" else (split,)
        examples = [e for name in names for e in world.splits[name]]
        corpus = world.corpus
    elif args.dataset == "flashrag":
        if args.data_path is None:
            raise ConfigError("--dataset flashrag needs --data-path (a FlashRAG {id, question, golden_answers} JSONL)")
        path = existing(args.data_path, "--data-path")
        examples = split_of(load_dataset("flashrag", path), split, "flashrag")
        corpus_path = corpus_path or path.parent / "corpus.jsonl"
    else:
        path = existing(args.data_path or DEFAULT_DATA_PATHS[args.dataset], "--data-path")
        examples = split_of(load_dataset(args.dataset, path), split, args.dataset)
        if corpus_path is None:
            corpus = build_corpus(args.dataset, path, level=args.corpus_level)
    if corpus_path is not None:
        corpus = load_flashrag_corpus(existing(corpus_path, "corpus file (--corpus-path)"))
    if args.limit is not None:
        examples = examples[: args.limit]
    if not examples:
        raise ConfigError(f"--dataset {args.dataset} --split {split} has no questions; pick another --split")
    logger.info("dataset %s (%s): %d examples, corpus of %d documents", args.dataset, split, len(examples), len(corpus))
    return list(examples), list(corpus)


def _describe_split(dataset: str, split: str) -> str:
    if dataset == "synthetic":
        return _SYNTHETIC_SPLITS.get(split, f"the synthetic world's {split} questions")
    return _SPLITS[split]


def _run_config(args: argparse.Namespace, split: str) -> dict[str, Any]:
    """``config.json``: this call's flags (``split`` resolved) and the :func:`result_settings` ``--resume`` checks."""
    flags = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"}
    flags["split"] = split
    return {**flags, "settings": result_settings(flags)}


def cmd_eval(args: argparse.Namespace) -> int:
    """``rolecall eval``: check everything, build everything, evaluate, print the summary table.

    Returns:
        0 (a question that failed is reported, and counted in the summary's errors).

    Raises:
        RolecallError: a bad flag, file or run folder (before anything loads), a record or the summary that could not
            be written (a full disk; those written before stay, for ``--resume``), or every question failed (after
            the records and the summary are written); ``main`` prints it in one line and exits 1.
    """
    import dspy

    from rolecall.evaluation import evaluate, format_summary
    from rolecall.evaluation.runner import RECORDS_FILE
    from rolecall.lm.engines import make_lm
    from rolecall.programs.core.calls import with_max_tokens
    from rolecall.programs.core.saving import check_saved_adapters
    from rolecall.programs.registry import build_program

    check_eval_args(args)
    if args.load is not None:  # fail on a missing, foreign or damaged directory before loading anything
        args.program, program_cls = saved_program(args.load)
        check_saved_adapters(args.load)
        options: dict[str, Any] = {}
    else:
        program_cls = get_program_class(args.program)  # fail on a broken registry entry before loading anything
        options = parse_program_options(args.program, args.option)
    split = args.split or "test"
    config = _run_config(args, split)
    out = args.out or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-eval-{args.program}"
    check_run_folder(out, config["settings"], resume=args.resume, overwrite=args.overwrite)
    examples, corpus = load_data(args, split)
    # A program class may declare `uses_retriever = False` (closed-book baselines): then no index is built.
    retriever = (
        build_retriever(args.retriever, corpus, args.k, args.index)
        if getattr(program_cls, "uses_retriever", True)
        else None
    )
    lm = make_lm(args.model, engine=args.engine, temperature=args.temperature, max_tokens=args.max_tokens or 256)
    if args.load is not None:
        program = program_cls.load(args.load, retriever=retriever, lm=lm)
    else:
        if "top_k" not in options and "top_k" in option_names(program_cls):
            options["top_k"] = args.k
        program = build_program(args.program, retriever, lm, **options)
    if args.max_tokens is not None and isinstance(getattr(program, "lm_kwargs", None), dict):
        program.lm_kwargs = with_max_tokens(program.lm_kwargs, args.max_tokens)  # the flag beats each role's own

    start_run_folder(out, config, overwrite=args.overwrite)
    try:
        with dspy.context(lm=lm), max_tokens_advice(args.max_tokens):
            result = evaluate(
                program,
                examples,
                num_threads=args.threads,
                output_dir=out,
                show_progress=not args.no_progress,
                resume=args.resume,
            )
    except OSError as err:  # a full disk or a read-only folder: the records written before the failure stay
        where = err.filename or out / RECORDS_FILE
        raise ConfigError(
            f"could not write {where} ({err.strerror or err}); the records written before it are kept: free space "
            "(or fix the folder), then rerun with --resume"
        ) from err
    summary = result.summary
    print(f"{args.program} on {args.dataset} ({len(examples)} questions, {args.retriever} k={args.k})")
    print(f"split: {split} ({_describe_split(args.dataset, split)})")
    print(format_summary(summary))
    print(f"records: {out / 'records.jsonl'}\nsummary: {out / 'summary.json'}")
    from rolecall.evaluation.report import write_report

    print(f"report: {write_report(out)} (a browser page; `rolecall show {out} --question ID` reads one trajectory)")
    failed = [r for r in result.records if r.failed]
    if failed:
        first = f"{failed[0].id}: {failed[0].error or failed[0].call_error}"
        if len(failed) == len(result.records):
            raise RolecallError(f"every question failed ({len(failed)} of {len(failed)}); the first, {first}")
        print(f"{len(failed)} of {summary.n} questions failed (their records say how); the first, {first}")
    return 0
