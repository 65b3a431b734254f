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

import copy
import functools
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import dspy
from tqdm.auto import tqdm

from rolecall.data.types import Example
from rolecall.errors import ConfigError
from rolecall.evaluation.metrics import answer_exact_match
from rolecall.optimizers.core import distributed
from rolecall.optimizers.core.base import RunConfig, WeightOptimizer
from rolecall.optimizers.core.config import LORA_LEARNING_RATE, LRSchedule, TrainerConfig
from rolecall.optimizers.core.metrics_log import MetricsLog
from rolecall.optimizers.core.sample import TrainingSample
from rolecall.optimizers.core.samples import load_samples, samples_from_trajectory, save_samples
from rolecall.optimizers.core.stage import Stage, StepContext
from rolecall.optimizers.gold.runner import gold_trajectories
from rolecall.optimizers.max_steps import check_max_steps, parse_max_steps
from rolecall.optimizers.registry import LiveMapping
from rolecall.programs.core.calls import is_local_lm
from rolecall.programs.core.demos import check_adapter_groups
from rolecall.programs.core.gold import format_pair
from rolecall.programs.core.options import option
from rolecall.programs.core.parallel import parallel_map
from rolecall.programs.core.program import Program
from rolecall.programs.core.trajectory import Trajectory
from rolecall.programs.registry import get_program_class, gold_builder, gold_programs

__all__ = [
    "SFT",
    "SFTConfig",
    "GOLD_BUILDERS",
    "check_max_steps",
    "parse_max_steps",
    "rerender",
    "trainable_examples",
    "untrain",
]

logger = logging.getLogger(__name__)


GOLD_BUILDERS: Mapping[type, Callable[..., Any]] = LiveMapping(
    lambda: {(cls := get_program_class(name)): gold_builder(cls) for name in gold_programs()}
)
"""Program class -> its gold-path override builder ``builder(example, corpus=None) -> override``."""


@dataclass(kw_only=True)
class SFTConfig(RunConfig):
    """Settings of :class:`SFT` (validated on construction)."""

    source: Literal["gold", "self"] = "gold"
    """``gold``: targets from the gold decomposition; ``self``: the program's own (or a teacher's) trajectories that
    pass the metric (rejection sampling)."""
    epochs: float = option(2.0, low=0.01)
    """Passes over each adapter's samples (fractions allowed)."""
    max_steps: int | dict[str, int] | None = None
    """At most this many optimizer steps per adapter, or a mapping adapter -> its cap (adapters not in it are
    uncapped); None: as many as ``epochs`` take."""
    learning_rate: float = option(LORA_LEARNING_RATE, low=1e-7, high=1.0)
    """AdamW learning rate. 2e-3 for the default LoRA (r=8, alpha=32, top half of the layers) on a 135M model: on
    OPERA's analysis role, 3e-4 left every held-out call unparsed after 7 steps, 1e-3 parsed all of them after 8, and
    2e-3 reached 44% exact completions after 24 steps (``benchmarks/bench_compile.py`` budgets ~15 minutes)."""
    lr_schedule: LRSchedule = "linear"
    """``linear``: the learning rate falls to 0 over each adapter's planned steps, or over the time budget when that
    runs out first (see ``TrainerConfig.lr_schedule``); ``constant`` keeps ``learning_rate``. On OPERA's plan role
    (180 two-sample steps at 2e-3) linear decay got 75% of 60 held-out plans exactly right, constant 58%; end to end
    (``benchmarks/bench_compile.py``, 15 minutes, 200 test questions) OPERA reached 0.410 EM against 0.300."""
    micro_batch_size: int = option(2, low=1)
    """Samples per forward/backward pass. On 2 CPU cores the budget, not the data, runs out, and small steps learn
    more per second: ``benchmarks/bench_sft_batch.py`` (OPERA's analysis role, ~205 s each, one process) got 22% /
    44% / 34% of 32 held-out answers right at 8 / 4 / 2 samples a step; single runs gave 28% / 38% / 56%, and on
    the plan role 38% (8) against 53% (2) whole plans right. Between 2 and 4 the runs disagree within their noise."""
    gradient_accumulation_steps: int = option(1, low=1)
    """Micro-batches per optimizer step (2 samples a step by default)."""
    roles: tuple[str, ...] | None = None
    """Train only these roles' adapters (None: every role that has samples)."""
    multitask: bool = False
    """Merge every trained role into one adapter named ``multitask`` (REAP's multi-task SFT): the program's roles are
    rebound to it before collection."""
    demo_free: bool = True
    """Train on prompts without demos, so the compiled roles run without them."""
    tries: int = option(2, low=1)
    """``self``: sampled runs per training question."""
    temperature: float = option(0.7, low=0.0, high=2.0)
    """``self``: sampling temperature of those runs."""
    threshold: float = option(1.0, low=0.0, high=1.0)
    """``self``: keep a run's role calls when the metric reaches this."""

    def __post_init__(self) -> None:
        super().__post_init__()
        caps = self.max_steps.values() if isinstance(self.max_steps, dict) else [self.max_steps]
        if any(c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1) for c in caps):
            raise ConfigError(f"SFT max_steps must be an int >= 1, a mapping adapter -> int >= 1, or None; got "
                              f"{self.max_steps!r}")  # fmt: skip


class SFT(WeightOptimizer[list[TrainingSample], list[TrainingSample], list[TrainingSample]]):
    """Supervised fine-tuning of a rolecall program's role adapters (see the module docstring).

    One stage per adapter (or adapter group), interleaved so a time budget that runs out stops every adapter at the
    same fraction of its steps; checkpoints, resume and ``metrics.jsonl`` come from :class:`WeightOptimizer`.

    Args:
        config: the settings; keyword arguments build one instead (``SFT(epochs=3)``).
        metric: ``metric(example, prediction) -> float`` for ``source="self"`` (default: exact match).
        teacher: ``source="self"`` with a teacher: every role runs on this ``dspy.LM`` during collection (with its
            demos), and the student's adapters learn the teacher's accepted outputs.

    Example:
        >>> program = OPERA(retriever, lm=LocalLM())                                        # doctest: +SKIP
        >>> compiled = program.compile(optimizer=SFT(epochs=2), trainset=world.train)       # doctest: +SKIP
    """

    def __init__(
        self,
        config: SFTConfig | None = None,
        *,
        metric: Callable[..., float] | None = None,
        teacher: dspy.LM | None = None,
        **kw: Any,
    ):
        self.sft_config = SFTConfig.merged(config, kw)
        cfg = self.sft_config
        super().__init__(cfg.loop_config("interleaved"))
        if teacher is not None and cfg.source != "self":
            raise ConfigError("SFT(teacher=...) samples the teacher's trajectories: pass source='self' with it")
        self.metric = metric or answer_exact_match
        self.teacher = teacher
        self.samples: dict[str, list[TrainingSample]] = {}
        self.untrained: list[str] = []  # after compile: the adapters that trained no step (they keep their demos)
        self._demos: dict[str, list[Any]] = {}
        self._trained_before: set[str] = set()

    def trainer_config(self) -> TrainerConfig:
        """The completion-only NLL trainer every stage uses."""
        cfg = self.sft_config
        return TrainerConfig(
            loss="nll",
            learning_rate=cfg.learning_rate,
            lr_schedule=cfg.lr_schedule,
            micro_batch_size=cfg.micro_batch_size,
            gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        )

    # ------------------------------------------------------------------ the weight-optimizer contract
    def stages(self, student: Program, trainset: Sequence[Any]) -> list[Stage]:
        """Collect the samples (before a resume restores any adapter, so a resumed run sees the same ones) and plan
        one stage per adapter: ``epochs * samples / samples_per_step`` steps, at most ``max_steps``.

        Raises:
            ConfigError: the program is not on a ``LocalLM``, has no gold builder (``source="gold"``), the trainset
                holds no rolecall ``Example``, or no sample was collected.
        """
        cfg = self.sft_config
        examples = trainable_examples("SFT", student, trainset, "with gold decompositions")
        if cfg.roles is not None and (unknown := sorted(set(cfg.roles) - set(student.roles))):
            raise ConfigError(
                f"SFT roles={list(cfg.roles)}: {type(student).__name__} has no role {', '.join(map(repr, unknown))}; "
                f"its roles are {list(student.roles)}"
            )
        if cfg.multitask:
            trained_roles = [r for r in student.roles if cfg.roles is None or r in cfg.roles]
            student.adapter_groups = check_adapter_groups({"multitask": trained_roles}, list(student.roles))
            student.bind_role_adapters(student.lm)
        adapters = {a: r for a, r in student.adapter_roles().items() if cfg.roles is None or set(r) & set(cfg.roles)}
        check_max_steps(cfg.max_steps, list(student.adapter_roles()), list(adapters), type(student).__name__)
        self._demos = {role: list(predictor.demos) for role, predictor in student.roles.items()}
        self._trained_before = set(student.demo_free_adapters)  # a warm start's trained adapters stay trained
        self.samples = self._load_samples() if cfg.resume else {}
        if not self.samples:
            self.samples = self._collect_samples(student, examples, set(adapters))
            self._save_samples()
        elif cfg.demo_free:
            for adapter in self.samples:
                student.mark_trained(adapter)
        if not self.samples:
            raise ConfigError(
                f"SFT collected no training sample from {cfg.source!r} targets; check the trainset's gold "
                "decompositions and the roles option"
            )
        logger.info("SFT samples per adapter: %s", {a: len(s) for a, s in self.samples.items()})
        trainer = self.trainer_config()
        stages = []
        for adapter, samples in self.samples.items():
            steps = max(1, round(cfg.epochs * len(samples) / trainer.samples_per_step))
            cap = cfg.max_steps.get(adapter) if isinstance(cfg.max_steps, dict) else cfg.max_steps
            steps = min(steps, cap) if cap is not None else steps
            stages.append(Stage(name=adapter, adapter=adapter, steps=steps, trainer=trainer,
                                roles=tuple(adapters[adapter])))  # fmt: skip
        return stages

    def collect(self, ctx: StepContext) -> list[TrainingSample]:
        """The next ``samples_per_step`` samples of the stage's adapter (reshuffled each epoch)."""
        return ctx.take(self.samples[ctx.stage.adapter], ctx.stage.trainer.samples_per_step)

    def compile(self, student: Program, *, trainset: Sequence[Any], valset: Sequence[Any] | None = None, **kw: Any):
        """Train ``student``'s adapters in place on ``trainset`` (rolecall ``Example`` s) and return it; with an
        ``output_dir``, also write ``sft_config.json`` and the loss curve ``loss.png``."""
        super().compile(student, trainset=trainset, valset=valset, **kw)
        # an adapter the budget (or the evaluation hook) stopped before its first step is not trained: it keeps its
        # demos, as an adapter without targets does
        self.untrained = [a for a in self.samples if not self.steps.get(a) and a not in self._trained_before]
        for adapter in self.untrained:
            logger.warning("SFT: adapter %s trained no step (%s); it keeps its demos", adapter,
                           self.stopped.get(adapter, "no step planned"))  # fmt: skip
            untrain(student, adapter, self._demos)
        if self.sft_config.output_dir is not None and distributed.is_main_process():
            out = Path(self.sft_config.output_dir)
            (out / "sft_config.json").write_text(json.dumps(asdict(self.sft_config), indent=2))
            records = MetricsLog(out / "metrics.jsonl").read() or self.history  # a resumed run's steps before it too
            if records:
                plot_loss(records, out / "loss.png")
        return student

    # ------------------------------------------------------------------ collection
    def _collect_samples(self, program: Program, examples: list[Example], adapters: set[str]) -> dict[str, list]:
        cfg = self.sft_config
        lm = program.lm
        demos = {role: list(predictor.demos) for role, predictor in program.roles.items()}
        trained_before = set(program.demo_free_adapters)  # a warm start's trained adapters stay as they were
        if cfg.source == "gold":
            if cfg.demo_free:
                for adapter in adapters:
                    program.mark_trained(adapter)  # collect on the demo-free prompts the trained roles will see
            trajectories = self._gold_trajectories(program, examples)
        else:
            trajectories = self._self_trajectories(program, examples)  # with demos: the untrained roles need them
            if cfg.demo_free:
                for adapter in adapters:
                    program.mark_trained(adapter)
            trajectories = [rerender(program, t) for t in trajectories]  # the prompts the trained roles will see
        samples: dict[str, list[TrainingSample]] = {}
        for trajectory in trajectories:
            steps = trajectory.steps
            if cfg.source == "gold":  # a call the gold path left to the LM is the untrained model's output: no target
                steps = [step for step in steps if step.meta.get("gold")]
            for sample in samples_from_trajectory(steps, lm, roles=cfg.roles):
                if sample.adapter in adapters:
                    samples.setdefault(sample.adapter, []).append(sample)
        if untargeted := sorted(adapters - set(samples)):
            # no gold target for these adapters (e.g. OPERA's plan on HotpotQA, which has no decomposition): they stay
            # untrained, so they keep their demos; the collection ran them demo-free, so pass ``roles`` to train only
            # the others on the prompts they will see
            targeted = sorted(r for a in samples for r in program.adapter_roles()[a])
            logger.warning(
                "SFT: no %s target for adapter(s) %s; they stay untrained and keep their demos (pass roles=%s to "
                "collect with them)", cfg.source, untargeted, targeted
            )  # fmt: skip
            for adapter in set(untargeted) - trained_before:
                untrain(program, adapter, demos)
        return samples

    def _gold_trajectories(self, program: Program, examples: list[Example]) -> list[Any]:
        builder = gold_builder(type(program))
        if builder is None:
            names = ", ".join(sorted(get_program_class(n).__name__ for n in gold_programs()))
            raise ConfigError(f"SFT(source='gold') has gold-path builders for {names}, not {type(program).__name__}")
        corpus = getattr(program.retriever, "docs", None)  # titles and key sentences for the gold queries
        runs = gold_trajectories(
            program,
            examples,
            override_for=functools.partial(builder, corpus=corpus),
            num_threads=self.sft_config.num_threads,
            show_progress=self.sft_config.show_progress,
        )
        return [pred.trajectory for _, pred in runs]

    def _self_trajectories(self, program: Program, examples: list[Example]) -> list[Any]:
        cfg = self.sft_config
        jobs = [e for e in examples for _ in range(cfg.tries)]
        saved = program.lm_kwargs.get("*", {}).copy()
        program.lm_kwargs["*"] = {**saved, "temperature": cfg.temperature}
        bound = {role: p.lm for role, p in program.roles.items()}
        if self.teacher is not None:
            for predictor in program.roles.values():
                predictor.lm = self.teacher
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
            for role, lm in bound.items():
                program.roles[role].lm = lm
        logger.info("SFT(self): kept %d of %d runs", len(kept), len(jobs))
        if not kept:  # before any role is marked trained: the program is left as it was
            raise ConfigError(
                f"SFT collected no training sample; no run reached threshold={cfg.threshold}: lower it, add tries, "
                "or pass a teacher"
            )
        return kept

    def _samples_path(self) -> Path | None:
        return Path(self.sft_config.output_dir) / "samples.jsonl" if self.sft_config.output_dir else None

    def _save_samples(self) -> None:
        if (path := self._samples_path()) is not None and distributed.is_main_process():
            save_samples(path, self.samples)

    def _load_samples(self) -> dict[str, list[TrainingSample]]:
        path = self._samples_path()
        out = load_samples(path) if path is not None else {}
        if out:
            logger.info("SFT: resumed with the %d samples collected in %s", sum(map(len, out.values())), path)
        return out


def trainable_examples(owner: str, student: Program, trainset: Sequence[Any], needs: str) -> list[Example]:
    """``trainset`` as rolecall ``Example`` s, after checking that ``student`` has LoRA role adapters to train.

    Raises:
        ConfigError: the program is not on a ``LocalLM`` with per-role adapters, or the trainset is empty or holds
            something other than rolecall ``Example`` s (``needs`` says what they must carry).
    """
    if not is_local_lm(student.lm) or not student.per_role_adapters:
        raise ConfigError(f"{owner} trains LoRA adapters: build the program with lm=LocalLM() and per_role_adapters")
    examples = [e for e in trainset if isinstance(e, Example)]
    if len(examples) != len(trainset) or not examples:
        raise ConfigError(f"{owner} needs a non-empty trainset of rolecall.data.Example ({needs})")
    return examples


def untrain(program: Program, adapter: str, demos: dict[str, list[Any]]) -> None:
    """Marks ``adapter`` untrained again: its roles get back their ``demos`` (role -> demos before training)."""
    program.mark_trained(adapter, demo_free=False)
    for role in program.adapter_roles()[adapter]:
        if role in demos:
            program.roles[role].demos = list(demos[role])


def rerender(program: Program, trajectory: Trajectory) -> Trajectory:
    """A copy of ``trajectory`` whose successful role steps carry the messages and completion the roles would get now
    (demo-free, short trained prompts), rebuilt from each step's inputs and parsed outputs."""
    steps = []
    for step in trajectory.steps:
        if step.kind == "role" and step.ok and step.role in program.roles and step.outputs is not None:
            step = copy.copy(step)
            step.messages, step.completion = format_pair(program, step.role, dict(step.inputs), dict(step.outputs))
            step.adapter = program.adapter_name(step.role)
        steps.append(step)
    out = copy.copy(trajectory)
    out.steps = steps
    return out


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
