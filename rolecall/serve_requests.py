"""The request side of ``rolecall serve`` (:mod:`rolecall.serve`): its limits, the OpenAI-style error it answers with,
and the checks that turn a JSON body's fields into typed values or a 4xx that names the field and the fix."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

__all__ = [
    "ADAPTER_NAME",
    "APIError",
    "DEFAULT_MAX_TOKENS",
    "ERROR_TYPES",
    "MAX_BODY_BYTES",
    "MAX_LOGPROBS",
    "MAX_N",
    "MAX_PROMPTS",
    "MAX_ROWS",
    "ROLES",
    "Sampling",
    "bad_request",
    "bool_field",
    "float_field",
    "int_field",
    "messages_field",
    "name_field",
    "stop_field",
]

MAX_BODY_BYTES = 16 * 2**20
"""Largest request body accepted (413 above it)."""
MAX_N = 64
"""Most samples per prompt (``n``)."""
MAX_PROMPTS = 256
"""Most prompts in one ``/v1/completions`` request."""
MAX_ROWS = 1024
"""Most sample rows (prompts times ``n``) in one ``/v1/completions`` request."""
MAX_LOGPROBS = 20
"""Largest ``logprobs`` of ``/v1/completions`` (only the sampled token is returned whatever it is)."""
DEFAULT_MAX_TOKENS = 256
ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
ROLES = ("system", "user", "assistant")
ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    411: "LengthRequiredError",
    413: "RequestTooLargeError",
    500: "InternalServerError",
}


class APIError(Exception):
    """An error answered as OpenAI's ``{"error": {...}}`` body with HTTP status ``status``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, close: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.close = status, message, param, close


# ---------------------------------------------------------------------------------------------------- validation
def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def int_field(body: dict[str, Any], name: str, default: int | None, lo: int, hi: int | None = None) -> int | None:
    """``body[name]`` as an int in ``[lo, hi]`` (``default`` when absent or null)."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer, got {value!r}", name)
    if value < lo or (hi is not None and value > hi):
        bounds = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise bad_request(f"'{name}' must be {bounds}, got {value}", name)
    return value


def float_field(
    body: dict[str, Any], name: str, default: float, lo: float, hi: float, *, lo_open: bool = False
) -> float:
    """``body[name]`` as a finite number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(f"'{name}' must be a number, got {value!r}", name)
    if value < lo or value > hi or (lo_open and value == lo):
        raise bad_request(f"'{name}' must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {value!r}", name)
    return float(value)


def bool_field(body: dict[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be true or false, got {value!r}", name)
    return value


def name_field(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if value is None:
        raise bad_request(f"'{name}' is required", name)
    if not isinstance(value, str) or not value:
        raise bad_request(f"'{name}' must be a non-empty string, got {value!r}", name)
    return value


@dataclasses.dataclass
class Sampling:
    """The sampling fields both generation endpoints share."""

    n: int
    temperature: float
    top_p: float
    max_tokens: int | None  # None: the default, clipped to the context left after the prompt
    stop: tuple[str, ...]
    seed: int | None

    @classmethod
    def parse(cls, body: dict[str, Any]) -> Sampling:
        if body.get("stream"):
            raise bad_request("'stream': true is not supported; omit it (responses come whole)", "stream")
        for penalty in ("frequency_penalty", "presence_penalty"):
            if float_field(body, penalty, 0.0, -2.0, 2.0) != 0.0:
                raise bad_request(f"'{penalty}' is not supported; omit it or pass 0", penalty)
        max_tokens = int_field(body, "max_tokens", None, 1)  # the newer name wins when both are given, as in vLLM
        max_tokens = int_field(body, "max_completion_tokens", max_tokens, 1)
        return cls(
            n=int_field(body, "n", 1, 1, MAX_N),  # type: ignore[arg-type]
            temperature=float_field(body, "temperature", 1.0, 0.0, 100.0),
            top_p=float_field(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
            max_tokens=max_tokens,
            stop=stop_field(body.get("stop")),
            seed=int_field(body, "seed", None, -(2**62), 2**62),
        )


def stop_field(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 16:
        raise bad_request(f"'stop' must be a non-empty string or a list of at most 16 of them, got {value!r}", "stop")
    return tuple(stops)


def messages_field(value: Any) -> list[dict[str, str]]:
    """Chat messages with their content flattened to a string (text parts joined)."""
    if not isinstance(value, list) or not value:
        raise bad_request(
            f"'messages' must be a non-empty list of {{role, content}} objects, got {value!r:.200}", "messages"
        )
    messages = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise bad_request(
                f"messages[{i}] must be an object whose role is one of {list(ROLES)}, got {m!r:.200}", "messages"
            )
        content = m.get("content")
        if isinstance(content, list):
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
            ):
                raise bad_request(
                    f"messages[{i}].content parts must be {{'type': 'text', 'text': str}} (only text is supported), "
                    f"got {content!r:.200}",
                    "messages",
                )
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise bad_request(
                f"messages[{i}].content must be a string or a list of text parts, got {content!r:.200}", "messages"
            )
        messages.append({"role": m["role"], "content": content})
    return messages
