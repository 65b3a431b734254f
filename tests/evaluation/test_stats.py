"""Tests for rolecall.evaluation.stats: bootstrap intervals, avg@k and pass@k."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rolecall.evaluation import stats
from rolecall.evaluation.stats import avg_at_k, mean_and_ci, pass_at_k


def test_docstring_examples_run():
    result = doctest.testmod(stats)
    assert result.attempted > 0
    assert result.failed == 0


# ---------------------------------------------------------------- bootstrap


def test_interval_contains_the_mean_and_is_deterministic_for_a_seed():
    values = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.25, 1.0, 0.0]
    mean, lo, hi = mean_and_ci(values, seed=3)
    assert mean == pytest.approx(0.575)
    assert lo < mean < hi
    assert mean_and_ci(values, seed=3) == (mean, lo, hi)

    # Scores with many distinct values, so two seeds' quantiles do not land on the same resample mean.
    continuous = np.random.default_rng(0).random(50)
    assert mean_and_ci(continuous, seed=3) != mean_and_ci(continuous, seed=4)


def test_two_point_sample_spans_zero_to_one():
    """values [0, 1]: a resample holds 0, 1 or 2 ones, so its mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4.

    About 250 of 1000 resample means are 0 and about 250 are 1, so the 2.5% quantile is 0 and the 97.5% is 1.
    """
    assert mean_and_ci([0.0, 1.0], n_boot=1000, seed=0) == (0.5, 0.0, 1.0)


@pytest.mark.parametrize("values", [[0.7], [0.7] * 50])
def test_constant_values_give_a_zero_width_interval(values):
    mean, lo, hi = mean_and_ci(values)
    assert (mean, lo, hi) == pytest.approx((0.7, 0.7, 0.7))


def test_width_matches_the_normal_approximation():
    """400 scores with 120 ones: p = 0.3, SE = sqrt(0.3 * 0.7 / 400) = 0.022913.

    A 95% interval is about p ± 1.96 * SE = 0.3 ± 0.04491, width 0.08982; 4000 resamples land within 10%.
    """
    values = [1.0] * 120 + [0.0] * 280
    mean, lo, hi = mean_and_ci(values, n_boot=4000, seed=0)
    se = math.sqrt(0.3 * 0.7 / 400)
    assert mean == pytest.approx(0.3)
    assert hi - lo == pytest.approx(2 * 1.959964 * se, rel=0.1)
    assert (mean - lo) == pytest.approx(hi - mean, abs=0.01)


def test_narrower_confidence_gives_a_narrower_interval():
    values = np.random.default_rng(0).random(200)
    _, lo95, hi95 = mean_and_ci(values, alpha=0.05)
    _, lo50, hi50 = mean_and_ci(values, alpha=0.5)
    assert lo95 < lo50 < hi50 < hi95


def test_blocked_resampling_equals_one_block(monkeypatch):
    """Drawing the resample indices in blocks consumes the generator the same way as one big draw."""
    values = np.random.default_rng(1).random(37)
    whole = mean_and_ci(values, n_boot=250, seed=7)
    monkeypatch.setattr(stats, "_MAX_BLOCK_ELEMENTS", 37 * 16)  # blocks of 16 resamples
    assert mean_and_ci(values, n_boot=250, seed=7) == pytest.approx(whole, abs=1e-12)


def test_matches_the_naive_loop():
    """The docstring's naive loop, drawn with the same generator calls, gives the same interval."""
    values = np.asarray([0.0, 0.2, 1.0, 1.0, 0.4, 0.0, 1.0])
    rng = np.random.default_rng(5)
    means = [values[rng.integers(0, len(values), size=len(values))].mean() for _ in range(300)]
    expected_lo, expected_hi = np.quantile(means, [0.025, 0.975])
    mean, lo, hi = mean_and_ci(values, n_boot=300, seed=5)
    assert (mean, lo, hi) == pytest.approx((values.mean(), expected_lo, expected_hi))


@pytest.mark.parametrize(
    ("values", "kwargs", "error", "match"),
    [
        ([], {}, ValueError, "values is empty"),
        ([0.5, float("nan")], {}, ValueError, "non-finite"),
        ([[0.5, 1.0]], {}, ValueError, "one-dimensional"),
        (["a", "b"], {}, TypeError, "flat sequence of numbers"),
        ([0.5], {"n_boot": 0}, ValueError, "n_boot must be a positive int"),
        ([0.5], {"alpha": 0.0}, ValueError, "alpha must lie in"),
        ([0.5], {"alpha": 1.5}, ValueError, "alpha must lie in"),
    ],
)
def test_mean_and_ci_rejects_bad_input(values, kwargs, error, match):
    with pytest.raises(error, match=match):
        mean_and_ci(values, **kwargs)


@settings(max_examples=50, deadline=None)
@given(values=st.lists(st.floats(0, 1), min_size=1, max_size=40), seed=st.integers(0, 2**16))
def test_interval_is_ordered_and_inside_the_data_range(values, seed):
    mean, lo, hi = mean_and_ci(values, n_boot=200, seed=seed)
    assert min(values) - 1e-12 <= lo <= hi <= max(values) + 1e-12


# ---------------------------------------------------------------- avg@k and pass@k


def test_avg_at_k_worked_example():
    """Question 0 runs [1, 0, 1, 1] -> 0.75; question 1 runs [0, 0, 0, 1] -> 0.25; avg@4 = (0.75 + 0.25) / 2 = 0.5."""
    assert avg_at_k([[1, 0, 1, 1], [0, 0, 0, 1]]) == 0.5


def test_pass_at_k_worked_example():
    """Runs [1, 0, 0], [0, 0, 0], [0, 1, 1]: questions 0 and 2 have a correct run -> pass@3 = 2/3."""
    assert pass_at_k([[1, 0, 0], [0, 0, 0], [0, 1, 1]]) == pytest.approx(2 / 3)


def test_pass_at_k_threshold_for_graded_scores():
    """F1 runs [0.4, 0.6] and [0.2, 0.3]: with threshold 1.0 nothing passes; with 0.5 question 0 passes -> 1/2."""
    runs = [[0.4, 0.6], [0.2, 0.3]]
    assert pass_at_k(runs) == 0.0
    assert pass_at_k(runs, threshold=0.5) == 0.5


def test_avg_and_pass_accept_numpy_arrays():
    runs = np.array([[1.0, 0.0], [0.0, 0.0]])
    assert avg_at_k(runs) == 0.25
    assert pass_at_k(runs) == 0.5


@pytest.mark.parametrize("fn", [avg_at_k, pass_at_k])
@pytest.mark.parametrize(
    ("scores", "error", "match"),
    [
        ([], ValueError, "is empty"),
        ([[1.0], []], ValueError, "question 1 has no runs"),
        ([[1.0, 0.0], [1.0]], ValueError, "same number of runs"),
        ([[1.0], [float("inf")]], ValueError, "non-finite"),
        ([1.0, 0.0], TypeError, r"scores_per_question\[0\] must be a sequence"),
        ("10", TypeError, "must be a sequence"),
    ],
)
def test_avg_and_pass_reject_bad_input(fn, scores, error, match):
    with pytest.raises(error, match=match):
        fn(scores)


@settings(max_examples=100, deadline=None)
@given(
    data=st.integers(1, 5).flatmap(
        lambda k: st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=k, max_size=k), min_size=1, max_size=10)
    )
)
def test_pass_at_k_bounds_avg_at_k_for_binary_scores(data):
    """For 0/1 scores a question's max run is >= its mean run, so pass@k >= avg@k; with k = 1 they are equal."""
    assert 0.0 <= avg_at_k(data) <= pass_at_k(data) <= 1.0
    if len(data[0]) == 1:
        assert avg_at_k(data) == pass_at_k(data)
