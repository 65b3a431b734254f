"""OnceMemo: one computation per key across threads, waiting callers share it, a failed computation is forgotten."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rolecall.programs.core.memo import OnceMemo


def test_concurrent_callers_of_one_key_share_one_computation():
    memo: OnceMemo[int] = OnceMemo()
    calls = []
    lock = threading.Lock()

    def compute() -> int:
        with lock:
            calls.append(1)
        time.sleep(0.05)  # the other callers arrive while this one is in flight
        return 42

    with ThreadPoolExecutor(8) as pool:
        values = list(pool.map(lambda _: memo.get("k", compute), range(8)))
    assert values == [42] * 8 and len(calls) == 1
    assert (memo.misses, memo.hits, len(memo)) == (1, 7, 1)
    assert memo.get("other", lambda: 7) == 7 and memo.misses == 2


def test_a_failed_computation_is_forgotten():
    memo: OnceMemo[int] = OnceMemo()

    def fail() -> int:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        memo.get("k", fail)
    assert len(memo) == 0 and memo.get("k", lambda: 3) == 3
