"""The run folder of ``rolecall compile``: what it may hold before a compile starts, what ``--resume`` continues,
what the compile reports at its end and on Ctrl-C.

A compile writes into OUT: ``compile_config.json`` (``settings``: the flags that define the training), then the
collected samples, ``metrics.jsonl``, a checkpoint after every step and, at the end, ``program.json`` with the
adapters. Before the data or the model load (after :mod:`rolecall.cli_compile_checks` checked the flags),
:func:`check_run_folder` refuses

* an ``--out`` that is a file, or lies under one;
* a folder holding a run, unless ``--resume`` continues it or ``--overwrite`` starts again; a folder compile did not
  write is never cleared;
* ``--resume`` with settings other than the saved ones (one line naming each differing flag with both values), or of
  a folder whose checkpoints are all damaged (the line names the damaged file).

What may differ on resume: ``--num-threads``, ``--served-url``, ``--no-progress`` and ``-v``. On Ctrl-C,
:func:`interrupted_message` names the step the last checkpoint holds and the command that continues it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shlex
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rolecall.errors import ConfigError
from rolecall.utils.paths import check_out_folder

__all__ = [
    "CONFIG_FILE",
    "check_run_folder",
    "compile_settings",
    "interrupted_message",
    "print_curves",
    "start_run_folder",
    "steps_per_adapter",
    "stop_model_thread",
]

logger = logging.getLogger("rolecall.cli")

CONFIG_FILE = "compile_config.json"
"""The file in OUT that records the settings of the compile that wrote it."""

# The command's own settings that define a compile, in the order of `rolecall compile --help`, and their flags; the
# optimizers' settings follow, one per config field (their flags generated, :mod:`rolecall.cli_fields`).
_FLAGS = {
    "program": "--program",
    "optimizer": "--optimizer",
    "from_dir": "--from",
    "dataset": "--dataset",
    "data_path": "--data-path",
    "seed": "--seed",
    "limit": "--limit",
    "k": "--k",
    "model": "--model",
    "option": "-o",
    "config": "--config",
}
# Config fields that may differ on --resume (or are set by the flags above): not part of the settings.
_NOT_SETTINGS = ("output_dir", "resume", "show_progress", "num_threads", "seed")


def _written() -> set[str]:
    """What compile writes into OUT: a folder holding one of these is a compile run --overwrite may clear."""
    from rolecall.optimizers.registry import optimizer_names

    return {CONFIG_FILE, "program.json", "metrics.jsonl", "samples.jsonl", "summary.json", "checkpoints", "adapters",
            "sft_config.json", "loss.png", "rewards.png", *optimizer_names()}  # fmt: skip


# ----------------------------------------------------------------------------------------------------- the settings
def compile_settings(args: argparse.Namespace, chain: Sequence[str], optimizers: Sequence[Any]) -> dict[str, Any]:
    """The settings that define this compile (``--resume`` must repeat them), as ``compile_config.json`` holds them:
    the command's flags (paths resolved, ``--config`` with its contents' digest) and, under ``"optimizers"``, every
    config field of each optimizer of the chain (the run settings that may change on resume left out)."""
    from rolecall.cli_common import DEFAULT_DATA_PATHS
    from rolecall.lm.embedded import DEFAULT_LM
    from rolecall.optimizers.registry import config_fields
    from rolecall.tuning.config_file import optimizer_config

    def resolved(path: Any) -> str | None:
        return None if path is None else str(Path(path).resolve())

    model = args.model or DEFAULT_LM
    config = getattr(args, "config", None)
    values = {name: getattr(args, name, None) for name in _FLAGS}
    values.update(
        optimizer=",".join(chain),
        from_dir=resolved(getattr(args, "from_dir", None)),
        data_path=None if args.dataset == "synthetic" else resolved(args.data_path or DEFAULT_DATA_PATHS[args.dataset]),
        model=resolved(model) if Path(model).exists() else model,
        option=sorted(args.option),
        config=None if config is None else {"path": resolved(config),
                                            "sha256": hashlib.sha256(Path(config).read_bytes()).hexdigest()},
    )  # fmt: skip
    values["optimizers"] = {
        name: {k: v for k, v in config_fields(optimizer_config(o)).items() if k not in _NOT_SETTINGS}
        for name, o in zip(chain, optimizers, strict=True)
    }
    return json.loads(json.dumps(values))  # as read back from the file (tuples become lists)


def _shown(name: str, value: Any, flag: str | None = None) -> str:
    """One setting as the flags that give it (``--epochs 2``, ``-o a=1 -o b=2``, ``(no --limit)``)."""
    flag = flag or _FLAGS.get(name, name)
    if value is None or value == []:
        return f"(no {flag})"
    if isinstance(value, float):
        return f"{flag} {value:g}"
    if isinstance(value, dict) and name == "config":
        return f"{flag} {value.get('path')} (sha256 {str(value.get('sha256'))[:12]})"
    if isinstance(value, dict):
        return f"{flag} {','.join(f'{k}={v}' for k, v in value.items())}"
    if name == "option":
        return " ".join(f"-o {v}" for v in value)
    if isinstance(value, list):
        return f"{flag} {','.join(map(str, value))}"
    return f"{flag} {value}"


# -------------------------------------------------------------------------------------------------- the run folder
def _entries(out: Path) -> list[str]:
    """The names in ``out`` (none when it does not exist), ``compile_config.json`` alone counting as none: a compile
    that stopped before writing anything else left nothing to lose."""
    names = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    return [] if names == [CONFIG_FILE] else names


def _listed(names: Sequence[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def check_run_folder(out: Path, settings: Mapping[str, Any], *, resume: bool, overwrite: bool) -> list[str]:
    """Checks that this compile may write to ``out`` (see the module docstring); writes nothing.

    Args:
        out: ``--out``.
        settings: this call's :func:`compile_settings`.
        resume: ``--resume`` was given.
        overwrite: ``--overwrite`` was given.

    Returns:
        What ``--resume`` continues from, one line per checkpoint folder (``resuming from DIR (step N)``).

    Raises:
        ConfigError: ``out`` is a file, holds a run this call may not write over, holds another compile, or all the
            checkpoints of one of its optimizers are damaged.
    """
    check_out_folder(out, "the compiled program and its checkpoints")
    names = _entries(out)
    ours = sorted(set(names) & _written())
    if not names:
        return [f"--resume: {out} holds no run yet; training starts afresh"] if resume else []
    if not ours:
        flag = "--overwrite would delete" if overwrite else "--out"
        raise ConfigError(f"{flag} {out}, which holds {_listed(names)} and no rolecall compile run; empty it "
                          "yourself or pick another --out")  # fmt: skip
    if overwrite:
        return []
    if not resume:
        raise ConfigError(f"{out} holds an earlier compile ({_listed(ours)}); pass --resume to continue it, "
                          "--overwrite to start again (its contents are deleted), or another --out")  # fmt: skip
    config = out / CONFIG_FILE
    if config.is_file():
        _check_same(out, config, settings)
    else:
        logger.warning("%s has no %s (an older rolecall wrote it): --resume cannot check that this call's settings "
                       "are the run's", out, CONFIG_FILE)  # fmt: skip
    return _resume_points(out)


def _check_same(out: Path, config: Path, settings: Mapping[str, Any]) -> None:
    try:
        saved = json.loads(config.read_text(encoding="utf-8"))["settings"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{config} is unreadable ({err}); pass --overwrite to start the run again") from None
    differ = [(n, None, saved.get(n), settings.get(n)) for n in _FLAGS if saved.get(n) != settings.get(n)]
    if not differ and "optimizers" not in saved:
        logger.warning("%s was compiled by an earlier rolecall, whose %s does not record the optimizers' settings: "
                       "--resume cannot check that this call's are the run's", out, CONFIG_FILE)  # fmt: skip
    elif not differ:  # the same chain: compare each optimizer's settings, named by their flags
        from rolecall.cli_fields import flag_of

        chain = list(settings.get("optimizers", {}))
        for position, name in enumerate(chain):
            old, new = (saved.get("optimizers") or {}).get(name, {}), settings["optimizers"][name]
            prefix = None if position == len(chain) - 1 else name
            differ += [(field, flag_of(field, prefix), old.get(field), new.get(field))
                       for field in new if old.get(field) != new.get(field)]  # fmt: skip
    if differ:
        was = " ".join(_shown(name, old, flag) for name, flag, old, _ in differ)
        now = " ".join(_shown(name, new, flag) for name, flag, _, new in differ)
        raise ConfigError(f"--resume: {out} was compiled with {was}; this call says {now}; pass the same settings, "
                          "or --overwrite to start again")  # fmt: skip


def _resume_points(out: Path) -> list[str]:
    from rolecall.optimizers.core.checkpoint import find_checkpoint, latest_checkpoint

    lines = []
    for root in sorted(p for p in out.rglob("checkpoints") if p.is_dir()):
        checkpoint, damaged = find_checkpoint(root)
        if checkpoint is None and damaged:
            raise ConfigError(f"--resume: {damaged[0]}, and no earlier checkpoint in {root} is intact; delete "
                              f"{latest_checkpoint(root)} to redo that training, or pass --overwrite to start "
                              "again")  # fmt: skip
        if checkpoint is not None:
            lines.append(f"resuming from {checkpoint.path} (step {checkpoint.state.get('global_step')})")
    return lines or [f"--resume: {out} holds no checkpoint yet; training starts at step 0 (collected samples are "
                     "reused)"]  # fmt: skip


def start_run_folder(out: Path, settings: Mapping[str, Any], *, overwrite: bool) -> None:
    """Clears ``out`` with ``overwrite`` (checked by :func:`check_run_folder`), creates it and writes
    ``compile_config.json``; the main process only."""
    if overwrite and out.is_dir():
        for path in out.iterdir():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{CONFIG_FILE}.tmp"
    tmp.write_text(json.dumps({"settings": dict(settings)}, indent=2) + "\n", encoding="utf-8")
    tmp.replace(out / CONFIG_FILE)


# --------------------------------------------------------------------------------------------- the report, Ctrl-C
def steps_per_adapter(optimizer: Any) -> dict[str, int]:
    """Optimizer steps per adapter: the whole run's (a resumed run's earlier steps too), else this process's."""
    steps: dict[str, int] = {}
    for r in optimizer.history:
        steps[r.get("adapter", r["stage"])] = r["step"]
    done = getattr(optimizer, "steps", None)
    if isinstance(done, dict) and not optimizer.history:  # resumed after its last step: nothing ran here
        steps = {name: n for name, n in done.items() if n}
    return steps


def stop_model_thread(lm: Any) -> None:
    """Lets the LM's model thread finish what it runs and stop, so the interrupted process exits cleanly (a daemon
    thread inside torch at exit aborts it: "terminate called without an active exception")."""
    batcher = getattr(getattr(lm, "backend", None), "batcher", None)
    if batcher is not None and hasattr(batcher, "close"):
        batcher.close()


def print_curves(args: argparse.Namespace, chain: list[str], rl: list[str], optimizers: list[Any]) -> None:
    """Prints the paths of the training curves that were written (plotting the RL rewards to OUT/rewards.png) and
    what an optimizer selected, when it reports a selection."""
    from rolecall.demo import plot_training_curve

    def show(label: str, path: Path) -> None:
        if path.is_file():
            print(f"{label}: {path}")

    for optimizer in optimizers:
        folder = Path(optimizer.config.output_dir) if optimizer.config.output_dir else args.out
        show("loss curve", folder / "loss.png")
        show("cold start loss curve", folder / "cold_start" / "loss.png")
        log = folder / "metrics.jsonl"
        first = log.read_text().split("\n", 1)[0] if log.is_file() else ""
        if '"reward/mean"' in first and plot_training_curve(log, args.out / "rewards.png"):
            show("reward curves", args.out / "rewards.png")
        selection = getattr(optimizer, "selection", None)
        if selection:
            print(f"selected samples: {selection} ({folder / 'selection.json'})")


def _newest_checkpoint(out: Path) -> tuple[Path | None, int]:
    """The checkpoint written last under ``out`` (any optimizer of a chain) and its global step."""
    from rolecall.optimizers.core.checkpoint import latest_checkpoint

    found = [c for r in out.rglob("checkpoints") if (c := latest_checkpoint(r)) is not None] if out.is_dir() else []
    if not found:
        return None, 0
    newest = max(found, key=lambda c: (c / "state.json").stat().st_mtime)
    try:
        return newest, int(json.loads((newest / "state.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return newest, int(newest.name.split("-")[-1])


def interrupted_message(args: argparse.Namespace, argv: Sequence[str], error: BaseException) -> str:
    """What an interrupted ``rolecall compile`` prints: the step its last checkpoint holds and the command that
    continues it (``argv`` with ``--resume``; ``error`` is a ``TrainingInterrupted`` when training was running)."""
    checkpoint, step = getattr(error, "checkpoint", None), getattr(error, "global_step", 0)
    if checkpoint is None:
        checkpoint, step = _newest_checkpoint(args.out)
    again = [a for a in argv if a != "--overwrite"]
    if checkpoint is None and not _entries(args.out):
        return f"rolecall compile: interrupted before it wrote anything; start again with: rolecall {shlex.join(again)}"
    command = f"rolecall {shlex.join(again if '--resume' in again else [*again, '--resume'])}"
    if checkpoint is None:
        return (
            f"rolecall compile: interrupted before the first checkpoint (no step trained yet); continue with: {command}"
        )
    return (
        f"rolecall compile: interrupted; training is saved up to step {step} in {checkpoint}; continue with: {command}"
    )
