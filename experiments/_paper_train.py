"""How each method of the paper experiments trains a program: one optimizer per method, built from a row's ``params``
and the run's size, the way ``rolecall compile`` and the benchmarks build them (``rolecall.cli_compile``,
``benchmarks/bench_compile.py``, ``benchmarks/bench_rl_family.py``)."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path
from typing import Any

from _paper_config import Row, Size

MAPGRPO_STEPS = {"plan": 6, "analysis": 8, "rewrite": 2}
"""MAPGRPO / GRPO steps per stage when a row sets none (bench_compile's ladder); the time budget usually ends first."""
MANY_STEPS = 10_000
"""The step cap of budget-limited RL rows: the row's minutes end them."""


def rl_steps(size: Size, default: int = MANY_STEPS) -> int:
    """RL steps for a budget-limited row: the size's cap, else ``default``."""
    return min(default, size.rl_max_steps) if size.rl_max_steps else default


def sft_optimizer(row: Row, size: Size, folder: Path, cls: Any = None) -> Any:
    """SFT(gold) (or ``cls``, an SFT subclass) from the size's SFT budget, as ``rolecall compile`` builds it."""
    from rolecall.cli_compile import sft_from_args

    args = Namespace(
        epochs=row.params.get("epochs", size.sft_epochs),
        max_steps=str(size.sft_max_steps or "") or None,
        learning_rate=row.params.get("learning_rate", 2e-3),
        lr_schedule="linear",
        batch_size=2,
        grad_accum=1,
        budget_minutes=size.sft_minutes,
        threads=size.threads,
    )
    optimizer = sft_from_args(args, folder, show_progress=False, cls=cls)
    if cls is not None and "task_weights" in row.params:
        optimizer.task_weights.update({k: float(v) for k, v in row.params["task_weights"].items()})
    return optimizer


def make_optimizer(row: Row, size: Size, folder: Path, seed: int) -> Any:
    """The optimizer ``row.method`` trains with, writing under ``folder`` (no model loads here).

    Raises:
        ValueError: the method has no optimizer (prompt-only, eval) or a param is invalid.
    """
    p, threads = row.params, size.threads
    if row.method == "sft":
        return sft_optimizer(row, size, folder)
    if row.method == "multitask_sft":
        from rolecall.optimizers.multitask_sft import MultiTaskSFT

        return sft_optimizer(row, size, folder, cls=MultiTaskSFT)
    if row.method in ("mapgrpo", "grpo"):
        from rolecall.optimizers import MAPGRPO, JointGRPO, MAPGRPOConfig

        steps = {k: int(v) for k, v in p.get("steps", MAPGRPO_STEPS).items()}
        if size.rl_max_steps:
            steps = {k: min(v, size.rl_max_steps) for k, v in steps.items()}
        config = MAPGRPOConfig(
            stages=tuple(steps),
            steps=steps,
            group_size=size.group_size,
            inputs_per_step=int(p.get("inputs_per_step", 4)),
            time_budget_s=size.rl_minutes * 60,
            expert_gradient=bool(p.get("expert_gradient", False)),
            num_threads=threads,
            output_dir=folder,
            seed=seed,
            show_progress=False,
        )
        return MAPGRPO(config) if row.method == "mapgrpo" else JointGRPO(config)
    if row.method == "search_r1_grpo":
        from rolecall.optimizers import SearchR1GRPO

        return SearchR1GRPO(
            group_size=size.group_size,
            steps=rl_steps(size, int(p.get("steps", MANY_STEPS))),
            time_budget_s=size.rl_minutes * 60,
            num_threads=threads,
            output_dir=folder,
            seed=seed,
            show_progress=False,
        )
    if row.method == "splanrl":
        from rolecall.optimizers.splanrl import SPlanRL

        return SPlanRL(
            group_size=size.group_size,
            steps=rl_steps(size, int(p.get("steps", MANY_STEPS))),
            time_budget_minutes=size.rl_minutes,
            cold_start="none",
            use_plan_reward=bool(p.get("use_plan_reward", True)),
            questions_per_step=int(p.get("questions_per_step", 2)),
            num_threads=threads,
            seed=seed,
            output_dir=str(folder),
            show_progress=False,
        )
    if row.method == "opd_teacher":
        from rolecall.optimizers.opd import OPDConfig
        from rolecall.optimizers.opd_teacher import OPDTeacher

        return OPDTeacher(
            OPDConfig(
                group_size=size.group_size,
                teacher_steps=rl_steps(size, int(p.get("steps", MANY_STEPS))),
                teacher_minutes=size.rl_minutes,
                num_threads=threads,
                seed=seed,
                output_dir=str(folder),
                show_progress=False,
            )
        )
    if row.method == "opd":
        from rolecall.optimizers.opd import OPD

        steps = rl_steps(size, int(p.get("steps", MANY_STEPS)))
        return OPD(
            group_size=size.group_size,
            steps=steps,
            teacher_steps=steps,
            time_budget_minutes=size.rl_minutes,
            teacher_minutes=size.rl_minutes,
            train_teacher=not row.teacher,
            outcome_only=bool(p.get("outcome_only", False)),
            num_threads=threads,
            seed=seed,
            output_dir=str(folder),
            show_progress=False,
        )
    if row.method == "stride_ft":
        from rolecall.optimizers import STRIDEFT

        extra = {k: (tuple(v) if k == "legs" else v) for k, v in p.items()}
        return STRIDEFT(
            time_budget_minutes=size.rl_minutes,
            num_threads=threads,
            output_dir=str(folder),
            seed=seed,
            show_progress=False,
            **extra,
        )
    raise ValueError(f"method {row.method!r} does not train")


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
            "learning_rate": row.params.get("learning_rate", 2e-3),
            "lr_schedule": "linear",
            "batch_size": 2,
        }
    elif row.method == "bootstrap_fewshot":
        out = {"max_bootstrapped_demos": row.params.get("max_bootstrapped_demos", 3)}
    else:
        out = {"budget_minutes": size.rl_minutes, "group_size": size.group_size, "max_steps": size.rl_max_steps or None}
    return {**out, **{k: v for k, v in row.params.items() if k not in out}}
