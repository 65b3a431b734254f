"""Every rolecall program and baseline on the synthetic world and the real dev subsets, with the embedded model.

One LM (SmolLM2-135M-Instruct by default) and one closed-corpus BM25 index per dataset; every program answers the same
first ``--limit`` questions of each dataset. Each (dataset, program) run streams its per-question records to
``OUT/runs/<dataset>/<program>/records.jsonl``, so a killed comparison resumes where it stopped (pass ``--fresh`` to
start over). At the end it writes, under ``OUT`` (default ``experiments/results/``):

- ``compare_programs.md``: one table (EM, F1, cover-EM, steps, LM calls, tokens, latency, success rate) per dataset;
- ``compare_programs.json`` / ``compare_programs.csv``: the same rows, machine-readable;
- ``compare_programs.png``: a bar chart of EM and F1 per program and dataset.

Usage::

    .venv/bin/python experiments/compare_programs.py                        # all programs, 4 datasets, 50 q each
    .venv/bin/python experiments/compare_programs.py --limit 5 --datasets synthetic --programs opera,ircot
    .venv/bin/python experiments/compare_programs.py --report-only          # rebuild the table from saved runs

The real datasets are read from ``../shared/data`` (beside the checkout); a dataset whose files are missing is skipped
with a message.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rolecall.data.corpus import DEV_SUBSET_FILES
from rolecall.utils.logs import quiet_repeated_warnings

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
DATA_FILES: dict[str, Path] = {name: SHARED_DATA / rel for name, rel in DEV_SUBSET_FILES.items()}
DATASETS = ("synthetic", "hotpotqa", "2wiki", "musique")
COLUMNS = (
    ("em", "EM", "{:.3f}"),
    ("f1", "F1", "{:.3f}"),
    ("cover_em", "cover-EM", "{:.3f}"),
    ("steps", "steps", "{:.1f}"),
    ("lm_calls", "LM calls", "{:.1f}"),
    ("tokens", "tokens", "{:.0f}"),
    ("latency_s", "latency s", "{:.1f}"),
    ("success_rate", "success", "{:.2f}"),
    ("n_errors", "errors", "{:d}"),
)

logger = logging.getLogger("compare_programs")


def load_dataset_with_corpus(name: str, limit: int, seed: int = 0) -> tuple[list[Any], list[Any]] | None:
    """The first ``limit`` questions of ``name`` and its closed corpus, or None when its files are absent."""
    from rolecall.data.corpus import build_corpus, load_dataset

    if name == "synthetic":
        from rolecall.data.synthetic import synthetic_world

        world = synthetic_world(seed=seed)
        return list(world.test[:limit]), list(world.corpus)
    path = DATA_FILES[name]
    if not path.is_file():
        return None
    return list(load_dataset(name, path)[:limit]), list(build_corpus(name, path))


def run_one(program_name: str, dataset: str, examples: list[Any], retriever: Any, lm: Any, args: Any) -> dict:
    """Evaluate one registered program on one dataset (resuming its records) and return its table row."""
    import dspy

    from rolecall.evaluation import evaluate
    from rolecall.programs.registry import build_program, get_program_class

    cls = get_program_class(program_name)
    program = build_program(program_name, retriever if getattr(cls, "uses_retriever", True) else None, lm)
    out = args.out / "runs" / dataset / program_name
    with dspy.context(lm=lm):
        result = evaluate(
            program,
            examples,
            num_threads=args.threads,
            output_dir=out,
            show_progress=getattr(args, "concurrent_programs", 1) == 1,
            resume=not args.fresh,
        )
    return row_of(program_name, dataset, result.summary.to_dict())


def row_of(program_name: str, dataset: str, summary: dict[str, Any]) -> dict[str, Any]:
    """A table row from an evaluation summary dict."""
    row = {"program": program_name, "dataset": dataset, "n": summary.get("n", 0)}
    for key, _, _ in COLUMNS:
        if key == "tokens":
            row[key] = (summary.get("prompt_tokens") or 0) + (summary.get("completion_tokens") or 0)
        else:
            row[key] = summary.get(key)
    row["em_ci"] = [summary.get("em/ci_low"), summary.get("em/ci_high")]
    row["parse_rates"] = {k.split("/", 1)[1]: v for k, v in summary.items() if k.startswith("parse_rate/")}
    return row


def saved_rows(out: Path) -> list[dict[str, Any]]:
    """Rows rebuilt from every ``runs/<dataset>/<program>/summary.json`` under ``out``."""
    rows = []
    for summary_path in sorted((out / "runs").glob("*/*/summary.json")):
        dataset, program_name = summary_path.parent.parent.name, summary_path.parent.name
        summary = json.loads(summary_path.read_text())
        rows.append(row_of(program_name, dataset, summary.get("summary", summary)))
    return rows


def dataset_order(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The datasets present in ``rows``, in ``DATASETS`` order (synthetic first), any others after them."""
    seen = list(dict.fromkeys(r["dataset"] for r in rows))
    return [d for d in DATASETS if d in seen] + [d for d in seen if d not in DATASETS]


def _ci_cell(ci: Sequence[float | None] | None) -> str:
    if not ci or any(v is None for v in ci):
        return "-"
    return f"{ci[0]:.2f}–{ci[1]:.2f}"


RUN_SETTINGS = ("k", "limit", "threads", "concurrent_programs")


def run_settings(args: Any) -> argparse.Namespace:
    """The settings the saved runs were made with: ``OUT/runs/settings.json`` when a run wrote it, else ``args``.

    A ``--report-only`` call with other flags must not misstate how the saved records were produced.
    """
    saved = args.out / "runs" / "settings.json"
    values = {name: getattr(args, name) for name in RUN_SETTINGS}
    if saved.is_file():
        try:
            values.update({k: v for k, v in json.loads(saved.read_text()).items() if k in RUN_SETTINGS})
        except (json.JSONDecodeError, AttributeError):
            logger.warning("ignoring unreadable %s; the report states this command's settings", saved)
    return argparse.Namespace(**values)


def setup_note(args: Any) -> str:
    """The paragraph above the tables: what was run (``k``, ``limit``, ``threads``, ``concurrent_programs`` of
    ``args``), and how to read the columns."""
    return (
        "# rolecall programs with the embedded model\n\n"
        f"SmolLM2-135M-Instruct (embedded, untrained), one closed-corpus BM25 index per dataset (default k={args.k}), "
        f"the first {args.limit} questions of each dataset. Up to {args.threads} questions per program and "
        f"{args.concurrent_programs} programs ran at once, their LM calls sharing the continuous batcher, so "
        "*latency s* is the wall time of one question under that shared load: compare it within a table, not with a "
        "single-question run. *EM 95% CI* is a bootstrap interval over questions: with this few questions, "
        "a gap between two programs that is small beside these intervals is noise. *steps*, *LM calls* and *tokens* "
        "(prompt + completion) are means per question; *success* is the share of questions that ended with a "
        "non-empty answer and no exception; *errors* "
        "counts questions whose program raised or one of whose LM calls failed (recorded and scored as wrong, never "
        "dropped).\n\n"
        "Rebuild the report: `.venv/bin/python experiments/compare_programs.py --report-only`; "
        "rerun from scratch: add `--fresh`.\n"
    )


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown tables, one per dataset, programs sorted by EM."""
    parts = []
    for dataset in dataset_order(rows):
        subset = sorted((r for r in rows if r["dataset"] == dataset), key=lambda r: -(r["em"] or 0.0))
        parts.append(f"### {dataset} ({subset[0]['n']} questions)\n")
        headers = [h for _, h, _ in COLUMNS]
        headers.insert(1, "EM 95% CI")
        parts.append("| program | " + " | ".join(headers) + " |")
        parts.append("|---|" + "---:|" * len(headers))
        for r in subset:
            cells = [fmt.format(r[k]) if r.get(k) is not None else "-" for k, _, fmt in COLUMNS]
            cells.insert(1, _ci_cell(r.get("em_ci")))
            parts.append(f"| {r['program']} | " + " | ".join(cells) + " |")
        parts.append("")
    return "\n".join(parts)


def plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Grouped bars: EM (top) and F1 (bottom) per program, one group per dataset, one distinct colour per program."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = dataset_order(rows)
    programs = sorted(dict.fromkeys(r["program"] for r in rows))
    by = {(r["dataset"], r["program"]): r for r in rows}
    palette = plt.get_cmap("tab20" if len(programs) > 10 else "tab10")
    width = 0.8 / max(len(programs), 1)
    fig, axes = plt.subplots(2, 1, figsize=(max(7.0, 1.6 * len(datasets) * max(len(programs), 4) / 4), 7), sharex=True)
    for ax, metric in zip(axes, ("em", "f1"), strict=True):
        for j, name in enumerate(programs):
            xs = [i + (j - (len(programs) - 1) / 2) * width for i in range(len(datasets))]
            ys = [(by.get((d, name)) or {}).get(metric) or 0.0 for d in datasets]
            ax.bar(xs, ys, width=width, label=name, color=palette(j % palette.N))
        ax.set_ylabel(metric.upper())
        ax.set_ylim(0, max(0.05, *(r[metric] or 0.0 for r in rows)) * 1.15)
        ax.grid(axis="y", alpha=0.3)
    axes[1].set_xticks(range(len(datasets)), datasets)
    axes[0].set_title("rolecall programs with the embedded SmolLM2-135M (BM25, closed corpus)")
    # the legend sits right of the axes, so it never hides a bar
    axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def write_report(rows: Sequence[dict[str, Any]], out: Path, note: str = "") -> None:
    """Write the markdown table (led by ``note``), JSON, CSV and bar chart under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare_programs.md").write_text(f"{note}\n{format_table(rows)}" if note else format_table(rows))
    (out / "compare_programs.json").write_text(json.dumps(list(rows), indent=2))
    with (out / "compare_programs.csv").open("w", newline="") as f:
        keys = ["program", "dataset", "n", *[k for k, _, _ in COLUMNS], "em_ci_low", "em_ci_high"]
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            low, high = r.get("em_ci") or (None, None)
            writer.writerow({**r, "em_ci_low": low, "em_ci_high": high})
    plot(rows, out / "compare_programs.png")


def main(argv: Sequence[str] | None = None) -> int:
    from rolecall.programs.registry import program_names

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", default="all", help="comma-separated registry names, or 'all' (default)")
    parser.add_argument("--datasets", default=",".join(DATASETS), help=f"comma-separated, from {', '.join(DATASETS)}")
    parser.add_argument("--limit", type=int, default=50, help="questions per dataset (default 50)")
    parser.add_argument("--threads", type=int, default=8, help="questions run concurrently (default 8)")
    parser.add_argument(
        "--concurrent-programs",
        type=int,
        default=4,
        help="programs evaluated at the same time; their LM calls share batches (default 4)",
    )
    parser.add_argument("--k", type=int, default=5, help="BM25 default k (programs keep their own top_k)")
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results", help="output directory")
    parser.add_argument("--fresh", action="store_true", help="ignore saved records and rerun every question")
    parser.add_argument("--report-only", action="store_true", help="only rebuild the table and chart from saved runs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    quiet_repeated_warnings()

    names = program_names() if args.programs == "all" else [p.strip() for p in args.programs.split(",") if p.strip()]
    unknown = sorted(set(names) - set(program_names()))
    datasets = [d.strip() for d in args.datasets.split(",") if d.strip()]
    bad = sorted(set(datasets) - set(DATASETS))
    if unknown or bad or min(args.limit, args.threads, args.concurrent_programs) < 1:
        parser.error(f"unknown programs {unknown} / datasets {bad}, or --limit/--threads/--concurrent-programs < 1")
    if not args.report_only:
        from rolecall.lm import LocalLM
        from rolecall.programs.core.program import parallel_map
        from rolecall.retrievers.bm25 import BM25

        lm = LocalLM()
        loaded: dict[str, tuple[list[Any], Any]] = {}
        for dataset in datasets:
            found = load_dataset_with_corpus(dataset, args.limit)
            if found is None:
                print(f"skipping {dataset}: {DATA_FILES[dataset]} not found (../shared/data beside the checkout)")
                continue
            examples, corpus = found
            loaded[dataset] = (examples, BM25(corpus, default_k=args.k))
            print(f"{dataset}: {len(examples)} questions, closed corpus of {len(corpus)} passages", flush=True)
        (args.out / "runs").mkdir(parents=True, exist_ok=True)
        (args.out / "runs" / "settings.json").write_text(json.dumps({n: getattr(args, n) for n in RUN_SETTINGS}))
        print_lock = threading.Lock()  # programs finish on worker threads: one line each, never interleaved
        start = time.perf_counter()

        def one(job: tuple[str, str]) -> None:
            dataset, name = job
            examples, retriever = loaded[dataset]
            row = run_one(name, dataset, examples, retriever, lm, args)
            with print_lock:
                print(
                    f"  {dataset:<9} {name:<20} EM {row['em']:.3f}  F1 {row['f1']:.3f}  "
                    f"success {row['success_rate']:.2f}  (done at {time.perf_counter() - start:.0f} s)",
                    flush=True,
                )

        # one queue over every (dataset, program): the next dataset's programs start while the last of a dataset
        # finish, so the shared batches stay full to the end
        parallel_map(one, [(d, n) for d in loaded for n in names], max_workers=args.concurrent_programs)
    rows = [r for r in saved_rows(args.out) if r["program"] in names and r["dataset"] in datasets]
    if not rows:
        print("no finished runs to report", file=sys.stderr)
        return 1
    write_report(rows, args.out, note=setup_note(run_settings(args)))
    print(format_table(rows))
    print(f"wrote {args.out / 'compare_programs.md'} and {args.out / 'compare_programs.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
