"""The main job (``rolecall demo`` / ``make demo``): OPERA's training ladder on the embedded model, prompt-only ->
SFT -> SFT + MAPGRPO.

Builds the synthetic world, evaluates prompt-only OPERA (built-in demos) on held-out test questions, compiles it with
SFT on gold-path targets for a fixed number of steps per adapter (:data:`DEMO_SFT_STEPS`; each role's adapter trained
demo-free), evaluates it, trains the plan role further with MAPGRPO in issue 55's recipe (:data:`DEMO_RL_RECIPE`: plans
judged against gold instead of executed, c_best with a gradient and outside the baseline, T = 0.8, warm-up and linear
decay, two passes a step) for a fixed number of steps (:data:`DEMO_RL_STEPS`), evaluates it again, judges each rung
against the one before it on the same questions (won / lost, paired interval) and writes everything to
``runs/<timestamp>/``: ``before/``, ``after_sft/`` and ``after/`` (per-question records with trajectories,
summaries), ``sft/`` (samples, ``metrics.jsonl``, ``summary.json``: steps planned and run, checkpoints, ``loss.png``:
the loss curve per adapter), ``mapgrpo/`` (the same), ``training_curve.png`` (the reward per MAPGRPO stage),
``program/`` (the trained program), ``table.md`` (one column per rung) and ``results.json``.
``optimizer="sft"`` stops after SFT (a before/after table); ``optimizer="mapgrpo"`` runs MAPGRPO from the untrained
roles (with off-policy guidance).

The training is bounded by steps, never by the clock: a busy or slower machine takes longer and trains the same
amount, so it gets the same table within noise. :func:`estimate_minutes` says beforehand how long
an idle 2-core machine takes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rolecall.demo_steps import (
    DEMO_COLLECT_QUESTIONS,
    DEMO_RL_GROUP_SIZE,
    DEMO_RL_RECIPE,
    DEMO_RL_STEPS,
    DEMO_SCRATCH_RL_STEPS,
    DEMO_SFT_STEPS,
    EVAL_SECONDS_PER_QUESTION,
    RL_COLLECT_SECONDS,
    RL_STAGES,
    RL_STEP_SECONDS,
    SCRATCH_RL_COLLECT_SECONDS,
    SCRATCH_RL_STEP_SECONDS,
    SFT_ADAPTERS,
    SFT_STEP_SECONDS,
    check_steps,
)
from rolecall.errors import ConfigError
from rolecall.lm.engines import ENGINES

if TYPE_CHECKING:  # the CLI reads DemoConfig's defaults before anything heavy loads
    from rolecall.evaluation.compare import PairedComparison
    from rolecall.optimizers.core.base import WeightOptimizer
    from rolecall.optimizers.core.config import LRSchedule

__all__ = [
    "DemoConfig",
    "demo_optimizer",
    "estimate_minutes",
    "run_demo",
    "comparison_table",
    "ladder_table",
    "paired_line",
    "paired_rungs",
    "plot_training_curve",
]

logger = logging.getLogger(__name__)

CHAINS = ("sft,mapgrpo", "sft", "mapgrpo")
"""The demo's compiles: the ladder, SFT only, MAPGRPO from the untrained roles."""

TABLE_METRICS = (
    ("em", "EM"),
    ("f1", "F1"),
    ("cover_em", "cover-EM"),
    ("success_rate", "success rate"),
    ("retrieval_recall", "gold-passage recall"),
    ("steps", "steps / question"),
    ("lm_calls", "LM calls / question"),
    ("prompt_tokens_per_call", "prompt tokens / LM call"),
    ("latency_s", "latency s / question"),
)


@dataclass(kw_only=True)
class DemoConfig:
    """Settings of the demo (each has a ``rolecall demo`` flag), checked on construction, before anything loads.

    Raises:
        ConfigError: a value out of range (its field and flag named), an unknown chain, or a steps table naming an
            unknown adapter or a count below 1.
    """

    seed: int = 0
    """Seed of the synthetic world and of training."""
    eval_questions: int = 24
    """Held-out test questions evaluated before and after each rung (24: the whole ladder fits 30 minutes on 2
    cores)."""
    optimizer: str = "sft,mapgrpo"
    """``sft,mapgrpo`` (the ladder: SFT, then MAPGRPO), ``sft`` (gold-path SFT only) or ``mapgrpo`` (MAPGRPO from the
    untrained roles, with off-policy guidance)."""
    train_questions: int = 400
    """Training questions SFT collects its gold-path samples from."""
    sft_steps: dict[str, int] | None = None
    """SFT optimizer steps per adapter; adapters it does not name keep :data:`DEMO_SFT_STEPS`."""
    rl_steps: dict[str, int] | None = None
    """MAPGRPO optimizer steps per stage; stages it does not name keep :data:`DEMO_RL_STEPS` (after SFT) or
    :data:`DEMO_SCRATCH_RL_STEPS` (from the untrained roles)."""
    lr_schedule: LRSchedule = "constant"
    """SFT's learning-rate schedule. ``constant`` here, unlike SFT's default ``linear``: when the demo's SFT stopped
    the plan adapter near 85 steps, decaying the rate over so few left the plans unlearned (EM 8.3 -> 8.3 with
    ``linear``; 8.3 -> 25.0 at a constant rate). Over ~180 plan steps ``linear`` is the better one: 0.410 against
    0.300 EM in ``benchmarks/bench_compile.py``."""
    group_size: int = DEMO_RL_GROUP_SIZE
    """G of MAPGRPO (including c_best): 5, as issue 55's recipe was measured."""
    threads: int = 24
    """Concurrent questions (their LM calls are batched together)."""
    out: Path | None = None
    """Run directory; default ``runs/<timestamp>``."""
    model: str | None = None
    """LM name or path; default the embedded SmolLM2-135M-Instruct."""
    engine: str = "auto"
    """Where the evaluations and MAPGRPO's rollouts generate: ``auto``, ``local`` or ``vllm``
    (:mod:`rolecall.lm.engines`); the updates run in torch either way."""
    show_progress: bool = True
    """Progress bars."""

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ConfigError(f"engine (--engine) must be one of {list(ENGINES)}; got {self.engine!r}")
        if self.optimizer not in CHAINS:
            raise ConfigError(f"optimizer (--optimizer) must be one of {list(CHAINS)}; got {self.optimizer!r}")
        baseline = " (a MAPGRPO group needs c_best and a sample for its baseline)"
        for name, low, why in (("eval_questions", 1, ""), ("train_questions", 1, ""), ("threads", 1, ""),
                               ("group_size", 2, baseline)):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                label = name if name == "train_questions" else f"{name} (--{name.replace('_', '-')})"  # no flag
                raise ConfigError(f"{label} must be an integer >= {low}{why}; got {value!r}")
        check_steps("sft_steps", self.sft_steps, SFT_ADAPTERS)
        check_steps("rl_steps", self.rl_steps, RL_STAGES)

    @property
    def chain(self) -> list[str]:
        """The compiles in order: ``["sft", "mapgrpo"]``, ``["sft"]`` or ``["mapgrpo"]``."""
        return self.optimizer.split(",")

    @property
    def planned_sft_steps(self) -> dict[str, int]:
        """SFT steps per adapter: :data:`DEMO_SFT_STEPS` with ``sft_steps`` over it."""
        return {**DEMO_SFT_STEPS, **(self.sft_steps or {})}

    @property
    def planned_rl_steps(self) -> dict[str, int]:
        """MAPGRPO steps per stage: the demo's (after SFT, or from the untrained roles) with ``rl_steps`` over it."""
        base = DEMO_SCRATCH_RL_STEPS if self.chain[0] == "mapgrpo" else DEMO_RL_STEPS
        return {**base, **(self.rl_steps or {})}


def estimate_minutes(config: DemoConfig) -> float:
    """Minutes the demo takes alone on an idle 2-core machine with the embedded model: the measured step costs
    (``SFT_STEP_SECONDS``, ``RL_STEP_SECONDS`` and each MAPGRPO stage's input collection in :mod:`rolecall.demo_steps`,
    or their demo-prompt counterparts from the untrained roles) times the planned steps, plus the evaluations
    (``EVAL_SECONDS_PER_QUESTION``). A busy or slower machine takes longer for the same steps.

    Example:
        >>> round(estimate_minutes(DemoConfig()))  # the default ladder
        24
    """
    seconds = (len(config.chain) + 1) * config.eval_questions * EVAL_SECONDS_PER_QUESTION
    if "sft" in config.chain:
        seconds += sum(SFT_STEP_SECONDS[a] * n for a, n in config.planned_sft_steps.items())
    if "mapgrpo" in config.chain:
        scratch = config.chain[0] == "mapgrpo"
        costs = SCRATCH_RL_STEP_SECONDS if scratch else RL_STEP_SECONDS
        collect = SCRATCH_RL_COLLECT_SECONDS if scratch else RL_COLLECT_SECONDS
        seconds += sum(costs[s] * n + (collect if scratch or s != "plan" else 0.0)
                       for s, n in config.planned_rl_steps.items())  # fmt: skip
    return seconds / 60.0


def demo_optimizer(name: str, config: DemoConfig, out: Path, *, warm: bool) -> WeightOptimizer:
    """The optimizer of one rung of the demo's ladder, bounded by steps and never by the clock (no time budget).

    Args:
        name: ``"sft"`` or ``"mapgrpo"``.
        config: the demo's settings (their steps per adapter / stage).
        out: the run directory; the optimizer writes under ``out / name``.
        warm: MAPGRPO on SFT's roles, in issue 55's recipe (:data:`DEMO_RL_RECIPE`, the stages ``rl_steps`` names;
            the recipe's settings that concern one stage, such as the plan reward, touch only that stage); False runs
            it from the untrained roles with off-policy guidance and the library's other defaults.

    Returns:
        An :class:`~rolecall.optimizers.SFT` or :class:`~rolecall.optimizers.MAPGRPO`.
    """
    if name == "sft":
        from rolecall.optimizers.sft import SFT

        return SFT(
            epochs=20.0,  # the steps come from max_steps
            max_steps=config.planned_sft_steps,
            lr_schedule=config.lr_schedule,
            output_dir=str(out / "sft"),
            seed=config.seed,
            num_threads=config.threads,
            show_progress=config.show_progress,
        )
    from rolecall.optimizers import MAPGRPO, MAPGRPOConfig
    from rolecall.tuning.config_file import apply_fields

    rl = MAPGRPOConfig(  # its stages: the roles the steps name, in the paper's order (MAPGRPOConfig.stage_order)
        group_size=config.group_size,
        steps=config.planned_rl_steps,
        collect_questions=DEMO_COLLECT_QUESTIONS,
        stage_patience=0,  # the demo's work is its fixed steps: no stage ends early (docs/demo.md's timings)
        expert_gradient=True,  # off-policy guidance, from the untrained roles as in the recipe
        output_dir=out / "mapgrpo",
        seed=config.seed,
        num_threads=config.threads,
        show_progress=config.show_progress,
    )
    return MAPGRPO(apply_fields(rl, DEMO_RL_RECIPE) if warm else rl)


def _summary_dict(result: Any) -> dict[str, Any]:
    summary = result.summary
    out = summary.to_dict() if hasattr(summary, "to_dict") else dict(summary)
    if out.get("lm_calls"):
        out["prompt_tokens_per_call"] = out.get("prompt_tokens", 0.0) / out["lm_calls"]
    return out


def comparison_table(before: dict[str, Any], after: dict[str, Any], method: str = "SFT") -> str:
    """A markdown table of the headline metrics before and after training with ``method``."""
    lines = [f"| metric | prompt-only OPERA | {method} OPERA | change |", "|---|---:|---:|---:|"]
    for key, label in TABLE_METRICS:
        if before.get(key) is None or after.get(key) is None:
            continue
        b, a = float(before[key]), float(after[key])
        scale = 100.0 if key in ("em", "f1", "cover_em", "success_rate", "retrieval_recall") else 1.0
        lines.append(f"| {label} | {b * scale:.1f} | {a * scale:.1f} | {(a - b) * scale:+.1f} |")
    return "\n".join(lines)


def _method_name(chain: list[str]) -> str:
    """``["sft"]`` -> ``SFT``; ``["sft", "mapgrpo"]`` -> ``SFT + MAPGRPO``; MAPGRPO from untrained roles runs with
    off-policy guidance (c_best gets a gradient), and says so."""
    if chain == ["mapgrpo"]:
        return "MAPGRPO + off-policy guidance"
    return " + ".join(name.upper() for name in chain)


def ladder_table(columns: list[tuple[str, dict[str, Any]]]) -> str:
    """A markdown table of the headline metrics of each ``(name, summary)`` column, with the last one's change over
    the first.

    Example:
        >>> print(ladder_table([("a", {"em": 0.1}), ("b", {"em": 0.3}), ("c", {"em": 0.4})]))
        | metric | a | b | c | change |
        |---|---:|---:|---:|---:|
        | EM | 10.0 | 30.0 | 40.0 | +30.0 |
    """
    names = [name for name, _ in columns]
    lines = ["| metric | " + " | ".join(names) + " | change |", "|---|" + "---:|" * (len(names) + 1)]
    for key, label in TABLE_METRICS:
        values = [summary.get(key) for _, summary in columns]
        if any(v is None for v in values):
            continue
        scale = 100.0 if key in ("em", "f1", "cover_em", "success_rate", "retrieval_recall") else 1.0
        cells = " | ".join(f"{float(v) * scale:.1f}" for v in values)
        lines.append(f"| {label} | {cells} | {(float(values[-1]) - float(values[0])) * scale:+.1f} |")
    return "\n".join(lines)


def plot_training_curve(log_path: Path, png_path: Path) -> bool:
    """Plot mean group reward per step, one panel per stage, from a MAPGRPO ``metrics.jsonl``; False if empty."""
    if not log_path.is_file():
        return False
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    if not records:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    stages = list(dict.fromkeys(r["stage"] for r in records))
    fig, axes = plt.subplots(1, len(stages), figsize=(4.2 * len(stages), 3.4), squeeze=False)
    for ax, stage in zip(axes[0], stages, strict=True):
        rows = [r for r in records if r["stage"] == stage]
        steps = [r["step"] for r in rows]
        ax.plot(steps, [r["reward/mean"] for r in rows], marker="o", label="policy samples (mean)")
        ax.plot(steps, [r.get("reward/expert", 0.0) for r in rows], linestyle="--", marker="s", label="c_best (expert)")
        ax.plot(steps, [r.get("parse/rate", 0.0) for r in rows], linestyle=":", marker="x", label="parse rate")
        ax.set_title(f"stage: {stage}")
        ax.set_xlabel("optimizer step")
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
        distinct = sorted(set(steps))
        if len(distinct) <= 12:  # every step a tick: the auto locator puts fractional ticks around a single step
            ax.set_xticks(distinct)
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("reward")
    handles, labels = axes[0][0].get_legend_handles_labels()
    # one legend under the panels, where it cannot hide a point
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.suptitle("MAPGRPO training: reward per stage")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return True


def run_demo(config: DemoConfig) -> dict[str, Any]:
    """Run the whole demo and return its results (also written to the run directory).

    Each rung trains its planned steps whatever the machine's speed; ``results["training"]`` holds, per rung, the
    steps planned and run per stage and why a stage stopped early (for example MAPGRPO finding no inputs for one).
    """
    import dspy

    from rolecall.data.synthetic import synthetic_world
    from rolecall.evaluation import evaluate
    from rolecall.lm.engines import make_lm
    from rolecall.optimizers.core.checkpoint import seed_everything
    from rolecall.programs import OPERA
    from rolecall.retrievers.bm25 import BM25

    out = config.out or Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    world = synthetic_world(seed=config.seed)
    held_out = world.test[: config.eval_questions]
    lm = make_lm(config.model, engine=config.engine)
    seed_everything(config.seed)  # the adapters' LoRA A matrices: the same demo trains the same weights
    program = OPERA(BM25(world.corpus), lm=lm)
    started = time.perf_counter()
    chain = config.chain
    with dspy.context(lm=lm):
        before = evaluate(
            program, held_out, num_threads=config.threads, output_dir=out / "before", show_progress=config.show_progress
        )
        columns: list[tuple[str, dict[str, Any]]] = [("prompt-only OPERA", _summary_dict(before))]
        folders = [out / "before"]
        history: list[dict[str, Any]] = []
        training: dict[str, dict[str, Any]] = {}
        train_seconds = 0.0
        for position, name in enumerate(chain):
            optimizer = demo_optimizer(name, config, out, warm=position > 0)
            trainset = world.train[: config.train_questions] if name == "sft" else world.train
            t0 = time.perf_counter()
            program = program.compile(optimizer=optimizer, trainset=trainset)
            train_seconds += time.perf_counter() - t0
            history += [dict(r, optimizer=name) for r in optimizer.history]
            training[name] = _training_summary(out / name)
            for stage, reason in training[name].get("stopped", {}).items():
                logger.warning("demo %s %s: stopped early: %s", name, stage, reason)
            last = position == len(chain) - 1
            after = evaluate(program, held_out, num_threads=config.threads,
                             output_dir=out / ("after" if last else f"after_{name}"),
                             show_progress=config.show_progress)  # fmt: skip
            columns.append((f"{_method_name(chain[: position + 1])} OPERA", _summary_dict(after)))
            folders.append(out / ("after" if last else f"after_{name}"))
    program.save(out / "program")
    b, a = _summary_dict(before), _summary_dict(after)
    if len(chain) == 1:
        table = comparison_table(b, a, columns[-1][0].removesuffix(" OPERA"))
    else:
        table = ladder_table(columns)
    paired = paired_rungs([name for name, _ in columns], folders)
    table += "\n\n" + "\n".join(paired_line(c) for c in paired)
    (out / "table.md").write_text(table + "\n", encoding="utf-8")
    curve = out / "sft" / "loss.png"
    plotted = "sft" in chain and curve.is_file()
    if "mapgrpo" in chain:
        curve = out / "training_curve.png"
        plotted = plot_training_curve(out / "mapgrpo" / "metrics.jsonl", curve)
    results = {
        "run_dir": str(out),
        "questions": len(held_out),
        "before": b,
        "after": a,
        "train_seconds": train_seconds,
        "total_seconds": time.perf_counter() - started,
        "estimate_minutes": estimate_minutes(config),
        "training": training,
        "columns": [{"name": name, "summary": summary} for name, summary in columns],
        "paired": [c.to_dict() for c in paired],
        "train_log": history,
        "training_curve": str(curve) if plotted else None,
        "loss_curve": str(out / "sft" / "loss.png") if (out / "sft" / "loss.png").is_file() else None,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(config).items()},
    }
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    results["table"] = table
    return results


def paired_rungs(names: list[str], folders: list[Path]) -> list[PairedComparison]:
    """Each rung judged against the rung before it on the same held-out questions (:mod:`rolecall.evaluation.compare`:
    won / lost, paired bootstrap interval, McNemar's exact p)."""
    from rolecall.evaluation.compare import compare_runs

    judged = []
    for i in range(1, len(folders)):
        c = compare_runs(folders[i - 1], folders[i])
        judged.append(dataclasses.replace(c, name_a=names[i - 1], name_b=names[i]))
    return judged


def paired_line(c: PairedComparison) -> str:
    """One line under the table: ``B vs A: won W, lost L, tied T; EM +d (paired 95% CI lo .. hi), McNemar p``.

    Example:
        >>> from rolecall.evaluation.compare import paired_comparison
        >>> c = paired_comparison({"a": 0.0, "b": 1.0}, {"a": 1.0, "b": 1.0}, names=("SFT", "SFT + MAPGRPO"))
        >>> paired_line(c)[:60]
        'SFT + MAPGRPO vs SFT on 2 questions: won 1, lost 0, tied 1; '
    """
    return (
        f"{c.name_b} vs {c.name_a} on {c.n} questions: won {c.won}, lost {c.lost}, tied {c.tied}; "
        f"EM {100 * c.em_diff:+.1f} (paired 95% CI {100 * c.ci_low:+.1f} .. {100 * c.ci_high:+.1f}), "
        f"McNemar p = {c.p_value:.3g}"
    )


def _training_summary(folder: Path) -> dict[str, Any]:
    """A rung's ``summary.json`` (steps planned and run per stage, ``stopped``: why a stage ended early)."""
    path = folder / "summary.json"
    if not path.is_file():
        return {}
    summary = json.loads(path.read_text(encoding="utf-8"))
    return {k: summary[k] for k in ("planned", "steps", "stopped", "stop_reason") if k in summary}
