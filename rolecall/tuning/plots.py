"""The study's plots as PNG files, drawn by ``optuna.visualization.matplotlib``.

- ``history.png``: each trial's dev score and the best so far (``plot_optimization_history``);
- ``importances.png``: how much of the score's variance each parameter explains (``plot_param_importances``, fANOVA);
- ``slice.png``: the score against each parameter's values (``plot_slice``);
- ``intermediate.png``: the dev scores each trial reported while training, pruned trials included
  (``plot_intermediate_values``).

A plot optuna cannot draw yet (importances need two finished trials whose parameters vary) is skipped with a log
message, not an error.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

__all__ = ["PLOTS", "save_plots"]

logger = logging.getLogger(__name__)

PLOTS: dict[str, str] = {
    "history": "plot_optimization_history",
    "importances": "plot_param_importances",
    "slice": "plot_slice",
    "intermediate": "plot_intermediate_values",
}
"""File stem -> the ``optuna.visualization.matplotlib`` function that draws it."""


def save_plots(study: optuna.Study, out_dir: str | Path, *, names: tuple[str, ...] = tuple(PLOTS)) -> list[Path]:
    """Draws the study's plots into ``out_dir/<name>.png``; returns the files written.

    Args:
        study: The study (its finished trials are plotted).
        out_dir: The folder of the PNG files (created if missing).
        names: Which of :data:`PLOTS` to draw.

    Raises:
        ValueError: If a name is not one of :data:`PLOTS`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as optuna_plots

    unknown = sorted(set(names) - set(PLOTS))
    if unknown:
        raise ValueError(f"unknown plots {unknown}; valid plots are {list(PLOTS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names:
        draw: Callable[..., Any] = getattr(optuna_plots, PLOTS[name])
        path = out_dir / f"{name}.png"
        try:
            with warnings.catch_warnings():  # the matplotlib backend is marked experimental in optuna
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                warnings.simplefilter("ignore", UserWarning)
                axes = draw(study)
        except (ValueError, RuntimeError, ZeroDivisionError) as err:  # too few trials, or parameters that never vary
            logger.info("plot %s skipped: %s", name, err)
            plt.close("all")
            continue
        figure = _figure(axes)
        figure.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return written


def _figure(axes: Any) -> Any:
    """The figure of an Axes or of an array of them (``plot_slice`` returns one Axes per parameter)."""
    first = axes.flat[0] if hasattr(axes, "flat") else axes
    return first.figure
