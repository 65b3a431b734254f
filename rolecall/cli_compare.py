"""``rolecall compare A B``: the paired judgement of two evaluations of the same questions
(:mod:`rolecall.evaluation.compare`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rolecall.cli_common import add_command
from rolecall.errors import ConfigError

__all__ = ["add_compare_parser", "cmd_compare"]


_COMPARE_HELP = "paired comparison of two evaluations on the same questions (won / lost, paired 95%% CI, McNemar p)"
_COMPARE_DESCRIPTION = (
    "Judge evaluation B against evaluation A question by question: both EM and F1, the questions B\n"
    "won and lost, the paired bootstrap 95% interval of the EM difference and McNemar's exact p-value.\n"
    "A and B are folders `rolecall eval` wrote (or their records.jsonl) on the same questions."
)
_COMPARE_EPILOG = (
    "example:\n"
    "  rolecall eval --load runs/opera-sft --out runs/eval-sft --limit 500\n"
    "  rolecall eval --load runs/opera-sft-mapgrpo --out runs/eval-mapgrpo --limit 500\n"
    "  rolecall compare runs/eval-sft runs/eval-mapgrpo"
)


def add_compare_parser(sub: Any) -> None:
    """Adds ``rolecall compare`` to the subcommands ``sub``."""
    p = add_command(sub, "compare", _COMPARE_HELP, _COMPARE_DESCRIPTION, _COMPARE_EPILOG)
    p.add_argument("run_a", type=Path, metavar="A", help="the baseline evaluation (e.g. the warm start)")
    p.add_argument("run_b", type=Path, metavar="B", help="the evaluation judged against it")
    p.add_argument("--resamples", type=int, default=10_000, help="bootstrap resamples (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="the bootstrap's seed (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("-v", "--verbose", action="count", default=0, help="log more: -v for INFO, -vv for DEBUG")
    p.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    """``rolecall compare``: read both records files, print the paired comparison."""
    from rolecall.evaluation.compare import compare_runs, format_comparison

    if args.resamples < 100:
        raise ConfigError(f"--resamples must be >= 100, got {args.resamples}")
    result = compare_runs(args.run_a, args.run_b, resamples=args.resamples, seed=args.seed)
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_comparison(result))
    return 0
