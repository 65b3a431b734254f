"""What a rolecall program offers the modules that implement parts of it.

:class:`~rolecall.programs.core.program.Program` imports its helper modules (:mod:`~rolecall.programs.core.chain`,
:mod:`~rolecall.programs.core.gold`, :mod:`~rolecall.programs.core.saving`) to implement ``compile``, the gold path and
``save`` / ``load``. Those modules name the program through :class:`ProgramLike` rather than importing ``Program``
back, so imports run one way. ``isinstance(x, ProgramLike)`` tells a rolecall program from another ``dspy.Module``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["ProgramLike"]


@runtime_checkable
class ProgramLike(Protocol):
    """The attributes and methods of a rolecall program that its helper modules use (see the module docstring)."""

    Options: Any
    retriever: Any
    lm: Any
    roles: dict[str, Any]
    demo_free_adapters: set[str]
    _role_lms: dict[str, Any]

    def named_predictors(self) -> list[tuple[str, Any]]:
        """Every predictor with its name (DSPy's)."""
        ...

    def dump_state(self) -> dict[str, Any]:
        """DSPy's state: demos, instructions, signatures."""
        ...

    def load_state(self, state: dict[str, Any]) -> Any:
        """Restore what :meth:`dump_state` wrote."""
        ...

    def config(self) -> dict[str, Any]:
        """The options, adapter groups and demo policy that rebuild the program."""
        ...

    def adapter_name(self, role: str) -> str:
        """The LoRA adapter ``role`` runs on."""
        ...

    def adapter_roles(self) -> dict[str, list[str]]:
        """Each adapter and the roles that share it."""
        ...

    def role_lm(self, role: str) -> Any:
        """The LM bound to ``role`` (None: the program's)."""
        ...

    def set_role_lm(self, role: str, lm: Any) -> None:
        """Bind ``role`` to ``lm``."""
        ...

    def runs_demo_free(self, role: str) -> bool:
        """Whether ``role`` runs without its demos."""
        ...

    def role_adapter(self, role: str) -> Any:
        """The DSPy adapter that formats ``role``'s prompts."""
        ...

    def mark_trained(self, adapter: str, *, demo_free: bool = True) -> list[str]:
        """Record that ``adapter`` was trained; its roles drop their demos."""
        ...
