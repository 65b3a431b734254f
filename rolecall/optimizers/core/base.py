"""The weight-optimizer base: stages, a time budget split by measured cost, a checkpoint every step, resume, metrics.

A :class:`WeightOptimizer` is a ``dspy.Teleprompter`` whose ``compile`` owns the training loop; a subclass says what
one step does. The contract:

- ``stages(student, trainset) -> list[Stage]``: what to train. A stage is one adapter (or adapter group shared by
  several roles) with its step count and its :class:`TrainerConfig` (the loss by name).
- ``setup(student, trainset, stages)``: once per process, after a resume has restored the adapters (for example
  SFT's gold collection). ``start_stage(ctx)``: when a stage is first entered in this process (for example MAPGRPO's
  per-stage input collection with the earlier agents trained). Both must depend only on their inputs and the
  adapters: they run under a private copy of the RNGs, so an uninterrupted and a resumed run stay identical.
- per step, in order (:meth:`WeightOptimizer._step`): ``collect(ctx) -> batch`` (take inputs from the stage's
  sample stream, ``ctx.take(items, n)``, which the checkpoint resumes by position), ``generate(ctx, batch) ->
  rollouts`` (default: none, the batch passes through), ``execute(ctx, rollouts) -> executed`` (running what the
  rollouts proposed downstream, such as MAPGRPO's candidate plans; default: none), ``score(ctx, executed) -> (samples,
  metrics)`` (rewards, advantages; default: the batch already is the samples) and ``update(ctx, samples, trainer) ->
  metrics`` (default: ``trainer.step(samples)``). Randomness comes from ``ctx.rng`` or the global RNGs; all of them
  are checkpointed.

  The phases hand each other typed records, never dicts: a subclass defines its rollouts (and, when ``execute`` adds
  to them, its executed) record as a small dataclass in its own module and names the three types where it subclasses,
  ``class MAPGRPO(WeightOptimizer[list[RoleInput], Rollouts, Executed])`` (:data:`BatchT`, :data:`RolloutsT`,
  :data:`ExecutedT`). An optimizer whose ``collect`` already returns the samples (SFT) overrides ``collect`` only
  and names ``list[TrainingSample]`` for all three.

The base writes ``<output_dir>/metrics.jsonl`` (one flat line per step, with ``time/collect``, ``time/generate``,
``time/execute``, ``time/score``, ``time/update`` and ``time/step`` in seconds; with rollouts on a server, its
counters so far: ``served/requests``, ``served/retries``, ``served/pushes``, ...), an atomic checkpoint after every step
(:mod:`rolecall.optimizers.core.checkpoint`), ``summary.json`` (steps done and why training stopped) and the final
adapters under ``adapters/<name>/``. ``resume=True`` continues from the last intact checkpoint, after a SIGKILL too.
Ctrl-C lets the running step finish and checkpoint, then raises :class:`TrainingInterrupted` naming that checkpoint
(:mod:`rolecall.optimizers.core.interrupt`); a checkpoint that cannot be written (a full disk) raises
:class:`TrainingWriteError` with the previous one intact.

An optional evaluation hook (:meth:`WeightOptimizer.set_eval_hook`, :mod:`rolecall.optimizers.core.eval_hook`) is
called after each stage's last step and every N steps; it may score the student on the ``valset`` and stop training.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

import dspy
from tqdm.auto import tqdm

from rolecall.errors import ConfigError
from rolecall.optimizers.core import distributed
from rolecall.optimizers.core.budget import check_budget, next_stage, stage_progress
from rolecall.optimizers.core.checkpoint import (
    TrainingWriteError,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    seed_everything,
    set_rng_state,
)
from rolecall.optimizers.core.eval_hook import EvalHook, EvalPoint, eval_due
from rolecall.optimizers.core.interrupt import StopOnInterrupt, TrainingInterrupted, wait_for_model_thread
from rolecall.optimizers.core.metrics_log import MetricsLog
from rolecall.optimizers.core.run_config import RunConfig, WeightOptimizerConfig
from rolecall.optimizers.core.sample import TrainingSample
from rolecall.optimizers.core.stage import Stage, StepContext
from rolecall.optimizers.core.trainer import AdapterTrainer

__all__ = [
    "BatchT",
    "EvalHook",
    "EvalPoint",
    "RunConfig",
    "ExecutedT",
    "RolloutsT",
    "Stage",
    "StepContext",
    "TrainingInterrupted",
    "TrainingWriteError",
    "WeightOptimizer",
    "WeightOptimizerConfig",
]

logger = logging.getLogger(__name__)

PHASES = ("collect", "generate", "execute", "score", "update")
"""The timed phases of one step, in order (``time/<phase>`` in ``metrics.jsonl``)."""

BatchT = TypeVar("BatchT")
"""What ``collect`` returns and ``generate`` reads: the step's inputs (a list of the stage's items)."""
RolloutsT = TypeVar("RolloutsT")
"""What ``generate`` returns and ``execute`` reads: the step's rollouts record (default: the batch itself)."""
ExecutedT = TypeVar("ExecutedT")
"""What ``execute`` returns and ``score`` reads: the rollouts with their downstream results (default: the rollouts)."""


class WeightOptimizer(dspy.teleprompt.Teleprompter, Generic[BatchT, RolloutsT, ExecutedT]):
    """Trains a program's LoRA adapters stage by stage, with budget, checkpoints, resume and metrics (see module).

    Args:
        config: The loop settings.

    Attributes:
        history: The metrics records of the steps this process ran.
        stop_reason: ``"completed"``, ``"time_budget"``, ``"eval_hook"`` (the evaluation hook stopped training) or
            ``"interrupted"`` (Ctrl-C) after :meth:`compile`.
        stopped: Stage -> why it stopped before its planned steps.
        steps: Stage -> steps done after :meth:`compile` (those before a resume included).
        checkpoint: The last checkpoint written or resumed from (None: none), after ``checkpoint_step`` steps.
    """

    clock: Callable[[], float] = staticmethod(time.perf_counter)
    """The seconds every timing and the budget are measured in (a test may substitute a virtual clock)."""

    def __init__(self, config: WeightOptimizerConfig | None = None) -> None:
        super().__init__()
        self.config = config or WeightOptimizerConfig()
        self.history: list[dict[str, Any]] = []
        self._transport: Any = None  # the student LM's transport_metrics(), when its rollouts go to a server
        self.stop_reason: str | None = None
        self.stopped: dict[str, str] = {}
        self.eval_hook: EvalHook | None = None
        self.eval_every: int | None = None
        self.steps: dict[str, int] = {}
        self.checkpoint: Path | None = None
        self.checkpoint_step = 0

    def set_eval_hook(self, hook: EvalHook | None, *, every: int | None = None) -> None:
        """Calls ``hook(point)`` after each stage's last planned step and, with ``every``, after every ``every``
        global steps; a truthy return stops training (``stop_reason == "eval_hook"``). None removes the hook.

        Args:
            hook: ``hook(EvalPoint) -> bool | None``; it sees the student and the ``valset`` given to ``compile``.
            every: Global steps between calls (None: only at the end of each stage).

        Raises:
            ConfigError: If ``every`` is not an integer >= 1 or None.

        Example:
            >>> sft.set_eval_hook(lambda p: evaluate(p.student, p.valset).summary.em < 0.1, every=10)  # doctest: +SKIP
        """
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ConfigError(f"set_eval_hook(every=...) must be an integer >= 1 or None; got {every!r}.")
        self.eval_hook, self.eval_every = hook, every

    # ------------------------------------------------------------------ the subclass contract
    def stages(self, student: Any, trainset: Sequence[Any]) -> list[Stage]:
        """The stages to train, in order."""
        raise NotImplementedError(f"{type(self).__name__} must implement stages(student, trainset)")

    def setup(self, student: Any, trainset: Sequence[Any], stages: list[Stage]) -> None:
        """Runs once per process before the first step (after a resume restored the adapters)."""

    def start_stage(self, ctx: StepContext) -> bool | None:
        """Runs when ``ctx.stage`` is first entered in this process (also when a resume lands mid-stage); returning
        False skips the stage (recorded in ``stopped``), for example when it collected no inputs."""

    def stage_exhausted(self, stage: str, records: list[dict[str, Any]]) -> str | None:
        """Checked after every step: why ``stage`` should end before its planned steps (its unspent share of the time
        budget then goes to the later stages), or None to go on. ``records`` are the stage's step records this
        process ran, oldest first. The default never ends a stage early."""
        return None

    def collect(self, ctx: StepContext) -> BatchT:
        """Phase 1: the step's inputs, usually ``ctx.take(pool, n)``."""
        raise NotImplementedError(f"{type(self).__name__} must implement collect(ctx)")

    def generate(self, ctx: StepContext, batch: BatchT) -> RolloutsT:
        """Phase 2: the rollouts record of the batch (default: none; the batch passes through)."""
        return batch  # type: ignore[return-value]

    def execute(self, ctx: StepContext, rollouts: RolloutsT) -> ExecutedT:
        """Phase 3: downstream work the rewards need, timed apart from scoring, as the executed record (default:
        none; the rollouts pass through)."""
        return rollouts  # type: ignore[return-value]

    def score(self, ctx: StepContext, executed: ExecutedT) -> tuple[list[TrainingSample], dict[str, float]]:
        """Phase 4: training samples and reward metrics of the executed rollouts (default: they already are the
        samples)."""
        return list(executed), {}  # type: ignore[call-overload]

    def update(self, ctx: StepContext, samples: list[TrainingSample], trainer: AdapterTrainer) -> dict[str, float]:
        """Phase 5: trains the stage's adapter on the samples (default: ``trainer.step(samples)``)."""
        return trainer.step(samples)

    def backend(self, student: Any) -> Any:
        """The ``ModelBackend`` holding the adapters (default: ``student.lm.backend``, or ``student.backend``)."""
        lm = getattr(student, "lm", None) or student
        backend = getattr(lm, "backend", None)
        if backend is None or not hasattr(backend, "save_adapter"):
            raise ConfigError(f"{type(self).__name__} trains LoRA adapters: build the program with lm=LocalLM().")
        return backend

    # ------------------------------------------------------------------ the loop
    def compile(self, student: Any, *, trainset: Sequence[Any], valset: Sequence[Any] | None = None, **_: Any) -> Any:
        """Trains ``student``'s adapters in place, stage by stage, and returns it (``valset`` reaches the evaluation
        hook, when one is set).

        Raises:
            ConfigError: If the stages are invalid, the student is not on a LocalLM, or no checkpoint is intact.
            TrainingInterrupted: On Ctrl-C, once the running step finished and wrote its checkpoint (a second Ctrl-C:
                at once, without that step); it names the checkpoint ``resume=True`` continues from.
            TrainingWriteError: A checkpoint or metrics line could not be written (a full disk); the previous
                checkpoint is intact.
        """
        cfg = self.config
        stages = self.stages(student, trainset)
        names = [s.name for s in stages]
        if not stages or len(set(names)) != len(names):
            raise ConfigError(f"{type(self).__name__}.stages() must return stages with unique names; got {names}.")
        backend = self.backend(student)
        self._transport = getattr(getattr(student, "lm", None), "transport_metrics", None)
        for stage in stages:
            backend.ensure_adapter(stage.adapter)
        out = Path(cfg.output_dir) if cfg.output_dir is not None else None
        self.rng = random.Random(cfg.seed)
        state, saved_trainers = self._start(out, backend)
        with StopOnInterrupt(type(self).__name__) as interrupt:
            try:
                with self._private_rng(cfg.seed):
                    self.setup(student, trainset, stages)
                hook_stopped = self._train(student, valset, stages, state, saved_trainers, interrupt)
            except KeyboardInterrupt:
                wait_for_model_thread(backend)  # exiting while it runs torch aborts the process (see interrupt.py)
                self.steps, self.stop_reason = dict(state["steps"]), "interrupted"
                raise TrainingInterrupted(type(self).__name__, self.checkpoint, self.checkpoint_step) from None
        self.steps, self.stopped = dict(state["steps"]), dict(state["stopped"])
        self.stop_reason = "time_budget" if any("budget" in r for r in self.stopped.values()) else "completed"
        if hook_stopped:
            self.stop_reason = "eval_hook"
        if out is not None and distributed.is_main_process():
            self._finish(out, backend, stages, state)
        return student

    def _train(self, student: Any, valset: Sequence[Any] | None, stages: list[Stage], state: dict[str, Any],
               saved_trainers: dict[str, dict[str, Any]], interrupt: StopOnInterrupt) -> bool:  # fmt: skip
        """The loop: a step of the next stage at a time, each followed by its checkpoint, until every stage is done
        or stopped; whether the evaluation hook stopped it. A Ctrl-C between steps raises ``KeyboardInterrupt``."""
        cfg = self.config
        by_name = {s.name: s for s in stages}
        planned = {s.name: s.steps for s in stages}
        backend = self.backend(student)
        out = Path(cfg.output_dir) if cfg.output_dir is not None else None
        trainers: dict[str, AdapterTrainer] = {}
        started: set[str] = set()
        bar = tqdm(total=sum(planned.values()), initial=state["global_step"], desc=type(self).__name__,
                   disable=not cfg.show_progress)  # fmt: skip
        clock, elapsed0 = self.clock(), state["elapsed_s"]
        try:
            while (name := next_stage(planned, state, cfg.schedule)) is not None:
                state["elapsed_s"] = elapsed0 + self.clock() - clock
                # several processes: the main one's clock (and Ctrl-C) decides for all; the state is updated in place
                synced, stop = distributed.broadcast_object((state, interrupt.requested))
                if synced is not state:
                    state.clear()
                    state.update(synced)
                if stop:  # the last step's checkpoint is written: stop here
                    raise KeyboardInterrupt
                reason = check_budget(name, planned, state, cfg.time_budget_s, cfg.schedule)
                if reason is not None:
                    state["stopped"][name] = reason
                    logger.warning("%s %s: stopped after %d of %d steps: %s", type(self).__name__, name,
                                   state["steps"].get(name, 0), planned[name], reason)  # fmt: skip
                    continue
                stage = by_name[name]
                ctx = StepContext(stage=stage, step=state["steps"].get(name, 0), global_step=state["global_step"],
                                  position=state["positions"].get(name, 0), rng=self.rng, seed=cfg.seed)  # fmt: skip
                if name not in started:
                    started.add(name)
                    with self._private_rng(f"{cfg.seed}-{name}"):
                        ready = self.start_stage(ctx)
                    if ready is False:
                        state["stopped"][name] = "start_stage found nothing to train on"
                        logger.warning("%s %s: nothing to train on; stage skipped", type(self).__name__, name)
                        continue
                if name not in trainers:  # after the restore: loading an adapter replaces its parameters
                    trainers[name] = AdapterTrainer(backend, stage.adapter, stage.trainer)
                    if name in saved_trainers:
                        trainers[name].load_state_dict(saved_trainers[name])
                trainers[name].set_progress(stage_progress(name, planned, state, cfg.time_budget_s, cfg.schedule))
                record = self._step(ctx, trainers[name])
                self._account(state, ctx, record, elapsed0 + self.clock() - clock)
                if state["steps"][name] < planned[name]:
                    why = self.stage_exhausted(name, [r for r in self.history if r.get("stage") == name])
                    if why is not None:  # recorded before the checkpoint, so a resume keeps it ended
                        state["stopped"][name] = why
                        logger.warning("%s %s: ended after %d of %d steps: %s", type(self).__name__, name,
                                       state["steps"][name], planned[name], why)  # fmt: skip
                if out is not None:
                    t0 = self.clock()
                    trained = sorted({by_name[s].adapter for s, n in state["steps"].items() if n > 0})
                    self.checkpoint = save_checkpoint(
                        out / "checkpoints", state["global_step"], backend=backend, adapters=trained,
                        trainers=trainers, state=state, generator=self.rng, keep=cfg.keep_checkpoints,
                        fresh_adapters={stage.adapter}, fresh_trainers={name},
                    )  # fmt: skip
                    self.checkpoint_step = state["global_step"]
                    state["checkpoint_s"] = self.clock() - t0
                bar.update(1)
                loss = record.get("loss/total")  # absent when every group was skipped: no update was made
                bar.set_postfix(stage=name, loss="skipped" if loss is None else f"{loss:.4f}")
                t0 = self.clock()
                hook_stopped = self._evaluate(student, valset, ctx, planned, state)
                clock += self.clock() - t0  # evaluating is not training: the time budget does not pay for it
                if hook_stopped:
                    return True
            return False
        finally:
            bar.close()

    def _evaluate(self, student: Any, valset: Sequence[Any] | None, ctx: StepContext, planned: dict[str, int],
                  state: dict[str, Any]) -> bool:  # fmt: skip
        """Runs the evaluation hook when it is due after this step; whether it stops training (recorded in
        ``state["stopped"]`` for every unfinished stage)."""
        name, global_step = ctx.stage.name, state["global_step"]
        stage_done = state["steps"][name] >= planned[name]
        if self.eval_hook is None or not eval_due(global_step, self.eval_every, stage_done):
            return False
        point = EvalPoint(student=student, valset=valset, stage=name, step=state["steps"][name],
                          global_step=global_step, stage_done=stage_done)  # fmt: skip
        with self._private_rng(f"{self.config.seed}-eval-{global_step}"):
            stop = bool(self.eval_hook(point))
        stop = distributed.broadcast_object(stop)  # several processes: the main one's hook decides for all
        if stop:
            for stage, steps in planned.items():
                if state["steps"].get(stage, 0) < steps:
                    state["stopped"].setdefault(stage, f"the evaluation hook stopped training at global step "
                                                       f"{global_step}")  # fmt: skip
            logger.info("%s: the evaluation hook stopped training at global step %d", type(self).__name__,
                        global_step)  # fmt: skip
        return stop

    def _account(self, state: dict[str, Any], ctx: StepContext, record: dict[str, Any], elapsed: float) -> None:
        """Moves the loop state past the step (its cost includes the last checkpoint's write) and logs the record."""
        name = ctx.stage.name
        state["steps"][name], state["positions"][name] = ctx.step + 1, ctx.position
        state["global_step"] += 1
        seconds, count = state["costs"].get(name, [0.0, 0])
        state["costs"][name] = [seconds + record["time/step"] + state["checkpoint_s"], count + 1]
        state["elapsed_s"] = record["elapsed_s"] = elapsed
        self._log(Path(self.config.output_dir) if self.config.output_dir else None, record)

    def _step(self, ctx: StepContext, trainer: AdapterTrainer) -> dict[str, Any]:
        """One step's five phases, in order, each timed: collect -> generate -> execute -> score -> update."""
        times = {}
        t0 = self.clock()
        batch = self.collect(ctx)
        times["collect"] = self.clock()
        rollouts = self.generate(ctx, batch)
        times["generate"] = self.clock()
        executed = self.execute(ctx, rollouts)
        times["execute"] = self.clock()
        samples, metrics = self.score(ctx, executed)
        times["score"] = self.clock()
        metrics = {**metrics, **self.update(ctx, samples, trainer)}
        times["update"] = self.clock()
        record: dict[str, Any] = {"stage": ctx.stage.name, "adapter": ctx.stage.adapter, "step": ctx.step + 1,
                                  "global_step": ctx.global_step + 1}  # fmt: skip
        previous = t0
        for phase in PHASES:
            record[f"time/{phase}"] = times[phase] - previous
            previous = times[phase]
        record["time/step"] = previous - t0
        record.update({k: float(v) for k, v in metrics.items()})
        if self._transport is not None:  # served / vLLM rollouts: requests, retries, adapter pushes so far
            record.update(self._transport())
        return record

    # ------------------------------------------------------------------ state, logging, output
    def _start(self, out: Path | None, backend: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """The loop state and saved trainer states: from the last checkpoint on resume, else fresh (and seeded)."""
        fresh = {"global_step": 0, "steps": {}, "positions": {}, "costs": {}, "elapsed_s": 0.0, "checkpoint_s": 0.0,
                 "allotments": {}, "stopped": {}}  # fmt: skip
        checkpoint = load_checkpoint(out / "checkpoints") if self.config.resume and out is not None else None
        if checkpoint is not None:
            checkpoint.restore(backend, self.rng)
            state = {**fresh, **checkpoint.state}
            self.checkpoint, self.checkpoint_step = checkpoint.path, state["global_step"]
            MetricsLog(out / "metrics.jsonl").truncate(state["global_step"])
            logger.info("%s: resumed at global step %d (%s)", type(self).__name__, state["global_step"], state["steps"])
            return state, checkpoint.trainers
        if self.config.resume:
            logger.info("%s: no checkpoint in %s; starting afresh", type(self).__name__, out)
        if out is not None:
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
            MetricsLog(out / "metrics.jsonl").clear()
        seed_everything(self.config.seed)
        return fresh, {}

    def _log(self, out: Path | None, record: dict[str, Any]) -> None:
        self.history.append(record)
        logger.debug("%s %s step %d: %s", type(self).__name__, record["stage"], record["step"], record)
        if out is not None:
            try:
                MetricsLog(out / "metrics.jsonl").append(record)
            except OSError as exc:
                kept = f"the checkpoint {self.checkpoint} is intact" if self.checkpoint else "no checkpoint was written"
                raise TrainingWriteError(
                    f"could not write {out / 'metrics.jsonl'} ({exc}); {kept}: free space (or fix the folder), then "
                    "resume the run (rolecall compile ... --resume, or resume=True)"
                ) from exc

    def summary_extra(self) -> dict[str, Any]:
        """What an optimizer adds to ``summary.json`` (none by default)."""
        return {}

    def _finish(self, out: Path, backend: Any, stages: list[Stage], state: dict[str, Any]) -> None:
        for adapter in dict.fromkeys(s.adapter for s in stages):
            backend.save_adapter(adapter, out / "adapters" / adapter)
        summary = {"stop_reason": self.stop_reason, "stopped": state["stopped"],
                   "steps": {s.name: state["steps"].get(s.name, 0) for s in stages},
                   "planned": {s.name: s.steps for s in stages}, "global_step": state["global_step"],
                   "elapsed_s": state["elapsed_s"], "time_budget_minutes": self.config.time_budget_minutes,
                   **self.summary_extra()}  # fmt: skip
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        logger.info("%s: %s after %d steps in %.1fs; output in %s", type(self).__name__, self.stop_reason,
                    state["global_step"], state["elapsed_s"], out)  # fmt: skip

    @contextlib.contextmanager
    def _private_rng(self, seed: int | str) -> Iterator[None]:
        """Runs a hook on freshly seeded global RNGs and puts the loop's RNG states back afterwards."""
        saved = rng_state(self.rng)
        seed_everything(seed)
        try:
            yield
        finally:
            set_rng_state(saved, self.rng)
