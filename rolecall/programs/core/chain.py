"""Compiling a program with one optimizer or a chain of them (DSPy prompt optimizers and rolecall weight optimizers).

``program.compile(optimizer=[dspy.MIPROv2(...), SFT(...)], trainset=train, valset=dev)`` runs each optimizer's
``compile`` on the program the previous one returned (BetterTogether's prompt-then-weights recipe, Soylu et al.,
EMNLP 2024, https://arxiv.org/abs/2407.10930). The optimizers disagree on what they take, so each step gets:

- the examples it reads: a rolecall weight optimizer (:class:`~rolecall.optimizers.core.base.WeightOptimizer`: SFT,
  MAPGRPO, ...) gets the examples as given (it needs rolecall ``Example`` s, with their gold decompositions), every
  other optimizer (DSPy's) gets each rolecall ``Example`` as ``Example.to_dspy()`` (``question`` as input). So a chain
  takes rolecall ``Example`` s; ``dspy.Example`` s suit a chain of DSPy optimizers only;
- ``valset`` only when its ``compile`` has a ``valset`` parameter (GEPA, MIPROv2 and the weight optimizers do; SIMBA
  and BootstrapFewShot do not);
- of the other keyword arguments, those its ``compile`` names (all of them when it takes ``**kwargs``). An argument no
  step takes is an error, raised before any step runs.

A DSPy optimizer returns a deep copy of the program (:meth:`Program.__deepcopy__` shares the LM, its LoRA adapters and
the retriever), so a weight optimizer later in the chain trains the same adapters the earlier steps ran.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Sequence
from typing import Any

from rolecall.data.types import Example
from rolecall.errors import ConfigError
from rolecall.programs.core.protocol import ProgramLike

__all__ = ["compile_chain", "is_weight_optimizer", "examples_for"]

logger = logging.getLogger(__name__)

_WEIGHT_OPTIMIZER_MODULE = "rolecall.optimizers.core.base"


def is_weight_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` is a rolecall weight optimizer (it reads rolecall ``Example`` s and trains adapters).

    The base class is looked up among the loaded modules rather than imported: when it is not loaded, no object can be
    an instance of it, and a chain of DSPy optimizers then never imports the training stack (torch).
    """
    base = sys.modules.get(_WEIGHT_OPTIMIZER_MODULE)
    return base is not None and isinstance(optimizer, base.WeightOptimizer)


def examples_for(optimizer: Any, examples: Sequence[Any] | None) -> Sequence[Any] | None:
    """``examples`` as ``optimizer`` reads them: unchanged for a rolecall weight optimizer, each rolecall ``Example``
    as ``Example.to_dspy()`` (``question`` as input, the gold fields riding along) for any other; None stays None.

    Example:
        >>> e = Example(id="q1", question="Who?", answers=["Ada"])
        >>> [d.inputs().keys() for d in examples_for(object(), [e])]
        [['question']]
    """
    if examples is None:
        return None
    if is_weight_optimizer(optimizer):
        return examples
    return [e.to_dspy() if isinstance(e, Example) else e for e in examples]


def _accepted(optimizer: Any) -> tuple[set[str], bool]:
    """The keyword parameters of ``optimizer.compile`` and whether it also takes ``**kwargs``."""
    try:
        params = inspect.signature(optimizer.compile).parameters
    except (TypeError, ValueError):  # a builtin or C-level compile: assume it takes everything
        return set(), True
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = {n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return named, var_kw


def compile_chain(
    program: ProgramLike,
    optimizers: Sequence[Any],
    *,
    trainset: Sequence[Any],
    valset: Sequence[Any] | None = None,
    **kwargs: Any,
) -> Any:
    """Compile ``program`` with each optimizer in turn, each on the previous one's result (see the module docstring).

    Args:
        program: the rolecall program to compile.
        optimizers: the optimizers, in order (one, or a chain).
        trainset: the training examples (rolecall ``Example`` s, converted for DSPy's optimizers).
        valset: validation examples, passed to the optimizers whose ``compile`` takes a ``valset``.
        **kwargs: further ``compile`` arguments, each passed to the optimizers whose ``compile`` names it.

    Returns:
        What the last optimizer returned.

    Raises:
        ConfigError: no optimizer, an argument that no optimizer's ``compile`` takes, or a step before the last that
            returned something other than a rolecall ``Program`` (the next step could not compile it).
    """
    if not optimizers:
        raise ConfigError("compile(optimizer=[...]) needs at least one optimizer")
    accepted = [_accepted(step) for step in optimizers]
    unused = sorted(k for k in kwargs if not any(var_kw or k in named for named, var_kw in accepted))
    if unused:
        names = ", ".join(type(step).__name__ for step in optimizers)
        raise ConfigError(f"compile() got {unused}, which no optimizer's compile takes ({names}); remove them")
    current: Any = program
    for i, (step, (named, var_kw)) in enumerate(zip(optimizers, accepted, strict=True)):
        if i and not isinstance(current, ProgramLike):
            raise ConfigError(
                f"{type(optimizers[i - 1]).__name__}.compile returned a {type(current).__name__}, not a rolecall "
                f"Program, so {type(step).__name__} cannot compile it; put that optimizer last in the chain"
            )
        step_kwargs = {k: v for k, v in kwargs.items() if var_kw or k in named}
        if valset is not None:
            if var_kw or "valset" in named:
                step_kwargs["valset"] = examples_for(step, valset)
            else:
                logger.info("%s.compile takes no valset; it runs on the trainset only", type(step).__name__)
        logger.info("compile step %d/%d: %s", i + 1, len(optimizers), type(step).__name__)
        current = step.compile(current, trainset=examples_for(step, trainset), **step_kwargs)
    return current
