"""A request batcher: concurrent generation calls from many threads become one padded forward pass.

Each caller submits a :class:`~rolecall.lm.generation.GenerationRequest` and blocks on a future. One worker thread
takes whatever is queued, waits up to ``max_wait_ms`` for more (so calls issued together by a thread pool land in the
same batch), caps the batch at ``max_batch_rows`` sample rows, and runs them through
:func:`~rolecall.lm.generation.generate_batch`. Requests of different LoRA adapters share a batch.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from rolecall.lm.generation import Completion, GenerationRequest

T = TypeVar("T")

__all__ = ["QueueBatcher", "RequestBatcher", "BatcherStats"]

logger = logging.getLogger(__name__)


@dataclass
class BatcherStats:
    """Counters of what the batcher did (for benchmarks and logs)."""

    batches: int = 0
    requests: int = 0
    rows: int = 0
    max_rows: int = 0

    @property
    def mean_rows(self) -> float:
        """Mean number of sample rows per forward batch."""
        return self.rows / self.batches if self.batches else 0.0


@dataclass
class _Call:
    """A function queued by :meth:`QueueBatcher.call`, to run on the worker thread."""

    fn: Callable[[], Any]
    future: Future

    def run(self) -> None:
        try:
            self.future.set_result(self.fn())
        except BaseException as exc:  # noqa: BLE001 - the caller re-raises it; the worker keeps serving
            self.future.set_exception(exc)


class QueueBatcher:
    """What both batchers share: a queue of ``(request, future)`` pairs, one worker thread running ``_loop``, and the
    ``submit`` / ``generate`` / ``call`` / ``close`` API the LM calls. Subclasses set their state, then call
    ``_start``, and read the queue through ``_get``."""

    def __init__(self, *, max_batch_rows: int, max_wait_ms: float) -> None:
        if max_batch_rows < 1:
            raise ValueError(f"max_batch_rows must be >= 1, got {max_batch_rows}")
        self.max_batch_rows = max_batch_rows
        self.max_wait_s = max_wait_ms / 1000.0
        self._queue: queue.Queue[tuple[GenerationRequest, Future] | None] = queue.Queue()
        self._closed = False
        self._thread: threading.Thread | None = None

    def _start(self, name: str) -> None:
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        raise NotImplementedError

    def _get(self, block: bool = True, timeout: float | None = None) -> tuple[GenerationRequest, Future] | None:
        """The next request (or the close signal, None) from the queue, as ``queue.Queue.get`` (``queue.Empty``
        when there is none in time). Functions queued by :meth:`call` run here, on the worker thread, as they come."""
        while True:
            item = self._queue.get(block, timeout)
            if not isinstance(item, _Call):
                return item
            item.run()

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the worker thread, between two batches (or decode steps), and return what it returns.

        Trainers run their updates through here so that every forward and backward pass of the model happens on one
        thread. PyTorch's CPU thread pool (OpenMP) belongs to the thread that calls it, so parallel work on a second
        thread leaves the process a second pool; with more pool threads than cores (most likely through libgomp's
        shortened barrier spinning, not confirmed) generation after a training step ran ~2x slower on 2 cores
        (decode step 225 -> 508 ms, measured with a forward + backward pass on the main thread between two
        evaluations; ``benchmarks/bench_model_thread.py``).

        Raises:
            BaseException: Whatever ``fn`` raised (re-raised in the calling thread).
        """
        thread = self._thread
        if thread is None or thread is threading.current_thread() or self._closed or not thread.is_alive():
            return fn()
        future: Future = Future()
        self._queue.put(_Call(fn, future))  # type: ignore[arg-type]
        return future.result()

    def submit(self, request: GenerationRequest) -> Future:
        """Queue one request; the returned future resolves to its list of ``n`` completions."""
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        fut: Future = Future()
        self._queue.put((request, fut))
        return fut

    def generate(self, request: GenerationRequest) -> list[Completion]:
        """Submit and wait (the call a DSPy thread makes)."""
        return self.submit(request).result()

    def close(self, timeout: float = 600.0) -> None:
        """Stop the worker once the queued work is done."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            if self._thread is not None:
                self._thread.join(timeout=timeout)


class RequestBatcher(QueueBatcher):
    """Gathers generation requests from many threads into batches run by one worker thread.

    Args:
        run_batch: runs a list of requests and returns their completions (one list per request).
        max_batch_rows: most sample rows (sum of ``n``) in one batch; a single larger request runs alone.
        max_wait_ms: how long the worker waits for more requests after the first one arrives.

    Example:
        >>> b = RequestBatcher(lambda reqs: [[Completion("x", [1], "stop")] * r.n for r in reqs])
        >>> b.submit(GenerationRequest(prompt_ids=[1, 2], n=2)).result()[0].text
        'x'
        >>> b.close()
    """

    def __init__(
        self,
        run_batch: Callable[[Sequence[GenerationRequest]], list[list[Completion]]],
        *,
        max_batch_rows: int = 32,
        max_wait_ms: float = 15.0,
    ) -> None:
        super().__init__(max_batch_rows=max_batch_rows, max_wait_ms=max_wait_ms)
        self._run_batch = run_batch
        self._pending: tuple[GenerationRequest, Future] | None = None
        self.stats = BatcherStats()
        self._start("rolecall-batcher")

    def _collect(self) -> list[tuple[GenerationRequest, Future]] | None:
        first = self._pending or self._get()
        self._pending = None
        if first is None:
            return None
        batch = [first]
        rows = first[0].n
        deadline = time.monotonic() + self.max_wait_s
        while rows < self.max_batch_rows:
            timeout = deadline - time.monotonic()
            try:
                item = self._get(timeout=max(timeout, 0)) if timeout > 0 else self._get(block=False)
            except queue.Empty:
                break
            if item is None:
                self._queue.put(None)  # re-deliver the close signal after this batch
                break
            if rows + item[0].n > self.max_batch_rows:
                self._pending = item
                break
            batch.append(item)
            rows += item[0].n
        return batch

    def _loop(self) -> None:
        while True:
            batch = self._collect()
            if batch is None:
                return
            requests = [r for r, _ in batch]
            rows = sum(r.n for r in requests)
            self.stats.batches += 1
            self.stats.requests += len(requests)
            self.stats.rows += rows
            self.stats.max_rows = max(self.stats.max_rows, rows)
            try:
                results = self._run_batch(requests)
            except BaseException as exc:  # hand the failure to every waiting caller, keep serving
                logger.exception("generation batch of %d requests failed", len(requests))
                for _, fut in batch:
                    fut.set_exception(exc)
                continue
            for (_, fut), res in zip(batch, results, strict=True):
                fut.set_result(res)
