"""Tests for rolecall.evaluation.metrics: hand-worked examples, then property tests."""

from __future__ import annotations

import doctest
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rolecall.evaluation import metrics
from rolecall.evaluation.metrics import (
    cover_exact_match,
    exact_match,
    f1_precision_recall,
    f1_score,
    ndcg_at_k,
    normalize_answer,
    qa_scores,
    recall_at_k,
)


def test_docstring_examples_run():
    result = doctest.testmod(metrics)
    assert result.attempted > 0
    assert result.failed == 0


# ---------------------------------------------------------------- normalization


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  eiffel\ttower!  ", "eiffel tower"),
        ("U.S.A.", "usa"),  # punctuation is deleted, not replaced by a space
        ("an apple a day", "apple day"),
        ("theater and Anatomy", "theater and anatomy"),  # articles only as whole words
        ("Rock'n'Roll", "rocknroll"),
        ("the", ""),
        ("", ""),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_normalize_answer_rejects_non_string():
    with pytest.raises(TypeError, match="expects a str"):
        normalize_answer(1990)


# ---------------------------------------------------------------- exact match


def test_exact_match_ignores_case_articles_and_punctuation():
    """normalize("The Eiffel Tower") = "eiffel tower" = normalize("eiffel tower!"), so EM = 1."""
    assert exact_match("The Eiffel Tower", "eiffel tower!") == 1.0


def test_exact_match_is_strict():
    """ "eiffel tower paris" != "eiffel tower": containment is not EM."""
    assert exact_match("Eiffel Tower, Paris", "Eiffel Tower") == 0.0


def test_exact_match_takes_max_over_aliases():
    assert exact_match("NYC", ["New York City", "nyc"]) == 1.0
    assert exact_match("NYC", ["New York City", "Big Apple"]) == 0.0


@pytest.mark.parametrize("prediction", [None, "", "   ", "The", "?!"])
def test_empty_prediction_scores_zero_everywhere(prediction):
    """A prediction that normalizes to "" scores 0, even against a gold that also normalizes to ""."""
    for gold in ["Paris", "the", ""]:
        assert qa_scores(prediction, gold) == {"em": 0.0, "f1": 0.0, "precision": 0.0, "recall": 0.0, "cover_em": 0.0}


def test_empty_gold_never_matches():
    assert exact_match("Paris", []) == 0.0
    assert exact_match("Paris", ["", "the"]) == 0.0
    assert f1_score("Paris", []) == 0.0
    assert cover_exact_match("Paris", "") == 0.0


@pytest.mark.parametrize("fn", [exact_match, f1_score, f1_precision_recall, cover_exact_match, qa_scores])
def test_non_string_inputs_raise_type_error(fn):
    with pytest.raises(TypeError, match="prediction must be a str or None"):
        fn(1990, "1990")
    with pytest.raises(TypeError, match="gold must be a str or a sequence of str"):
        fn("1990", None)
    with pytest.raises(TypeError, match="gold must be a str or a sequence of str"):
        fn("1990", b"1990")
    with pytest.raises(TypeError, match="gold alias 1 must be a str"):
        fn("1990", ["1990", 1990])


# ---------------------------------------------------------------- F1


def test_f1_worked_example():
    """pred "the big red dog" -> [big, red, dog]; gold "red dog barked" -> [red, dog, barked].

    common = {red, dog} -> 2 tokens; P = 2/3, R = 2/3, F1 = 2 * (2/3 * 2/3) / (2/3 + 2/3) = 2/3.
    """
    f1, precision, recall = f1_precision_recall("the big red dog", "red dog barked")
    assert math.isclose(precision, 2 / 3)
    assert math.isclose(recall, 2 / 3)
    assert math.isclose(f1, 2 / 3)
    assert f1 == f1_score("the big red dog", "red dog barked")


def test_f1_asymmetric_precision_recall():
    """pred [big, red, dog] vs gold [red, dog]: common 2, P = 2/3, R = 2/2 = 1, F1 = (4/3) / (5/3) = 0.8."""
    f1, precision, recall = f1_precision_recall("The big red dog.", "Red dog")
    assert (round(f1, 10), round(precision, 10), recall) == (0.8, round(2 / 3, 10), 1.0)


def test_f1_counts_repeated_tokens_as_a_multiset():
    """pred [dog, dog, dog] vs gold [dog]: the multiset intersection holds one "dog".

    P = 1/3, R = 1/1, F1 = 2 * (1/3) / (4/3) = 0.5.
    """
    f1, precision, recall = f1_precision_recall("dog dog dog", "dog")
    assert (f1, precision, recall) == pytest.approx((0.5, 1 / 3, 1.0))


def test_f1_no_overlap_is_zero():
    assert f1_precision_recall("London", "Paris") == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("prediction", "gold"),
    [
        ("yes", "yes it is"),  # plain token overlap would give P = 1, R = 1/3, F1 = 0.5
        ("yes it is", "yes"),  # symmetric: the gold is special
        ("no", "no way"),
        ("yes", "no"),
        ("noanswer", "no answer"),  # "no answer" normalizes to two tokens, "noanswer" to the special one
    ],
)
def test_f1_yes_no_rule_gives_no_partial_credit(prediction, gold):
    assert f1_precision_recall(prediction, gold) == (0.0, 0.0, 0.0)


def test_f1_yes_no_exact_agreement_scores_one():
    assert f1_precision_recall("Yes.", "yes") == (1.0, 1.0, 1.0)
    assert exact_match("No!", "no") == 1.0


def test_f1_takes_best_alias_and_returns_its_precision_recall():
    """Against "red dog barked" (F1 2/3) and "red dog" (F1 0.8), the second alias wins with its (P, R) = (2/3, 1)."""
    f1, precision, recall = f1_precision_recall("the big red dog", ["red dog barked", "red dog", "cat"])
    assert (f1, precision, recall) == pytest.approx((0.8, 2 / 3, 1.0))


def test_f1_alias_ties_keep_the_first_alias():
    """pred [x, y] vs alias [x, z]: common 1, P = 1/2, R = 1/2, F1 = 1/2.

    pred [x, y] vs alias [x, y, p, q, r, s]: common 2, P = 1, R = 2/6 = 1/3, F1 = 2 * (1/3) / (4/3) = 1/2.
    Equal F1, different (P, R): the alias listed first supplies the triple.
    """
    assert f1_precision_recall("x y", ["x z", "x y p q r s"]) == pytest.approx((0.5, 0.5, 0.5))
    assert f1_precision_recall("x y", ["x y p q r s", "x z"]) == pytest.approx((0.5, 1.0, 1 / 3))


# ---------------------------------------------------------------- cover-EM


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("He was born in 1990.", "1990", 1.0),
        ("19901", "1990", 0.0),  # not a whole token
        ("born 1990s", "1990", 0.0),
        ("The answer is the Eiffel Tower in Paris", "Eiffel Tower", 1.0),  # contiguous run of tokens
        ("Eiffel and Tower", "Eiffel Tower", 0.0),  # tokens present but not contiguous
        ("martial arts", "art", 0.0),
        ("Paris", "Paris, France", 0.0),  # gold longer than the prediction
        ("It is Paris, France.", ["Lutetia", "Paris"], 1.0),  # max over aliases
    ],
)
def test_cover_exact_match_respects_token_boundaries(prediction, gold, expected):
    assert cover_exact_match(prediction, gold) == expected


def test_qa_scores_keys_and_values():
    """pred "the Eiffel Tower in Paris" -> [eiffel, tower, in, paris]; gold "Eiffel Tower" -> [eiffel, tower].

    EM 0; common 2: P = 2/4, R = 2/2, F1 = 2 * 0.5 / 1.5 = 2/3; cover-EM 1.
    """
    scores = qa_scores("the Eiffel Tower in Paris", "Eiffel Tower")
    assert set(scores) == {"em", "f1", "precision", "recall", "cover_em"}
    assert scores == pytest.approx({"em": 0.0, "f1": 2 / 3, "precision": 0.5, "recall": 1.0, "cover_em": 1.0})


# ---------------------------------------------------------------- retrieval


def test_recall_at_k_worked_example():
    """retrieved [x, g1, y, g2], gold {g1, g2, g3}: top-1 has 0 gold, top-2 has g1, top-4 and beyond g1 and g2."""
    retrieved, gold = ["x", "g1", "y", "g2"], ["g1", "g2", "g3"]
    assert recall_at_k(retrieved, gold, k=1) == 0.0
    assert recall_at_k(retrieved, gold, k=2) == pytest.approx(1 / 3)
    assert recall_at_k(retrieved, gold, k=4) == pytest.approx(2 / 3)
    assert recall_at_k(retrieved, gold, k=100) == pytest.approx(2 / 3)


def test_recall_at_k_counts_duplicates_once():
    """[g1, g1] holds one distinct gold id of two, and gold repeats do not inflate the denominator."""
    assert recall_at_k(["g1", "g1"], ["g1", "g2", "g2"], k=2) == 0.5


def test_ndcg_hits_at_ranks_one_and_three():
    """Gold {g1, g2}; hits at ranks 1 and 3.

    DCG = 1/log2(2) + 1/log2(4) = 1 + 0.5 = 1.5; IDCG = 1/log2(2) + 1/log2(3) = 1 + 0.63093 = 1.63093;
    NDCG = 1.5 / 1.63093 = 0.91972.
    """
    expected = (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    assert ndcg_at_k(["g1", "x", "g2", "y"], ["g1", "g2"], k=4) == pytest.approx(expected)
    assert expected == pytest.approx(0.91972, abs=1e-5)


def test_ndcg_duplicate_occupies_its_slot_without_gain():
    """[g1, g1, g2]: rank 2 repeats g1 (gain 0), g2 lands at rank 3 -> the same 0.91972 as above."""
    expected = (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    assert ndcg_at_k(["g1", "g1", "g2"], ["g1", "g2"], k=3) == pytest.approx(expected)


def test_ndcg_ideal_is_truncated_at_k():
    """Three gold ids but k = 2: IDCG counts min(3, 2) = 2 hits, so two hits at ranks 1-2 score 1."""
    assert ndcg_at_k(["g1", "g2", "x"], ["g1", "g2", "g3"], k=2) == pytest.approx(1.0)
    # Only the hit at rank 2 counts within k = 2: (1/log2(3)) / (1 + 1/log2(3)).
    expected = (1 / math.log2(3)) / (1 + 1 / math.log2(3))
    assert ndcg_at_k(["x", "g1", "g2"], ["g1", "g2", "g3"], k=2) == pytest.approx(expected)


def test_retrieval_metrics_empty_gold_and_empty_retrieval():
    assert recall_at_k(["a", "b"], [], k=2) == 0.0
    assert ndcg_at_k(["a", "b"], [], k=2) == 0.0
    assert recall_at_k([], ["a"], k=5) == 0.0
    assert ndcg_at_k([], ["a"], k=5) == 0.0


@pytest.mark.parametrize("fn", [recall_at_k, ndcg_at_k])
def test_retrieval_metrics_validate_inputs(fn):
    with pytest.raises(TypeError, match="Wrap a single id in a list"):
        fn("g1", ["g1"], k=1)
    with pytest.raises(TypeError, match="gold_ids must be a sequence"):
        fn(["g1"], "g1", k=1)
    with pytest.raises(ValueError, match="k must be >= 1"):
        fn(["g1"], ["g1"], k=0)
    with pytest.raises(TypeError, match="k must be an int"):
        fn(["g1"], ["g1"], k=2.0)


# ---------------------------------------------------------------- properties

# Text drawn from letters, digits, spaces, punctuation and a few articles / special answers, so normalization and
# the yes/no rule are exercised often.
_words = st.sampled_from(["a", "an", "the", "yes", "no", "noanswer", "Paris", "dog", "1990", "U.S.", "x"])
_texts = st.one_of(
    st.text(alphabet=st.characters(codec="utf-8", categories=["L", "N", "P", "Zs"]), max_size=30),
    st.lists(_words, max_size=6).map(" ".join),
)
_gold = st.one_of(_texts, st.lists(_texts, max_size=3))


@settings(max_examples=200, deadline=None)
@given(prediction=_texts, gold=_gold)
def test_scores_are_bounded_and_consistent(prediction, gold):
    scores = qa_scores(prediction, gold)
    assert all(0.0 <= value <= 1.0 for value in scores.values())
    if scores["em"] == 1.0:
        assert scores["f1"] == scores["precision"] == scores["recall"] == 1.0
        assert scores["cover_em"] == 1.0
    assert scores["f1"] <= max(scores["precision"], scores["recall"]) + 1e-12


@settings(max_examples=200, deadline=None)
@given(text=_texts)
def test_exact_match_with_itself(text):
    # Normalization drops articles and punctuation, so a non-empty result means a non-article token exists.
    assume(normalize_answer(text) != "")
    assert exact_match(text, text) == 1.0
    assert f1_score(text, text) == 1.0
    assert cover_exact_match(text, text) == 1.0


@settings(max_examples=200, deadline=None)
@given(text=_texts)
def test_normalize_is_idempotent(text):
    once = normalize_answer(text)
    assert normalize_answer(once) == once


@settings(max_examples=200, deadline=None)
@given(a=_texts, b=_texts)
def test_f1_is_symmetric_with_precision_and_recall_swapped(a, b):
    f1_ab, p_ab, r_ab = f1_precision_recall(a, b)
    f1_ba, p_ba, r_ba = f1_precision_recall(b, a)
    assert f1_ab == pytest.approx(f1_ba)
    assert (p_ab, r_ab) == pytest.approx((r_ba, p_ba))


@settings(max_examples=200, deadline=None)
@given(prediction=_texts, aliases=st.lists(_texts, min_size=1, max_size=4))
def test_alias_list_is_the_max_over_single_aliases(prediction, aliases):
    assert f1_score(prediction, aliases) == max(f1_score(prediction, a) for a in aliases)
    assert exact_match(prediction, aliases) == max(exact_match(prediction, a) for a in aliases)
    assert cover_exact_match(prediction, aliases) == max(cover_exact_match(prediction, a) for a in aliases)


_ids = st.lists(st.sampled_from([f"d{i}" for i in range(8)]), max_size=10)


@settings(max_examples=200, deadline=None)
@given(retrieved=_ids, gold=_ids, k=st.integers(1, 12))
def test_retrieval_metrics_bounded_and_monotone_in_k(retrieved, gold, k):
    recall, ndcg = recall_at_k(retrieved, gold, k), ndcg_at_k(retrieved, gold, k)
    assert 0.0 <= recall <= 1.0
    assert 0.0 <= ndcg <= 1.0 + 1e-12
    assert recall_at_k(retrieved, gold, k + 1) >= recall


@settings(max_examples=100, deadline=None)
@given(gold=st.lists(st.sampled_from([f"d{i}" for i in range(8)]), min_size=1, unique=True), k=st.integers(1, 12))
def test_ndcg_of_an_ideal_ranking_is_one(gold, k):
    assert ndcg_at_k(gold + ["other"], gold, k) == pytest.approx(1.0)


# ---------------------------------------------------------------- parity with DSPy's HotpotQA metrics

_ascii_texts = st.one_of(
    st.text(alphabet=st.characters(codec="ascii", categories=["L", "N", "P", "S", "Zs"]), max_size=30),
    st.lists(_words, max_size=6).map(" ".join),
)


@settings(max_examples=200, deadline=None)
@given(prediction=_ascii_texts, aliases=st.lists(_ascii_texts, min_size=1, max_size=3))
def test_parity_with_dspy_hotpot_metrics(prediction, aliases):
    """On ASCII text DSPy's ``EM`` / ``HotPotF1`` follow the official script (their extra NFD step is a no-op).

    Our only documented difference is the degenerate case: an empty normalized prediction or alias scores 0 here.
    """
    reference = pytest.importorskip("dspy.evaluate.metrics")
    assume(normalize_answer(prediction) != "")
    assume(all(normalize_answer(alias) != "" for alias in aliases))
    assert exact_match(prediction, aliases) == float(reference.EM(prediction, aliases))
    assert f1_score(prediction, aliases) == pytest.approx(reference.HotPotF1(prediction, aliases))
