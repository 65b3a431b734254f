"""The demo's table and training-curve helpers (the full demo runs in `make demo`)."""

from __future__ import annotations

import json

from rolecall.cli import main
from rolecall.demo import comparison_table, plot_training_curve


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


def test_demo_rejects_bad_flags(capsys):
    assert main(["demo", "--eval-questions", "0"]) == 1
    assert "eval-questions" in capsys.readouterr().err


def test_ladder_table_has_a_column_per_rung():
    from rolecall.demo import ladder_table

    columns = [("prompt-only OPERA", {"em": 0.05, "lm_calls": 6.0}), ("SFT OPERA", {"em": 0.30, "lm_calls": 4.0}),
               ("SFT + MAPGRPO OPERA", {"em": 0.35, "lm_calls": 4.0})]  # fmt: skip
    table = ladder_table(columns)
    assert table.splitlines()[0] == "| metric | prompt-only OPERA | SFT OPERA | SFT + MAPGRPO OPERA | change |"
    assert "| EM | 5.0 | 30.0 | 35.0 | +30.0 |" in table and "| LM calls / question | 6.0 | 4.0 | 4.0 | -2.0 |" in table


def test_the_sft_then_mapgrpo_demo_on_a_tiny_model(tmp_path, tiny_model, smollm_tokenizer):
    """`rolecall demo --optimizer sft,mapgrpo`: three evaluations, a three-column table, the SFT loss curve and the
    MAPGRPO reward curves (the paper's Eq. 11 after SFT: no expert gradient)."""
    from rolecall.demo import DemoConfig, run_demo

    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    smollm_tokenizer.save_pretrained(model_dir)
    config = DemoConfig(optimizer="sft,mapgrpo", eval_questions=2, train_questions=3, budget_minutes=0.2,
                        rl_minutes=0.01, max_steps={"plan": 1, "analysis": 1, "synthesis": 1, "rewrite": 1},
                        group_size=2, threads=2, model=str(model_dir), out=tmp_path / "run",
                        show_progress=False)  # fmt: skip
    results = run_demo(config)
    assert [c["name"] for c in results["columns"]] == ["prompt-only OPERA", "SFT OPERA", "SFT + MAPGRPO OPERA"]
    assert "| metric | prompt-only OPERA | SFT OPERA | SFT + MAPGRPO OPERA | change |" in results["table"]
    for sub in ("before", "after_sft", "after"):
        assert (tmp_path / "run" / sub / "records.jsonl").is_file()
    assert results["loss_curve"] and results["training_curve"].endswith("training_curve.png")
    assert {r["optimizer"] for r in results["train_log"]} == {"sft", "mapgrpo"}
