"""OpenAIClient against real loopback HTTP servers: transient failures are retried with back-off and counted, a 4xx
raises at once with the server's message, an unreachable server fails after its retries with a clear error."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rolecall.lm.openai_client import OpenAIClient, ServerError
from rolecall.lm.served import chat_payload, completions_from_chat


class _Flaky(BaseHTTPRequestHandler):
    """Answers 503 to the first ``failures`` requests, then 200 with a JSON echo; /bad answers 400."""

    failures = 2
    seen = 0

    def log_message(self, *args):  # keep pytest output clean
        pass

    def do_POST(self):  # noqa: N802 (http.server's naming)
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        type(self).seen += 1
        if self.path == "/v1/bad":
            self._send(400, {"error": {"message": "n must be >= 1, got 0", "code": 400}})
        elif type(self).seen <= type(self).failures:
            self._send(503, {"error": {"message": "busy"}})
        else:
            self._send(200, {"echo": body})

    def _send(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def flaky_server():
    _Flaky.seen = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_retries_5xx_with_backoff_then_succeeds(flaky_server):
    client = OpenAIClient(flaky_server + "/v1", max_retries=3, backoff_s=0.01)
    assert client.request("POST", "/v1/echo", {"x": 1}) == {"echo": {"x": 1}}
    assert client.stats["retries"] == 2 and client.stats["requests"] == 1 and client.stats["failures"] == 0


def test_gives_up_after_max_retries(flaky_server):
    _Flaky.failures = 10
    try:
        client = OpenAIClient(flaky_server, max_retries=2, backoff_s=0.01)
        with pytest.raises(ServerError, match="failed after 3 tries: HTTP 503: busy"):
            client.request("POST", "/v1/echo", {})
        assert client.stats["failures"] == 1 and client.stats["retries"] == 2
    finally:
        _Flaky.failures = 2


def test_4xx_raises_at_once_with_the_servers_message(flaky_server):
    client = OpenAIClient(flaky_server, max_retries=3, backoff_s=0.01)
    with pytest.raises(ServerError, match="HTTP 400: n must be >= 1, got 0") as info:
        client.request("POST", "/v1/bad", {})
    assert info.value.status == 400 and client.stats["retries"] == 0


def test_unreachable_server_counts_connection_errors():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = OpenAIClient(f"http://127.0.0.1:{port}", max_retries=1, backoff_s=0.01, timeout=2)
    with pytest.raises(ServerError, match="Is the server running"):
        client.models()
    assert client.stats["connection_errors"] == 2 and client.stats["failures"] == 1


def test_chat_payload_asks_for_token_ids_with_logprobs():
    payload = chat_payload([{"role": "user", "content": "hi"}], model="plan", n=4, temperature=1.0, stop=["\n"],
                           seed=3, logprobs=True)  # fmt: skip
    assert payload["n"] == 4 and payload["stop"] == ["\n"] and payload["seed"] == 3
    assert payload["logprobs"] is True and payload["return_tokens_as_token_ids"] is True
    assert "logprobs" not in chat_payload([{"role": "user", "content": "hi"}], model="plan")


def test_completions_from_chat_reads_token_ids_or_retokenizes(smollm_tokenizer):
    eos = smollm_tokenizer.eos_token_id
    ids = smollm_tokenizer("Paris is", add_special_tokens=False)["input_ids"]
    body = {
        "usage": {"prompt_tokens": 12},
        "choices": [
            {"index": 1, "message": {"content": "Paris is"}, "finish_reason": "stop", "logprobs": None},
            {"index": 0, "message": {"content": "Paris is"}, "finish_reason": "length",
             "logprobs": {"content": [{"token": f"token_id:{i}", "logprob": -0.5} for i in ids]}},
        ],
    }  # fmt: skip
    first, second = completions_from_chat(body, smollm_tokenizer, eos)
    assert first.token_ids == ids and first.logprobs == [-0.5] * len(ids) and first.finish_reason == "length"
    assert first.prompt_tokens == 12
    assert second.token_ids == [*ids, eos] and second.logprobs is None and second.finish_reason == "stop"
