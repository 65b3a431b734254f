"""A small client for OpenAI-compatible servers (``rolecall serve``, ``vllm serve``), retrying with back-off.

Only what served rollouts need: chat completions with n samples and token log-probs, the model list, and vLLM's
runtime LoRA endpoints. Connection errors, time-outs, 429 and 5xx answers are retried with exponential back-off and
counted in :attr:`OpenAIClient.stats`; a 4xx answer is the caller's mistake and raises at once with the server's
message.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from rolecall.errors import RolecallError

__all__ = ["OpenAIClient", "ServerError"]

logger = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class ServerError(RolecallError, RuntimeError):
    """An inference server refused a request, or could not be reached after the retries.

    Attributes:
        status: the HTTP status, or None when no answer came.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class OpenAIClient:
    """Thread-safe JSON client of one OpenAI-compatible server.

    Args:
        base_url: the server's root, with or without ``/v1`` (``http://127.0.0.1:8000``).
        api_key: sent as a bearer token when given (vLLM's ``--api-key``).
        timeout: seconds to wait for one answer.
        max_retries: retries after the first try for connection errors, time-outs, 408 / 429 / 5xx.
        backoff_s: the first retry's wait; each further retry doubles it (capped at ``max_backoff_s``).
        max_backoff_s: the longest wait between two tries.

    Attributes:
        stats: ``requests`` (answered), ``retries``, ``timeouts``, ``connection_errors``, ``failures`` (gave up).
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 300.0,
        max_retries: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
    ) -> None:
        import httpx

        root = base_url.rstrip("/")
        self.base_url = root[: -len("/v1")] if root.endswith("/v1") else root
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, limits=limits)
        self.max_retries = max(0, int(max_retries))
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.stats: dict[str, float] = dict.fromkeys(
            ("requests", "retries", "timeouts", "connection_errors", "failures"), 0.0
        )
        self._stats_lock = threading.Lock()

    def _count(self, key: str) -> None:
        with self._stats_lock:
            self.stats[key] += 1

    def request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        """Send one request, retrying transient failures; returns the decoded JSON (or the text of a text answer).

        Raises:
            ServerError: On a 4xx answer (with the server's message), or when every try failed.
        """
        import httpx

        last = "no attempt"
        for attempt in range(self.max_retries + 1):
            if attempt:
                self._count("retries")
                time.sleep(min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))
            try:
                response = self._http.request(method, path, json=payload)
            except httpx.TimeoutException as exc:
                self._count("timeouts")
                last = f"timed out ({exc})"
                logger.warning("%s %s %s (try %d of %d)", method, path, last, attempt + 1, self.max_retries + 1)
                continue
            except httpx.TransportError as exc:
                self._count("connection_errors")
                last = f"could not connect ({type(exc).__name__}: {exc})"
                logger.warning("%s %s: %s (try %d of %d)", method, path, last, attempt + 1, self.max_retries + 1)
                continue
            if response.status_code in RETRY_STATUS:
                last = f"HTTP {response.status_code}: {_message(response)}"
                logger.warning("%s %s: %s (try %d of %d)", method, path, last, attempt + 1, self.max_retries + 1)
                continue
            if response.status_code >= 400:
                raise ServerError(
                    f"{method} {self.base_url}{path} answered HTTP {response.status_code}: {_message(response)}",
                    status=response.status_code,
                )
            self._count("requests")
            if "json" in response.headers.get("content-type", ""):
                return response.json()
            return response.text
        self._count("failures")
        raise ServerError(
            f"{method} {self.base_url}{path} failed after {self.max_retries + 1} tries: {last}. Is the server running "
            f"(rolecall serve / vllm serve --enable-lora) and reachable at {self.base_url}?"
        )

    # ------------------------------------------------------------------ endpoints
    def models(self) -> list[dict[str, Any]]:
        """``GET /v1/models``: the base model and the loaded adapters."""
        return list(self.request("GET", "/v1/models").get("data", []))

    def chat(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/chat/completions``."""
        return self.request("POST", "/v1/chat/completions", payload)

    def load_adapter(self, name: str, path: str) -> None:
        """Load (or replace) LoRA adapter ``name`` from ``path`` on the server.

        Asks for an in-place load first; a server that does not replace loaded adapters (older vLLM answers 400 "has
        already been loaded") gets an unload and a fresh load.

        Raises:
            ServerError: If the server refuses the adapter, or has no runtime LoRA loading (HTTP 404: vLLM registers
                the endpoint only when started with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``).
        """
        try:
            self.request("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path, "load_inplace": True})
        except ServerError as err:
            if err.status == 404 and str(err).endswith(": Not Found"):  # the route itself is missing
                raise ServerError(
                    f"{err} -- the server cannot load LoRA adapters at run time: start vLLM with the environment "
                    "variable VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora (rolecall serve always can)",
                    status=404,
                ) from err
            if err.status != 400 or "already" not in str(err):
                raise
            self.unload_adapter(name)
            self.request("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    def unload_adapter(self, name: str) -> None:
        """Unload LoRA adapter ``name`` from the server."""
        self.request("POST", "/v1/unload_lora_adapter", {"lora_name": name})

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()


def _message(response: Any) -> str:
    """The error message of an answer: OpenAI's ``{"error": {"message"}}``, vLLM's ``{"message"}``, FastAPI's
    ``{"detail"}``, or the text."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if body.get("message"):
            return str(body["message"])
        if isinstance(body.get("detail"), str):  # FastAPI's own answers (an unknown route: "Not Found")
            return body["detail"]
    return str(body)[:500]
