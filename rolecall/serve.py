"""``rolecall serve``: an OpenAI-compatible HTTP server over a :class:`~rolecall.lm.local.LocalLM`.

The endpoints are the subset of OpenAI's API that rolecall's clients use, with vLLM's runtime LoRA extensions:

* ``POST /v1/chat/completions`` and ``POST /v1/completions``: the ``model`` field picks the base model (its served name)
  or a loaded LoRA adapter (its name). One chat request is one
  :class:`~rolecall.lm.generation.GenerationRequest`, so its ``n`` samples share one prompt prefill.
* ``GET /v1/models``: the base model, then one entry per loaded LoRA adapter (``parent``: the base), as vLLM lists them.
* ``POST /v1/load_lora_adapter`` / ``POST /v1/unload_lora_adapter``: vLLM's hot LoRA (re)loading. A per-adapter
  readers/writer gate lets in-flight requests of an adapter finish before its weights are swapped or removed. A load
  that fails (a damaged folder, an adapter of another base model) answers 400 and changes nothing.
* ``GET /health`` (200) and ``GET /stats`` (rolecall's: completed requests per model, errors per status, batcher
  counters, adapter versions).

Every handler thread submits to the LM's batcher, so concurrent HTTP requests decode in one running batch exactly as
concurrent ``LocalLM`` calls do (continuous batching, role prompt prefixes cached).

Where it differs from OpenAI: no streaming; log-probabilities are the model's own at temperature 1
(:attr:`GenerationRequest.logprobs`) and cover the sampled tokens only: alternatives are not computed, so chat's
``top_logprobs`` must be 0 and each of a completion's ``top_logprobs`` dicts holds just the sampled token. A
completion's tokens include its EOS token (as :attr:`Completion.token_ids` do), in ``logprobs`` and in
``usage.completion_tokens``; its text does not. In ``/v1/completions`` prompt ``i`` of a list is sampled with seed
``seed + 1000 * i``, as :meth:`LocalLM.sample` does.

Example:
    >>> server = make_server(LocalLM(), port=0)             # doctest: +SKIP
    >>> threading.Thread(target=server.serve_forever, daemon=True).start()  # doctest: +SKIP
    >>> dspy.LM("openai/smollm2-135m-instruct", api_base=server.url + "/v1", api_key="-")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rolecall.errors import ModelLoadError
from rolecall.lm.generation import BASE_ADAPTER, Completion, GenerationRequest
from rolecall.lm.local import LocalLM, prompt_group
from rolecall.serve_requests import (
    ADAPTER_NAME,
    DEFAULT_MAX_TOKENS,
    ERROR_TYPES,
    MAX_BODY_BYTES,
    MAX_LOGPROBS,
    MAX_N,
    MAX_PROMPTS,
    MAX_ROWS,
    APIError,
    Sampling,
    bad_request,
    bool_field,
    int_field,
    messages_field,
    name_field,
)
from rolecall.serve_responses import chat_logprobs, completion_logprobs, finish_reason, response_envelope

__all__ = ["RolecallServer", "make_server", "serve", "default_model_name", "MAX_BODY_BYTES", "MAX_N"]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------- the gate
class _AdapterGate:
    """A readers/writer lock over one adapter: generations hold it shared, a load or unload holds it alone.

    A waiting writer keeps new readers out, so a steady stream of requests cannot starve a reload; the swap then
    happens between the last in-flight request finishing and the next one starting.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writing and not self._writers_waiting)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            self._cond.wait_for(lambda: not self._writing and not self._readers)
            self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


# ---------------------------------------------------------------------------------------------------- the server
def default_model_name(lm: LocalLM) -> str:
    """The name the base model is served under: the model's short name (``smollm2-135m-instruct``)."""
    name = lm.model.split("@")[0].removeprefix("local/")
    return name.rsplit(":", 1)[-1] or "model"


class RolecallServer(ThreadingHTTPServer):
    """A threaded HTTP server answering OpenAI-style requests with one :class:`LocalLM` (see the module docstring).

    Args:
        lm: the LM to serve; its base model and every LoRA adapter on its backend are served.
        host: address to listen on.
        port: port to listen on; 0 picks a free one (read it from :attr:`url`).
        served_model_name: the base model's name in requests and ``/v1/models`` (default :func:`default_model_name`).
    """

    daemon_threads = True
    request_queue_size = 256  # many clients connect at once; a short listen backlog makes them retry after 1 s

    def __init__(self, lm: LocalLM, *, host: str = "127.0.0.1", port: int = 0, served_model_name: str | None = None):
        if not isinstance(lm, LocalLM):
            raise TypeError(f"make_server needs a rolecall LocalLM, got {type(lm).__name__}")
        self.lm = lm
        self.backend = lm.backend
        self.model_name = served_model_name or default_model_name(lm)
        if self.model_name == BASE_ADAPTER or self.model_name in self.backend.adapters:
            raise ValueError(f"served_model_name {self.model_name!r} is reserved or an adapter's name; pick another")
        self.created = int(time.time())
        config = getattr(self.backend.model, "config", None)
        self.context_length: int | None = getattr(config, "max_position_embeddings", None)
        self.vocab_size: int = getattr(config, "vocab_size", None) or len(self.backend.tokenizer)
        self._lock = threading.Lock()
        self.completed: Counter[str] = Counter()
        self.errors: Counter[int] = Counter()
        self._gates: dict[str, _AdapterGate] = {}
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the listening socket."""
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in str(host) else f"http://{host}:{port}"

    # ------------------------------------------------------------------ state
    def gate(self, adapter: str) -> _AdapterGate:
        with self._lock:
            return self._gates.setdefault(adapter, _AdapterGate())

    def count(self, *, model: str | None = None, status: int | None = None) -> None:
        with self._lock:
            if model is not None:
                self.completed[model] += 1
            if status is not None:
                self.errors[status] += 1

    def models(self) -> dict[str, Any]:
        base = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "rolecall"}
        data = [{**base, "root": self.model_name, "parent": None, "max_model_len": self.context_length}]
        for name in self.backend.adapters:
            data.append({**base, "id": name, "root": name, "parent": self.model_name})
        return {"object": "list", "data": data}

    def stats(self) -> dict[str, Any]:
        batcher = self.backend.batcher.stats
        with self._lock:
            completed, errors = dict(self.completed), {str(k): v for k, v in sorted(self.errors.items())}
        return {
            "requests": completed,
            "errors": errors,
            "batcher": {**dataclasses.asdict(batcher), "mean_rows": batcher.mean_rows},
            "adapters": {name: self.backend.adapter_versions.get(name, 0) for name in self.backend.adapters},
        }

    # ------------------------------------------------------------------ generation
    def generate(self, model: Any, requests: list[GenerationRequest]) -> tuple[str, list[list[Completion]]]:
        """Run ``requests`` on the model named ``model`` (None: the base), holding its adapter's gate shared.
        Returns the model name answered and each request's completions."""
        if model is None or model == self.model_name:
            return self.model_name, self.backend.generate(requests)
        if not isinstance(model, str):
            raise bad_request(f"'model' must be a string, got {model!r}", "model")
        with self._lock:
            gate = self._gates.get(model)  # (an adapter being reloaded in place is briefly missing from the model)
        if gate is None and model not in self.backend.adapters:
            raise self._unknown_model(model)
        with (gate or self.gate(model)).shared():
            if model not in self.backend.adapters:  # unloaded while this request waited for the gate
                raise self._unknown_model(model)
            for r in requests:
                r.adapter = model
            return model, self.backend.generate(requests)

    def _unknown_model(self, model: str) -> APIError:
        known = [self.model_name, *self.backend.adapters]
        return APIError(404, f"The model {model!r} does not exist; served models: {known}", param="model")

    def budget(self, prompt_ids: Sequence[int], max_tokens: int | None, param: str) -> int:
        """The completion budget of one prompt, checked against the context length."""
        if not prompt_ids:
            raise bad_request("the prompt is empty; send at least one token", param)
        bad = [i for i in prompt_ids if not 0 <= i < self.vocab_size]
        if bad:
            raise bad_request(f"token ids must be in [0, {self.vocab_size}), got {bad[:5]}", param)
        if self.context_length is None:
            return max_tokens or DEFAULT_MAX_TOKENS
        room = self.context_length - len(prompt_ids)
        if max_tokens is None and room >= 1:
            return min(DEFAULT_MAX_TOKENS, room)
        if max_tokens is None or max_tokens > room:
            raise bad_request(
                f"This model's maximum context length is {self.context_length} tokens; the prompt has "
                f"{len(prompt_ids)} and max_tokens is {max_tokens or DEFAULT_MAX_TOKENS}; shorten one",
                "max_tokens",
            )
        return max_tokens

    # ------------------------------------------------------------------ adapters
    def load_adapter(self, name: str, path: str, load_inplace: bool) -> None:
        """Load (or with ``load_inplace``, replace) LoRA adapter ``name`` from a PEFT folder ``path``.

        All or nothing (:meth:`ModelBackend.load_adapter <rolecall.lm.backend.ModelBackend.load_adapter>`): a folder
        that does not load answers 400 naming it and leaves the server as it was; an adapter it was to replace keeps
        serving its old weights."""
        if name in (self.model_name, BASE_ADAPTER):
            raise bad_request(f"lora_name {name!r} is the base model's name; pick another", "lora_name")
        if not ADAPTER_NAME.fullmatch(name) or name in "lora_":
            raise bad_request(
                f"lora_name must be letters, digits, '_' or '-' (at most 128) and not part of 'lora_' (PEFT would "
                f"confuse it with its own weight names), got {name!r}",
                "lora_name",
            )
        with self.gate(name).exclusive():
            if name in self.backend.adapters and not load_inplace:
                raise bad_request(
                    f"The LoRA adapter {name!r} is already loaded; pass load_inplace=true to replace its weights",
                    "lora_name",
                )
            try:  # all or nothing: a failed load leaves no trace, and a replaced adapter keeps its old weights
                self.backend.load_adapter(name, Path(path).expanduser())
            except ModelLoadError as err:  # a damaged folder, or an adapter of another base model
                logger.warning("loading LoRA adapter %r from %s failed: %s", name, path, err)
                raise bad_request(str(err), "lora_path") from err
        logger.info("loaded LoRA adapter %r from %s", name, path)

    def unload_adapter(self, name: str) -> None:
        """Remove LoRA adapter ``name`` once its in-flight requests are done."""
        if name not in self.backend.adapters:
            raise APIError(
                404, f"The LoRA adapter {name!r} is not loaded; loaded: {self.backend.adapters}", param="lora_name"
            )
        with self.gate(name).exclusive():
            if name not in self.backend.adapters:
                raise APIError(404, f"The LoRA adapter {name!r} is not loaded", param="lora_name")
            self.backend.delete_adapter(name)  # keeps the version count, unwraps PEFT after the last adapter
        logger.info("unloaded LoRA adapter %r", name)


def make_server(
    lm: LocalLM, *, host: str = "127.0.0.1", port: int = 0, served_model_name: str | None = None
) -> RolecallServer:
    """A bound, not yet serving :class:`RolecallServer`; call ``serve_forever()`` (and later ``shutdown()``).

    Raises:
        OSError: If the address cannot be bound (the port is taken).
    """
    return RolecallServer(lm, host=host, port=port, served_model_name=served_model_name)


def serve(lm: LocalLM, *, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None) -> None:
    """Serve ``lm`` until interrupted (blocks)."""
    server = make_server(lm, host=host, port=port, served_model_name=served_model_name)
    logger.info("rolecall serve: listening on %s (model %s)", server.url, server.model_name)
    try:
        server.serve_forever()
    finally:
        server.server_close()


def _generation_request(
    sampling: Sampling,
    prompt_ids: list[int],
    *,
    max_tokens: int,
    seed: int | None,
    logprobs: bool,
    prefix_group: str | None = None,
) -> GenerationRequest:
    """One prompt's :class:`GenerationRequest` with the body's sampling fields."""
    return GenerationRequest(
        prompt_ids=prompt_ids,
        n=sampling.n,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_tokens=max_tokens,
        stop=sampling.stop,
        seed=seed,
        logprobs=logprobs,
        prefix_group=prefix_group,
    )


def chat_completion(server: RolecallServer, body: dict[str, Any]) -> dict[str, Any]:
    """Answer a ``/v1/chat/completions`` body."""
    messages = messages_field(body.get("messages"))
    sampling = Sampling.parse(body)
    logprobs = bool_field(body, "logprobs")
    if int_field(body, "top_logprobs", 0, 0) != 0:
        raise bad_request(
            "'top_logprobs' > 0 is not supported: alternative tokens are not computed; pass 0", "top_logprobs"
        )
    as_ids = bool_field(body, "return_tokens_as_token_ids")
    try:
        prompt_ids = server.backend.encode_messages(messages)
    except Exception as err:  # the chat template rejects the conversation (roles out of order, ...)
        raise bad_request(f"the chat template rejected these messages: {err}", "messages") from err
    request = _generation_request(
        sampling,
        prompt_ids,
        max_tokens=server.budget(prompt_ids, sampling.max_tokens, "messages"),
        seed=sampling.seed,
        logprobs=logprobs,
        prefix_group=prompt_group(messages),
    )
    model, (completions,) = server.generate(body.get("model"), [request])
    choices = [
        {
            "index": j,
            "message": {"role": "assistant", "content": c.text},
            "finish_reason": finish_reason(c),
            "logprobs": chat_logprobs(server.backend.tokenizer, c, as_ids) if logprobs else None,
        }
        for j, c in enumerate(completions)
    ]
    return response_envelope("chatcmpl", "chat.completion", model, choices, len(prompt_ids), completions)


def _prompts(server: RolecallServer, value: Any) -> list[list[int]]:
    """``prompt`` as token ids: a string, a list of strings, a list of ids, or a list of lists of ids."""
    tokenizer = server.backend.tokenizer

    def ids(p: Any) -> list[int]:
        if isinstance(p, str):
            return list(tokenizer(p)["input_ids"])
        if isinstance(p, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in p):
            return list(p)
        raise bad_request(f"each prompt must be a string or a list of token ids, got {p!r:.200}", "prompt")

    if isinstance(value, str) or (isinstance(value, list) and value and isinstance(value[0], int)):
        return [ids(value)]
    if not isinstance(value, list) or not value:
        raise bad_request(
            f"'prompt' must be a string, a list of strings or a list of token ids, got {value!r:.200}", "prompt"
        )
    if len(value) > MAX_PROMPTS:
        raise bad_request(f"at most {MAX_PROMPTS} prompts per request, got {len(value)}; split the request", "prompt")
    return [ids(p) for p in value]


def completion(server: RolecallServer, body: dict[str, Any]) -> dict[str, Any]:
    """Answer a ``/v1/completions`` body."""
    if bool_field(body, "echo"):
        raise bad_request("'echo': true is not supported; omit it and prepend the prompt yourself", "echo")
    prompts = _prompts(server, body.get("prompt"))
    sampling = Sampling.parse(body)
    if len(prompts) * sampling.n > MAX_ROWS:
        raise bad_request(f"{len(prompts)} prompts x n={sampling.n} exceeds {MAX_ROWS} samples; split the request", "n")
    top = int_field(body, "logprobs", None, 0, MAX_LOGPROBS)
    as_ids = bool_field(body, "return_tokens_as_token_ids")
    requests = [
        _generation_request(
            sampling,
            p,
            max_tokens=server.budget(p, sampling.max_tokens, "prompt"),
            seed=None if sampling.seed is None else sampling.seed + 1000 * i,
            logprobs=top is not None,
        )
        for i, p in enumerate(prompts)
    ]
    model, results = server.generate(body.get("model"), requests)
    choices = [
        {
            "index": i * sampling.n + j,
            "text": c.text,
            "finish_reason": finish_reason(c),
            "logprobs": completion_logprobs(server.backend.tokenizer, c, as_ids) if top is not None else None,
        }
        for i, completions in enumerate(results)
        for j, c in enumerate(completions)
    ]
    every = [c for cs in results for c in cs]
    return response_envelope("cmpl", "text_completion", model, choices, sum(len(p) for p in prompts), every)


# ---------------------------------------------------------------------------------------------------- HTTP
class _Handler(BaseHTTPRequestHandler):
    """Routes one connection's requests (HTTP/1.1 keep-alive) to the server's endpoints."""

    protocol_version = "HTTP/1.1"
    timeout = 300  # seconds an idle keep-alive connection is kept
    server: RolecallServer

    GET = ("/v1/models", "/health", "/stats")
    POST = ("/v1/chat/completions", "/v1/completions", "/v1/load_lora_adapter", "/v1/unload_lora_adapter")

    def log_message(self, format: str, *args: Any) -> None:  # (the base class names it format)
        logger.debug("%s " + format, self.address_string(), *args)

    def log_error(self, format: str, *args: Any) -> None:
        logger.info("%s " + format, self.address_string(), *args)

    @property
    def route(self) -> str:
        return urlsplit(self.path).path.rstrip("/") or "/"

    def do_GET(self) -> None:  # (BaseHTTPRequestHandler dispatches on do_<METHOD>)
        self._handle(self.GET, None)

    def do_POST(self) -> None:
        self._handle(self.POST, self._read_body)

    def do_PUT(self) -> None:
        self._handle((), None)

    do_DELETE = do_PATCH = do_PUT

    def _handle(self, routes: Sequence[str], read: Any) -> None:
        try:
            body = read() if read is not None else None
            route = self.route
            if route not in routes:
                known = route in self.GET or route in self.POST
                allowed = "GET" if route in self.GET else "POST"
                if known:
                    raise APIError(405, f"{self.command} is not allowed on {route}; use {allowed}")
                raise APIError(404, f"No route {route}; routes: {sorted(self.GET + self.POST)}")
            self._dispatch(route, body)
        except APIError as err:
            self._send_error(err)
        except Exception as err:  # a bug or a failed generation: answer 500, log it, keep serving
            logger.exception("%s %s failed", self.command, self.path)
            self._send_error(APIError(500, f"internal error: {type(err).__name__}: {err}; see the server log"))

    def _dispatch(self, route: str, body: dict[str, Any] | None) -> None:
        server = self.server
        if route == "/health":
            self._send(200, b"", "text/plain")
        elif route == "/v1/models":
            self._send_json(server.models())
        elif route == "/stats":
            self._send_json(server.stats())
        elif route in ("/v1/chat/completions", "/v1/completions"):
            answer = (chat_completion if route == "/v1/chat/completions" else completion)(server, body or {})
            server.count(model=answer["model"])
            self._send_json(answer)
        elif route == "/v1/load_lora_adapter":
            name = name_field(body or {}, "lora_name")
            server.load_adapter(name, name_field(body or {}, "lora_path"), bool_field(body or {}, "load_inplace"))
            self._send(200, f"Success: LoRA adapter '{name}' added successfully.".encode(), "text/plain")
        else:
            name = name_field(body or {}, "lora_name")
            server.unload_adapter(name)
            self._send(200, f"Success: LoRA adapter '{name}' removed successfully.".encode(), "text/plain")

    def _read_body(self) -> dict[str, Any]:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise APIError(411, "chunked request bodies are not supported; send a Content-Length", close=True)
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise APIError(400, "Content-Length must be an integer", close=True) from None
        if length < 0:
            raise APIError(400, f"Content-Length must be >= 0, got {length}", close=True)
        if length > MAX_BODY_BYTES:
            raise APIError(
                413, f"the request body ({length} bytes) exceeds the {MAX_BODY_BYTES}-byte limit", close=True
            )
        raw = self.rfile.read(length)
        if self.route not in self.POST:
            return {}  # 404 / 405 follows; the body was read so the connection stays usable
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as err:
            raise bad_request(f"the request body is not valid JSON ({err}); send a JSON object") from None
        if not isinstance(body, dict):
            raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
        return body

    def _send(
        self, status: int, payload: bytes, content_type: str, close: bool = False, headers: dict[str, str] | None = None
    ) -> None:
        # a GET / PUT / DELETE body is never read: the connection cannot carry another request after it
        close = close or (self.command != "POST" and self.headers.get("Content-Length", "0") not in ("", "0"))
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the client left; nothing to answer
            self.close_connection = True
            logger.debug("client %s went away before its response", self.address_string())

    def _send_json(
        self, obj: dict[str, Any], status: int = 200, close: bool = False, headers: dict[str, str] | None = None
    ) -> None:
        self._send(status, json.dumps(obj, ensure_ascii=False).encode("utf-8"), "application/json", close, headers)

    def _send_error(self, err: APIError) -> None:
        self.server.count(status=err.status)
        logger.info("%s %s -> %d: %s", self.command, self.path, err.status, err.message)
        error_type = ERROR_TYPES.get(err.status, "BadRequestError" if err.status < 500 else "InternalServerError")
        body = {"error": {"message": err.message, "type": error_type, "param": err.param, "code": err.status}}
        allow = {"Allow": "GET" if self.route in self.GET else "POST"} if err.status == 405 else {}
        self._send_json(body, err.status, close=err.close, headers=allow)
