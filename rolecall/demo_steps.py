"""The demo's amount of work and how long it takes: fixed training steps per OPERA adapter (SFT) and per stage
(MAPGRPO), and the time an idle 2-core machine needs for them (the step costs measured on this project's machine).

The demo trains these steps whatever the machine's speed (no wall-clock budget), so a busy or slower machine takes
longer and gives the same table within noise; :func:`rolecall.demo.estimate_minutes` is printed before it starts.
"""

from __future__ import annotations

from rolecall.errors import ConfigError

__all__ = [
    "DEMO_COLLECT_QUESTIONS",
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
DEMO_RL_STEPS: dict[str, int] = {"plan": 2, "analysis": 8, "rewrite": 3}
"""MAPGRPO optimizer steps per stage after SFT (G = 4, 4 inputs a step): what the demo's former 8-minute MAPGRPO
budget fitted alone on the machine (docs/demo.md: the ladder's 24m48s run of 2026-12-04, 2 plan, 8 analysis and 3
rewrite steps; the budget's split by measured cost stopped the plan stage after 2 of its 4 planned steps). At
:data:`RL_STEP_SECONDS` with each stage's input collection they take ~6.8 minutes."""
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
RL_STEP_SECONDS: dict[str, float] = {"plan": 51.3, "analysis": 16.6, "rewrite": 16.9}
"""Seconds per MAPGRPO step on the SFT-trained roles, alone on a 2-core machine (``bench_compile.json``, the rung with
shared sub-goals: G = 4, 4 inputs a step; the plan step executes its candidate plans downstream)."""
RL_COLLECT_SECONDS = 40.0
"""Seconds a MAPGRPO stage spends collecting its inputs on the trained roles (12 questions run through the program):
that rung's 20.7 training minutes less its summed step times, over its 3 stages."""
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
