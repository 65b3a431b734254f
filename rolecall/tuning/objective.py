"""The tuning objective: one trial is a config, a compile on the trainset and an evaluation on the dev set.

    config_t = base_config ⊕ space.suggest(trial)          (dotted fields, grouped by optimizer)
    program_t = compile(program, optimizers(config_t), trainset)
    score_t = EM(program_t, devset)

While it trains, every optimizer of the chain reports the dev score through the loop's evaluation hook (after each
stage and, with ``eval_every``, every N optimizer steps) as ``trial.report(score, step)``, the step counted over the
whole chain; when ``trial.should_prune()`` says so, the hook stops training and the trial ends as pruned
(``optuna.TrialPruned``). Each trial starts from the program ``program_factory`` returns with every LoRA adapter put
back to the identity, so trials do not inherit each other's training.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import optuna

from rolecall.errors import ConfigError
from rolecall.optimizers.core.eval_hook import EvalPoint
from rolecall.tuning.config_file import config_sections, nest, optimizer_config, with_fields
from rolecall.tuning.space import SearchSpace

__all__ = ["Metric", "Objective", "reset_adapters"]

logger = logging.getLogger(__name__)

Metric = Literal["em", "f1", "cover_em"]
"""The dev-set score a trial maximizes: exact match (the papers' headline number), token F1 or cover-EM."""


@dataclass
class _TrialRun:
    """What one trial has reported so far."""

    trial: optuna.Trial
    offset: int = 0
    """Optimizer steps of the earlier optimizers of the chain."""
    last_step: int | None = None
    last_score: float | None = None
    pruned: bool = False


class Objective:
    """``objective(trial) -> dev score``: compiles a fresh program with the trial's config and evaluates it.

    Args:
        program_factory: Builds the program to train (called once per trial; its LM should be shared, so the model
            loads once).
        optimizers: The optimizer chain, by name (``{"sft": SFT(...), "mapgrpo": MAPGRPO(...)}``): templates whose
            configs the trial's fields change (:func:`~rolecall.tuning.config_file.with_fields`).
        space: The searched fields (dotted; with several optimizers, prefixed by the optimizer's name).
        trainset: The compile's training examples.
        devset: The examples of the dev score (never the test split).
        base_config: ``{optimizer: fields}`` applied before the trial's fields (a ``--config`` file).
        grid: Sample simplex groups from their grid (with optuna's ``GridSampler``).
        eval_every: Report the dev score every N optimizer steps too (None: after each stage only).
        metric: The dev score (:data:`Metric`).
        output_dir: Trial ``n`` writes ``trials/<n>/<optimizer>/`` (metrics, adapters) and ``trials/<n>/dev/`` (the
            final dev records) here; None keeps nothing on disk.
        num_threads: Dev questions evaluated concurrently.
        reset: Put every LoRA adapter of the program's model back to the identity before a trial.

    Raises:
        ConfigError: If ``optimizers`` or ``devset`` is empty, or ``base_config`` names an unknown field.
    """

    def __init__(
        self,
        *,
        program_factory: Callable[[], Any],
        optimizers: Mapping[str, Any],
        space: SearchSpace,
        trainset: Sequence[Any],
        devset: Sequence[Any],
        base_config: Mapping[str, Mapping[str, Any]] | None = None,
        grid: bool = False,
        eval_every: int | None = None,
        metric: Metric = "em",
        output_dir: str | Path | None = None,
        num_threads: int = 8,
        reset: bool = True,
    ) -> None:
        if not optimizers:
            raise ConfigError("Objective needs at least one optimizer")
        if not devset:
            raise ConfigError("Objective needs a non-empty dev set (the trials' score)")
        if metric not in ("em", "f1", "cover_em"):
            raise ConfigError(f"metric={metric!r}; valid metrics are em, f1, cover_em")
        self.program_factory, self.optimizers, self.space = program_factory, dict(optimizers), space
        self.trainset, self.devset = list(trainset), list(devset)
        self.base_config = {k: nest(v) for k, v in (base_config or {}).items()}
        self.grid, self.eval_every, self.metric = grid, eval_every, metric
        self.output_dir = Path(output_dir) if output_dir is not None else None
        self.num_threads, self.reset = num_threads, reset
        unknown = sorted(set(self.base_config) - set(self.optimizers))
        if unknown:
            raise ConfigError(f"base_config sections {unknown} are not optimizers of the chain {list(optimizers)}")
        for corner in space.corners(grid=grid):  # a bad field name or range fails now, before any model loads
            self.build_chain(self.trial_config(corner))

    # ------------------------------------------------------------------ one trial
    def __call__(self, trial: optuna.Trial) -> float:
        """Runs one trial: suggest, compile (reporting and maybe pruning), evaluate; returns the dev score.

        Raises:
            optuna.TrialPruned: When the pruner stopped the trial.
        """
        config = self.trial_config(self.space.suggest(trial, grid=self.grid))
        trial.set_user_attr("config", config)
        chain = self.build_chain(config, trial.number)
        program = self.program_factory()
        if self.reset:
            reset_adapters(program)
        run = _TrialRun(trial)
        for name, optimizer in chain.items():
            optimizer.set_eval_hook(lambda point, run=run: self._report(run, point), every=self.eval_every)
            program = optimizer.compile(program, trainset=self.trainset, valset=self.devset)
            run.offset += len(optimizer.history)
            if run.pruned:
                trial.set_user_attr("stopped_in", name)
                raise optuna.TrialPruned(f"trial {trial.number} pruned at step {run.last_step}: dev {self.metric} "
                                         f"{run.last_score:.4f}")  # fmt: skip
        trial.set_user_attr("steps", run.offset)
        if run.last_step is not None and run.last_step == run.offset:
            return float(run.last_score)
        score = self.score(program, write_to=self._trial_dir(trial.number, "dev"))
        trial.report(score, run.offset)
        return score

    def trial_config(self, values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """``{optimizer: fields}`` of a trial: the base config, then the suggested dotted fields over it."""
        sections = {k: dict(v) for k, v in self.base_config.items()}
        for name, fields in config_sections(dict(values), list(self.optimizers)).items():
            sections[name] = _merge(sections.get(name, {}), fields)
        return sections

    def default_values(self) -> dict[str, Any]:
        """Each searched dotted field's value when the study does not set it: the optimizer's default (the paper's
        value) or the base config's. Enqueued as a study's first trial, it puts the defaults in the same table as the
        searched points.

        Raises:
            ConfigError: If a searched field does not name a config field of the chain.
        """
        configs = {name: optimizer_config(o) for name, o in self.build_chain(self.base_config).items()}
        out: dict[str, Any] = {}
        for name in self.space.names:
            ((section, fields),) = config_sections({name: None}, list(self.optimizers)).items()
            node: Any = configs[section]
            while isinstance(fields, Mapping):
                ((key, fields),) = fields.items()
                if isinstance(node, Mapping) and key in node:
                    node = node[key]
                elif hasattr(node, key):
                    node = getattr(node, key)
                else:
                    raise ConfigError(f"{name}: {type(node).__name__} has no field {key!r}")
            out[name] = node
        return out

    def build_chain(self, config: Mapping[str, Mapping[str, Any]], number: int | None = None) -> dict[str, Any]:
        """The trial's optimizers: each template with its config fields, writing under the trial's folder."""
        chain = {}
        for name, template in self.optimizers.items():
            fields = dict(config.get(name, {}))
            known = {f.name for f in dataclasses.fields(optimizer_config(template))}
            out = self._trial_dir(number, name)
            if "output_dir" in known:  # a trial never resumes another's checkpoints
                fields["output_dir"] = str(out) if out is not None else None
            if "resume" in known:
                fields["resume"] = False
            chain[name] = with_fields(template, fields)
        return chain

    def score(self, program: Any, *, write_to: Path | None = None) -> float:
        """The dev score of ``program`` (:data:`Metric` over ``devset``)."""
        from rolecall.evaluation import evaluate

        result = evaluate(program, self.devset, num_threads=self.num_threads, output_dir=write_to, show_progress=False)
        return float(getattr(result.summary, self.metric))

    # ------------------------------------------------------------------ helpers
    def _report(self, run: _TrialRun, point: EvalPoint) -> bool:
        """The evaluation hook: report the dev score at the chain-wide step; True (stop training) when pruned."""
        step = run.offset + point.global_step
        score = self.score(point.student)
        run.trial.report(score, step)
        run.last_step, run.last_score = step, score
        logger.info("trial %d: dev %s %.4f at step %d", run.trial.number, self.metric, score, step)
        if run.trial.should_prune():
            run.pruned = True
        return run.pruned

    def _trial_dir(self, number: int | None, part: str) -> Path | None:
        if self.output_dir is None or number is None:
            return None
        return self.output_dir / "trials" / str(number) / part


def reset_adapters(program: Any) -> list[str]:
    """Puts every LoRA adapter of ``program``'s model back to the identity (delete, then create again); returns their
    names. A program without a local model (no ``lm.backend``) is left as it is."""
    backend = getattr(getattr(program, "lm", None), "backend", None)
    if backend is None or not hasattr(backend, "delete_adapter"):
        return []
    names = list(backend.adapters)
    for name in names:
        backend.delete_adapter(name)
    for name in names:
        backend.ensure_adapter(name)
    return names


def _merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        nested = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = _merge(out[key], value) if nested else value
    return out
