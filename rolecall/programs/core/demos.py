"""Few-shot demos of a program's roles: the per-role demo policy and the one pattern every built-in demo set follows
(and the check of adapter groups, which decide which roles a trained, demo-free adapter covers).

A role's **demo policy** says when it is shown demos:

- ``"always"``: its demos, trained or not;
- ``"never"``: zero-shot from the start;
- ``"until_trained"`` (default): its demos until its adapter has been trained without demos (the adapter has then
  learned the output format), and none after that. A trained role's prompt is 2-3x shorter.

**Built-in demos** are built from gold decompositions of the default demo source
(:func:`~rolecall.programs.core.demo_source.default_demo_source`). Each system writes one builder
``xxx_demos(examples, corpus, *, n=3, ...) -> {role: [dspy.Example]}`` and gets its cached default with
:func:`built_in_demos`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, get_args

import dspy

from rolecall.errors import ConfigError
from rolecall.programs.core.demo_source import default_demo_source

__all__ = ["DemoPolicy", "DEMO_POLICIES", "Demos", "built_in_demos", "resolve_policies", "check_adapter_groups"]

DemoPolicy = Literal["always", "never", "until_trained"]
"""When a role sees its few-shot demos (see the module docstring)."""

DEMO_POLICIES: tuple[str, ...] = get_args(DemoPolicy)

Demos = Literal["auto"] | dict[str, list[dspy.Example]] | None
"""A program's initial demos: ``"auto"`` (its built-in demos), None (none, or what a loaded state sets), or a dict
role -> examples."""

DemoBuilder = Callable[..., dict[str, list[dspy.Example]]]


def built_in_demos(builder: DemoBuilder) -> Callable[..., dict[str, list[dspy.Example]]]:
    """The cached default of a demo builder: ``default(**options)`` is ``builder(examples, corpus, **options)`` over
    the default demo source, built once per process and options, and returned as fresh lists of copies (so a caller
    may edit its demos without touching anyone else's).

    Example:
        >>> def tiny_demos(examples, corpus, *, n=3):
        ...     return {"answer": [dspy.Example(question=e.question, answer=e.answer) for e in examples[:n]]}
        >>> default_tiny_demos = built_in_demos(tiny_demos)
        >>> len(default_tiny_demos(n=2)["answer"]), default_tiny_demos() is not default_tiny_demos()
        (2, True)
    """

    @functools.lru_cache(maxsize=8)
    def cached(options: tuple[tuple[str, Any], ...]) -> dict[str, tuple[dspy.Example, ...]]:
        examples, corpus = default_demo_source()
        return {role: tuple(demos) for role, demos in builder(examples, corpus, **dict(options)).items()}

    @functools.wraps(builder)
    def default(**options: Any) -> dict[str, list[dspy.Example]]:
        return {role: [d.copy() for d in demos] for role, demos in cached(tuple(sorted(options.items()))).items()}

    default.__doc__ = f"The built-in demos of :func:`{builder.__name__}` (cached; fresh copies on every call)."
    return default


def resolve_policies(policy: DemoPolicy | Mapping[str, DemoPolicy], roles: list[str]) -> dict[str, DemoPolicy]:
    """Each role's demo policy from one policy for all roles or a dict role -> policy (unnamed roles:
    ``"until_trained"``; the key ``"*"`` sets the default).

    Raises:
        ConfigError: a policy that is not one of :data:`DEMO_POLICIES`, or a dict naming a role the program lacks.
    """
    if isinstance(policy, str):
        policy = {"*": policy}
    if not isinstance(policy, Mapping):
        raise ConfigError(f"demo_policy must be one of {DEMO_POLICIES} or a dict role -> policy, got {policy!r}")
    for role, value in policy.items():
        if value not in DEMO_POLICIES:
            raise ConfigError(f"demo_policy for {role!r} must be one of {', '.join(DEMO_POLICIES)}, got {value!r}")
    unknown = sorted(set(policy) - set(roles) - {"*"})
    if unknown:
        raise ConfigError(f"demo_policy names unknown roles {unknown}; the roles are {roles}")
    default = policy.get("*", "until_trained")
    return {role: policy.get(role, default) for role in roles}


def check_adapter_groups(groups: Mapping[str, Sequence[str]], roles: list[str]) -> dict[str, list[str]]:
    """Validate adapter groups (adapter name -> roles sharing it) against a program's roles.

    Raises:
        ConfigError: an empty group name, a role the program lacks, or a role in two groups.
    """
    owner: dict[str, str] = {}
    for name, members in groups.items():
        if not name or not isinstance(name, str):
            raise ConfigError(f"adapter group names must be non-empty strings, got {name!r}")
        unknown = sorted(set(members) - set(roles))
        if unknown:
            raise ConfigError(f"adapter group {name!r} names unknown roles {unknown}; the roles are {sorted(roles)}")
        for role in members:
            if role in owner:
                raise ConfigError(f"role {role!r} is in two adapter groups, {owner[role]!r} and {name!r}")
            owner[role] = name
    return {name: list(members) for name, members in groups.items()}
