"""Utilities shipped with the library: test doubles for programs and optimizers."""

from rolecall.utils.dummies import SchemaLM, ScriptedTextLM

__all__ = ["SchemaLM", "ScriptedTextLM"]
