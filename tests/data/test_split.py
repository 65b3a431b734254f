"""Tests for rolecall.data.split: a stable, order-preserving split by a hash of the example id."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rolecall.data import hash_split
from rolecall.data.split import hash_fraction
from rolecall.data.types import Example
from rolecall.errors import ConfigError


def examples(n: int, prefix: str = "q") -> list[Example]:
    return [Example(id=f"{prefix}{i}", question=f"Question {i}?", answers=["a"]) for i in range(n)]


def ids(part: list[Example]) -> list[str]:
    return [e.id for e in part]


def test_stable_across_calls_and_processes() -> None:
    data = examples(200)
    first, second = hash_split(data)
    again = hash_split(examples(200))
    assert (ids(again[0]), ids(again[1])) == (ids(first), ids(second))
    # Another interpreter (with another PYTHONHASHSEED) puts every id on the same side.
    code = "from rolecall.data.split import hash_fraction; print(repr(hash_fraction('q7', 'abc')))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "123"},
    )
    assert float(out.stdout) == hash_fraction("q7", "abc")


def test_fraction_roughly_honoured_on_1000_ids() -> None:
    # 1000 Bernoulli(0.8) draws: standard deviation sqrt(1000 * 0.8 * 0.2) ~ 12.6, so 800 +- 50 is ~4 sigma.
    first, second = hash_split(examples(1000), fraction=0.8)
    assert 750 <= len(first) <= 850 and len(first) + len(second) == 1000
    third, _ = hash_split(examples(1000), fraction=0.3)
    assert 250 <= len(third) <= 350


def test_disjoint_complete_and_order_preserved() -> None:
    data = examples(300)
    first, second = hash_split(data, fraction=0.5)
    assert not set(ids(first)) & set(ids(second))
    assert sorted(ids(first) + ids(second)) == sorted(ids(data))
    position = {e.id: i for i, e in enumerate(data)}
    assert [position[i] for i in ids(first)] == sorted(position[i] for i in ids(first))
    assert [position[i] for i in ids(second)] == sorted(position[i] for i in ids(second))


def test_side_depends_on_the_id_only() -> None:
    data = examples(100)
    first, _ = hash_split(data)
    reordered_first, _ = hash_split(list(reversed(data)) + examples(50, prefix="extra"))
    assert set(ids(first)) == {i for i in ids(reordered_first) if not i.startswith("extra")}


def test_salt_changes_the_split_and_edges_are_all_or_nothing() -> None:
    data = examples(200)
    assert ids(hash_split(data, salt="a")[0]) != ids(hash_split(data, salt="b")[0])
    assert hash_split(data, fraction=0.0) == ([], data)
    assert hash_split(data, fraction=1.0) == (data, [])
    assert hash_split([]) == ([], [])


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "0.8", None, True])
def test_bad_fraction_raises_config_error_naming_the_value(bad: object) -> None:
    with pytest.raises(
        ConfigError, match=r"fraction must be a number in \[0, 1\].*got " + repr(bad).replace(".", r"\.")
    ):
        hash_split(examples(3), fraction=bad)  # type: ignore[arg-type]
