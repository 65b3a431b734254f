"""The ``rolecall`` command.

Subcommands:

* ``rolecall demo``: the main job: prompt-only OPERA, SFT training, OPERA again (see :mod:`rolecall.demo`).
* ``rolecall compile``: train a program's role adapters (SFT) and save the compiled program.
* ``rolecall eval``: build a dataset, its closed corpus, a retriever, the local LM and a registered program, evaluate
  the program (:func:`rolecall.evaluation.evaluate`) and print the summary table (see :mod:`rolecall.cli_eval`).
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
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rolecall.cli_common import HelpFormatter, add_command, add_common
from rolecall.demo import DemoConfig
from rolecall.errors import RolecallError
from rolecall.lm.engines import add_engine_argument
from rolecall.utils.logs import quiet_repeated_warnings

__all__ = ["main", "build_parser"]

logger = logging.getLogger("rolecall.cli")


# ---------------------------------------------------------------------------------------------------------- parser
_DEMO_HELP = "the main job: prompt-only OPERA -> SFT -> SFT + MAPGRPO, each evaluated (embedded model, CPU)"
_DEMO_DESCRIPTION = (
    "Build the synthetic world, evaluate prompt-only OPERA on held-out questions, compile it with\n"
    "SFT on gold-path targets (the trained roles run without demos), evaluate it, train it further with\n"
    "MAPGRPO (the plan role, in the recipe that beat SFT by +6 EM on 500 questions; docs/opera-mapgrpo.md),\n"
    "evaluate it again and print the three-column table with each rung judged against the one before it\n"
    "on the same questions (won / lost, paired 95% interval, McNemar p).\n\n"
    "Training is a fixed number of steps per SFT adapter and per MAPGRPO stage, never a wall-clock budget:\n"
    "a busy or slower machine takes longer and gives the same table within noise. The time an idle 2-core\n"
    "machine needs is printed before anything loads.\n\n"
    "Writes OUT/before, OUT/after_sft and OUT/after (per-question records with trajectories), OUT/sft\n"
    "(metrics.jsonl, summary.json, checkpoints, loss.png), OUT/mapgrpo (the same), OUT/training_curve.png\n"
    "(reward per stage), OUT/program (the trained program), OUT/table.md and OUT/results.json.\n\n"
    "Examples:\n  rolecall demo --optimizer sft --eval-questions 6 --sft-steps 20   # a quick look: 20 steps each\n"
    "  rolecall demo --rl-steps plan=4   # MAPGRPO trains 4 plan steps"
)


def _add_eval_parser(sub: Any) -> None:
    from rolecall.cli_eval import add_eval_parser  # the eval command lives in rolecall.cli_eval

    add_eval_parser(sub)


def _add_demo_parser(sub: Any) -> None:
    p = add_command(sub, "demo", _DEMO_HELP, _DEMO_DESCRIPTION)
    from rolecall.demo_steps import DEMO_RL_STEPS, DEMO_SCRATCH_RL_STEPS, DEMO_SFT_STEPS

    sft_default = ",".join(f"{k}={v}" for k, v in DEMO_SFT_STEPS.items())
    rl_default = ",".join(f"{k}={v}" for k, v in DEMO_RL_STEPS.items())
    rl_scratch = ",".join(f"{k}={v}" for k, v in DEMO_SCRATCH_RL_STEPS.items())
    p.add_argument("--seed", type=int, default=DemoConfig.seed,
                   help="seed of the synthetic world and of training (default %(default)s)")  # fmt: skip
    p.add_argument("--eval-questions", type=int, default=DemoConfig.eval_questions,
                   help="held-out test questions (default %(default)s)")  # fmt: skip
    p.add_argument("--optimizer", default=DemoConfig.optimizer, choices=("sft,mapgrpo", "sft", "mapgrpo"),
                   metavar="CHAIN", help="the compile: sft,mapgrpo (the ladder: SFT, then MAPGRPO), sft (SFT only) or "
                   "mapgrpo (MAPGRPO from the untrained roles) (default: %(default)s)")  # fmt: skip
    p.add_argument("--sft-steps", metavar="STEPS", default=None,
                   help=f"SFT steps per adapter, N (each) or adapter=N,...; adapters not named keep theirs "
                   f"(default {sft_default})")  # fmt: skip
    p.add_argument("--rl-steps", metavar="STEPS", default=None,
                   help=f"MAPGRPO steps per stage, N (each) or stage=N,...; stages not named keep theirs (default "
                   f"{rl_default} after SFT, {rl_scratch} from the untrained roles)")  # fmt: skip
    p.add_argument("--lr-schedule", default=DemoConfig.lr_schedule, choices=("constant", "linear"),
                   help="SFT learning-rate schedule (default %(default)s: the demo trains too few steps to decay "
                   "over)")  # fmt: skip
    p.add_argument("--group-size", type=int, default=DemoConfig.group_size,
                   help="MAPGRPO group size G >= 2, c_best included (default %(default)s)")  # fmt: skip
    p.add_argument("--threads", type=int, default=DemoConfig.threads,
                   help="concurrent questions; LM calls batch (default %(default)s)")  # fmt: skip
    p.add_argument("--model", default=None, help="LM name or local path (default: embedded SmolLM2-135M-Instruct)")
    add_engine_argument(p)
    p.add_argument("--out", type=Path, default=None, help="run directory (default runs/<timestamp>)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    add_common(p)
    p.set_defaults(func=_cmd_demo)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``rolecall`` argument parser with every subcommand; ``argv`` is the command line it will parse, which
    decides the optimizer settings ``rolecall compile`` / ``tune`` list in ``--help`` (None: every optimizer's)."""
    from rolecall import __version__

    parser = argparse.ArgumentParser(
        prog="rolecall",
        description="rolecall: trained multi-agent retrieval-augmented multi-hop QA programs.",
        epilog="Run `rolecall <command> --help` for a command's options.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rolecall {__version__}")
    sub = parser.add_subparsers(dest="command", title="commands", metavar="<command>")
    _add_eval_parser(sub)
    from rolecall.cli_compile import add_compile_parser

    add_compile_parser(sub, argv)
    from rolecall.cli_index import add_index_parser

    add_index_parser(sub)
    _add_demo_parser(sub)
    from rolecall.cli_serve import add_serve_parser

    add_serve_parser(sub)
    from rolecall.cli_tune import add_tune_parser

    add_tune_parser(sub, argv)
    from rolecall.cli_compare import add_compare_parser

    add_compare_parser(sub)
    from rolecall.cli_inspect import add_inspect_parsers

    add_inspect_parsers(sub)
    return parser


# -------------------------------------------------------------------------------------------------------- commands
def _cmd_demo(args: argparse.Namespace) -> int:
    """``rolecall demo``: prompt-only OPERA -> SFT (or MAPGRPO) -> OPERA, with the before/after table; every flag is
    checked (``DemoConfig``) and the time estimate printed before anything loads."""
    from rolecall.demo import estimate_minutes, run_demo
    from rolecall.demo_steps import RL_STAGES, SFT_ADAPTERS, parse_steps

    config = DemoConfig(
        seed=args.seed,
        eval_questions=args.eval_questions,
        optimizer=args.optimizer,
        sft_steps=None if args.sft_steps is None else parse_steps(args.sft_steps, "--sft-steps", SFT_ADAPTERS),
        rl_steps=None if args.rl_steps is None else parse_steps(args.rl_steps, "--rl-steps", RL_STAGES),
        lr_schedule=args.lr_schedule,
        group_size=args.group_size,
        threads=args.threads,
        out=args.out,
        model=args.model,
        engine=args.engine,
        show_progress=not args.no_progress,
    )
    rungs = {"sft": ("SFT", config.planned_sft_steps), "mapgrpo": ("MAPGRPO", config.planned_rl_steps)}
    plan = ", then ".join(
        f"{label} {' '.join(f'{k}={v}' for k, v in steps.items())} steps"
        for label, steps in map(rungs.get, config.chain)
    )
    print(f"rolecall demo: OPERA on the synthetic world, {config.eval_questions} held-out questions; {plan}")
    estimate = f"about {estimate_minutes(config):.0f} minutes on an idle 2-core machine"
    if config.model is not None:
        estimate += " with the embedded model (--model changes it)"
    print(f"{estimate}; a busy or slower machine takes longer and trains the same steps")
    results = run_demo(config)
    print()
    print(results["table"])
    for name, summary in results["training"].items():
        for stage, reason in summary.get("stopped", {}).items():
            done, planned = summary["steps"].get(stage, 0), summary["planned"].get(stage, 0)
            print(f"{rungs[name][0]} {stage}: {done} of {planned} steps ({reason})")
    minutes = results["train_seconds"] / 60, results["total_seconds"] / 60, results["estimate_minutes"]
    print("\ntraining: {:.1f} min, whole demo {:.1f} min (about {:.0f} on an idle 2-core machine)".format(*minutes))
    print(f"run directory: {results['run_dir']}")
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
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
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
    except KeyboardInterrupt as err:
        print(_interrupted(args, argv, err), file=sys.stderr)
        return 130


def _interrupted(args: argparse.Namespace, argv: list[str], err: KeyboardInterrupt) -> str:
    """What an interrupted command prints: where its finished work is and how to continue it."""
    if args.command == "compile":
        from rolecall.cli_compile_run import interrupted_message

        return interrupted_message(args, argv, err)
    if args.command == "eval":
        return "interrupted; finished questions are in records.jsonl (rerun with --resume)"
    if args.command == "demo":
        return "rolecall demo: interrupted; the demo does not resume: run it again to start over"
    return f"rolecall {args.command}: interrupted"


if __name__ == "__main__":
    sys.exit(main())
