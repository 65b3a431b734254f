"""The paired comparison: counts, McNemar's exact test, the paired bootstrap interval and mismatched question sets."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rolecall.errors import ConfigError
from rolecall.evaluation.compare import compare_runs, format_comparison, mcnemar_exact, paired_comparison


def test_mcnemar_exact_by_hand() -> None:
    """b = 3, c = 0: P[X <= 0] = 1/8 for X ~ Bin(3, 1/2), two-sided 1/4; b = 10, c = 2: 2 * 79/4096."""
    assert mcnemar_exact(3, 0) == pytest.approx(0.25)
    assert mcnemar_exact(10, 2) == pytest.approx(2 * (1 + 12 + 66) / 4096)
    assert mcnemar_exact(5, 5) == 1.0
    assert mcnemar_exact(0, 0) == 1.0


def test_counts_and_interval() -> None:
    ids = [f"q{i}" for i in range(100)]
    a = {i: 0.0 for i in ids}
    b = {i: 0.0 for i in ids}
    for i in ids[:30]:  # both right
        a[i] = b[i] = 1.0
    for i in ids[30:45]:  # B right only: 15 won
        b[i] = 1.0
    for i in ids[45:50]:  # A right only: 5 lost
        a[i] = 1.0
    c = paired_comparison(a, b, resamples=4000)
    assert (c.n, c.won, c.lost, c.tied) == (100, 15, 5, 80)
    assert c.em_a == pytest.approx(0.35) and c.em_b == pytest.approx(0.45)
    assert c.em_diff == pytest.approx(0.10)
    # the paired interval is about mean +- 1.96 * sd(d) / sqrt(n): d is +1 x15, -1 x5, 0 x80
    d = np.array([1.0] * 15 + [-1.0] * 5 + [0.0] * 80)
    half = 1.96 * d.std() / math.sqrt(100)
    assert c.ci_low == pytest.approx(0.10 - half, abs=0.02) and c.ci_high == pytest.approx(0.10 + half, abs=0.02)
    assert c.p_value == pytest.approx(mcnemar_exact(15, 5))
    assert "won 15, lost 5, tied 80" in format_comparison(c)


def test_identical_programs_have_a_zero_interval() -> None:
    em = {f"q{i}": float(i % 3 == 0) for i in range(50)}
    c = paired_comparison(em, dict(em))
    assert (c.won, c.lost, c.em_diff, c.ci_low, c.ci_high, c.p_value) == (0, 0, 0.0, 0.0, 0.0, 1.0)


def test_mismatched_questions_are_an_error() -> None:
    with pytest.raises(ConfigError, match="not evaluated on the same questions: 2 against 2.*'q2'.*'q3'"):
        paired_comparison({"q1": 1.0, "q2": 0.0}, {"q1": 1.0, "q3": 0.0})
    with pytest.raises(ConfigError, match="empty"):
        paired_comparison({}, {})


def _write_run(folder: Path, em: dict[str, float]) -> Path:
    folder.mkdir()
    lines = [json.dumps({"id": i, "question": i, "answers": ["x"], "em": v, "f1": v}) for i, v in em.items()]
    (folder / "records.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_compare_runs_reads_records(tmp_path: Path) -> None:
    a = _write_run(tmp_path / "a", {"q1": 1.0, "q2": 0.0, "q3": 0.0})
    b = _write_run(tmp_path / "b", {"q3": 1.0, "q2": 1.0, "q1": 1.0})
    c = compare_runs(a, b)
    assert (c.n, c.won, c.lost) == (3, 2, 0)
    with pytest.raises(ConfigError, match="no records.jsonl"):
        compare_runs(a, tmp_path / "nothing")


def test_cli_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rolecall.cli import main

    a = _write_run(tmp_path / "a", {f"q{i}": float(i < 5) for i in range(20)})
    b = _write_run(tmp_path / "b", {f"q{i}": float(i < 12) for i in range(20)})
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "n = 20 questions" in out and "won 7, lost 0, tied 13" in out and "McNemar exact p = 0.01562" in out
    assert main(["compare", str(a), str(b), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["won"] == 7
    c = _write_run(tmp_path / "c", {"q0": 1.0})
    assert main(["compare", str(a), str(c)]) == 1
    assert "not evaluated on the same questions" in capsys.readouterr().err
