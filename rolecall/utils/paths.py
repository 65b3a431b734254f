"""Checks of the output folders the CLI commands write into."""

from __future__ import annotations

from pathlib import Path

from rolecall.errors import ConfigError

__all__ = ["check_out_folder"]


def check_out_folder(out: Path, purpose: str) -> None:
    """Raise unless ``--out`` ``out`` is a folder or can become one: no file stands in its place or above it.

    Args:
        out: the ``--out`` path.
        purpose: what the command writes there, for the message (``"the run's records"``).

    Raises:
        ConfigError: ``out`` or one of its parents is a file (the message names which).

    Example:
        >>> import tempfile
        >>> file = Path(tempfile.mkstemp()[1])
        >>> check_out_folder(file / "run", "the run's records")
        Traceback (most recent call last):
        ...
        rolecall.errors.ConfigError: --out ... is a file, not a folder; pass a folder for the run's records
    """
    for path in (out, *out.parents):
        if path.exists():
            if not path.is_dir():
                raise ConfigError(f"--out {out}: {path} is a file, not a folder; pass a folder for {purpose}")
            return
