"""The demo: its fixed amount of work (steps, not minutes), its checks and time estimate, its table and curve helpers,
and the ladder on a tiny model (the full demo runs in `make demo`)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from rolecall.cli import main
from rolecall.demo import (
    DemoConfig,
    comparison_table,
    demo_optimizer,
    estimate_minutes,
    ladder_table,
    plot_training_curve,
    run_demo,
)
from rolecall.demo_steps import DEMO_RL_STEPS, DEMO_SCRATCH_RL_STEPS, DEMO_SFT_STEPS, RL_STEP_SECONDS
from rolecall.errors import ConfigError
from rolecall.optimizers.core.base import WeightOptimizer


def test_comparison_table_scales_and_signs():
    before = {"em": 0.05, "f1": 0.10, "cover_em": 0.05, "success_rate": 0.5, "lm_calls": 6.0, "retrieval_recall": None}
    after = {"em": 0.20, "f1": 0.30, "cover_em": 0.25, "success_rate": 0.9, "lm_calls": 4.5, "retrieval_recall": 0.4}
    table = comparison_table(before, after)
    assert "| EM | 5.0 | 20.0 | +15.0 |" in table
    assert "| LM calls / question | 6.0 | 4.5 | -1.5 |" in table
    assert "recall" not in table  # a metric missing on one side is left out, not crashed on


def test_training_curve_png(tmp_path):
    log = tmp_path / "train_log.jsonl"
    rows = [
        {"stage": s, "step": i, "reward/mean": 0.1 * i, "reward/expert": 0.9, "parse/rate": 0.5}
        for s in ("plan", "analysis")
        for i in range(1, 4)
    ]
    log.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    png = tmp_path / "curve.png"
    assert plot_training_curve(log, png)
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert not plot_training_curve(tmp_path / "missing.jsonl", png)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--group-size", "0"], "--group-size"),
        (["--group-size", "1"], "--group-size"),
        (["--eval-questions", "0"], "--eval-questions"),
        (["--threads", "0"], "--threads"),
        (["--sft-steps", "plan=0"], "--sft-steps"),
        (["--sft-steps", "planner=3"], "--sft-steps"),
        (["--rl-steps", "synthesis=2"], "--rl-steps"),
        (["--rl-steps", "plan=x"], "--rl-steps"),
    ],
)
def test_demo_rejects_bad_flags_before_anything_loads(tmp_path, capsys, argv, named):
    """A bad value is one error line naming its flag, before the estimate, the run directory or any model (a group
    size of 0 used to start the whole 25-minute run)."""
    assert main(["demo", *argv, "--out", str(tmp_path / "run")]) == 1
    out, err = capsys.readouterr()
    assert err.startswith("rolecall demo: error: ") and named in err and len(err.strip().splitlines()) == 1
    assert out == "" and not (tmp_path / "run").exists()


def test_demo_rejects_nan_and_non_integers():
    """argparse refuses ``--threads nan`` (a usage error); DemoConfig refuses what a caller passes around it."""
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--threads", "nan"])
    assert exit_info.value.code == 2
    for bad in ({"threads": float("nan")}, {"eval_questions": 2.5}, {"group_size": True}, {"optimizer": "grpo"},
                {"rl_steps": {"plan": 1.5}}):  # fmt: skip
        with pytest.raises(ConfigError):
            DemoConfig(**bad)


def test_demo_optimizers_are_step_bounded_not_time_bounded(tmp_path):
    """The optimizers the demo builds carry its fixed steps per adapter / stage and no wall-clock budget."""
    config = DemoConfig()
    sft = demo_optimizer("sft", config, tmp_path, warm=False)
    assert sft.sft_config.max_steps == DEMO_SFT_STEPS == {"plan": 112, "analysis": 75, "synthesis": 19, "rewrite": 3}
    assert sft.sft_config.time_budget_minutes is None and sft.config.time_budget_s is None
    rl = demo_optimizer("mapgrpo", config, tmp_path, warm=True)
    assert rl.mapgrpo_config.steps == DEMO_RL_STEPS == {"plan": 8} and rl.mapgrpo_config.stage_order(True) == ("plan",)
    assert rl.mapgrpo_config.time_budget_minutes is None and rl.config.time_budget_s is None
    # issue 55's recipe on SFT's roles: plans judged against gold, not executed; c_best guides, outside the baseline
    recipe = rl.mapgrpo_config
    assert (recipe.plan_logic, recipe.execute_plans, recipe.expert_gradient, recipe.expert_in_baseline) == (
        "gold", False, True, False)  # fmt: skip
    assert (recipe.temperature, recipe.num_iterations, recipe.lr_schedule, recipe.lr_warmup_steps) == (
        0.8, 2, "linear", 2)  # fmt: skip
    assert recipe.learning_rate["plan"] == 5e-4 and recipe.group_size == 5 and recipe.plan_weights.execution == 0.0
    assert recipe.plan_weights.logic == 0.6 and recipe.plan_weights.placeholder == 0.2
    scratch = demo_optimizer("mapgrpo", DemoConfig(optimizer="mapgrpo"), tmp_path, warm=False)
    assert scratch.mapgrpo_config.steps == DEMO_SCRATCH_RL_STEPS and scratch.config.time_budget_s is None
    assert scratch.mapgrpo_config.expert_gradient
    # a flag overrides the adapters it names; the others keep the demo's steps
    override = DemoConfig(sft_steps={"analysis": 5}, rl_steps={"plan": 4})
    assert demo_optimizer("sft", override, tmp_path, warm=False).sft_config.max_steps == {**DEMO_SFT_STEPS,
                                                                                          "analysis": 5}  # fmt: skip
    assert demo_optimizer("mapgrpo", override, tmp_path, warm=True).mapgrpo_config.steps == {"plan": 4}
    # a stage the recipe does not train by default runs when named, after the plan stage
    more = demo_optimizer("mapgrpo", DemoConfig(rl_steps={"analysis": 2}), tmp_path, warm=True).mapgrpo_config
    assert more.stage_order(True) == ("plan", "analysis") and more.steps == {"plan": 8, "analysis": 2}


def test_the_time_estimate_is_the_step_costs_times_the_steps():
    """The default ladder on an idle 2-core machine, by hand: 3 evaluations x 24 questions x 8.5 s = 612 s; SFT
    112 x 1.55 + 75 x 2.95 + 19 x 1.55 + 3 x 1.85 = 429.85 s; MAPGRPO 8 plan steps x RL_STEP_SECONDS["plan"], no
    collection (the plan stage's inputs are the training questions); an analysis stage adds its steps and 40 s of
    collection."""
    plan = RL_STEP_SECONDS["plan"]
    assert estimate_minutes(DemoConfig()) == pytest.approx((612 + 429.85 + 8 * plan) / 60)
    assert estimate_minutes(DemoConfig()) < 26  # with setup, inside the demo's 30 minutes
    assert estimate_minutes(DemoConfig(optimizer="sft")) == pytest.approx((2 * 24 * 8.5 + 429.85) / 60)
    assert estimate_minutes(DemoConfig(sft_steps={"plan": 224})) == pytest.approx(
        (612 + 429.85 + 8 * plan + 112 * 1.55) / 60)  # fmt: skip
    assert estimate_minutes(DemoConfig(rl_steps={"analysis": 2})) == pytest.approx(
        (612 + 429.85 + 8 * plan + 2 * 16.6 + 40) / 60)  # fmt: skip


def test_the_estimate_is_printed_before_anything_loads(tmp_path, capsys):
    """The estimate comes first: here the model then fails to load, and the estimate was already on stdout."""
    assert main(["demo", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "run"), "--no-progress"]) == 1
    out, err = capsys.readouterr()
    assert "SFT plan=112 analysis=75 synthesis=19 rewrite=3 steps, then MAPGRPO plan=8 steps" in out
    assert f"about {estimate_minutes(DemoConfig()):.0f} minutes on an idle 2-core machine" in out and "no-model" in err


def test_ladder_table_has_a_column_per_rung():
    columns = [("prompt-only OPERA", {"em": 0.05, "lm_calls": 6.0}), ("SFT OPERA", {"em": 0.30, "lm_calls": 4.0}),
               ("SFT + MAPGRPO OPERA", {"em": 0.35, "lm_calls": 4.0})]  # fmt: skip
    table = ladder_table(columns)
    assert table.splitlines()[0] == "| metric | prompt-only OPERA | SFT OPERA | SFT + MAPGRPO OPERA | change |"
    assert "| EM | 5.0 | 30.0 | 35.0 | +30.0 |" in table and "| LM calls / question | 6.0 | 4.0 | 4.0 | -2.0 |" in table


def test_the_sft_then_mapgrpo_demo_on_a_tiny_model(tmp_path, tiny_model, smollm_tokenizer, monkeypatch):
    """`rolecall demo --optimizer sft,mapgrpo`: three evaluations, a three-column table, the SFT loss curve and the
    MAPGRPO reward curves (issue 55's recipe after SFT, here with analysis and rewrite stages too). The training clock
    runs ~1000x slow (10 minutes a reading, far past the former 7- and 8-minute budgets, which then trained none of
    these steps): every rung still trains all its steps."""
    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    smollm_tokenizer.save_pretrained(model_dir)
    ticks = iter(range(0, 10**9, 600))  # a loaded machine, exaggerated: each clock reading is 10 minutes later
    monkeypatch.setattr(WeightOptimizer, "clock", staticmethod(lambda: next(ticks)))
    sft_steps = {"plan": 2, "analysis": 2, "synthesis": 1, "rewrite": 1}
    config = DemoConfig(optimizer="sft,mapgrpo", eval_questions=2, train_questions=3, sft_steps=sft_steps,
                        rl_steps={"plan": 2, "analysis": 1, "rewrite": 1}, group_size=2, threads=2,
                        model=str(model_dir), out=tmp_path / "run", show_progress=False)  # fmt: skip
    results = run_demo(config)
    assert [c["name"] for c in results["columns"]] == ["prompt-only OPERA", "SFT OPERA", "SFT + MAPGRPO OPERA"]
    assert "| metric | prompt-only OPERA | SFT OPERA | SFT + MAPGRPO OPERA | change |" in results["table"]
    # under the table, each rung judged against the one before on the same 2 questions
    assert "SFT OPERA vs prompt-only OPERA on 2 questions: won " in results["table"]
    assert "SFT + MAPGRPO OPERA vs SFT OPERA on 2 questions: won " in results["table"]
    assert [(p["name_a"], p["n"]) for p in results["paired"]] == [("prompt-only OPERA", 2), ("SFT OPERA", 2)]
    for sub in ("before", "after_sft", "after"):
        assert (tmp_path / "run" / sub / "records.jsonl").is_file()
    assert results["loss_curve"] and results["training_curve"].endswith("training_curve.png")
    assert results["training"]["mapgrpo"]["planned"] == config.planned_rl_steps
    for name in ("sft", "mapgrpo"):
        training = results["training"][name]
        ran = Counter(r["stage"] for r in results["train_log"] if r["optimizer"] == name)
        assert training["steps"] == dict(ran) | {s: 0 for s in training["planned"] if s not in ran}
        # no stage stopped on the clock: each trained its planned steps, unless it had nothing to train on
        for stage, steps in training["planned"].items():
            assert ran[stage] == steps or "nothing to train on" in training["stopped"][stage], (name, stage)
            assert "budget" not in training["stopped"].get(stage, "")
    sft_planned = results["training"]["sft"]["planned"]  # rewrite: no gold target in 3 questions, no stage
    assert {"plan", "analysis", "synthesis"} <= set(sft_planned) and all(
        sft_steps[a] == n for a, n in sft_planned.items()
    )
    assert results["training"]["sft"]["stop_reason"] == "completed"
    assert results["training"]["mapgrpo"]["steps"]["plan"] == 2  # the plan stage always has questions to plan
