"""The request batcher gathers concurrent calls into shared batches and isolates failures."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from rolecall.lm.batching import RequestBatcher
from rolecall.lm.generation import Completion, GenerationRequest


def _echo(requests):
    return [
        [Completion(text=str(r.prompt_ids[0]), token_ids=[r.prompt_ids[0]], finish_reason="stop")] * r.n
        for r in requests
    ]


def test_concurrent_requests_share_batches():
    seen: list[int] = []
    lock = threading.Lock()

    def run(requests):
        with lock:
            seen.append(len(requests))
        return _echo(requests)

    batcher = RequestBatcher(run, max_batch_rows=64, max_wait_ms=50)
    with ThreadPoolExecutor(16) as pool:
        outs = list(pool.map(lambda i: batcher.generate(GenerationRequest([i])), range(16)))
    batcher.close()
    assert [o[0].text for o in outs] == [str(i) for i in range(16)]  # every caller gets its own answer
    assert max(seen) > 1  # at least one batch merged several callers
    assert batcher.stats.requests == 16 and batcher.stats.batches == len(seen)


def test_row_cap_splits_batches():
    sizes: list[int] = []

    def run(requests):
        sizes.append(sum(r.n for r in requests))
        return _echo(requests)

    batcher = RequestBatcher(run, max_batch_rows=4, max_wait_ms=30)
    futures = [batcher.submit(GenerationRequest([i], n=2)) for i in range(5)]
    assert [len(f.result()) for f in futures] == [2] * 5
    batcher.close()
    assert max(sizes) <= 4


def test_failure_reaches_caller_and_batcher_keeps_serving():
    calls = {"n": 0}

    def run(requests):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return _echo(requests)

    batcher = RequestBatcher(run, max_wait_ms=1)
    with pytest.raises(RuntimeError, match="boom"):
        batcher.generate(GenerationRequest([1]))
    assert batcher.generate(GenerationRequest([2]))[0].text == "2"
    batcher.close()
    with pytest.raises(RuntimeError):
        batcher.submit(GenerationRequest([3]))


def test_invalid_cap():
    with pytest.raises(ValueError, match="max_batch_rows"):
        RequestBatcher(_echo, max_batch_rows=0)


def test_call_runs_on_the_worker_thread_and_raises_in_the_caller():
    batcher = RequestBatcher(_echo, max_wait_ms=1)
    assert batcher.call(lambda: threading.current_thread().name) == "rolecall-batcher"
    with pytest.raises(ZeroDivisionError):
        batcher.call(lambda: 1 / 0)
    assert batcher.generate(GenerationRequest([7]))[0].text == "7"  # a failed call does not stop the worker
    batcher.close()
    assert batcher.call(lambda: threading.current_thread().name) == threading.current_thread().name  # closed: inline


def test_a_call_waits_its_turn_behind_queued_requests():
    gate = threading.Event()

    def run(requests):
        gate.wait(5)
        return _echo(requests)

    batcher = RequestBatcher(run, max_batch_rows=1, max_wait_ms=1)
    first = batcher.submit(GenerationRequest([1]))
    second = batcher.submit(GenerationRequest([2]))
    with ThreadPoolExecutor(1) as pool:
        called = pool.submit(batcher.call, lambda: second.done())
        gate.set()
        assert called.result(timeout=5) is True  # queued after the second request, it ran after that one was answered
    assert first.result()[0].text == "1" and second.result()[0].text == "2"
    batcher.close()
