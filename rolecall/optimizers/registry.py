"""The optimizer registry: every weight optimizer by name, with its config class and what a chain may do with it.

``rolecall compile --optimizer``, ``rolecall tune``, ``rolecall programs`` and the paper experiments' methods are all
generated from this table and from the system registry (:mod:`rolecall.programs.registry`, which says which
optimizers apply to which program). Classes are named as ``"module:Class"`` strings and imported only when an
optimizer is built, so listing the names never loads torch.

Adding an optimizer is one registration::

    register_optimizer(OptimizerEntry(
        name="my_rl", optimizer="my_pkg.my_rl:MyRL", config="my_pkg.my_rl:MyRLConfig",
        summary="what it does, in one line", label="SFT + MyRL", needs="answers", warm_start="required"))
    register_system(dataclasses.replace(system("opera"), optimizers=(*system("opera").optimizers, "my_rl")))

after which ``rolecall compile --program opera --optimizer sft,my_rl --help`` lists ``MyRLConfig``'s fields as flags.
The config class is a ``@dataclass(kw_only=True)`` subclass of :class:`~rolecall.optimizers.core.run_config.RunConfig`
and the optimizer class takes ``(config=None, **fields)``.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rolecall.errors import ConfigError

__all__ = [
    "OPTIMIZERS",
    "LiveMapping",
    "OptimizerEntry",
    "build_optimizer",
    "config_class",
    "load_target",
    "optimizer_entry",
    "optimizer_names",
    "register_optimizer",
    "unregister_optimizer",
]

Kind = Literal["warm_start", "trainer", "alone"]
Needs = Literal["nothing", "answers", "decomposition"]
WarmStart = Literal["none", "optional", "required"]


@dataclass(frozen=True)
class OptimizerEntry:
    """One registered weight optimizer."""

    name: str
    """What ``--optimizer`` and the experiment rows call it."""
    optimizer: str
    """``"module:Class"`` of the optimizer; it takes ``(config=None, **fields)``."""
    config: str
    """``"module:Class"`` of its config, a ``RunConfig`` subclass (its fields are the CLI's flags)."""
    summary: str
    """One line for ``rolecall programs`` and ``--help``."""
    label: str = ""
    """Its name in result tables (default: ``name``)."""
    kind: Kind = "trainer"
    """``warm_start``: may start a chain (``sft,mapgrpo``); ``trainer``: trains alone or after the warm start, writing
    to ``OUT/<name>``; ``alone``: never in a chain."""
    needs: Needs = "answers"
    """What a training example must carry: gold ``decomposition`` (gold-path targets or a gold expert) or
    ``answers``."""
    warm_start: WarmStart = "optional"
    """Whether an experiment row using it starts from another row's saved program."""
    after_warm_start: Mapping[str, Any] = field(default_factory=dict)
    """Config fields set when it follows a warm start (a chain's ``sft``, or ``--from``): SPlanRL then skips its
    own cold start."""


OPTIMIZERS: dict[str, OptimizerEntry] = {}
"""Name -> entry, in registration order (the order ``rolecall programs`` lists them)."""


class LiveMapping(Mapping[Any, Any]):
    """A read-only mapping rebuilt by ``table()`` on every access: a view of the registries that sees what is
    registered after it was made (``APPLIES_TO``, ``GOLD_BUILDERS``, ``OPTIMIZER_SUMMARIES``)."""

    def __init__(self, table: Callable[[], Mapping[Any, Any]]) -> None:
        self._table = table

    def __getitem__(self, key: Any) -> Any:
        return self._table()[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


def register_optimizer(entry: OptimizerEntry) -> OptimizerEntry:
    """Adds (or replaces) an optimizer; returns it.

    Raises:
        ConfigError: the name is not an identifier, or a target is not ``"module:Class"``.
    """
    if not entry.name.isidentifier():
        raise ConfigError(f"optimizer name {entry.name!r} must be a Python identifier (it becomes --{entry.name}.X)")
    for target in (entry.optimizer, entry.config):
        if target.count(":") != 1:
            raise ConfigError(f"optimizer {entry.name!r}: {target!r} must be 'module:Class'")
    OPTIMIZERS[entry.name] = entry
    return entry


def unregister_optimizer(name: str) -> None:
    """Removes a registered optimizer (a test's toy); unknown names are ignored."""
    OPTIMIZERS.pop(name, None)


def optimizer_names() -> list[str]:
    """The registered optimizer names, in registration order."""
    return list(OPTIMIZERS)


def optimizer_entry(name: str) -> OptimizerEntry:
    """The entry registered as ``name``.

    Raises:
        ConfigError: ``name`` is not registered (the message lists the registered names).
    """
    if name not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {name!r}; choose one of: {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name]


def load_target(target: str, what: str) -> Any:
    """Imports ``"module:attribute"``.

    Raises:
        ConfigError: the module or the attribute does not exist (the message names ``what`` registered it).
    """
    module_name, _, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is None or not module_name.startswith(err.name):
            raise  # a missing third-party dependency: its own ImportError says what to install
        raise ConfigError(f"{what} is registered as {target!r}, but module {module_name!r} does not exist") from err
    try:
        return getattr(module, attribute)
    except AttributeError as err:
        raise ConfigError(f"{what} is registered as {target!r}, but {module_name} has no {attribute!r}") from err


def config_class(name: str) -> type:
    """The config dataclass of optimizer ``name``."""
    return load_target(optimizer_entry(name).config, f"optimizer {name!r}'s config")


def build_optimizer(name: str, fields: Mapping[str, Any] | None = None, **extras: Any) -> Any:
    """Optimizer ``name`` built from config ``fields`` (validated by the config class, before any model loads);
    ``extras`` are the optimizer's other keyword arguments (``warm_start``, ``teacher``, ...).

    Raises:
        ConfigError: an unknown optimizer or field (the message lists the valid ones), or a value out of range.
    """
    entry = optimizer_entry(name)
    cls = load_target(entry.config, f"optimizer {name!r}'s config")
    config = cls.from_kwargs(f"optimizer {name}", dict(fields or {}))
    return load_target(entry.optimizer, f"optimizer {name!r}")(config, **extras)


def config_fields(config: Any) -> dict[str, Any]:
    """A config's fields as a plain mapping (nested dataclasses as mappings): what ``compile_config.json`` records."""
    return {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(config)}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return config_fields(value)
    if isinstance(value, tuple):
        return list(value)
    return value


for _entry in (
    OptimizerEntry(
        name="sft",
        optimizer="rolecall.optimizers.sft:SFT",
        config="rolecall.optimizers.sft:SFTConfig",
        summary="supervised fine-tuning of each role's adapter on the program's own prompts along the gold path",
        label="SFT(gold)",
        kind="warm_start",
        needs="decomposition",
        warm_start="none",
    ),
    OptimizerEntry(
        name="mapgrpo",
        optimizer="rolecall.optimizers.mapgrpo:MAPGRPO",
        config="rolecall.optimizers.mapgrpo_config:MAPGRPOConfig",
        summary="MAPGRPO: each role in turn with GRPO and an expert-augmented group (OPERA, paper Eq. 11)",
        label="SFT + MAPGRPO",
        needs="decomposition",
        warm_start="required",
    ),
    OptimizerEntry(
        name="grpo",
        optimizer="rolecall.optimizers.mapgrpo:JointGRPO",
        config="rolecall.optimizers.mapgrpo_config:MAPGRPOConfig",
        summary="single-stage GRPO over all roles (OPERA), or Search-R1's GRPO over whole rollouts (search_r1)",
        label="SFT + GRPO",
        needs="decomposition",
        warm_start="required",
    ),
    OptimizerEntry(
        name="stride_ft",
        optimizer="rolecall.optimizers.stride_ft:STRIDEFT",
        config="rolecall.optimizers.stride_ft:STRIDEFTConfig",
        summary="STRIDE-FT: Meta-Planner DPO and Supervisor / Extractor / Reasoner SFT from STRIDE's own runs",
        label="SFT + STRIDE-FT",
    ),
    OptimizerEntry(
        name="multitask_sft",
        optimizer="rolecall.optimizers.multitask_sft:MultiTaskSFT",
        config="rolecall.optimizers.sft:SFTConfig",
        summary="one adapter trained on REAP's merged Decomposer and Re-Planner data",
        label="multi-task SFT",
        kind="alone",
        needs="decomposition",
    ),
    OptimizerEntry(
        name="splanrl",
        optimizer="rolecall.optimizers.splanrl:SPlanRL",
        config="rolecall.optimizers.splanrl:SPlanRLConfig",
        summary="SPlanRL: an SFT cold start, then GRPO on D2Plan's Reasoner with the Purifier frozen",
        label="SFT + SPlanRL",
        warm_start="required",
        after_warm_start={"cold_start": "none"},
    ),
    OptimizerEntry(
        name="opd",
        optimizer="rolecall.optimizers.opd:OPD",
        config="rolecall.optimizers.opd_config:OPDConfig",
        summary="MultiAgent-OPD: role rewards and on-policy distillation of the Searchers from a cascaded Teacher",
        label="MultiAgent-OPD",
        warm_start="required",
    ),
    OptimizerEntry(
        name="search_r1_grpo",
        optimizer="rolecall.optimizers.search_r1_grpo:SearchR1GRPO",
        config="rolecall.optimizers.search_r1_grpo:SearchR1GRPOConfig",
        summary="Search-R1's plain GRPO over whole agent rollouts (EM minus a format penalty)",
        label="GRPO",
        warm_start="none",
    ),
    OptimizerEntry(
        name="opd_teacher",
        optimizer="rolecall.optimizers.opd_teacher:OPDTeacher",
        config="rolecall.optimizers.opd_config:OPDConfig",
        summary="MultiAgent-OPD's Stage I alone: GRPO on the cascaded team that becomes the Teacher",
        label="C-MAS + RL (Stage I GRPO)",
    ),
):
    register_optimizer(_entry)
