"""What every benchmark script shares: its argument parser with ``--out``, and the results writer.

Each script's results JSON carries a ``config`` block (its arguments plus the machine it ran on) so a number in
``benchmarks/results/`` can always be traced back to the command and the hardware that produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"


def bench_parser(doc: str | None, name: str) -> argparse.ArgumentParser:
    """An argument parser for benchmark ``name`` whose help is the script's docstring.

    It already has ``--out`` (default ``benchmarks/results/<name>.json``), listed in its own group after the script's
    options.
    """
    parser = argparse.ArgumentParser(
        prog=f"{name}.py", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    output = parser.add_argument_group("output")
    output.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR / f"{name}.json",
        help=f"where to write the JSON results (default: benchmarks/results/{name}.json)",
    )
    return parser


def repo_relative(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (results files carry no machine's home folder)."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def machine_info() -> dict[str, Any]:
    """The facts about this machine and software stack that a timing depends on."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
        info["cuda"] = bool(torch.cuda.is_available())
    return info


def write_results(results: dict[str, Any], args: argparse.Namespace) -> Path:
    """Add the ``config`` block (arguments and machine) to ``results`` and write it as JSON to ``args.out``.

    Values JSON cannot encode (paths, dtypes) are written as strings. Returns the path written.
    """
    out = Path(args.out)
    arguments = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    results["config"] = {**arguments, **machine_info()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n", encoding="utf-8")
    return out


def trained_once(
    folder: Path, load: Any, train: Any, *, reuse: bool = True, extra: Any = None
) -> tuple[Any, float, list[dict[str, Any]]]:
    """The program a finished training saved in ``folder/program`` (with ``folder/train.json``), or ``train()``'s.

    Args:
        folder: where the program and ``train.json`` (its minutes and the optimizer's history) go.
        load: ``load(path) -> program``, the saved program's class loader with its retriever and LM bound.
        train: ``train() -> (program, optimizer)``, run when there is nothing to reuse (or ``reuse`` is False).
        reuse: take a finished training from ``folder`` when there is one.
        extra: ``extra(optimizer) -> dict`` (JSON values), stored in ``train.json`` under ``"extra"`` so that a
            reused training still reports it (read it back with :func:`training_extra`).

    Returns:
        The program, its training minutes and the optimizer's history (numbers and strings of each record).
    """
    import time

    saved, meta = folder / "program", folder / "train.json"
    if reuse and finished_training(folder):
        info = json.loads(meta.read_text(encoding="utf-8"))
        return load(saved), info["minutes"], info["history"]
    started = time.perf_counter()
    program, optimizer = train()
    minutes = (time.perf_counter() - started) / 60
    program.save(saved)
    history = [{k: v for k, v in r.items() if isinstance(v, (int, float, str))} for r in optimizer.history]
    info: dict[str, Any] = {"minutes": minutes, "history": history}
    if extra is not None:
        info["extra"] = extra(optimizer)
    meta.write_text(json.dumps(info) + "\n", encoding="utf-8")
    return program, minutes, history


def training_extra(folder: Path) -> dict[str, Any]:
    """What :func:`trained_once`'s ``extra`` stored for the training in ``folder`` (empty when nothing was)."""
    try:
        return dict(json.loads((folder / "train.json").read_text(encoding="utf-8")).get("extra") or {})
    except (OSError, ValueError, AttributeError):
        return {}


def finished_training(folder: Path) -> bool:
    """Whether :func:`trained_once` left a finished training in ``folder`` (the program and ``train.json``)."""
    return (folder / "program" / "program.json").is_file() and (folder / "train.json").is_file()


def parse_fields(specs: list[str], flag: str) -> dict[str, Any]:
    """``FIELD=VALUE`` command-line options (``flag``, for the message) as config fields, each value read as JSON
    (``1.3``, ``true``, ``{"plan": 4e-4}``), else kept as text; dotted fields (``learning_rate.plan``) stay dotted
    for :func:`rolecall.tuning.config_file.apply_fields`."""
    fields: dict[str, Any] = {}
    for spec in specs:
        key, sep, text = spec.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"{flag} takes FIELD=VALUE (e.g. {flag} temperature=1.3); got {spec!r}")
        try:
            fields[key.strip()] = json.loads(text)
        except ValueError:
            fields[key.strip()] = text
    return fields


def fields_label(fields: dict[str, Any]) -> tuple[str, str]:
    """``(label, slug)`` of config fields: ``"k=v,k=v"`` for a row's name and a folder-safe form of it (both empty
    when there are no fields). A slug past 120 characters keeps its first 100 and a hash of the whole label, so a
    row with many fields still gets a folder name the file system takes (255 bytes at most) and its own."""
    import hashlib
    import re

    label = ",".join(f"{k}={v}" for k, v in fields.items())
    slug = re.sub(r"[^A-Za-z0-9_.=-]+", "_", label)
    if len(slug) > 120:
        slug = f"{slug[:100]}-{hashlib.sha1(label.encode()).hexdigest()[:12]}"
    return label, slug


def with_fields(config: Any, fields: dict[str, Any], flag: str) -> Any:
    """``config`` (an optimizer config dataclass) with the ``flag`` fields of :func:`parse_fields` applied; a bad
    field or value exits with the config's message (which lists the valid fields)."""
    from rolecall.errors import ConfigError
    from rolecall.tuning.config_file import apply_fields

    try:
        return apply_fields(config, fields)
    except ConfigError as err:
        raise SystemExit(f"{flag}: {err}") from None


def sft_optimizer(
    args: argparse.Namespace, folder: Path, *, show_progress: bool = True, cls: str = "sft", resume: bool = False
) -> Any:
    """The SFT optimizer (or ``cls``, another registered SFT-style optimizer) a benchmark's SFT flags describe, built
    through the optimizer registry as ``rolecall compile`` builds it: ``--epochs``, ``--max-steps``,
    ``--learning-rate``, ``--lr-schedule``, ``--batch-size``, ``--grad-accum``, ``--roles``, ``--budget-minutes``
    (or ``--sft-minutes``), ``--sft-seed`` and ``--threads``, each only where the script has it (else SFT's default)."""
    from rolecall.optimizers.max_steps import parse_max_steps
    from rolecall.optimizers.registry import build_optimizer

    names = {"epochs": "epochs", "learning_rate": "learning_rate", "lr_schedule": "lr_schedule",
             "batch_size": "micro_batch_size", "grad_accum": "gradient_accumulation_steps", "threads": "num_threads",
             "budget_minutes": "time_budget_minutes", "sft_minutes": "time_budget_minutes",
             "sft_seed": "seed"}  # fmt: skip
    fields: dict[str, Any] = {field: getattr(args, flag) for flag, field in names.items() if hasattr(args, flag)}
    if getattr(args, "max_steps", None) is not None:
        fields["max_steps"] = parse_max_steps(str(args.max_steps))
    if getattr(args, "roles", None):
        fields["roles"] = tuple(r.strip() for r in args.roles.split(",") if r.strip())
    fields.update(output_dir=str(folder), show_progress=show_progress, resume=resume)
    return build_optimizer(cls, fields)


def paired_against(baseline_eval: Path, eval_dir: Path) -> dict[str, Any] | None:
    """The paired comparison (:func:`rolecall.evaluation.compare.compare_runs`) of the evaluation in ``eval_dir``
    against the one in ``baseline_eval`` (A, e.g. the warm start): n, A's EM, won / lost / tied, the EM difference with
    its paired bootstrap 95% interval and McNemar's exact p, printed and returned as JSON values. None when the
    baseline has no records or the two hold different questions (the reason is printed)."""
    from rolecall.errors import ConfigError
    from rolecall.evaluation.compare import compare_runs, format_comparison

    if not (baseline_eval / "records.jsonl").is_file():
        return None
    try:
        c = compare_runs(baseline_eval, eval_dir)
    except ConfigError as err:
        print(f"no paired comparison against {repo_relative(baseline_eval)}: {err}", flush=True)
        return None
    print(format_comparison(c), flush=True)
    return {"records": repo_relative(baseline_eval), "warm_start_em": round(c.em_a, 4), "n": c.n, "won": c.won,
            "lost": c.lost, "tied": c.tied, "em_diff": round(c.em_diff, 4),
            "em_diff_ci": [round(c.ci_low, 4), round(c.ci_high, 4)], "p_value": round(c.p_value, 4)}  # fmt: skip


def paired_cell(versus: dict[str, Any] | None) -> str:
    """A table cell for :func:`paired_against`'s result: ``+d [lo, hi], W/L, p`` in EM points (empty for None)."""
    if not versus or "em_diff_ci" not in versus:
        return ""
    low, high = versus["em_diff_ci"]
    return (f"{100 * versus['em_diff']:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}], {versus['won']}/{versus['lost']}, "
            f"p={versus['p_value']:.3g}")  # fmt: skip
