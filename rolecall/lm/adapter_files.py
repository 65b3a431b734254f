"""Integrity checks of a PEFT adapter folder, run before PEFT or torch touch it.

A LoRA adapter on disk is ``adapter_config.json`` plus ``adapter_model.safetensors``. A run killed while copying, a
full disk or a hand-edited config leave a folder that PEFT reads with a long traceback (or, for a truncated
safetensors file, an error that blames the PEFT version). :func:`check_adapter_folder` reads only the config and the
safetensors *header* (a few kB, no tensor data) and raises :class:`~rolecall.errors.ModelLoadError` with one line
naming the damaged file and what to do.

The safetensors layout: 8 bytes little-endian header length N, N bytes of JSON header (tensor name -> dtype, shape,
``data_offsets`` into the data area), then the data area, whose length is the largest end offset.

Example:
    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> check_adapter_folder(folder)
    Traceback (most recent call last):
    ...
    rolecall.errors.ModelLoadError: ... holds no PEFT adapter (adapter_config.json is missing); ...
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from rolecall.errors import ModelLoadError

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "check_adapter_folder", "check_safetensors_file"]

ADAPTER_CONFIG = "adapter_config.json"
"""The PEFT config file of an adapter folder."""
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
"""The weight files PEFT reads, in its order of preference."""

_MAX_HEADER = 100 * 1024 * 1024  # safetensors refuses headers above 100 MB too


def check_safetensors_file(path: Path) -> None:
    """Checks that ``path`` is a complete safetensors file: a readable header whose tensors fit the file exactly.

    Raises:
        ModelLoadError: the file is empty, truncated, padded or its header is not valid JSON (the message names it).
    """
    size = path.stat().st_size
    fix = "re-save it, or train the adapter again"
    if size < 8:
        raise ModelLoadError(f"{path} is damaged: {size} bytes, too short for a safetensors file; {fix}")
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > _MAX_HEADER or 8 + header_len > size:
            raise ModelLoadError(
                f"{path} is damaged: its header claims {header_len} bytes but the file has {size} (truncated?); {fix}"
            )
        try:
            header = json.loads(f.read(header_len).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ModelLoadError(f"{path} is damaged: its safetensors header is not JSON ({err}); {fix}") from None
    if not isinstance(header, dict):
        raise ModelLoadError(f"{path} is damaged: its safetensors header is not a JSON object; {fix}")
    end = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        offsets = meta.get("data_offsets") if isinstance(meta, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise ModelLoadError(f"{path} is damaged: tensor {name!r} has no valid data_offsets; {fix}")
        end = max(end, offsets[1])
    if 8 + header_len + end != size:
        raise ModelLoadError(
            f"{path} is damaged: its tensors need {8 + header_len + end} bytes but the file has {size} "
            f"({'truncated' if size < 8 + header_len + end else 'trailing bytes'}); {fix}"
        )


def check_adapter_folder(path: str | Path) -> Path:
    """Checks a PEFT adapter folder before it is loaded: a JSON-object ``adapter_config.json`` naming a LoRA
    (``peft_type``, ``r``) and a complete weight file.

    Returns:
        The folder as a :class:`~pathlib.Path`.

    Raises:
        ModelLoadError: the folder, its config or its weights are missing or damaged; the one-line message names the
            file and the fix.
    """
    folder = Path(path)
    config = folder / ADAPTER_CONFIG
    if not folder.is_dir():
        raise ModelLoadError(f"{folder} is not an adapter folder (no such directory); pass the folder PEFT saved")
    if not config.is_file():
        raise ModelLoadError(
            f"{folder} holds no PEFT adapter ({ADAPTER_CONFIG} is missing); pass a folder written by save_pretrained"
        )
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"{config} is damaged: not valid JSON ({err}); re-save the adapter") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{config} is damaged: a JSON {type(data).__name__}, not an object; re-save the adapter")
    missing = [key for key in ("peft_type", "r") if key not in data]
    if missing:
        raise ModelLoadError(f"{config} is damaged: it lacks {', '.join(missing)}; re-save the adapter")
    weights = [folder / name for name in ADAPTER_WEIGHTS if (folder / name).is_file()]
    if not weights:
        raise ModelLoadError(
            f"{folder} holds no adapter weights ({' or '.join(ADAPTER_WEIGHTS)} is missing); re-save the adapter"
        )
    if weights[0].suffix == ".safetensors":
        check_safetensors_file(weights[0])
    elif weights[0].stat().st_size == 0:
        raise ModelLoadError(f"{weights[0]} is damaged: 0 bytes; re-save the adapter")
    return folder
