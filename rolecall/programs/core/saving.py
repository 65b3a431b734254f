"""Saving and loading a program: ``program.json`` (JSON state, no pickle) and one PEFT folder per LoRA adapter.

Format 2 records the program's options, adapter groups, demo policy and the adapters trained demo-free next to DSPy's
dumped state (demos, instructions, signatures). Format 1 (before adapter groups) is still read.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import dspy

from rolecall.errors import ModelLoadError
from rolecall.programs.core.calls import is_local_lm

if TYPE_CHECKING:
    from rolecall.programs.core.protocol import ProgramLike
    from rolecall.retrievers.base import Retriever

__all__ = [
    "save_program",
    "load_program",
    "copy_program",
    "STATE_FILE",
    "ADAPTER_DIR",
    "adapter_folder",
    "check_saved_adapters",
    "read_payload",
]

logger = logging.getLogger(__name__)

P = TypeVar("P", bound="ProgramLike")

STATE_FILE = "program.json"
ADAPTER_DIR = "adapters"
FORMAT_VERSION = 2


def save_program(program: ProgramLike, path: Path) -> None:
    """Write ``program`` to ``path`` (see :meth:`Program.save`)."""
    path.mkdir(parents=True, exist_ok=True)
    # LMs are not program state (and a custom engine may not be serializable): dump with them unbound
    bound = {name: p.lm for name, p in program.named_predictors()}
    try:
        for _, p in program.named_predictors():
            p.lm = None
        state = program.dump_state()
    finally:
        for name, p in program.named_predictors():
            p.lm = bound[name]
    adapters: dict[str, str] = {}  # role -> adapter name; roles sharing one adapter save it once
    for role in program.roles:
        lm = program.role_lm(role)
        if is_local_lm(lm) and lm.adapter is not None:
            if lm.adapter not in adapters.values():
                lm.save_adapter(path / ADAPTER_DIR / lm.adapter)
            adapters[role] = lm.adapter
    payload = {
        "format_version": FORMAT_VERSION,
        "program": f"{type(program).__module__}.{type(program).__qualname__}",
        "config": program.config(),
        "adapters": adapters,
        "demo_free_adapters": sorted(program.demo_free_adapters),
        "state": state,
    }
    (path / STATE_FILE).write_text(json.dumps(payload, indent=2, ensure_ascii=False, default=str))


def read_payload(path: Path) -> dict[str, Any]:
    """The parsed ``program.json`` of a saved program directory (format 1, before adapters were saved per adapter
    group, or 2, the current one).

    Raises:
        ModelLoadError: the file is missing, is not valid JSON, or holds a format version this rolecall does not read
            (the message names it and what to do).
    """
    file = path / STATE_FILE
    if not file.is_file():
        raise ModelLoadError(f"{file} does not exist; pass the directory written by Program.save")
    try:
        payload = json.loads(file.read_text())
    except ValueError as err:
        raise ModelLoadError(f"{file} is not valid JSON ({err}); save the program again") from err
    version = payload.get("format_version", 1) if isinstance(payload, dict) else None
    if not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise ModelLoadError(
            f"{file} is a saved program of format version {version!r}; this rolecall reads versions 1 to "
            f"{FORMAT_VERSION}: load it with the rolecall that saved it (or a newer one), or save the program again"
        )
    return payload


def adapter_folder(path: Path, role: str, name: str) -> Path:
    """The folder of adapter ``name`` (bound to ``role``) in the saved program ``path``: ``adapters/<name>``, or
    ``adapters/<role>`` for programs of format 1, which wrote one folder per role."""
    folder = path / ADAPTER_DIR / name
    return folder if folder.is_dir() else path / ADAPTER_DIR / role


def check_saved_adapters(path: Path) -> None:
    """Check every adapter folder the program saved in ``path`` names (config and safetensors header), without a
    model.

    Raises:
        ModelLoadError: ``program.json`` or an adapter file is missing or damaged; the message names the file.
    """
    from rolecall.lm.adapter_files import check_adapter_folder

    for role, name in (read_payload(path).get("adapters") or {}).items():
        check_adapter_folder(adapter_folder(path, role, str(name)))


def load_program(cls: type[P], path: Path, *, retriever: Retriever | None = None, lm: dspy.LM | None = None) -> P:
    """Rebuild a program of class ``cls`` from ``path`` (see :meth:`Program.load`)."""
    payload = read_payload(path)
    expected = f"{cls.__module__}.{cls.__qualname__}"
    if payload.get("program") != expected:
        raise ModelLoadError(
            f"{path / STATE_FILE} holds a {payload.get('program')}, not a {expected}; load it with that class"
        )
    program = cls(retriever, lm=lm, demos=None, **_constructor_args(cls, payload.get("config", {})))
    program.load_state(payload["state"])
    for predictor in program.roles.values():  # DSPy restores demos as dicts; make them Examples again
        inputs = list(predictor.signature.input_fields)
        predictor.demos = [
            dspy.Example(**d).with_inputs(*[k for k in inputs if k in d]) if isinstance(d, dict) else d
            for d in predictor.demos
        ]
    if is_local_lm(lm):
        views: dict[str, Any] = {}
        for role, name in payload.get("adapters", {}).items():
            if role not in program.roles:
                continue
            if name not in views:
                views[name] = lm.load_adapter(adapter_folder(path, role, name), name=name)
            program.set_role_lm(role, views[name])
    for adapter in payload.get("demo_free_adapters", []):
        if adapter in program.adapter_roles():
            program.mark_trained(adapter, demo_free=True)
    return program


def _constructor_args(cls: type[ProgramLike], config: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments that rebuild a program from its saved ``config`` (format 2, or format 1's flat dict)."""
    if "options" in config:
        args = dict(config["options"])
        for key in ("per_role_adapters", "lm_kwargs", "adapter_groups", "demo_policy"):
            if key in config:
                args[key] = config[key]
        args["trained_prompt"] = config.get("trained_prompt", "full")  # saved before short trained prompts existed
        return args
    params = inspect.signature(cls.__init__).parameters
    option_names = {f for f in getattr(cls.Options, "__dataclass_fields__", {})}
    base = {"per_role_adapters", "lm_kwargs"}
    return {k: v for k, v in config.items() if k in option_names or k in base or k in params}


def copy_program(program: P, memo: dict[int, Any]) -> P:
    """A deep copy of ``program`` for ``copy.deepcopy``: predictors and demos are copied; the retriever and every LM
    (the model weights) are shared; an uncopyable handle (a lock, a file) is shared rather than copied."""
    shared = [program.retriever, program.lm, *program._role_lms.values()]
    shared += [p.lm for _, p in program.named_predictors() if p.lm is not None]
    for obj in shared:
        if obj is not None:
            memo[id(obj)] = obj
    new = type(program).__new__(type(program))
    memo[id(program)] = new
    for name, value in program.__dict__.items():
        try:
            new.__dict__[name] = copy.deepcopy(value, memo)
        except Exception:  # an uncopyable handle (lock, file) is shared rather than copied
            new.__dict__[name] = value
    return new
