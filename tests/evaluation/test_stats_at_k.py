"""avg@k and pass@k with question-bootstrap intervals (MultiAgent-OPD's avg@4 / pass@4), on hand-made records."""

from __future__ import annotations

import pytest

from rolecall.evaluation.stats import avg_pass_at_k, mean_and_ci


def test_avg_and_pass_at_4_on_hand_made_records():
    """Three questions, four runs each: per-question means (0.75, 0.25, 0) give avg@4 = 1/3; questions 1 and 2 have
    a right run, so pass@4 = 2/3. The intervals are the question bootstrap of those per-question values."""
    runs = [[1, 0, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]]
    result = avg_pass_at_k(runs, n_boot=500, seed=3)
    assert result["avg@4"] == pytest.approx(1 / 3) and result["pass@4"] == pytest.approx(2 / 3)
    assert (result["questions"], result["k"]) == (3.0, 4.0)
    assert (result["avg@4"], result["avg@4/lo"], result["avg@4/hi"]) == mean_and_ci([0.75, 0.25, 0.0], n_boot=500,
                                                                                     seed=3)  # fmt: skip
    assert (result["pass@4"], result["pass@4/lo"], result["pass@4/hi"]) == mean_and_ci([1.0, 1.0, 0.0], n_boot=500,
                                                                                        seed=3)  # fmt: skip
    assert 0.0 <= result["pass@4/lo"] <= result["pass@4"] <= result["pass@4/hi"] <= 1.0


def test_threshold_k_in_the_keys_and_bad_input():
    result = avg_pass_at_k([[0.4, 0.6], [0.2, 0.1]], threshold=0.5, n_boot=10)
    assert result["pass@2"] == 0.5 and result["avg@2"] == pytest.approx(0.325)
    with pytest.raises(ValueError, match="same number of runs"):
        avg_pass_at_k([[1, 0], [1]])
