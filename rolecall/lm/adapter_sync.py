"""Keeping an inference engine's LoRA adapters in step with the ones a trainer updates locally.

Rollouts on a served model (``rolecall serve``, ``vllm serve --enable-lora``) or an offline vLLM engine read adapters
from files, while the trainer updates them in a local :class:`~rolecall.lm.backend.ModelBackend`. An
:class:`AdapterPublisher` listens to that backend (``add_update_listener``): whenever an adapter is created, loaded or
stepped, it writes the adapter to a fresh versioned folder and hands the folder to a ``publish(name, path)`` callback,
so the next rollout runs the weights of the last step. Folders of older versions are removed once a newer one is
published (a server may still be reading the newest).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["AdapterPublisher"]

logger = logging.getLogger(__name__)


class AdapterPublisher:
    """Writes each updated adapter of a backend to ``sync_dir/<name>/v<version>`` and publishes it.

    Args:
        backend: the local ``ModelBackend`` the trainer updates.
        publish: ``publish(name, path)`` makes the engine serve adapter ``name`` from ``path`` (it may raise; the
            failure is counted and logged, and the next update publishes again).
        sync_dir: where adapters are written; a temporary folder by default. A remote server must see the same path
            (same machine or shared storage).
        keep: versions kept per adapter (the newest ``keep``); at least 1.

    Attributes:
        stats: ``pushes``, ``push_failures``, ``push_s`` (seconds spent writing and publishing, in all) and
            ``last_push_s`` (the newest push's seconds: the cost of publishing one step's adapter).
    """

    def __init__(
        self,
        backend: Any,
        publish: Callable[[str, Path], None],
        *,
        sync_dir: str | Path | None = None,
        keep: int = 1,
    ) -> None:
        self.backend = backend
        self.publish = publish
        self._owns_dir = sync_dir is None
        self.sync_dir = Path(sync_dir) if sync_dir is not None else Path(tempfile.mkdtemp(prefix="rolecall-adapters-"))
        self.sync_dir.mkdir(parents=True, exist_ok=True)
        self.keep = max(1, int(keep))
        self.stats: dict[str, float] = {"pushes": 0.0, "push_failures": 0.0, "push_s": 0.0, "last_push_s": 0.0}
        self.published: dict[str, int] = {}  # adapter -> version the engine serves
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        backend.add_update_listener(self.push)

    def _lock(self, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(name, threading.Lock())

    def push(self, name: str) -> Path | None:
        """Write adapter ``name`` as it is now and publish it, unless this version is already published.

        Returns:
            The folder published, or None when nothing was (already current, or the publish failed).
        """
        with self._lock(name):
            version = self.backend.adapter_versions.get(name, 0)
            if self.published.get(name) == version:
                return None
            start = time.perf_counter()
            folder = self.sync_dir / _safe(name) / f"v{version}"
            try:
                self.backend.save_adapter(name, folder)
                self.publish(name, folder.resolve())
            except Exception:
                self.stats["push_failures"] += 1
                logger.exception("publishing adapter %r (version %d) failed; the next update retries", name, version)
                return None
            finally:
                self.stats["last_push_s"] = time.perf_counter() - start
                self.stats["push_s"] += self.stats["last_push_s"]
            self.published[name] = version
            self.stats["pushes"] += 1
            self._prune(name, keep=folder)
            logger.debug("published adapter %r version %d from %s", name, version, folder)
            return folder

    def _prune(self, name: str, keep: Path) -> None:
        versions = sorted(
            (p for p in (self.sync_dir / _safe(name)).glob("v*") if p.is_dir()),
            key=lambda p: int(p.name[1:]) if p.name[1:].isdigit() else -1,
        )
        for old in versions[: -self.keep]:
            if old != keep:
                shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        """Remove the sync folder when this publisher created it."""
        if self._owns_dir:
            shutil.rmtree(self.sync_dir, ignore_errors=True)


def _safe(name: str) -> str:
    """A folder name for an adapter name (adapter names are free text)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "_"
