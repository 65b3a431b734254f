"""The demo's amount of work and how long it takes: fixed training steps per OPERA adapter (SFT) and per stage
(MAPGRPO), and the time an idle 2-core machine needs for them (the step costs measured on this project's machine).

The demo trains these steps whatever the machine's speed (no wall-clock budget), so a busy or slower machine takes
longer and gives the same table within noise; :func:`rolecall.demo.estimate_minutes` is printed before it starts.
"""

from __future__ import annotations

from rolecall.errors import ConfigError

__all__ = [
    "DEMO_COLLECT_QUESTIONS",
    "DEMO_RL_GROUP_SIZE",
    "DEMO_RL_RECIPE",
    "DEMO_RL_STEPS",
    "DEMO_SCRATCH_RL_STEPS",
    "DEMO_SFT_STEPS",
    "RL_STAGES",
    "SFT_ADAPTERS",
    "check_steps",
    "parse_steps",
]

SFT_ADAPTERS = ("plan", "analysis", "synthesis", "rewrite")
"""OPERA's adapters, one per role (SFT trains each)."""
RL_STAGES = ("plan", "analysis", "rewrite")
"""MAPGRPO's stages, in training order (``MAPGRPOConfig.stages``)."""

DEMO_SFT_STEPS: dict[str, int] = {"plan": 112, "analysis": 75, "synthesis": 19, "rewrite": 3}
"""SFT optimizer steps per OPERA adapter (2 samples a step): the work the demo's former 7-minute SFT budget fitted alone
on a 2-core machine. That budget stopped every adapter at the same fraction of the caps plan 240 / analysis 160 /
synthesis 40 / rewrite 6 (SFT's interleaved schedule); at :data:`SFT_STEP_SECONDS` those caps take 917 s, so 420 s
reach 0.46 of each, about 7/15: these (~7.2 minutes). Plans and passage reading get the most steps."""
DEMO_RL_STEPS: dict[str, int] = {"plan": 8}
"""MAPGRPO optimizer steps per stage after SFT: the plan stage only, with issue 55's recipe (:data:`DEMO_RL_RECIPE`;
G = 5, 4 inputs a step, two GRPO passes a step). That recipe beat its SFT warm start by +6.0 EM (paired 95% interval
+3.2 .. +9.0) on 500 questions in 52 steps (docs/opera-mapgrpo.md); the demo runs 8 of them, which moves few answers
on its 24 questions and shows the stage, its curve and the paired judgement. The former rung (2 plan steps executing
their plans, 8 analysis and 3 rewrite steps, the paper's Eq. 11) took 10.5 minutes and changed no answer."""
DEMO_RL_RECIPE: dict[str, object] = {
    "plan_logic": "gold",
    "execute_plans": False,
    "expert_gradient": True,
    "expert_in_baseline": False,
    "temperature": 0.8,
    "lr_warmup_steps": 2,
    "lr_schedule": "linear",
    "num_iterations": 2,
    "inputs_per_step": 4,
    "learning_rate": {"plan": 5e-4},
    "plan_weights": {"logic": 0.6, "feasibility": 0.1, "execution": 0.0, "efficiency": 0.1, "placeholder": 0.2},
}
"""The MAPGRPO fields of the demo's rung on SFT's roles, applied over ``MAPGRPOConfig`` as ``--rl-config`` applies
them in the benchmarks (:func:`rolecall.tuning.config_file.apply_fields`: the plan's rate merges into the per-role
rates, the weights into the plan reward's): issue 55's best row (docs/opera-mapgrpo.md, "Where issue 55 ends"). The
plan is judged against the gold decomposition instead of executed downstream (no 40-90 s of plan execution a step;
no execution term in its reward, logic against gold), c_best gets a gradient (off-policy guidance) and stays out of
the group baseline, sampling at T = 0.8, a 2-step warm-up then linear decay, two PPO passes a step, the plan adapter
at 5e-4 (the library default is 2e-4)."""
DEMO_RL_GROUP_SIZE = 5
"""G of the demo's MAPGRPO (c_best and 4 samples), as the recipe was measured."""
DEMO_COLLECT_QUESTIONS = 12
"""Training questions MAPGRPO runs to collect the analysis and rewrite stages' inputs in the demo: the 12 its step
costs and table were measured with (``MAPGRPOConfig.collect_questions`` defaults to 100, whose collection alone would
take the demo past its 30 minutes)."""
DEMO_SCRATCH_RL_STEPS: dict[str, int] = {"plan": 1, "analysis": 1, "rewrite": 1}
"""MAPGRPO steps per stage from the untrained roles (``optimizer="mapgrpo"``): one each. On the demo prompts a step
costs 50-200 s (:data:`SCRATCH_RL_STEP_SECONDS`); the former 7-minute budget fitted one plan step and nothing else."""

SFT_STEP_SECONDS: dict[str, float] = {"plan": 1.55, "analysis": 2.95, "synthesis": 1.55, "rewrite": 1.85}
"""Seconds per SFT step on an idle 2-core machine (embedded model, trained prompts): the latest OPERA SFT(gold) row
of ``benchmarks/results/bench_compile.json`` (``time/step`` 1.4 / 2.8 / 1.4 / 1.7 s) plus the ~0.15 s checkpoint each
step writes (that row's 15.2 training minutes less its summed step times, over its 393 steps)."""
RL_STEP_SECONDS: dict[str, float] = {"plan": 44.0, "analysis": 16.6, "rewrite": 16.9}
"""Seconds per MAPGRPO step on the SFT-trained roles, alone on a 2-core machine. Plan: the recipe's step
(:data:`DEMO_RL_RECIPE`, G = 5, 4 inputs, two passes; 16 s generating, 28 s updating: the 52-step row of
``benchmarks/results/bench_rl_plan_judge.json``). Analysis and rewrite (G = 4, 4 inputs a step, one pass): the rung
with shared sub-goals in ``bench_compile.json``."""
RL_COLLECT_SECONDS = 40.0
"""Seconds the analysis or rewrite stage spends collecting its inputs on the trained roles (12 questions run through
the program): that rung's 20.7 training minutes less its summed step times, over its 3 stages. The plan stage
collects nothing (its inputs are the training questions)."""
SCRATCH_RL_STEP_SECONDS: dict[str, float] = {"plan": 213.7, "analysis": 158.8, "rewrite": 99.0}
"""Seconds per MAPGRPO step on the untrained roles' demo prompts (``benchmarks/results/bench_mapgrpo.json``)."""
SCRATCH_RL_COLLECT_SECONDS = 218.0
"""Seconds a MAPGRPO stage spends collecting its inputs on the demo prompts (``bench_mapgrpo.json``: 1442 training
seconds less 789 s of steps, over 3 stages)."""
EVAL_SECONDS_PER_QUESTION = 8.5
"""Seconds per held-out question and evaluation (all at once, 24 threads), the model load and SFT's gold-path
collection spread over them: two ladder runs alone on the machine (24m48s in docs/demo.md, 23.3 minutes in a later one)
less their ~14 training minutes, over their 3 x 24 evaluated questions (9.1 s and 7.8 s)."""


def check_steps(name: str, steps: dict[str, int] | None, known: tuple[str, ...]) -> None:
    """Check a steps table of :class:`~rolecall.demo.DemoConfig` (field ``name``): known keys, counts >= 1.

    Raises:
        ConfigError: an unknown key (the known ones listed) or a count that is not an integer >= 1.
    """
    if steps is None:
        return
    flag = "--" + name.replace("_", "-")
    if not isinstance(steps, dict) or (unknown := sorted(set(steps) - set(known))):
        raise ConfigError(f"{name} ({flag}) names {unknown if isinstance(steps, dict) else steps!r}; its keys are "
                          f"{list(known)}, e.g. {known[0]}=20")  # fmt: skip
    for key, value in steps.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} ({flag}) must give each of {list(known)} an integer >= 1; got {key}={value!r}")


def parse_steps(text: str, flag: str, names: tuple[str, ...]) -> dict[str, int]:
    """Steps per adapter from the command line: ``"12"`` (each of ``names``) or ``"plan=60,analysis=25"``.

    Example:
        >>> parse_steps("plan=4,rewrite=1", "--rl-steps", RL_STAGES)
        {'plan': 4, 'rewrite': 1}

    Raises:
        ConfigError: ``text`` is neither form; the message shows both.
    """
    try:
        if "=" not in text:
            return dict.fromkeys(names, int(text))
        return {k.strip(): int(v) for k, v in (item.split("=", 1) for item in text.split(",") if item.strip())}
    except ValueError:
        example = ",".join(f"{n}=2" for n in names)
        raise ConfigError(f"{flag} takes N or adapter=N,... (e.g. {example}); got {text!r}") from None
