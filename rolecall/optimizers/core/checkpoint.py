"""Atomic training checkpoints: adapters, optimizer states, RNG states and the loop's position, written every step.

A checkpoint is one directory ``<root>/step-00000012/`` holding

- ``adapters/<name>/``: each trained adapter in PEFT format (``ModelBackend.save_adapter``);
- ``trainers/<stage>.pt``: each stage's ``AdapterTrainer.state_dict()`` (AdamW moments, step count);
- ``rng.pt``: the RNG states of Python's ``random``, NumPy, torch (and CUDA when present) plus the optimizer's own
  ``random.Random``;
- ``state.json``: the loop's state (stage, steps per stage, sample-stream positions, elapsed seconds, ...).

A step changes one adapter and one trainer, so the writer is told which (``fresh_adapters``, ``fresh_trainers``) and
hard-links the others' files from the previous checkpoint instead of writing them again: with OPERA's four adapters a
checkpoint writes ~15 MB instead of ~57 MB (``benchmarks/bench_checkpoint.py``). Checkpoints of the older one-file
layout (``trainers.pt`` holding trainers and RNG states) still load.

It is written into a hidden temporary directory beside the final one and renamed into place, so a run killed at any
moment (SIGKILL included) leaves either the previous checkpoint or the new one, never half of one. A write that fails
(a full disk) deletes its temporary directory and raises :class:`TrainingWriteError` naming the folder, with the
previous checkpoint intact. Only the last ``keep`` checkpoints are kept.

Loading checks every file of the newest checkpoint (the JSON state, each adapter's config and safetensors header, the
trainer and RNG files); a damaged one is skipped with a warning naming the file, for the newest intact checkpoint
before it. When none is intact, the error names the damaged file.

Under several processes (:mod:`rolecall.optimizers.core.distributed`; their adapters and optimizer states are
identical) only the main process writes, after all of them reached the same step, and every process resumes from
the same checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import shutil
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import numpy as np
import torch

from rolecall.errors import ConfigError, ModelLoadError, RolecallError
from rolecall.lm.adapter_files import check_adapter_folder
from rolecall.optimizers.core.distributed import barrier, is_main_process

__all__ = [
    "Checkpoint",
    "TrainingWriteError",
    "find_checkpoint",
    "latest_checkpoint",
    "load_checkpoint",
    "rng_state",
    "save_checkpoint",
    "seed_everything",
    "set_rng_state",
]

logger = logging.getLogger(__name__)

_PREFIX = "step-"
_TMP_PREFIX = ".tmp-"
_UNREADABLE = (OSError, ValueError, RuntimeError, KeyError, EOFError, pickle.UnpicklingError, ModelLoadError)
"""What reading a damaged checkpoint file raises (truncated zip or pickle, bad JSON, a missing file)."""


class TrainingWriteError(RolecallError, OSError):
    """A training run could not write its checkpoint or metrics (a full disk, a read-only folder); the message names
    the folder and the OS error, and the previous checkpoint is intact."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: where it lies, the loop state, the trainer states and the RNG states."""

    path: Path
    """The checkpoint directory (``<root>/step-XXXXXXXX``)."""
    state: dict[str, Any]
    """The JSON loop state given to :func:`save_checkpoint`."""
    trainers: dict[str, dict[str, Any]]
    """Stage name -> ``AdapterTrainer.state_dict()``."""
    rng: dict[str, Any]
    """What :func:`rng_state` returned when the checkpoint was written."""

    @property
    def adapters(self) -> list[str]:
        """Names of the adapters saved in the checkpoint."""
        folder = self.path / "adapters"
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if (p / "adapter_config.json").is_file())

    def restore(self, backend: Any, generator: random.Random | None = None) -> None:
        """Loads the saved adapters into ``backend`` (replacing those of the same name) and sets the RNG states
        (``generator`` gets the optimizer's own saved RNG state).

        Create the ``AdapterTrainer`` s only afterwards: loading an adapter replaces its parameter tensors.
        """
        for name in self.adapters:
            backend.load_adapter(name, self.path / "adapters" / name)
        set_rng_state(self.rng, generator)


def rng_state(generator: random.Random | None = None) -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's global RNGs (CUDA's too when available) and of ``generator``."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if generator is not None:
        state["generator"] = generator.getstate()
    return state


def set_rng_state(state: Mapping[str, Any], generator: random.Random | None = None) -> None:
    """Restores what :func:`rng_state` returned (``generator`` gets the saved generator state, if any)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if generator is not None and "generator" in state:
        generator.setstate(state["generator"])


def seed_everything(seed: int | str) -> None:
    """Seeds Python's, NumPy's and torch's global RNGs (a string seed is hashed to an integer deterministically)."""
    value = seed if isinstance(seed, int) else random.Random(seed).randrange(2**31)
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)


def save_checkpoint(
    root: str | Path,
    step: int,
    *,
    backend: Any,
    adapters: list[str],
    trainers: Mapping[str, Any],
    state: Mapping[str, Any],
    generator: random.Random | None = None,
    keep: int = 1,
    fresh_adapters: Collection[str] | None = None,
    fresh_trainers: Collection[str] | None = None,
) -> Path:
    """Writes checkpoint ``step`` atomically (temporary directory, then rename) and prunes older ones.

    Every process calls it; under several processes the main one writes once all of them got here (none is still
    reading the checkpoint it resumed from, nor deleting the old ones of a fresh start), and the others only return
    the path.

    Args:
        root: The directory holding the checkpoints.
        step: The global step count the checkpoint was taken after (names the directory).
        backend: The ``ModelBackend`` holding the adapters.
        adapters: The adapters to save (those trained so far).
        trainers: Stage name -> ``AdapterTrainer`` (its ``state_dict()`` is saved).
        state: The JSON-serializable loop state.
        generator: The optimizer's own RNG, saved with the global ones.
        keep: How many of the newest checkpoints to keep (>= 1).
        fresh_adapters: The adapters changed since the newest checkpoint under ``root`` (None: all of them); the
            others are hard-linked from it when it holds them, and written otherwise.
        fresh_trainers: The same for the trainer states (stage names).

    Returns:
        The checkpoint directory.

    Raises:
        ConfigError: If ``keep`` is below 1.
    """
    if keep < 1:
        raise ConfigError(f"keep must be >= 1 (the checkpoint just written); got {keep}.")
    root = Path(root)
    final = root / f"{_PREFIX}{step:08d}"
    barrier()
    if not is_main_process():
        return final
    previous = latest_checkpoint(root)
    tmp = root / f"{_TMP_PREFIX}{final.name}-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _write(tmp, previous, backend=backend, adapters=adapters, trainers=trainers, state=state, generator=generator,
               fresh_adapters=fresh_adapters, fresh_trainers=fresh_trainers)  # fmt: skip
        _move_into_place(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # never leave half a checkpoint behind
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint was written"
        raise TrainingWriteError(
            f"could not write checkpoint {final} ({exc}); {kept}: free space (or fix the folder), then resume the run "
            "(rolecall compile ... --resume, or resume=True)"
        ) from exc
    _prune(root, keep)
    return final


def _write(
    tmp: Path,
    previous: Path | None,
    *,
    backend: Any,
    adapters: list[str],
    trainers: Mapping[str, Any],
    state: Mapping[str, Any],
    generator: random.Random | None,
    fresh_adapters: Collection[str] | None,
    fresh_trainers: Collection[str] | None,
) -> None:
    """Writes the checkpoint's files into ``tmp``, linking the unchanged ones from ``previous``."""
    for name in adapters:
        old = _unchanged(previous, Path("adapters", name), name, fresh_adapters)
        if old is None or not _link_tree(old, tmp / "adapters" / name, "adapter_config.json"):
            backend.save_adapter(name, tmp / "adapters" / name)
    (tmp / "trainers").mkdir()
    for name, trainer in trainers.items():
        part = Path("trainers", f"{quote(name, safe='')}.pt")
        old = _unchanged(previous, part, name, fresh_trainers)
        if old is None or not _link_file(old, tmp / part):
            torch.save(trainer.state_dict(), tmp / part)
    torch.save(rng_state(generator), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps(dict(state), indent=1))


def _move_into_place(tmp: Path, final: Path) -> None:
    """Renames ``tmp`` to ``final``; a ``final`` already there (a resumed run re-took its step) is moved aside first
    and put back if the rename fails."""
    if not final.exists():
        os.replace(tmp, final)  # atomic on POSIX: readers see the old set of checkpoints or the new one
        return
    aside = final.with_name(f"{_TMP_PREFIX}old-{final.name}-{os.getpid()}")
    os.replace(final, aside)
    try:
        os.replace(tmp, final)
    except OSError:
        os.replace(aside, final)
        raise
    shutil.rmtree(aside, ignore_errors=True)


def _unchanged(previous: Path | None, part: Path, name: str, fresh: Collection[str] | None) -> Path | None:
    """``part`` of the previous checkpoint when ``name`` is not in ``fresh`` (what changed since it), else None."""
    if previous is None or fresh is None or name in fresh:
        return None
    return previous / part


def _link_file(source: Path, target: Path) -> bool:
    """Hard-links ``source`` to ``target`` (a copy where links are not possible); False when ``source`` is missing."""
    if not source.is_file():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
    return True


def _link_tree(source: Path, target: Path, marker: str) -> bool:
    """Links every file of folder ``source`` into ``target``; False (nothing linked) when ``source/marker`` is
    missing."""
    if not (source / marker).is_file():
        return False
    for path in source.iterdir():
        if path.is_file():
            _link_file(path, target / path.name)
    return True


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint directory under ``root`` (not checked for damage; see :func:`find_checkpoint`),
    or None."""
    done = _complete(Path(root))
    return done[-1] if done else None


def _complete(root: Path) -> list[Path]:
    """The complete checkpoint directories under ``root``, oldest first."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.name.startswith(_PREFIX) and (p / "state.json").is_file())


def _read(path: Path) -> Checkpoint:
    """Reads and checks every file of checkpoint ``path``.

    Raises:
        ConfigError: a file is damaged or missing; the message names it.
    """

    def load(file: Path, read: Any) -> Any:
        try:
            return read(file)
        except _UNREADABLE as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"{file} is unreadable ({reason})") from None

    state = load(path / "state.json", lambda f: json.loads(f.read_text()))
    if not isinstance(state, dict):
        raise ConfigError(f"{path / 'state.json'} is unreadable (not a JSON object)")
    folder = path / "adapters"
    for adapter in sorted(folder.iterdir()) if folder.is_dir() else []:
        try:
            check_adapter_folder(adapter)
        except ModelLoadError as exc:
            raise ConfigError(str(exc).split("; ")[0]) from None
    if (path / "trainers.pt").is_file():  # the older one-file layout
        # our own files: the RNG states need pickle
        payload = load(path / "trainers.pt", lambda f: torch.load(f, weights_only=False))
        trainers, rng = load(path / "trainers.pt", lambda _: (payload["trainers"], payload["rng"]))
    else:
        trainers = {unquote(f.stem): load(f, lambda f: torch.load(f, weights_only=False))
                    for f in sorted((path / "trainers").glob("*.pt"))}  # fmt: skip
        rng = load(path / "rng.pt", lambda f: torch.load(f, weights_only=False))
    return Checkpoint(path=path, state=state, trainers=trainers, rng=rng)


def find_checkpoint(root: str | Path) -> tuple[Checkpoint | None, list[str]]:
    """The newest intact checkpoint under ``root`` (None when there is none) and what is wrong with each newer, damaged
    one (a line naming the file); logs nothing.

    Example:
        >>> checkpoint, damaged = find_checkpoint("runs/opera-sft/checkpoints")  # doctest: +SKIP
    """
    damaged: list[str] = []
    for path in reversed(_complete(Path(root))):
        try:
            return _read(path), damaged
        except ConfigError as exc:
            damaged.append(str(exc))
    return None, damaged


def load_checkpoint(root: str | Path) -> Checkpoint | None:
    """Reads the newest intact checkpoint under ``root`` (None when there is none); call :meth:`Checkpoint.restore`
    next. A damaged newer checkpoint is skipped with a warning naming its damaged file.

    Raises:
        ConfigError: If no checkpoint under ``root`` is intact (the message names the newest one's damaged file).
    """
    checkpoint, damaged = find_checkpoint(root)
    if checkpoint is None and damaged:
        newest = _complete(Path(root))[-1]
        raise ConfigError(
            f"Checkpoint {newest} is unreadable: {damaged[0]}; no earlier checkpoint is intact: delete it to start "
            "this training afresh"
        )
    for problem in damaged:
        logger.warning("Skipping a damaged checkpoint: %s; resuming from %s", problem, checkpoint.path)
    if checkpoint is not None:
        logger.info("Loaded checkpoint %s", checkpoint.path)
    return checkpoint


def _prune(root: Path, keep: int) -> None:
    """Deletes all but the newest ``keep`` checkpoints and any temporary directory a killed write left behind."""
    for p in root.iterdir():
        if p.name.startswith(_TMP_PREFIX):
            shutil.rmtree(p, ignore_errors=True)
    done = sorted(p for p in root.iterdir() if p.name.startswith(_PREFIX))
    for p in done[:-keep]:
        shutil.rmtree(p, ignore_errors=True)
