"""A stable train/held-out split of any example list, decided by a hash of each example's id.

Unlike a shuffled split, an example's side depends on its id alone (and the salt): it stays put when examples are
added, removed or reordered, across runs, machines and Python processes (``hashlib``, not the salted built-in
``hash``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from rolecall.data.types import Example
from rolecall.errors import ConfigError

__all__ = ["hash_split", "hash_fraction"]

_SCALE = float(2**64)


def hash_fraction(example_id: str, salt: str = "") -> float:
    """A number in ``[0, 1)`` fixed by ``(salt, example_id)``: the first 8 bytes of their SHA-256, over ``2**64``.

    Example:
        >>> hash_fraction("q1") == hash_fraction("q1") and 0.0 <= hash_fraction("q1") < 1.0
        True
    """
    digest = hashlib.sha256(f"{salt}\x00{example_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / _SCALE


def hash_split(
    examples: Sequence[Example], fraction: float = 0.8, salt: str = ""
) -> tuple[list[Example], list[Example]]:
    """Split ``examples`` into ``(first, second)`` by a hash of each id: ``first`` gets those whose
    :func:`hash_fraction` is below ``fraction``, so about ``fraction`` of them, each side in input order.

    Naive equivalent: ``random.Random(seed).shuffle`` then cut, except that each example's side depends only on its
    id and ``salt``. Examples with the same id land on the same side.

    Args:
        examples: the examples to split.
        fraction: the expected share of ``first``, in ``[0, 1]`` (0 puts everything in ``second``, 1 in ``first``).
        salt: any string; a different salt gives a different, equally stable split.

    Returns:
        ``(first, second)``: disjoint, together all of ``examples``, each in the order of ``examples``.

    Raises:
        ConfigError: ``fraction`` is not a number in ``[0, 1]``.

    Example:
        >>> from rolecall.data.types import Example
        >>> data = [Example(id=f"q{i}", question="?", answers=["a"]) for i in range(100)]
        >>> train, dev = hash_split(data, fraction=0.8)
        >>> len(train) + len(dev), hash_split(data, fraction=0.8) == (train, dev)
        (100, True)
    """
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0.0 <= fraction <= 1.0:
        raise ConfigError(
            f"fraction must be a number in [0, 1] (the share of examples in the first part), got {fraction!r}; "
            "pass e.g. fraction=0.8 for an 80/20 split"
        )
    first: list[Example] = []
    second: list[Example] = []
    for example in examples:
        (first if hash_fraction(str(example.id), salt) < fraction else second).append(example)
    return first, second
