"""A thread-safe compute-once table: each key's value is computed by the first caller; callers that ask for a key
while it is being computed wait for that computation instead of repeating it.

MAPGRPO's plan stage executes a dozen candidate plans of the same questions at once, and candidates often share
sub-goals ("Who directed Krobrend's Hollow?"). With the downstream agents frozen a sub-goal's outcome depends only on
its filled-in text, so :meth:`rolecall.programs.OPERA.execute_plan` solves each distinct sub-goal once through a
:class:`OnceMemo`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Generic, TypeVar

__all__ = ["OnceMemo"]

V = TypeVar("V")


class OnceMemo(Generic[V]):
    """``memo.get(key, compute)``: ``compute()``'s value for ``key``, computed at most once across threads.

    A computation that raises is forgotten (every waiting caller gets the exception; the next caller computes again).
    ``hits`` counts the calls answered without computing, in-flight waits included; ``misses`` the computations.

    Example:
        >>> memo = OnceMemo()
        >>> memo.get("a", lambda: 1), memo.get("a", lambda: 2), (memo.hits, memo.misses)
        (1, 1, (1, 1))
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[Hashable, Future[V]] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._futures)

    def get(self, key: Hashable, compute: Callable[[], V]) -> V:
        """The value of ``key``: from the table, from a computation in flight, or by calling ``compute`` now."""
        with self._lock:
            future = self._futures.get(key)
            owner = future is None
            if owner:
                future = self._futures[key] = Future()
                self.misses += 1
            else:
                self.hits += 1
        if owner:
            try:
                future.set_result(compute())
            except BaseException as err:
                with self._lock:
                    del self._futures[key]
                future.set_exception(err)
                raise
        return future.result()
