"""What a study leaves behind: the best trial's config (for ``rolecall compile --config``) and a summary of all trials.

``best_config.json`` is ``{optimizer: fields}`` of the best finished trial (its searched fields over the base config),
the format :func:`rolecall.tuning.config_file.load_config_file` reads; ``trials.json`` lists every trial with its
state, score, parameters, config and intermediate scores.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import optuna

from rolecall.tuning.config_file import write_config_file

__all__ = ["best_trial", "summarize", "write_results"]

logger = logging.getLogger(__name__)


def best_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The best COMPLETE trial, or None while there is none (pruned trials never count as best)."""
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return study.best_trial if complete else None


def summarize(study: optuna.Study) -> dict[str, Any]:
    """The study as plain JSON data: counts per state, the best trial and one entry per trial."""
    trials = []
    for t in study.get_trials(deepcopy=False):
        duration = t.duration.total_seconds() if t.duration is not None else None
        trials.append({
            "number": t.number,
            "state": t.state.name,
            "value": t.value,
            "params": t.params,
            "config": t.user_attrs.get("config"),
            "intermediate_values": {str(k): v for k, v in sorted(t.intermediate_values.items())},
            "duration_s": duration,
            "retry_of": t.system_attrs.get("failed_trial"),
            "defaults": bool(t.user_attrs.get("defaults", False)),
        })  # fmt: skip
    states: dict[str, int] = {}
    for t in trials:
        states[t["state"]] = states.get(t["state"], 0) + 1
    best = best_trial(study)
    top = None
    if best is not None:
        config = best.user_attrs.get("config")
        top = {"number": best.number, "value": best.value, "params": best.params, "config": config}
    base = next((t for t in trials if t["defaults"]), None)
    return {
        "study": study.study_name,
        "direction": study.direction.name.lower(),
        "states": states,
        "best": top,
        "defaults": None if base is None else {k: base[k] for k in ("number", "state", "value", "params", "config")},
        "trials": trials,
    }


def write_results(study: optuna.Study, out_dir: str | Path, *, plots: bool = True) -> dict[str, Path]:
    """Writes ``trials.json``, ``best_config.json`` (when a trial completed) and the plots under ``plots/``.

    Returns:
        What was written: ``{"trials": path, "best_config": path, "plots": folder}`` (keys only for files written).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = summarize(study)
    written = {"trials": out_dir / "trials.json"}
    written["trials"].write_text(json.dumps(summary, indent=1, default=str) + "\n", encoding="utf-8")
    best = summary["best"]
    if best is not None:
        written["best_config"] = write_config_file(out_dir / "best_config.json", best["config"] or {})
        logger.info("best trial %d: %.4f; config in %s", best["number"], best["value"], written["best_config"])
    if plots:
        from rolecall.tuning.plots import save_plots

        if save_plots(study, out_dir / "plots"):
            written["plots"] = out_dir / "plots"
    return written
