"""Keep a long CPU decoding run's memory from creeping up: freed KV-cache buffers must not stay stuck in glibc's heap.

A continuous batcher allocates KV-cache buffers of ever different sizes (rows x cached tokens change at every
admission) and frees them minutes later. glibc serves anything under its *dynamic* mmap threshold (which climbs to
32 MiB after the first large free) from the main heap, and the heap can only shrink from its top: the holes freed
buffers leave below a live chunk stay resident. A 13-program comparison on SmolLM2-135M grew to 12.8 GiB resident in
9 minutes, almost all of it ``[heap]``. Two remedies, chosen by ``ROLECALL_MALLOC_TUNE``:

- ``trim`` (default): every few seconds the batcher calls ``malloc_trim(0)``, which hands the whole free pages inside
  those holes back to the system; allocation itself is unchanged.
- ``mmap``: pin the mmap threshold at 4 MiB, so every buffer that size or larger gets its own mapping, unmapped on
  free. Memory is lowest, but every large temporary (prefill activations, attention scores) then page-faults afresh.
- ``0`` / ``off``: leave malloc alone. Also the choice when ``MALLOC_MMAP_THRESHOLD_`` is set (the user tuned malloc)
  or the C library is not glibc.

``benchmarks/bench_memory.py`` measures the three on one request stream.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import platform
import threading
import time
from typing import Any, Literal

from rolecall.errors import ConfigError

__all__ = [
    "DEFAULT_MMAP_THRESHOLD",
    "HeapTrimmer",
    "heap_policy",
    "limit_heap_fragmentation",
    "pin_mmap_threshold",
    "resident_bytes",
    "trim_heap",
]

logger = logging.getLogger(__name__)

DEFAULT_MMAP_THRESHOLD = 4 << 20
"""Allocations of this many bytes or more are served by ``mmap`` once :func:`pin_mmap_threshold` has run."""

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
_OFF = {"0", "off", "false", "no", "none"}
_lock = threading.Lock()
_pinned: int | None = None


@functools.cache
def _glibc() -> Any:
    """glibc, or None off Linux/glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError as exc:
        logger.debug("cannot load the C library: %s", exc)
        return None


def heap_policy() -> Literal["trim", "mmap", "off"]:
    """The remedy ``ROLECALL_MALLOC_TUNE`` asks for (``trim`` when unset), or ``off`` where none applies.

    Raises:
        ConfigError: ``ROLECALL_MALLOC_TUNE`` holds something else.
    """
    value = os.environ.get("ROLECALL_MALLOC_TUNE", "trim").strip().lower()
    if value in _OFF:
        return "off"
    if value not in ("trim", "mmap"):
        raise ConfigError(f"ROLECALL_MALLOC_TUNE must be trim, mmap or 0, got {value!r}")
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or _glibc() is None:
        return "off"
    return value  # type: ignore[return-value]


def pin_mmap_threshold(threshold_bytes: int = DEFAULT_MMAP_THRESHOLD) -> bool:
    """Pin glibc's mmap threshold so allocations of ``threshold_bytes`` or more bypass the main heap (process-wide).

    Idempotent and thread-safe.

    Args:
        threshold_bytes: smallest allocation served by its own ``mmap`` (glibc caps this at 32 MiB).

    Returns:
        True when this threshold is in effect (now or from an earlier call); False when nothing was changed (not
        glibc, or ``mallopt`` refused).
    """
    global _pinned
    if threshold_bytes <= 0:
        raise ValueError(f"threshold_bytes must be positive, got {threshold_bytes}")
    with _lock:
        if _pinned is not None:
            return _pinned == threshold_bytes
        libc = _glibc()
        if libc is None:
            return False
        if not libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(threshold_bytes)):
            logger.warning("mallopt(M_MMAP_THRESHOLD, %d) was refused: heap fragmentation not limited", threshold_bytes)
            return False
        _pinned = threshold_bytes
        logger.debug("malloc serves allocations of %d bytes or more with mmap", threshold_bytes)
        return True


def trim_heap() -> bool:
    """Give the free pages inside glibc's heaps back to the system (``malloc_trim(0)``).

    Returns:
        True when some memory was released; False when none was, or off glibc.
    """
    libc = _glibc()
    return bool(libc.malloc_trim(ctypes.c_size_t(0))) if libc is not None else False


class HeapTrimmer:
    """Calls :func:`trim_heap` at most once every ``interval_s`` seconds; cheap to call on every decode step.

    Args:
        interval_s: least time between two trims.
    """

    def __init__(self, interval_s: float = 2.0) -> None:
        self.interval_s = interval_s
        self.trims = 0
        self._last = time.monotonic()

    def maybe_trim(self) -> bool:
        """Trim when ``interval_s`` has passed since the last trim; returns whether it trimmed."""
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return False
        trim_heap()
        self._last = time.monotonic()
        self.trims += 1
        return True


def limit_heap_fragmentation() -> HeapTrimmer | None:
    """Apply :func:`heap_policy`: pin the mmap threshold (``mmap``), or return the trimmer a batcher should call after
    each step (``trim``); None when the batcher has nothing to do.

    :class:`~rolecall.lm.backend.ModelBackend` calls it when it loads a model on the CPU.
    """
    policy = heap_policy()
    if policy == "mmap":
        pin_mmap_threshold()
    return HeapTrimmer() if policy == "trim" else None


def resident_bytes() -> dict[str, int]:
    """This process's resident memory now (``rss``) and at its peak (``peak``), in bytes; empty off Linux."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key = "rss" if line.startswith("VmRSS") else "peak"
                    out[key] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out
