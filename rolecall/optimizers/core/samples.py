"""Turning recorded trajectories into training samples, each exactly as its role saw it.

A recorded role step (:class:`~rolecall.programs.core.trajectory.Step`, ``kind="role"``) keeps the exact chat
messages DSPy's adapter sent (signature, instructions, demos or none) and the raw completion. The sample's prompt is
those messages encoded by the same ``encode_messages`` the LM generated with (chat template plus generation prompt),
so the trajectories of any program feed any optimizer.

The completion target, decided here:

- A call the LM sampled (a rollout) carries the exact token ids its engine sampled (``step.meta["sampled"]``, what
  :class:`~rolecall.programs.core.calls.LMCallRecorder` heard from the engine): the target is those ids, as sampled.
  Nothing is re-tokenized and nothing is added: the stop string's tokens or EOS are there when the model wrote them,
  and a truncated call (``finish_reason="length"``) is trained as truncated. The ids are used when they decode to
  text that starts with the recorded completion (so they belong to this tokenizer and this call) and the step has
  no masked spans; else the rules below rebuild the target from the text (a gold or hand-written completion).

- The LM stops on ChatAdapter's marker ``[[ ## completed ## ]]`` and cuts it from the text, so a recorded completion
  usually lacks it. The target restores it: ``completion.rstrip() + "\\n\\n[[ ## completed ## ]]"`` (the separator
  ChatAdapter itself writes before the marker), then EOS. A trained role thus ends its output the way the parser and
  the stop string expect, and also stops on EOS where no stop string is set.
- ``end_marker="auto"`` (default) adds the marker only to ChatAdapter-formatted completions (they hold a
  ``[[ ## field ## ]]`` header) that do not already end with it; JSON completions get EOS only.
- The completion text is tokenized without special tokens; EOS is ``tokenizer.eos_token_id`` (``<|im_end|>`` for
  SmolLM2, which also closes the assistant turn in its chat template).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rolecall.errors import ConfigError
from rolecall.lm.backend import ModelBackend
from rolecall.optimizers.core.sample import TrainingSample
from rolecall.programs.core.calls import COMPLETED_MARKER
from rolecall.programs.core.trajectory import Step, Trajectory

__all__ = [
    "completion_target",
    "sampled_ids",
    "encode_completion",
    "load_samples",
    "mask_spans",
    "samples_from_trajectory",
    "save_samples",
]

logger = logging.getLogger(__name__)

Span = tuple[int, int]
"""A character range ``[start, end)`` of a completion text."""


def completion_target(completion: str, end_marker: str | None = "auto") -> str:
    """The completion text the model should write, ending with ChatAdapter's completion marker where it applies.

    Args:
        completion: The raw completion recorded for the step (the LM cut the stop string from it).
        end_marker: ``"auto"`` adds ``[[ ## completed ## ]]`` to completions holding a ``[[ ## field ## ]]`` header;
            None adds nothing; another string is added to every completion (unless it already ends with it).

    Returns:
        The target text; it starts with ``completion`` unchanged up to its trailing whitespace, so character spans of
        ``completion`` index the same characters of the target.

    Example:
        >>> completion_target("[[ ## answer ## ]]\\nParis\\n")
        '[[ ## answer ## ]]\\nParis\\n\\n[[ ## completed ## ]]'
        >>> completion_target('{"answer": "Paris"}')
        '{"answer": "Paris"}'
    """
    marker = end_marker
    if end_marker == "auto":
        marker = COMPLETED_MARKER if "[[ ## " in completion else None
    if not marker or completion.rstrip().endswith(marker):
        return completion
    body = completion.rstrip()
    return f"{body}\n\n{marker}" if body else marker


def encode_completion(
    tokenizer: Any, text: str, *, add_eos: bool = True, spans: Sequence[Span] = ()
) -> tuple[list[int], list[int]]:
    """Tokenizes a completion target and builds its loss mask, 0 on tokens touching any of ``spans``.

    Args:
        tokenizer: A fast Hugging Face tokenizer (character offsets are needed when ``spans`` is given).
        text: The target text (see :func:`completion_target`).
        add_eos: Append ``tokenizer.eos_token_id`` (mask 1: the model must learn to stop).
        spans: Character ranges ``[start, end)`` of ``text`` that carry no gradient.

    Returns:
        ``(completion_ids, loss_mask)``, equally long.

    Raises:
        ConfigError: If ``add_eos`` is set and the tokenizer has no EOS token.
    """
    ids, mask = mask_spans(text, spans, tokenizer)
    if add_eos:
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            raise ConfigError("The tokenizer has no eos_token_id; pass add_eos=False or a tokenizer with an EOS token.")
        ids, mask = [*ids, int(eos)], [*mask, 1]
    return ids, mask


def mask_spans(completion_text: str, spans: Sequence[Span], tokenizer: Any) -> tuple[list[int], list[int]]:
    """Tokenizes ``completion_text`` and zeroes the loss mask of every token overlapping one of ``spans``.

    A token that overlaps a span by even one character is masked (the model did not write it all). Equivalent to
    the naive: tokenize, then for each token ``[a, b)`` of the offset mapping set ``mask = 0`` if any span ``[s, e)``
    has ``a < e and s < b``.

    Args:
        completion_text: The completion as the model saw it, e.g. with retrieved passages inserted between turns.
        spans: Character ranges ``[start, end)`` that carry no gradient (0 <= start <= end <= len(text)).
        tokenizer: A fast Hugging Face tokenizer (``return_offsets_mapping`` support).

    Returns:
        ``(ids, mask)``: the token ids (no special tokens) and one 0/1 per token.

    Raises:
        ValueError: If a span lies outside the text or ends before it starts.

    Example:
        >>> text = "Search: x\\nPassage: Paris is big.\\nAnswer: Paris"
        >>> start = text.index("Passage"); end = text.index("Answer")
        >>> ids, mask = mask_spans(text, [(start, end)], tokenizer)  # doctest: +SKIP
    """
    for start, end in spans:
        if not 0 <= start <= end <= len(completion_text):
            raise ValueError(f"Span ({start}, {end}) is outside the completion of {len(completion_text)} characters.")
    if not spans:
        ids = list(tokenizer(completion_text, add_special_tokens=False)["input_ids"])
        return ids, [1] * len(ids)
    encoded = tokenizer(completion_text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]
    mask = [0 if any(a < e and s < b for s, e in spans) else 1 for a, b in offsets]
    return ids, mask


def samples_from_trajectory(
    trajectory: Trajectory | Iterable[Step],
    tokenizer_or_lm: Any,
    *,
    roles: Sequence[str] | None = None,
    adapter_of: Mapping[str, str] | Callable[[Step], str | None] | None = None,
    include_failed: bool = False,
    end_marker: str | None = "auto",
    add_eos: bool = True,
    spans_of: Callable[[Step], Sequence[Span]] | None = None,
    advantage: float | None = None,
    exact_ids: bool = True,
) -> list[TrainingSample]:
    """Builds one :class:`TrainingSample` per recorded role call, exactly as the role saw it.

    Args:
        trajectory: A recorded :class:`Trajectory` (or its steps).
        tokenizer_or_lm: A ``LocalLM`` view, a :class:`ModelBackend`, or a Hugging Face tokenizer (its chat template
            is applied the way :meth:`ModelBackend.encode_messages` applies it).
        roles: Keep only these roles (default: every role).
        adapter_of: The adapter each sample trains: a mapping role -> adapter or a function of the step. Default: the
            adapter recorded on the step, else the role name.
        include_failed: Also keep steps whose output did not parse (off by default: SFT must not learn them).
        end_marker: See :func:`completion_target`.
        add_eos: Append EOS to each completion (the default: the model learns to stop).
        spans_of: Character spans of ``step.completion`` that carry no gradient; default
            ``step.meta.get("masked_spans", [])`` (e.g. passages a program inserted into a multi-turn completion).
        advantage: A scalar advantage given to every sample (e.g. a rejection-sampling weight); default None.
        exact_ids: Train a sampled call on the token ids its engine sampled (module docstring); False always
            re-tokenizes the text (``end_marker`` and ``add_eos`` apply).

    Returns:
        The samples in step order. Steps of another kind, without messages or completion, and (unless
        ``include_failed``) failed steps are skipped.

    Raises:
        TypeError: If ``tokenizer_or_lm`` is none of the accepted kinds.
    """
    encode, tokenizer = _encoder(tokenizer_or_lm)
    steps = trajectory.steps if isinstance(trajectory, Trajectory) else list(trajectory)
    samples = []
    for step in steps:
        if step.kind != "role" or (roles is not None and step.role not in roles):
            continue
        if not step.messages or step.completion is None or (not step.ok and not include_failed):
            continue
        spans = list(spans_of(step) if spans_of is not None else step.meta.get("masked_spans", []))
        sampled = sampled_ids(step, tokenizer) if exact_ids and not spans else None
        if sampled is not None:
            completion_ids, loss_mask = sampled, [1] * len(sampled)
        else:
            completion_ids, loss_mask = encode_completion(tokenizer, completion_target(step.completion, end_marker),
                                                          add_eos=add_eos, spans=[tuple(s) for s in spans])  # fmt: skip
        samples.append(
            TrainingSample(
                role=step.role,
                adapter=_adapter(step, adapter_of),
                prompt_ids=encode(step.messages),
                completion_ids=completion_ids,
                loss_mask=loss_mask,
                advantage=advantage,
            )
        )
    logger.debug("%d samples from %d steps", len(samples), len(steps))
    return samples


def sampled_ids(step: Step, tokenizer: Any) -> list[int] | None:
    """The token ids the engine sampled for ``step.completion`` (``step.meta["sampled"]``), or None when there are
    none or they do not decode to text starting with the recorded completion (another tokenizer, another call).

    Example:
        >>> step = Step(kind="role", role="qa", completion="Paris", meta={"sampled": {"token_ids": [1, 2]}})
        >>> sampled_ids(step, tokenizer)  # doctest: +SKIP
        [1, 2]
    """
    ids = (step.meta.get("sampled") or {}).get("token_ids")
    if not ids or step.completion is None:
        return None
    if not tokenizer.decode(ids, skip_special_tokens=True).startswith(step.completion):
        logger.debug("sampled ids of a %s call do not decode to its completion; re-tokenizing the text", step.role)
        return None
    return [int(t) for t in ids]


def _adapter(step: Step, adapter_of: Mapping[str, str] | Callable[[Step], str | None] | None) -> str:
    if callable(adapter_of):
        chosen = adapter_of(step)
    elif adapter_of is not None:
        chosen = adapter_of.get(step.role)
    else:
        chosen = None
    return chosen or step.adapter or step.role


def _encoder(source: Any) -> tuple[Callable[[Sequence[dict[str, Any]]], list[int]], Any]:
    """``(encode_messages, tokenizer)`` of a LocalLM, a ModelBackend or a tokenizer."""
    backend = getattr(source, "backend", None)
    if isinstance(backend, ModelBackend) or hasattr(backend, "encode_messages"):
        return backend.encode_messages, backend.tokenizer
    if hasattr(source, "encode_messages") and hasattr(source, "tokenizer"):
        return source.encode_messages, source.tokenizer
    if callable(source) and hasattr(source, "eos_token_id"):
        # the backend's own method on a stand-in holding only the tokenizer: one encoding rule, not two
        stand_in = SimpleNamespace(tokenizer=source)
        return (lambda messages: ModelBackend.encode_messages(stand_in, messages)), source
    raise TypeError(
        f"tokenizer_or_lm must be a LocalLM, a ModelBackend or a Hugging Face tokenizer; got {type(source).__name__}."
    )


def save_samples(path: Path, samples: Mapping[str, Sequence[TrainingSample]]) -> None:
    """Writes every adapter's samples to ``path`` as JSON lines (one sample a line, its adapter inside), so a resumed
    run trains on exactly the samples the killed one collected."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for group in samples.values():
            for sample in group:
                f.write(json.dumps(asdict(sample)) + "\n")


def load_samples(path: Path) -> dict[str, list[TrainingSample]]:
    """The samples :func:`save_samples` wrote, by adapter in file order; ``{}`` when ``path`` does not exist.

    Raises:
        ConfigError: If a line is not a sample (a corrupt file: delete it, or start without ``resume``).
    """
    if not path.exists():
        return {}
    out: dict[str, list[TrainingSample]] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            sample = TrainingSample(**json.loads(line))
        except (ValueError, TypeError) as err:
            raise ConfigError(f"{path}:{number} is not a training sample ({err}); delete it or resume=False") from err
        out.setdefault(sample.adapter, []).append(sample)
    return out
