"""How each method of the paper experiments trains a program: the registered optimizer of the method's name, its
config built from the run's size and the row's ``params`` through the optimizer registry, as ``rolecall compile``
builds it (:mod:`rolecall.optimizers.registry`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rolecall.optimizers.core.config import LORA_LEARNING_RATE

from _paper_config import Row, Size

MAPGRPO_STEPS = {"plan": 6, "analysis": 8, "rewrite": 2}
"""MAPGRPO / GRPO steps per stage when a row sets none (bench_compile's ladder); the time budget usually ends first."""
MANY_STEPS = 10_000
"""The step cap of budget-limited RL rows: the row's minutes end them."""


def rl_steps(size: Size, default: int = MANY_STEPS) -> int:
    """RL steps for a budget-limited row: the size's cap, else ``default``."""
    return min(default, size.rl_max_steps) if size.rl_max_steps else default


def train_fields(row: Row, size: Size, folder: Path, seed: int) -> dict[str, Any]:
    """The config fields a row trains with: the run's size mapped onto the fields its optimizer has (SFT's budget for
    an SFT-style optimizer, the RL budget and group size for the others, step caps), then the row's ``params``."""
    import dataclasses

    from rolecall.optimizers.registry import config_class, optimizer_entry

    entry, p = optimizer_entry(row.method), row.params
    names = {f.name for f in dataclasses.fields(config_class(row.method))}
    fields: dict[str, Any] = {"output_dir": str(folder), "seed": seed, "show_progress": False,
                              "num_threads": size.threads}  # fmt: skip
    if entry.needs == "decomposition" and "epochs" in names:  # SFT-style: the size's SFT budget
        fields.update(epochs=size.sft_epochs, max_steps=size.sft_max_steps or None,
                      time_budget_minutes=size.sft_minutes)  # fmt: skip
    else:
        fields.update({k: v for k, v in (("group_size", size.group_size), ("time_budget_minutes", size.rl_minutes),
                                         ("teacher_minutes", size.rl_minutes)) if k in names})  # fmt: skip
    if "stages" in names:  # MAPGRPO / GRPO: steps per stage, capped by the size
        steps = {k: int(v) for k, v in p.get("steps", MAPGRPO_STEPS).items()}
        if size.rl_max_steps:
            steps = {k: min(v, size.rl_max_steps) for k, v in steps.items()}
        fields.update(stages=tuple(steps), steps=steps)
    elif "steps" in names:  # one number of RL steps (and OPD's Stage I the same)
        fields["steps"] = rl_steps(size, int(p.get("steps", MANY_STEPS)))
        if "teacher_steps" in names:
            fields["teacher_steps"] = fields["steps"]
    elif "teacher_steps" in names:
        fields["teacher_steps"] = rl_steps(size, int(p.get("steps", MANY_STEPS)))
    if row.warm_start:
        fields.update(entry.after_warm_start)
    if "train_teacher" in names and row.method == "opd":
        fields["train_teacher"] = not row.teacher
    fields.update({k: (tuple(v) if isinstance(v, list) else v) for k, v in p.items()
                   if k in names and k not in ("steps", "teacher_steps")})  # fmt: skip
    return fields


def make_optimizer(row: Row, size: Size, folder: Path, seed: int) -> Any:
    """The optimizer ``row.method`` trains with, built through the optimizer registry from :func:`train_fields`,
    writing under ``folder`` (no model loads here).

    Raises:
        ValueError: the method has no optimizer (prompt-only, eval) or a param is invalid.
    """
    from rolecall.optimizers.registry import OPTIMIZERS, build_optimizer

    if row.method not in OPTIMIZERS:
        raise ValueError(f"method {row.method!r} does not train")
    optimizer = build_optimizer(row.method, train_fields(row, size, folder, seed))
    if "task_weights" in row.params:
        optimizer.task_weights.update({k: float(v) for k, v in row.params["task_weights"].items()})
    return optimizer


def bootstrap_fewshot(row: Row, program: Any, trainset: list[Any]) -> Any:
    """DSPy's BootstrapFewShot on ``program`` with an EM metric (as bench_compile runs it); returns the new program."""
    import dspy

    from rolecall.evaluation.metrics import answer_exact_match

    demos = int(row.params.get("max_bootstrapped_demos", 3))
    bfs = dspy.teleprompt.BootstrapFewShot(
        metric=answer_exact_match, max_bootstrapped_demos=demos, max_labeled_demos=0, max_rounds=1
    )
    return program.compile(optimizer=bfs, trainset=[e.to_dspy() for e in trainset])


def attach_teacher(lm: Any, teacher_dir: Path) -> str:
    """Load the Teacher row's saved cascaded team into ``lm`` as ``opd_teacher``, the adapter OPD's Stage II reads π_T
    from (``train_teacher=False``). Returns the Teacher's own adapter name."""
    from rolecall.optimizers.opd_teacher import load_teacher

    return load_teacher(lm, teacher_dir)


def steps_of(optimizer: Any) -> dict[str, int]:
    """Optimizer steps per adapter or stage, from its history (the last step number each one logged)."""
    steps: dict[str, int] = {}
    for record in getattr(optimizer, "history", None) or []:
        key = str(record.get("adapter") or record.get("stage") or "all")
        steps[key] = max(steps.get(key, 0), int(record.get("step", steps.get(key, 0) + 1)))
    return steps


def optimizer_settings(row: Row, size: Size) -> dict[str, Any]:
    """The settings a row trains with, for train.json and the report."""
    if row.method in ("sft", "multitask_sft"):
        out = {
            "budget_minutes": size.sft_minutes,
            "epochs": row.params.get("epochs", size.sft_epochs),
            "max_steps": size.sft_max_steps or None,
            "learning_rate": row.params.get("learning_rate", LORA_LEARNING_RATE),
            "lr_schedule": "linear",
            "batch_size": 2,
        }
    elif row.method == "bootstrap_fewshot":
        out = {"max_bootstrapped_demos": row.params.get("max_bootstrapped_demos", 3)}
    else:
        out = {"budget_minutes": size.rl_minutes, "group_size": size.group_size, "max_steps": size.rl_max_steps or None}
    return {**out, **{k: v for k, v in row.params.items() if k not in out}}
