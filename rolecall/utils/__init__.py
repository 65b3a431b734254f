"""Utilities shipped with the library: test doubles for programs and optimizers."""

from rolecall.utils.dummies import SchemaLM

__all__ = ["SchemaLM"]
