"""The OpenAI-shaped pieces of ``rolecall serve``'s answers: the response envelope, usage, finish reasons and the
per-token log-probs of the chat and completion endpoints (:mod:`rolecall.serve` builds the choices)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from rolecall.lm.generation import Completion

__all__ = ["chat_logprobs", "completion_logprobs", "finish_reason", "response_envelope"]


def _token_texts(tokenizer: Any, ids: Sequence[int], as_ids: bool) -> list[str]:
    if as_ids:
        return [f"token_id:{i}" for i in ids]
    return tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)


def _logprob(value: float) -> float:
    return max(value, -9999.0)  # -inf is not JSON


def chat_logprobs(tokenizer: Any, c: Completion, as_ids: bool) -> dict[str, Any]:
    """The chat endpoint's ``logprobs`` of one completion (each sampled token with its log-prob and bytes)."""
    tokens = _token_texts(tokenizer, c.token_ids, as_ids)
    return {
        "content": [
            {
                "token": t,
                "logprob": _logprob(lp),
                "bytes": list(t.encode("utf-8", errors="replace")),
                "top_logprobs": [],
            }
            for t, lp in zip(tokens, c.logprobs or [], strict=True)
        ]
    }


def completion_logprobs(tokenizer: Any, c: Completion, as_ids: bool) -> dict[str, Any]:
    """The completion endpoint's ``logprobs`` of one completion (tokens, log-probs, text offsets)."""
    tokens = _token_texts(tokenizer, c.token_ids, as_ids)
    logprobs = [_logprob(lp) for lp in c.logprobs or []]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": logprobs,
        "top_logprobs": [{t: lp} for t, lp in zip(tokens, logprobs, strict=True)],  # only the sampled token
        "text_offset": offsets,
    }


def _usage(prompt_tokens: int, completions: Sequence[Completion]) -> dict[str, int]:
    generated = sum(c.completion_tokens for c in completions)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": generated, "total_tokens": prompt_tokens + generated}


def finish_reason(completion: Completion) -> str:
    """The OpenAI ``finish_reason`` of a completion: ``stop`` (EOS or a stop string) or ``length`` (budget spent)."""
    return "stop" if completion.finish_reason == "stop" else "length"


def response_envelope(
    id_prefix: str,
    kind: str,
    model: str,
    choices: list[dict[str, Any]],
    prompt_tokens: int,
    completions: Sequence[Completion],
) -> dict[str, Any]:
    """The OpenAI response envelope both generation endpoints answer with (``kind`` is its ``object``)."""
    return {
        "id": f"{id_prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage(prompt_tokens, completions),
    }
