"""The rolecall exception hierarchy, modelled on DSPy's ``DSPyError``."""

from __future__ import annotations

__all__ = ["RolecallError", "DataFormatError", "ConfigError", "ModelLoadError", "RetrieverError"]


class RolecallError(Exception):
    """Base class of every error rolecall raises on purpose."""


class ConfigError(RolecallError, ValueError):
    """A configuration value is out of range or inconsistent; the message names the value and the fix."""


class DataFormatError(RolecallError, ValueError):
    """A dataset record is malformed; the message names the file and the line (or list index)."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None) -> None:
        where = ""
        if path is not None:
            where = f"{path}" + (f":{line}" if line is not None else "")
            message = f"{where}: {message}"
        super().__init__(message)
        self.path = path
        self.line = line


class ModelLoadError(RolecallError, RuntimeError):
    """A model could not be found or loaded; the message says where rolecall looked and how to fix it."""


class RetrieverError(RolecallError, RuntimeError):
    """A retriever index is missing, corrupt or inconsistent with its corpus."""
