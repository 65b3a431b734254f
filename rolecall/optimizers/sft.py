"""SFT: supervised fine-tuning of each role's (or adapter group's) LoRA adapter on the program's own prompts.

    D_gold = {(m_r, y_r*)}: run the program along the gold path (rolecall.programs.core.gold), every role's output
             replaced by y_r* built from the gold decomposition, so each prompt m_r is what role r sees at inference
    L(θ_a) = - 1/|T| Σ_{(m, y) ∈ D_a} Σ_t log π_{θ_a}(y_t | m, y_<t)     (completion-only NLL, per adapter a)

With ``source="self"`` the pairs are the program's own sampled role calls from trajectories whose metric reaches
``threshold`` (rejection sampling, as DSPy's BootstrapFinetune and STRIDE-FT's SFT leg do). Roles train without
demos by default (``demo_free=True``): the adapter learns the output format, and the compiled program's prompts drop
their demos (the demo policy ``"until_trained"``).
"""

from __future__ import annotations

import functools
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import dspy
from tqdm.auto import tqdm

from rolecall.data.types import Example
from rolecall.errors import ConfigError
from rolecall.evaluation.metrics import exact_match
from rolecall.optimizers.core.config import TrainerConfig
from rolecall.optimizers.core.sample import TrainingSample
from rolecall.optimizers.core.samples import samples_from_trajectory
from rolecall.optimizers.core.trainer import AdapterTrainer
from rolecall.optimizers.gold import d2plan_gold, opera_gold, reap_gold, stride_gold, team_gold
from rolecall.optimizers.gold.runner import gold_trajectories
from rolecall.programs.core.calls import is_local_lm
from rolecall.programs.core.options import ProgramOptions, option
from rolecall.programs.core.parallel import parallel_map
from rolecall.programs.core.program import Program
from rolecall.programs.d2plan.program import D2Plan
from rolecall.programs.opera.program import OPERA
from rolecall.programs.reap.program import REAP
from rolecall.programs.stride.program import STRIDE
from rolecall.programs.team.program import CascadedTeam, HierarchicalTeam

__all__ = ["SFT", "SFTConfig", "GOLD_BUILDERS"]

logger = logging.getLogger(__name__)

GOLD_BUILDERS: dict[type, Callable[..., Any]] = {
    OPERA: opera_gold,
    REAP: reap_gold,
    CascadedTeam: team_gold,
    HierarchicalTeam: team_gold,
    D2Plan: d2plan_gold,
    STRIDE: stride_gold,
}
"""Program class -> its gold-path override builder ``builder(example, corpus=None) -> override``."""


@dataclass(kw_only=True)
class SFTConfig(ProgramOptions):
    """Settings of :class:`SFT` (validated on construction)."""

    source: Literal["gold", "self"] = "gold"
    """``gold``: targets from the gold decomposition; ``self``: the program's own trajectories that pass the metric."""
    epochs: float = option(2.0, low=0.01)
    """Passes over each adapter's samples (fractions allowed)."""
    max_steps: int | None = None
    """At most this many optimizer steps per adapter (None: as many as ``epochs`` take)."""
    learning_rate: float = option(3e-4, low=1e-7, high=1.0)
    """AdamW learning rate (LoRA r=16 on a 135M model: 3e-4)."""
    micro_batch_size: int = option(4, low=1)
    """Samples per forward/backward pass."""
    gradient_accumulation_steps: int = option(2, low=1)
    """Micro-batches per optimizer step (8 samples a step by default)."""
    roles: tuple[str, ...] | None = None
    """Train only these roles' adapters (None: every role that has samples)."""
    demo_free: bool = True
    """Train on prompts without demos, so the compiled roles run without them."""
    tries: int = option(2, low=1)
    """``self``: sampled runs per training question."""
    temperature: float = option(0.7, low=0.0, high=2.0)
    """``self``: sampling temperature of those runs."""
    threshold: float = option(1.0, low=0.0, high=1.0)
    """``self``: keep a run's role calls when the metric reaches this."""
    num_threads: int = option(8, low=1)
    """Questions collected concurrently (their LM calls share batches)."""
    time_budget_minutes: float | None = None
    """Stop training when this much wall time has passed since compile started (None: no limit)."""
    seed: int = 0
    """Shuffling of the samples."""
    output_dir: str | None = None
    """Where ``metrics.jsonl`` and ``loss.png`` are written (None: nowhere)."""
    show_progress: bool = True
    """tqdm bars for collection and training."""


class SFT(dspy.teleprompt.Teleprompter):
    """Supervised fine-tuning of a rolecall program's role adapters (see the module docstring).

    Args:
        config: the settings; keyword arguments build one instead (``SFT(epochs=3)``).
        metric: ``metric(example, prediction) -> float`` for ``source="self"`` (default: exact match).

    Example:
        >>> program = OPERA(retriever, lm=LocalLM())                                        # doctest: +SKIP
        >>> compiled = program.compile(optimizer=SFT(epochs=2), trainset=world.train)       # doctest: +SKIP
    """

    def __init__(self, config: SFTConfig | None = None, *, metric: Callable[..., float] | None = None, **kw: Any):
        super().__init__()
        self.config = config if config is not None else SFTConfig.from_kwargs("SFT", kw)
        self.metric = metric or _exact_match
        self.history: list[dict[str, Any]] = []

    def compile(self, student: Program, *, trainset: Sequence[Any], valset: Sequence[Any] | None = None, **_: Any):
        """Train ``student``'s adapters in place on ``trainset`` (rolecall ``Example`` s) and return it.

        Raises:
            ConfigError: the program is not on a ``LocalLM``, has no gold builder (``source="gold"``), or no sample
                was collected.
        """
        cfg = self.config
        lm = student.lm
        if not is_local_lm(lm) or not student.per_role_adapters:
            raise ConfigError("SFT trains LoRA adapters: build the program with lm=LocalLM() and per_role_adapters")
        examples = [e for e in trainset if isinstance(e, Example)]
        if len(examples) != len(trainset) or not examples:
            raise ConfigError("SFT needs a non-empty trainset of rolecall.data.Example (with gold decompositions)")
        started = time.perf_counter()
        adapters = {a: r for a, r in student.adapter_roles().items() if cfg.roles is None or set(r) & set(cfg.roles)}
        if cfg.demo_free:
            for adapter in adapters:
                student.mark_trained(adapter)  # collect on the demo-free prompts the trained roles will see
        trajectories = self._collect(student, examples)
        samples: dict[str, list[TrainingSample]] = {}
        for trajectory in trajectories:
            for sample in samples_from_trajectory(trajectory, lm, roles=cfg.roles):
                if sample.adapter in adapters:
                    samples.setdefault(sample.adapter, []).append(sample)
        if not samples:
            raise ConfigError("SFT collected no training sample; check the trainset's gold decompositions")
        logger.info("SFT: %s", {a: len(s) for a, s in samples.items()})
        self._train(lm, samples, started)
        self._write(started)
        return student

    # ------------------------------------------------------------------ collection
    def _collect(self, program: Program, examples: list[Example]) -> list[Any]:
        cfg = self.config
        if cfg.source == "gold":
            builder = GOLD_BUILDERS.get(type(program))
            if builder is None:
                names = ", ".join(sorted(c.__name__ for c in GOLD_BUILDERS))
                raise ConfigError(
                    f"SFT(source='gold') has gold-path builders for {names}, not {type(program).__name__}"
                )
            corpus = getattr(program.retriever, "docs", None)  # titles and key sentences for the gold queries
            runs = gold_trajectories(
                program,
                examples,
                override_for=functools.partial(builder, corpus=corpus),
                num_threads=cfg.num_threads,
                show_progress=cfg.show_progress,
            )
            return [pred.trajectory for _, pred in runs]
        return self._self_trajectories(program, examples)

    def _self_trajectories(self, program: Program, examples: list[Example]) -> list[Any]:
        cfg = self.config
        jobs = [e for e in examples for _ in range(cfg.tries)]
        saved = program.lm_kwargs.get("*", {}).copy()
        program.lm_kwargs["*"] = {**saved, "temperature": cfg.temperature}
        try:
            bar = tqdm(total=len(jobs), desc="SFT collect", disable=not cfg.show_progress)

            def run(example: Example) -> Any:
                pred = program(question=example.question)
                bar.update(1)
                return pred.trajectory if self.metric(example, pred) >= cfg.threshold else None

            kept = [t for t in parallel_map(run, jobs, max_workers=cfg.num_threads) if t is not None]
            bar.close()
        finally:
            program.lm_kwargs["*"] = saved
        logger.info("SFT(self): kept %d of %d runs", len(kept), len(jobs))
        return kept

    # ------------------------------------------------------------------ training
    def _train(self, lm: Any, samples: dict[str, list[TrainingSample]], started: float) -> None:
        """Round-robin over the adapters, one optimizer step each in turn, so a time budget that runs out stops
        every adapter at a similar point instead of starving the last one."""
        cfg = self.config
        trainer_config = TrainerConfig(
            loss="nll",
            learning_rate=cfg.learning_rate,
            micro_batch_size=cfg.micro_batch_size,
            gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        )
        per_step = trainer_config.samples_per_step
        plans = {}
        for adapter, adapter_samples in samples.items():
            total = max(1, round(cfg.epochs * len(adapter_samples) / per_step))
            plans[adapter] = min(total, cfg.max_steps) if cfg.max_steps is not None else total
        trainers = {a: AdapterTrainer(lm, a, trainer_config) for a in samples}
        queues: dict[str, list[TrainingSample]] = {a: [] for a in samples}
        rng = random.Random(cfg.seed)
        bar = tqdm(total=sum(plans.values()), desc="SFT", disable=not cfg.show_progress)
        for step in range(max(plans.values())):
            for adapter, total in plans.items():
                if step >= total:
                    continue
                if cfg.time_budget_minutes is not None and time.perf_counter() - started > 60 * cfg.time_budget_minutes:
                    logger.warning("SFT: time budget spent after %d rounds of %s steps", step, plans)
                    bar.close()
                    return
                if len(queues[adapter]) < per_step:
                    fresh = list(samples[adapter])
                    rng.shuffle(fresh)
                    queues[adapter] += fresh
                batch, queues[adapter] = queues[adapter][:per_step], queues[adapter][per_step:]
                t0 = time.perf_counter()
                metrics = trainers[adapter].step(batch)
                self.history.append(
                    {"adapter": adapter, "step": step + 1, "seconds": time.perf_counter() - t0, **metrics}
                )
                bar.update(1)
                bar.set_postfix(adapter=adapter, loss=f"{metrics.get('loss/total', float('nan')):.3f}")
        bar.close()

    def _write(self, started: float) -> None:
        if self.config.output_dir is None:
            return
        out = Path(self.config.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        with (out / "metrics.jsonl").open("w") as f:
            for record in self.history:
                f.write(json.dumps(record) + "\n")
        (out / "sft_config.json").write_text(json.dumps(asdict(self.config), indent=2))
        plot_loss(self.history, out / "loss.png")
        logger.info("SFT: %.1f min; metrics in %s", (time.perf_counter() - started) / 60, out)


def plot_loss(history: Sequence[dict[str, Any]], path: Path) -> None:
    """One loss curve per adapter against its optimizer step (matplotlib, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for adapter in dict.fromkeys(r["adapter"] for r in history):
        rows = [r for r in history if r["adapter"] == adapter]
        ax.plot([r["step"] for r in rows], [r.get("loss/total") for r in rows], label=adapter)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("NLL per target token")
    ax.set_title("SFT loss by adapter")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _exact_match(example: Example, prediction: Any) -> float:
    return float(exact_match(str(prediction.answer or ""), list(example.answers)))
