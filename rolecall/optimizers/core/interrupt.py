"""Stopping a training loop cleanly on Ctrl-C.

While :class:`StopOnInterrupt` is active (the weight-optimizer loop, on the main thread), the first SIGINT only sets
``requested``: the step that runs finishes and writes its checkpoint, then the loop stops. A second SIGINT raises
``KeyboardInterrupt`` at once: that step is lost, the previous checkpoint is not. Either way the loop waits for the
model thread to finish what it runs (a training update or a decode step) and raises :class:`TrainingInterrupted`
naming the checkpoint that ``resume=True`` continues from.

Waiting matters: the model's forward and backward passes run on the LM's batcher thread, a daemon thread. A process
that exits while that thread is inside torch is killed mid-call by the interpreter's shutdown, which aborts it with
"terminate called without an active exception" (exit 134) instead of the interrupt's exit 130.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

__all__ = ["StopOnInterrupt", "TrainingInterrupted", "wait_for_model_thread"]

logger = logging.getLogger(__name__)


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C; ``resume=True`` continues from ``checkpoint``.

    Args:
        optimizer: The optimizer's class name.
        checkpoint: The last checkpoint written or resumed from (None: there is none).
        global_step: The global step that checkpoint was taken after (0 when there is none).
    """

    def __init__(self, optimizer: str, checkpoint: Path | None, global_step: int) -> None:
        where = f"its checkpoint {checkpoint} (global step {global_step})" if checkpoint else "no checkpoint yet"
        super().__init__(f"{optimizer} interrupted; resume=True continues from {where}")
        self.optimizer = optimizer
        self.checkpoint = checkpoint
        self.global_step = global_step


class StopOnInterrupt:
    """A context in which the first Ctrl-C asks the loop to stop after its running step (``requested``) and a second
    one raises ``KeyboardInterrupt``. Off the main thread, or when the program installed its own SIGINT handler, it
    changes nothing (Ctrl-C raises at once).

    Args:
        owner: Who stops (named in the warning the first Ctrl-C logs).

    Example:
        >>> with StopOnInterrupt("SFT") as interrupt:
        ...     while not interrupt.requested and train_one_step():  # doctest: +SKIP
        ...         pass
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> StopOnInterrupt:
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        logger.warning("Ctrl-C: %s stops after the running step and its checkpoint; press Ctrl-C again to stop now "
                       "(that step is lost)", self.owner)  # fmt: skip


def wait_for_model_thread(backend: Any) -> None:
    """Returns once ``backend``'s model thread finished what it was running (a no-op queued behind it has run); a
    further Ctrl-C stops the wait."""
    run = getattr(backend, "run_on_model_thread", None)
    if run is None:
        return
    try:
        run(lambda: None)
    except KeyboardInterrupt:
        logger.warning("stopped without waiting for the model thread")
