"""The ``metrics.jsonl`` of a training run: one flat JSON record per step, cut back to the checkpoint on resume.

Under several processes (:mod:`rolecall.optimizers.core.distributed`) only the main process writes the file; every
process can read it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rolecall.optimizers.core.distributed import is_main_process

__all__ = ["MetricsLog"]


class MetricsLog:
    """Appends step records to a JSONL file; on resume, drops those after the checkpoint's global step.

    Args:
        path: The ``metrics.jsonl`` file (its folder is created on the first append).

    Example:
        >>> log = MetricsLog(tmp_path / "metrics.jsonl")  # doctest: +SKIP
        >>> log.append({"global_step": 1, "loss/total": 2.5})  # doctest: +SKIP
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def append(self, record: Mapping[str, Any]) -> None:
        """Writes one record as one line (the main process only)."""
        if not is_main_process():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(dict(record)) + "\n")

    def read(self) -> list[dict[str, Any]]:
        """The complete records (a line a kill cut short is skipped)."""
        if not self.path.is_file():
            return []
        records = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records

    def truncate(self, global_step: int) -> None:
        """Keeps the records up to ``global_step`` (a run killed between its metrics line and its checkpoint wrote a
        line the resumed run writes again); rewritten atomically, by the main process only."""
        if not is_main_process() or not self.path.is_file():
            return
        kept = [r for r in self.read() if r.get("global_step", 0) <= global_step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
        tmp.replace(self.path)

    def clear(self) -> None:
        """Deletes the file (a fresh run; the main process only)."""
        if not is_main_process():
            return
        self.path.unlink(missing_ok=True)
