"""The paper experiments' command line: ``experiments/<paper>.py`` calls :func:`main` with its paper's name.

``--plan`` prints what each row trains on and for how long; a run trains and evaluates the selected rows, writing
each finished one at once (``_paper.Experiment``); ``--report-only`` rebuilds the report and the README block from the
results JSON; ``--fresh`` forgets the selected rows' results, programs and records first; ``--re-evaluate`` forgets
their results and records but keeps their programs, so they are evaluated again without training. A finished row
whose saved program was trained again since (a warm start retrained for a later row after runs/ lost it) is
evaluated again on its own, so no committed row describes a program that is no longer the saved one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import traceback
from pathlib import Path

from _paper import README, RESULTS, RUNS, Experiment
from _paper_config import DATASETS, SIZE_NAMES, Row, config_path, load_config
from _paper_report import EMBEDDED_MODEL, rewrite_readme


def parser_for(paper: str, doc: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"{paper}.py", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size",
        default="default",
        choices=SIZE_NAMES,
        help="default: the committed run's size (see the config); smoke: a few questions and seconds "
        "of training (tests); its results go to <paper>_smoke.json",
    )
    parser.add_argument(
        "--datasets", default=None, help=f"comma-separated, from {', '.join(DATASETS)} (default: the paper's)"
    )
    parser.add_argument("--rows", default=None, help="comma-separated row names (default: all of the config's)")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="forget the selected rows' results, saved programs and records, and run them again",
    )
    parser.add_argument(
        "--re-evaluate",
        action="store_true",
        help="forget the selected rows' results and evaluation records but keep their saved programs: evaluate "
        "them again without training (rows whose program is not saved are trained)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild the markdown, chart and README block from the results JSON; run nothing",
    )
    parser.add_argument(
        "--plan", action="store_true", help="print what each row trains on and for how long; run nothing"
    )
    parser.add_argument("--model", default=None, help="LM name or local path (default: the embedded SmolLM2-135M)")
    parser.add_argument("--threads", type=int, default=None, help="questions run concurrently (default: the size's)")
    parser.add_argument(
        "--test-questions", type=int, default=None, help="held-out questions per dataset (default: the size's)"
    )
    parser.add_argument("--config", type=Path, default=config_path(paper), help="the experiment config (TOML)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default: experiments/results)")
    parser.add_argument("--runs", type=Path, default=RUNS, help="programs and records (default: runs/experiments)")
    parser.add_argument(
        "--readme",
        type=Path,
        default=None,
        help="the README whose block for this paper is rewritten (default: experiments/README.md at "
        "the default size, none at smoke size)",
    )
    return parser


def main(paper: str, doc: str | None, argv: list[str] | None = None) -> int:
    """Run (or report) one paper's experiment; returns the exit status (1 when a row failed)."""
    parser = parser_for(paper, doc)
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ValueError as err:
        parser.error(str(err))
    datasets = _names(parser, "--datasets", args.datasets, list(config.datasets), list(config.datasets))
    names = _names(parser, "--rows", args.rows, [r.name for r in config.rows], [r.name for r in config.rows])
    rows = [config.row(n) for n in names]
    if args.fresh and args.re_evaluate:
        parser.error("--fresh retrains and --re-evaluate keeps the programs: give one of them")
    for value, flag in ((args.threads, "--threads"), (args.test_questions, "--test-questions")):
        if value is not None and value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    readme = args.readme if args.readme is not None else (README if args.size == "default" else None)
    exp = Experiment(
        config,
        args.size,
        out=args.out,
        runs=args.runs,
        model=args.model,
        threads=args.threads,
        test_questions=args.test_questions,
    )
    from rolecall.utils.logs import quiet_repeated_warnings

    quiet_repeated_warnings()
    if args.report_only:
        return report_only(exp, readme)
    jobs = exp.plan(datasets, rows)
    print(
        f"{config.title}: {len(jobs)} rows at size {args.size} ({exp.size.test_questions} test questions per "
        f"dataset, at most {exp.size.train_questions} training questions) with {args.model or EMBEDDED_MODEL}"
    )
    for dataset, row in jobs:
        print(f"  {dataset:<9} {row.name:<16} {exp.describe(dataset, row)}")
    if args.plan:
        return 0
    if args.fresh or args.re_evaluate:
        forget(exp, jobs, programs=args.fresh)
    failed, done = 0, finished(exp)  # a job records only its own row, so the later jobs' entries stay as read
    for i, (dataset, row) in enumerate(jobs, 1):
        tag = f"[{i}/{len(jobs)}] {dataset} / {row.name}"
        result = done.get((dataset, row.name))
        why = exp.stale(result) if result else None
        if result is not None and why is None:
            print(f"{tag}: done earlier (kept; --re-evaluate or --fresh reruns it)", flush=True)
            continue
        if why:
            print(f"{tag}: {why}; evaluating it again", flush=True)
        failed += run_job(exp, dataset, row, tag, readme)
    # a row whose program a later row trained again as its warm start: its result above describes the older one
    done = finished(exp)
    again = [(d, r, why) for d, r in jobs if (d, r.name) in done and (why := exp.stale(done[(d, r.name)]))]
    for i, (dataset, row, why) in enumerate(again, 1):
        tag = f"[again {i}/{len(again)}] {dataset} / {row.name}"
        print(f"{tag}: {why}; evaluating it again", flush=True)
        failed += run_job(exp, dataset, row, tag, readme)
    selected, loaded = {(d, r.name) for d, r in jobs}, {d for d, _ in jobs}
    for (dataset, name), result in finished(exp).items():
        if dataset not in loaded:
            continue
        if (dataset, name) not in selected and (why := exp.stale(result)):
            print(f"note: {dataset} / {name}: {why}; `--datasets {dataset} --rows {name}` evaluates it again")
        elif why := exp.outdated(result):
            print(f"note: {dataset} / {name}: {why}; `--fresh` on it trains it again from that one")
    print(f"wrote {exp.results}, {exp.results.with_suffix('.md')} and {exp.results.with_suffix('.png')}")
    return 1 if failed else 0


def _names(
    parser: argparse.ArgumentParser, flag: str, text: str | None, valid: list[str], default: list[str]
) -> list[str]:
    if text is None:
        return default
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in valid]
    if unknown or not names:
        parser.error(f"{flag}: unknown {unknown or 'empty list'}; valid: {', '.join(valid)}")
    return names


def finished(exp: Experiment) -> dict[tuple[str, str], dict]:
    """The results JSON's finished rows by (dataset, row name)."""
    return {(r["dataset"], r["row"]): r for r in exp.read_results().get("rows", []) if r.get("status") == "done"}


def run_job(exp: Experiment, dataset: str, row: Row, tag: str, readme: Path | None) -> int:
    """Train (or reuse) and evaluate one row and record its result; returns 1 when it failed, else 0."""
    print(f"{tag}: {row.title}", flush=True)
    started = time.perf_counter()
    try:
        result = exp.run_row(dataset, row)
    except Exception as err:  # a row that fails is recorded and the others run; the exit status says so
        result = {**exp.row_head(dataset, row), "status": "failed", "error": f"{type(err).__name__}: {err}"}
        traceback.print_exc()
    exp.record(result, readme)
    if result["status"] != "done":
        print(f"    FAILED: {result['error']}", flush=True)
        return 1
    print(
        f"    EM {100 * result['em']:.1f}  F1 {100 * result['f1']:.1f}  (n={result['n']}, "
        f"{(time.perf_counter() - started) / 60:.1f} min)",
        flush=True,
    )
    return 0


def forget(exp: Experiment, jobs: list[tuple[str, Row]], programs: bool = True) -> None:
    """Forget the jobs' result rows and evaluation records, and their saved programs too when ``programs``."""
    keys = {(d, r.name) for d, r in jobs}
    saved = exp.read_results()
    if saved.get("rows"):
        saved["rows"] = [r for r in saved["rows"] if (r["dataset"], r["row"]) not in keys]
        exp.results.write_text(json.dumps(saved, indent=2, default=str) + "\n", encoding="utf-8")
    for dataset, row in jobs:
        shutil.rmtree(exp.eval_dir(dataset, row), ignore_errors=True)
        if programs and row.has_program:
            shutil.rmtree(exp.program_dir(dataset, row), ignore_errors=True)


def fresh(exp: Experiment, jobs: list[tuple[str, Row]]) -> None:
    """Forget the jobs' result rows, saved programs and evaluation records."""
    forget(exp, jobs, programs=True)


def report_only(exp: Experiment, readme: Path | None) -> int:
    rows = exp.read_results().get("rows", [])
    if rows:
        exp.write(rows, readme)
        print(f"rebuilt {exp.results.with_suffix('.md')} and {exp.results.with_suffix('.png')} from {len(rows)} rows")
    else:
        print(f"no results in {exp.results} yet", file=sys.stderr)
        if readme is not None:
            rewrite_readme(readme, exp.config, {"rows": [], "size": exp.size_name, "tag": exp.tag})
    if readme is not None:
        print(f"rewrote the {exp.config.paper} block of {readme}")
    return 0
