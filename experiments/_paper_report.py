"""The paper experiments' reports: a markdown table per dataset, a PNG chart, and each paper's block of
``experiments/README.md`` (the paper's numbers beside ours), all built from the results JSON alone."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from _paper_config import DATASETS, REAL_DATASETS, PaperConfig

EMBEDDED_MODEL = "SmolLM2-135M-Instruct (embedded)"
NOT_RUN = "not run yet"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def _paper_cell(numbers: dict[str, float] | None, key: str) -> str:
    if not numbers or numbers.get(key) is None:
        return "–"
    return str(numbers[key])


def trained_on(row: dict[str, Any]) -> str:
    """'synthetic (200 q)', or '–' for an untrained row."""
    train = row.get("train")
    if not train:
        return "not trained"
    return f"{train['on']} ({train.get('questions', '?')} q)"


def training_cell(row: dict[str, Any]) -> str:
    train = row.get("train")
    if not train:
        return "–"
    own, total = train.get("minutes", 0.0), train.get("total_minutes", train.get("minutes", 0.0))
    return f"{own:.1f}" if abs(total - own) < 0.05 else f"{own:.1f} ({total:.1f} in all)"


def steps_cell(row: dict[str, Any]) -> str:
    steps = (row.get("train") or {}).get("steps") or {}
    return ", ".join(f"{k} {v}" for k, v in steps.items()) or "–"


def header(config: PaperConfig, payload: dict[str, Any]) -> str:
    model = payload.get("model", EMBEDDED_MODEL)
    cpus = (payload.get("machine") or {}).get("cpus", "?")
    size = payload.get("size_settings") or {}
    lines = [
        f"# {config.title}: rolecall reproduction ({payload.get('size', '?')} size)\n",
        f"Our rows run **{model}** on {cpus} CPU cores; the paper's run **{config.paper_model}** "
        f"(their numbers, in the *paper* columns, are {config.paper_metric}). A 135M model trained for minutes on a "
        "CPU is not expected to reach a 4-8B model's numbers: read our columns for the direction of each training step "
        "and ablation, with the 95% interval, not for the paper's level.\n",
        f"Maps to the paper's {config.tables}. Held-out questions: at most {size.get('test_questions', '?')} per "
        "dataset (synthetic: the world's test split; real dev subsets: the 20% side of rolecall's 80/20 hash split, "
        "closed corpus built from the dataset, BM25). EM and F1 are percentages with SQuAD normalization; *EM 95% CI* "
        "is a question-bootstrap interval; *train min* is the row's own training, *in all* adds its warm start's and "
        "Teacher's.\n",
    ]
    lines += [f"- {note}" for note in config.notes]
    return "\n".join(lines) + ("\n" if config.notes else "")


def dataset_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| row | paper row | trained on | train min | steps | n | EM | EM 95% CI | F1 | paper EM | paper F1 "
        "| LM calls / q | prompt tokens / call |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.get("status") != "done":
            lines.append(
                f"| {r['label']} (`{r['row']}`) | {r.get('paper_row') or '–'} | FAILED: "
                f"{str(r.get('error', ''))[:120]} |  |  |  |  |  |  | {_paper_cell(r.get('paper'), 'em')} "
                f"| {_paper_cell(r.get('paper'), 'f1')} |  |  |"
            )
            continue
        low, high = r.get("em_ci") or (None, None)
        ci = "–" if low is None else f"{100 * low:.1f}–{100 * high:.1f}"
        lines.append(
            f"| {r['label']} (`{r['row']}`) | {r.get('paper_row') or '–'} | {trained_on(r)} | {training_cell(r)} "
            f"| {steps_cell(r)} | {r['n']} | {_pct(r['em'])} | {ci} | {_pct(r['f1'])} "
            f"| {_paper_cell(r.get('paper'), 'em')} | {_paper_cell(r.get('paper'), 'f1')} "
            f"| {r['lm_calls_per_question']:.1f} | {r['prompt_tokens_per_call']:.0f} |"
        )
    return lines


def macro_rows(config: PaperConfig, rows: list[dict[str, Any]]) -> list[tuple[str, str, list[str], float | None, dict]]:
    """(row name, label, real datasets run, our macro EM, the paper's macro numbers) for rows with a paper macro."""
    out = []
    for spec in config.rows:
        if "macro" not in spec.paper:
            continue
        done = [
            r for r in rows if r["row"] == spec.name and r["dataset"] in REAL_DATASETS and r.get("status") == "done"
        ]
        ours = sum(r["em"] for r in done) / len(done) if done else None
        out.append((spec.name, spec.title, [r["dataset"] for r in done], ours, spec.paper["macro"]))
    return out


def training_notes(rows: list[dict[str, Any]]) -> list[str]:
    """One line per finished row: what it was trained on, for how long, from which warm start / Teacher; a row whose
    warm start (or Teacher) is not the program that row's own result describes says so."""
    lines = []
    trained_at = {(r["dataset"], r["row"]): (r.get("train") or {}).get("trained_at") for r in rows}
    for r in rows:
        train = r.get("train")
        if r.get("status") != "done":
            continue
        if not train:
            lines.append(f"- {r['dataset']} / `{r['row']}` ({r['label']}): not trained (prompt only, built-in demos).")
            continue
        where = f"trained on {train['on']}" + (f", evaluated on {r['dataset']}" if train["on"] != r["dataset"] else "")
        if train.get("method") == "eval":
            what = (
                f"the `{train.get('derived_from')}` program evaluated with {train.get('options')} "
                f"(its training: {where}, {train.get('questions')} questions; no training of its own)"
            )
        else:
            settings = ", ".join(f"{k} {v}" for k, v in (train.get("settings") or {}).items() if v is not None)
            what = (
                f"{where}, {train.get('questions')} questions, {train.get('minutes', 0):.1f} min, steps "
                f"{steps_cell(r)} ({settings})"
            )
            if train.get("warm_start"):
                what += f"; warm start `{train['warm_start']}`"
            if train.get("teacher"):
                what += f"; Teacher `{train['teacher']}`"
            if train.get("warm_start") or train.get("teacher"):
                what += f"; {train.get('total_minutes', 0):.1f} min in all"
            for link in ("warm_start", "teacher"):
                parent, at = train.get(link), train.get(f"{link}_trained_at")
                reported = trained_at.get((r["dataset"], parent), at) if parent else at
                if reported != at:
                    what += (
                        f"; **its {link.replace('_', ' ')} is the `{parent}` program trained at {at}, not the one "
                        f"`{parent}`'s row reports (trained at {reported})**"
                    )
        lines.append(f"- {r['dataset']} / `{r['row']}` ({r['label']}): {what}.")
    return lines


def markdown(config: PaperConfig, payload: dict[str, Any]) -> str:
    rows = payload.get("rows", [])
    parts = [header(config, payload)]
    for dataset in [d for d in DATASETS if any(r["dataset"] == d for r in rows)]:
        subset = [r for r in rows if r["dataset"] == dataset]
        n = max((r.get("n", 0) for r in subset), default=0)
        parts.append(f"## {dataset} ({n} test questions)\n")
        parts.append("\n".join(dataset_table(subset)) + "\n")
    macros = macro_rows(config, rows)
    if macros:
        parts.append("## Macro average over the real datasets (the paper reports only a macro average)\n")
        parts.append("| row | datasets run | our macro EM | paper macro EM |\n|---|---|---:|---:|")
        for name, label, datasets, ours, paper in macros:
            parts.append(
                f"| {label} (`{name}`) | {', '.join(datasets) or '–'} | {_pct(ours)} | {_paper_cell(paper, 'em')} |"
            )
        parts.append("")
    notes = training_notes(rows)
    if notes:
        parts.append("## What each row was trained on, and for how long\n")
        parts.append("\n".join(notes) + "\n")
    missing = [f"{r.title} (`{r.name}`)" for r in config.rows if not r.paper]
    if missing:
        parts.append(f"Rows without a paper number (PAPERS.md gives none for them): {', '.join(missing)}.\n")
    parts.append(f"Rebuild this report: `.venv/bin/python experiments/{config.paper}.py --report-only`.\n")
    return "\n".join(parts)


def plot(config: PaperConfig, payload: dict[str, Any], path: Path) -> None:
    """EM with 95% CI error bars per row, one panel per dataset; the paper's numbers as red markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in payload.get("rows", []) if r.get("status") == "done"]
    datasets = [d for d in DATASETS if any(r["dataset"] == d for r in rows)]
    if not datasets:
        return
    names = [spec.name for spec in config.rows if any(r["row"] == spec.name for r in rows)]
    palette = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    fig, axes = plt.subplots(
        1, len(datasets), figsize=(max(6.0, 0.55 * len(names) * len(datasets) + 2), 4.5), sharey=True, squeeze=False
    )
    for ax, dataset in zip(axes[0], datasets, strict=True):
        by = {r["row"]: r for r in rows if r["dataset"] == dataset}
        for i, name in enumerate(names):
            r = by.get(name)
            if r is None:
                continue
            em, (low, high) = 100 * r["em"], [100 * v for v in r["em_ci"]]
            ax.bar(i, em, color=palette(i % palette.N), label=r["label"] if dataset == datasets[0] else None)
            ax.errorbar(i, em, yerr=[[max(em - low, 0)], [max(high - em, 0)]], color="black", capsize=3, lw=1)
            paper = (r.get("paper") or {}).get(config.primary_metric)
            if paper is not None:
                ax.plot(
                    i,
                    paper,
                    marker="x",
                    color="red",
                    ms=8,
                    mew=2,
                    label=f"paper {config.primary_metric.upper()}" if dataset == datasets[0] and i == 0 else None,
                )
            if config.primary_metric == "f1":
                ax.plot(i, 100 * r["f1"], marker="D", color="black", ms=4, ls="none")
        ax.set_title(f"{dataset} (n={max(r['n'] for r in by.values()) if by else 0})")
        ax.set_xticks(range(len(names)), [n for n in names], rotation=60, ha="right", fontsize=7)
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylim(0, 100)
    axes[0][0].set_ylabel("EM (%) with 95% CI" + ("; ◆ our F1" if config.primary_metric == "f1" else ""))
    handles, labels = [], []
    for ax in axes[0]:
        h, lab = ax.get_legend_handles_labels()
        handles, labels = handles + h, labels + lab
    if not any(lab.startswith("paper") for lab in labels) and any(
        (r.get("paper") or {}).get(config.primary_metric) is not None for r in rows
    ):
        handles.append(plt.Line2D([], [], marker="x", color="red", ls="none", mew=2))
        labels.append(f"paper {config.primary_metric.upper()}")
    fig.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 0.95), frameon=False)
    fig.suptitle(
        f"{config.title}: {payload.get('model', EMBEDDED_MODEL)} vs the paper's {config.paper_model}", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def write_report(config: PaperConfig, payload: dict[str, Any], md: Path, png: Path) -> None:
    md.write_text(markdown(config, payload), encoding="utf-8")
    plot(config, payload, png)


# ---------------------------------------------------------------------------------------------------- README block
def markers(paper: str) -> tuple[str, str]:
    return (
        f"<!-- BEGIN {paper} results (generated: experiments/{paper}.py --report-only) -->",
        f"<!-- END {paper} results -->",
    )


def readme_block(config: PaperConfig, payload: dict[str, Any]) -> str:
    """The paper's numbers beside ours, one line per (row, dataset) the paper reports; ours "not run yet" until the
    results JSON holds the row."""
    rows = {(r["dataset"], r["row"]): r for r in payload.get("rows", []) if r.get("status") == "done"}
    metric = config.paper_metric
    lines = [
        f"| paper table | row (ours: `row`) | dataset | paper ({config.paper_model}) {metric} | ours EM / F1 (%) | n "
        "| ours trained on |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for spec in config.rows:
        for dataset in [d for d in (*DATASETS, "macro") if d in spec.paper]:
            numbers = spec.paper[dataset]
            paper = " / ".join(_paper_cell(numbers, k) for k in ("em", "f1"))
            if dataset == "macro":
                macro = next(m for m in macro_rows(config, list(payload.get("rows", []))) if m[0] == spec.name)
                ours, n, on = (
                    (_pct(macro[3]) + " EM (macro of " + ", ".join(macro[2]) + ")", "", "")
                    if macro[2]
                    else (NOT_RUN, "", "")
                )
            elif (dataset, spec.name) in rows:
                r = rows[(dataset, spec.name)]
                ours, n, on = f"{_pct(r['em'])} / {_pct(r['f1'])}", str(r["n"]), trained_on(r)
            else:
                ours, n, on = NOT_RUN, "", ""
            lines.append(
                f"| {spec.paper_table or '–'} | {spec.paper_row or spec.title} (`{spec.name}`) | {dataset} "
                f"| {paper} | {ours} | {n} | {on} |"
            )
    size, tag = payload.get("size"), payload.get("tag", config.paper)
    tail = f"Results of the `{size}` size; every row and dataset: [`results/{tag}.md`](results/{tag}.md)."
    if not rows:
        tail = f"Not run yet: `.venv/bin/python experiments/{config.paper}.py` fills this block."
    return "\n".join(lines) + "\n\n" + tail


def rewrite_readme(path: Path, config: PaperConfig, payload: dict[str, Any]) -> None:
    """Replace the paper's block between its markers in ``path`` (appended at the end when the markers are absent)."""
    begin, end = markers(config.paper)
    block = f"{begin}\n{readme_block(config, payload)}\n{end}"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + block + "\n"
    path.write_text(text, encoding="utf-8")
