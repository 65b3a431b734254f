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
