"""``Program``: the contract every rolecall program follows (roles, adapter groups, demo policy, recorded role calls).

A program is a ``dspy.Module`` whose predictors are its roles; ``forward(question)`` returns
``dspy.Prediction(answer=str, trajectory=Trajectory)`` and never raises. A subclass declares ``Options`` (its options
dataclass, :mod:`rolecall.programs.core.options`), ``ROLES`` (every role it can have) and ``MAX_TOKENS``, and writes
``_build_roles()`` (the predictors, as attributes so DSPy's optimizers find them), ``default_demos()``,
``default_adapter_groups()`` where roles share an adapter, and ``_run(question, trajectory)``: the control flow.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

import dspy
from dspy.utils.exceptions import AdapterParseError
from dspy.utils.usage_tracker import UsageTracker

from rolecall.errors import ConfigError
from rolecall.programs.core import saving
from rolecall.programs.core.calls import (
    COMPLETED_MARKER,
    LMCallRecorder,
    default_lm_kwargs,
    fill_lm_record,
    first_line,
    is_local_lm,
    jsonable,
    salvage_fields,
)
from rolecall.programs.core.chain import compile_chain
from rolecall.programs.core.demos import DemoPolicy, Demos, check_adapter_groups, resolve_policies
from rolecall.programs.core.gold import gold_call
from rolecall.programs.core.options import ProgramOptions
from rolecall.programs.core.parallel import parallel_map
from rolecall.programs.core.text import format_passages
from rolecall.programs.core.trained_prompt import TrainedChatAdapter
from rolecall.programs.core.trajectory import Step, Trajectory
from rolecall.retrievers.base import Passage, Retriever

__all__ = [
    "Program",
    "LMCallRecorder",
    "COMPLETED_MARKER",
    "format_passages",
    "is_local_lm",
    "parallel_map",
    "default_lm_kwargs",
]

logger = logging.getLogger(__name__)
_TRAINED_ADAPTER = TrainedChatAdapter()  # stateless; shared by every program

P = TypeVar("P", bound="Program")


class Program(dspy.Module):
    """Base contract of rolecall programs: role predictors, adapter groups, demo policy, recorded role calls.

    A role's name is the attribute holding its predictor (``self.plan`` -> ``"plan"``; a ``ChainOfThought`` at
    ``self.answer`` -> ``"answer"``).

    Args:
        retriever: the retriever tool, or None for programs that do not retrieve.
        lm: an LM for every role. A rolecall ``LocalLM`` gives each adapter (a role, or a group of roles) its own LoRA
            adapter view (``lm.for_role(adapter)``) when ``per_role_adapters``; any other LM is shared by all roles;
            None uses ``dspy.settings.lm``.
        demos: the initial demos: ``"auto"`` (the built-in ones), None (none, or what a loaded state sets), or a dict
            role -> examples. Demos of a role an ablation removed are skipped; a role the program never has is an
            error.
        demo_policy: when each role sees its demos: ``"always"``, ``"never"`` or ``"until_trained"`` (default: until
            its adapter is trained demo-free), for all roles or as a dict role -> policy.
        adapter_groups: adapter name -> the roles that share it (default: the program's, see
            :meth:`default_adapter_groups`); every other role has an adapter of its own, named after it. ``{}`` gives
            one adapter per role.
        per_role_adapters: False -> no LoRA adapters: every role calls ``lm`` itself.
        adapter: a DSPy adapter for the role calls (default: ``dspy.settings.adapter``, i.e. ``ChatAdapter``; a role
            whose adapter was trained demo-free gets the short prompt of ``TrainedChatAdapter`` unless
            ``trained_prompt="full"``).
        lm_kwargs: extra LM call arguments by role (``max_tokens``, ``temperature``, ``stop``, ...); the key ``"*"``
            applies to every role and a role's own entry wins. Default: stop on ``[[ ## completed ## ]]`` and each
            role's ``MAX_TOKENS``.
        **options: the program's options (see its ``Options`` class).

    Raises:
        ConfigError: an unknown option, an option value out of its range, or a bad demo policy or adapter group.
    """

    Options: ClassVar[type[ProgramOptions]] = ProgramOptions
    ROLES: ClassVar[tuple[str, ...]] = ()
    MAX_TOKENS: ClassVar[dict[str, int]] = {}

    def __init__(
        self,
        retriever: Retriever | None = None,
        *,
        lm: dspy.LM | None = None,
        demos: Demos = "auto",
        demo_policy: DemoPolicy | Mapping[str, DemoPolicy] = "until_trained",
        adapter_groups: Mapping[str, Sequence[str]] | None = None,
        per_role_adapters: bool = True,
        adapter: dspy.Adapter | None = None,
        trained_prompt: Literal["compact", "full"] = "compact",
        lm_kwargs: dict[str, dict[str, Any]] | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self.options = self.Options.from_kwargs(type(self).__name__, options)
        for f in dataclasses.fields(self.options):  # read as self.top_k etc. in the control flow
            setattr(self, f.name, getattr(self.options, f.name))
        self.retriever = retriever
        self.lm = lm
        self.per_role_adapters = per_role_adapters
        self.adapter = adapter
        if trained_prompt not in ("compact", "full"):
            raise ConfigError(f"trained_prompt must be 'compact' or 'full', got {trained_prompt!r}")
        self.trained_prompt = trained_prompt
        self.lm_kwargs = default_lm_kwargs(self.MAX_TOKENS) if lm_kwargs is None else copy.deepcopy(lm_kwargs)
        self._role_lms: dict[str, Any] = {}
        self.demo_free_adapters: set[str] = set()
        self._build_roles()
        groups = self.default_adapter_groups() if adapter_groups is None else adapter_groups
        self.adapter_groups = check_adapter_groups(groups, list(self.ROLES or self.roles))
        self.demo_policy = resolve_policies(demo_policy, list(self.ROLES or self.roles))
        self._apply_demos(demos)
        self._bind_lm()

    # ------------------------------------------------------------------ hooks for subclasses
    def _build_roles(self) -> None:
        """Create the role predictors as attributes (subclasses; the options are set already)."""

    def default_demos(self) -> dict[str, list[dspy.Example]]:
        """The program's built-in demos, role -> examples (``demos="auto"``); none by default."""
        return {}

    def default_adapter_groups(self) -> dict[str, list[str]]:
        """Adapter name -> roles sharing it, by default (the papers' parameter sharing); none by default."""
        return {}

    def _run(self, question: str, trajectory: Trajectory) -> dspy.Prediction:
        """The control flow: answer ``question``, recording into ``trajectory`` (subclasses)."""
        raise NotImplementedError(f"{type(self).__name__} must define _run(question, trajectory)")

    # ------------------------------------------------------------------ forward
    def forward(self, question: str) -> dspy.Prediction:
        """Answer ``question`` (``Prediction(answer, trajectory, ...)``); an exception becomes an ``error`` step."""
        trajectory = Trajectory(question=question)
        return self.guarded(trajectory, self._run, question, trajectory)

    def guarded(self, trajectory: Trajectory, fn: Callable[..., dspy.Prediction], *args: Any) -> dspy.Prediction:
        """``fn(*args)``, with an exception recorded in ``trajectory`` as a failure (see :meth:`failed`)."""
        try:
            return fn(*args)
        except Exception as e:  # anything unforeseen becomes a recorded error step
            return self.failed(trajectory, e)

    @staticmethod
    def failed(trajectory: Trajectory, error: BaseException) -> dspy.Prediction:
        """Record an unexpected error as an event step and return the empty prediction."""
        logger.debug("program run failed", exc_info=error)
        step = trajectory.event("error", type=type(error).__name__)
        step.error = f"{type(error).__name__}: {first_line(str(error))}"
        return dspy.Prediction(answer="", trajectory=trajectory)

    # ------------------------------------------------------------------ roles and adapters
    @property
    def roles(self) -> dict[str, dspy.Predict]:
        """Role name -> predictor, in definition order."""
        named = self.named_predictors()
        heads = [name.split(".")[0] for name, _ in named]
        return {(head if heads.count(head) == 1 else name): p for (name, p), head in zip(named, heads, strict=True)}

    def _predictor(self, role: str) -> dspy.Predict:
        roles = self.roles
        if role not in roles:
            raise ConfigError(f"{type(self).__name__} has no role {role!r}; its roles are {sorted(roles)}")
        return roles[role]

    def adapter_name(self, role: str) -> str:
        """The LoRA adapter ``role`` trains and runs with: its group's name, else the role's own name."""
        return next((name for name, members in self.adapter_groups.items() if role in members), role)

    def adapter_roles(self) -> dict[str, list[str]]:
        """Adapter name -> the roles of this program bound to it, in role order."""
        out: dict[str, list[str]] = {}
        for role in self.roles:
            out.setdefault(self.adapter_name(role), []).append(role)
        return out

    def set_role_lm(self, role: str, lm: dspy.LM | None) -> None:
        """Make ``role`` call ``lm`` (None: fall back to ``dspy.settings.lm``)."""
        self._predictor(role).lm = lm
        if lm is None:
            self._role_lms.pop(role, None)
        else:
            self._role_lms[role] = lm

    def role_lm(self, role: str) -> dspy.LM | None:
        """The LM ``role`` will call: its own, else the program's binding, else ``dspy.settings.lm``."""
        return self._predictor(role).lm or self._role_lms.get(role) or dspy.settings.lm

    def bind_role_adapters(self, local_lm: Any) -> None:
        """Bind every role to the LoRA adapter view of ``local_lm`` named :meth:`adapter_name` (one view per adapter,
        shared by the roles of a group)."""
        if not hasattr(local_lm, "for_role"):
            raise ConfigError(f"bind_role_adapters needs a rolecall LocalLM, got {type(local_lm).__name__}")
        views: dict[str, Any] = {}
        for role in self.roles:
            name = self.adapter_name(role)
            if name not in views:
                views[name] = local_lm.for_role(name)
            self.set_role_lm(role, views[name])

    def set_lm(self, lm: dspy.LM | None) -> None:
        """Make every role call ``lm``, as passing it to the constructor does: a rolecall ``LocalLM`` (with
        ``per_role_adapters``) gives each adapter its own view of it, any other LM is shared by all roles, None falls
        back to ``dspy.settings.lm``. ``lm`` becomes :attr:`lm`, the LM a weight optimizer trains.

        DSPy's ``Module.set_lm`` would bind every role to the one object given, here one adapter's view: SIMBA calls
        it with a sampling copy of :meth:`get_lm`, and every role would then run the same adapter.
        """
        self.lm = lm
        if lm is None:
            for role in self.roles:
                self.set_role_lm(role, None)
            return
        self._bind_lm()

    def get_lm(self) -> dspy.LM | None:
        """The program's LM: :attr:`lm` when every role calls it or one of its adapter views (DSPy's
        ``Module.get_lm`` finds several LMs there and raises), else the one LM all roles call.

        Raises:
            ValueError: the roles call different LMs that are not views of :attr:`lm` (DSPy's rule).
        """
        bound = [p.lm or self._role_lms.get(role) for role, p in self.roles.items()]
        if self.lm is not None and all(lm is None or _same_model(lm, self.lm) for lm in bound):
            return self.lm
        return super().get_lm()

    def _bind_lm(self) -> None:
        if self.lm is None:
            return
        if self.per_role_adapters and is_local_lm(self.lm):
            self.bind_role_adapters(self.lm)
        else:
            for role in self.roles:
                self.set_role_lm(role, self.lm)

    # ------------------------------------------------------------------ demos
    def _apply_demos(self, demos: Demos) -> None:
        if demos is None:
            return
        if isinstance(demos, str):
            if demos != "auto":
                raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {demos!r}")
            demos = self.default_demos()
        if not isinstance(demos, dict):
            raise ConfigError(f"demos must be 'auto', None or a dict role -> examples, got {type(demos).__name__}")
        known = set(self.ROLES or self.roles)
        unknown = sorted(set(demos) - known)
        if unknown:  # an ablated role's demos are skipped, a misspelt role is an error
            raise ConfigError(f"demos for unknown roles {unknown}; {type(self).__name__}'s roles are {sorted(known)}")
        self.set_demos({role: d for role, d in demos.items() if role in self.roles})

    def set_demos(self, demos: dict[str, list[dspy.Example]]) -> None:
        """Set the few-shot demos of each named role (roles not in ``demos`` keep theirs); a role whose policy says
        it runs without demos (``"never"``, or ``"until_trained"`` once its adapter is trained) keeps none."""
        roles = self.roles
        unknown = sorted(set(demos) - set(roles))
        if unknown:
            raise ConfigError(f"demos for unknown roles {unknown}; {type(self).__name__} has roles {sorted(roles)}")
        for role, role_demos in demos.items():
            roles[role].demos = [] if self.runs_demo_free(role) else list(role_demos)

    def runs_demo_free(self, role: str) -> bool:
        """Whether ``role`` runs without demos under its demo policy now."""
        policy = getattr(self, "demo_policy", {}).get(role, "until_trained")
        if policy == "never":
            return True
        return policy == "until_trained" and self.adapter_name(role) in self.demo_free_adapters

    def role_adapter(self, role: str) -> dspy.Adapter | None:
        """The DSPy adapter that formats ``role``'s prompts: the program's own, else the short
        :class:`TrainedChatAdapter` once the role runs demo-free on a trained adapter, else None (DSPy's default)."""
        if self.adapter is not None:
            return self.adapter
        if self.trained_prompt == "compact" and self.adapter_name(role) in self.demo_free_adapters:
            return _TRAINED_ADAPTER
        return None

    def mark_trained(self, adapter: str, *, demo_free: bool = True) -> list[str]:
        """Record that ``adapter`` was trained; with ``demo_free``, on prompts without demos, so its roles whose
        policy is ``"until_trained"`` drop their demos from now on (and :meth:`save` records it).

        Returns:
            The roles that now run without demos.

        Raises:
            ConfigError: no role of this program is bound to ``adapter``.
        """
        groups = self.adapter_roles()
        if adapter not in groups:
            raise ConfigError(f"{type(self).__name__} has no adapter {adapter!r}; its adapters are {sorted(groups)}")
        if not demo_free:
            self.demo_free_adapters.discard(adapter)
            return []
        self.demo_free_adapters.add(adapter)
        dropped = [role for role in groups[adapter] if self.runs_demo_free(role)]
        for role in dropped:
            self.roles[role].demos = []
        return dropped

    # ------------------------------------------------------------------ recorded calls
    def call_role(
        self,
        role: str,
        trajectory: Trajectory,
        /,
        *,
        lm_config: dict[str, Any] | None = None,
        salvage: bool = False,
        **inputs: Any,
    ) -> dspy.Prediction | None:
        """Run ``role`` on ``inputs`` and record a ``Step(kind="role")``; None when the call or its parsing failed.

        Args:
            role, trajectory: the role to call and where its step is recorded.
            lm_config: overrides the role's ``lm_kwargs`` for this one call (e.g. ``{"n": 5, "temperature": 1.0}``).
            salvage: when the output did not parse, return the output fields readable in the raw completion (a
                ``Prediction`` of strings, missing fields absent) instead of None. The step keeps its parse error.
            **inputs: the role's input fields.

        The step holds the inputs, the exact messages and raw completion of the (last) LM call, the parsed outputs or
        the error, the adapter, the seconds and ``usage``; earlier attempts (DSPy's JSON fallback) go to
        ``meta["attempts"]``, the fields readable in a failed call's completions to ``meta["salvaged"]``.
        """
        predictor = self._predictor(role)
        if (gold := gold_call(self, role, predictor, inputs, trajectory)) is not None:
            return gold  # a gold-path run (rolecall.programs.core.gold): the given outputs, no LM call
        recorder, tracker = LMCallRecorder(), UsageTracker()
        step = Step(kind="role", role=role, inputs=jsonable(inputs))
        call_kwargs: dict[str, Any] = {}
        if predictor.lm is None and role in self._role_lms:
            call_kwargs["lm"] = self._role_lms[role]
        if predictor.demos and self.runs_demo_free(role):
            # demos a DSPy optimizer wrote after training (BootstrapFewShot after SFT) would take a trained role off
            # the demo-free prompts it learned; its policy says it runs without them
            call_kwargs["demos"] = []
        lm_kwargs = {**self.lm_kwargs.get("*", {}), **self.lm_kwargs.get(role, {}), **(lm_config or {})}
        if lm_kwargs:
            call_kwargs["config"] = lm_kwargs
        overrides: dict[str, Any] = {
            "callbacks": [*dspy.settings.get("callbacks", []), recorder],
            "usage_tracker": tracker,
        }
        if (adapter := self.role_adapter(role)) is not None:
            overrides["adapter"] = adapter
        start = time.perf_counter()
        prediction: dspy.Prediction | None = None
        try:
            with dspy.context(**overrides):
                prediction = predictor(**inputs, **call_kwargs)
            step.outputs = {name: jsonable(prediction.get(name)) for name in predictor.signature.output_fields}
        except AdapterParseError as e:
            step.error = f"parse error: {first_line(str(e))}"
        except Exception as e:  # a role call must never crash the question
            logger.debug("role %s failed", role, exc_info=True)
            step.error = f"{type(e).__name__}: {first_line(str(e))}"
            step.meta["call_failed"] = True  # not a parse error: the evaluation counts it as a failure
        step.seconds = time.perf_counter() - start
        fill_lm_record(step, recorder, tracker, fallback_lm=self.role_lm(role))
        if step.error is not None:
            prediction = None
            salvaged = salvage_fields(step, list(predictor.signature.output_fields))
            if salvaged:
                step.meta["salvaged"] = salvaged
                if salvage:
                    prediction = dspy.Prediction(**salvaged)
        trajectory.add(step)
        return prediction

    def retrieve(self, trajectory: Trajectory, query: str, k: int) -> list[Passage]:
        """Top-``k`` passages for ``query``, recorded as a retrieval step; failures give an error step and ``[]``."""
        step = Step(kind="retrieval", role="retrieve", inputs={"query": query, "k": k})
        start = time.perf_counter()
        passages: list[Passage] = []
        if self.retriever is None:
            step.error = "no retriever"
        elif not query or not query.strip():
            step.error = "empty query"
        else:
            try:
                passages = list(self.retriever(query, k))
            except Exception as e:  # a broken index must not crash the question
                logger.debug("retrieval failed for %r", query, exc_info=True)
                step.error = f"{type(e).__name__}: {first_line(str(e))}"
            if step.error is None and not passages:
                step.error = "empty retrieval"
        step.outputs = {"passage_ids": [p.id for p in passages], "titles": [p.title for p in passages]}
        step.seconds = time.perf_counter() - start
        trajectory.add(step)
        return passages

    # ------------------------------------------------------------------ optimisation, copies, persistence
    def compile(self: P, optimizer: Any, *, trainset: list[Any], valset: list[Any] | None = None, **kwargs: Any) -> P:
        """``optimizer.compile(self, trainset=..., valset=...)``, or a chain of optimizers mixing DSPy's and rolecall's.

        A list of optimizers is a chain, each compiling the program the previous one returned, in order: for example
        ``program.compile(optimizer=[SFT(), MAPGRPO()], trainset=train)`` warms the roles up with SFT, then runs RL,
        and ``program.compile(optimizer=[dspy.MIPROv2(metric), SFT()], trainset=train, valset=dev)`` optimizes the
        prompts, then trains the adapters on them (BetterTogether). Each step gets the examples as it reads them (the
        rolecall ``Example`` s as given to a rolecall weight optimizer, as ``Example.to_dspy()`` to DSPy's), ``valset``
        only when its ``compile`` takes one, and the keyword arguments its ``compile`` names
        (:mod:`rolecall.programs.core.chain`).

        Raises:
            ConfigError: an empty chain, a keyword argument no optimizer takes, or a step before the last that
                returned something other than a rolecall ``Program``.
        """
        steps = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
        return compile_chain(self, steps, trainset=trainset, valset=valset, **kwargs)

    def config(self) -> dict[str, Any]:
        """What :meth:`save` records to rebuild the program: its options and the base-class arguments."""
        return {
            "options": self.options.to_dict(),
            "per_role_adapters": self.per_role_adapters,
            "lm_kwargs": self.lm_kwargs,
            "adapter_groups": self.adapter_groups,
            "demo_policy": self.demo_policy,
            "trained_prompt": self.trained_prompt,
        }

    def __deepcopy__(self, memo: dict[int, Any]) -> Program:
        # Predictors and demos are copied; the retriever and every LM (the model weights) are shared.
        return saving.copy_program(self, memo)

    def save(self, path: str | Path, save_program: bool = False, modules_to_serialize: Any = None) -> None:
        """Write ``path/program.json`` (options, adapter groups, demo policy, which adapters were trained demo-free,
        and each role's demos, instructions and signature; no LM objects) and each LoRA adapter's weights under
        ``path/adapters/<adapter>`` (once per adapter group).

        ``save_program`` and ``modules_to_serialize`` (``dspy.Module.save``'s pickle mode) are not supported.
        """
        if save_program or modules_to_serialize:
            raise ConfigError("Program.save writes JSON state and adapters only; save_program=True is not supported")
        saving.save_program(self, Path(path))

    @classmethod
    def load(cls: type[P], path: str | Path, *, retriever: Retriever | None = None, lm: dspy.LM | None = None) -> P:
        """Rebuild a program written by :meth:`save`: same options, groups, demos and instructions, and (when ``lm``
        is a ``LocalLM``) each saved adapter loaded into it and bound to its roles.

        Raises:
            ModelLoadError: if ``path/program.json`` is missing, unreadable, or was written by another program class.
        """
        return saving.load_program(cls, Path(path), retriever=retriever, lm=lm)


def _same_model(lm: Any, base: Any) -> bool:
    """Whether ``lm`` is ``base`` or a LoRA adapter view of the same local model (``base.for_role(...)``)."""
    if lm is base:
        return True
    backend = getattr(base, "backend", None)
    return is_local_lm(lm) and backend is not None and getattr(lm, "backend", None) is backend
