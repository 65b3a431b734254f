"""``rolecall serve`` on a tiny random Llama: every endpoint's shape, sampling fields, LoRA hot (re)loading, malformed
requests, 512 concurrent requests batched together, and the CLI."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import torch

from rolecall.cli import main
from rolecall.lm import LocalLM
from rolecall.serve import MAX_BODY_BYTES, RolecallServer, default_model_name, make_server
from tests.conftest import make_tiny_llama

REPO_ROOT = Path(__file__).resolve().parents[1]
LONG = "Tell me about the history of the river that runs through the old city, and who built its bridges. " * 2
MSG = [{"role": "user", "content": LONG}]  # long enough (> 32 tokens) for the prefix cache to keep its header


# ------------------------------------------------------------------------------------------------------- helpers
def call(
    url: str,
    method: str,
    path: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60,
    conn: http.client.HTTPConnection | None = None,
) -> tuple[int, dict[str, str], Any]:
    """One request; returns ``(status, headers, parsed JSON or text)``."""
    own = conn is None
    if conn is None:
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    try:
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        payload = resp.read()
        kind = resp.getheader("Content-Type", "")
        parsed = json.loads(payload) if kind.startswith("application/json") else payload.decode()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, parsed
    finally:
        if own:
            conn.close()


def chat(server: RolecallServer, **body: Any) -> dict[str, Any]:
    body.setdefault("messages", MSG)
    body.setdefault("max_tokens", 8)
    status, _, out = call(server.url, "POST", "/v1/chat/completions", body)
    assert status == 200, out
    return out


def greedy(server: RolecallServer, model: str | None = None, **body: Any) -> str:
    if model is not None:
        body["model"] = model
    return chat(server, temperature=0, **body)["choices"][0]["message"]["content"]


def start(lm: LocalLM, **kwargs: Any) -> RolecallServer:
    server = make_server(lm, port=0, **kwargs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop(server: RolecallServer) -> None:
    server.shutdown()
    server.server_close()
    server.backend.batcher.close(timeout=60)


@pytest.fixture(scope="module")
def server(smollm_tokenizer) -> Iterator[RolecallServer]:
    """One server over a tiny random Llama, shared by the read-only tests."""
    srv = start(LocalLM(model=make_tiny_llama(smollm_tokenizer), tokenizer=smollm_tokenizer))
    yield srv
    stop(srv)


@pytest.fixture
def fresh_server(smollm_tokenizer) -> Iterator[RolecallServer]:
    """A server of its own (adapters and batcher counters start empty)."""
    srv = start(LocalLM(model=make_tiny_llama(smollm_tokenizer), tokenizer=smollm_tokenizer))
    yield srv
    stop(srv)


@pytest.fixture(scope="module")
def adapter_dirs(smollm_tokenizer, tmp_path_factory) -> dict[str, Path]:
    """Two different PEFT adapters for the tiny Llama, saved from another LocalLM on the same (seeded) weights."""
    lm = LocalLM(model=make_tiny_llama(smollm_tokenizer), tokenizer=smollm_tokenizer)
    root = tmp_path_factory.mktemp("adapters")
    dirs = {}
    for seed, key in ((1, "alpha"), (2, "beta")):
        view = lm.for_role(key)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in lm.hf_model.named_parameters():
                if f"lora_B.{key}." in name:
                    param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
        lm.backend.mark_updated(key)
        view.save_adapter(root / key)
        dirs[key] = root / key
    lm.backend.batcher.close()
    return dirs


def load(server: RolecallServer, name: str, path: Path, **extra: Any) -> tuple[int, Any]:
    status, _, out = call(
        server.url, "POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path), **extra}
    )
    return status, out


# ------------------------------------------------------------------------------------------------------- endpoints
def test_health_models_and_stats(server):
    status, _, text = call(server.url, "GET", "/health")
    assert status == 200 and text == ""
    status, _, models = call(server.url, "GET", "/v1/models")
    assert status == 200 and models["object"] == "list"
    base = models["data"][0]
    assert base["id"] == server.model_name == default_model_name(server.lm) == "LlamaForCausalLM"
    assert (base["object"], base["owned_by"], base["root"], base["parent"]) == ("model", "rolecall", base["id"], None)
    chat(server)
    status, _, stats = call(server.url, "GET", "/stats")
    assert status == 200 and set(stats) == {"requests", "errors", "batcher", "adapters"}
    assert stats["requests"][server.model_name] >= 1
    assert {"requests", "rows", "steps", "max_rows", "mean_rows"} <= set(stats["batcher"])


def test_chat_completion_shape_and_n(server):
    out = chat(server, n=3, temperature=1.0, seed=7)
    assert out["id"].startswith("chatcmpl-") and out["object"] == "chat.completion"
    assert out["model"] == server.model_name and isinstance(out["created"], int)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    for c in out["choices"]:
        assert c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str)
        assert c["finish_reason"] in ("stop", "length") and c["logprobs"] is None
    usage = out["usage"]
    assert usage["prompt_tokens"] == len(server.backend.encode_messages(MSG))
    assert 3 <= usage["completion_tokens"] <= 24  # summed over the three choices of at most 8 tokens
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    named = chat(server, model=server.model_name, max_completion_tokens=2)  # the base by name; the newer field
    assert named["model"] == server.model_name and named["usage"]["completion_tokens"] <= 2


def test_greedy_and_seeded_requests_repeat(server):
    assert greedy(server) == greedy(server)
    first, second = (chat(server, temperature=1.0, seed=3, n=2)["choices"] for _ in range(2))
    assert [c["message"]["content"] for c in first] == [c["message"]["content"] for c in second]
    parts = [{"role": "user", "content": [{"type": "text", "text": LONG[:40]}, {"type": "text", "text": LONG[40:]}]}]
    assert greedy(server, messages=parts) == greedy(server)  # text parts are joined


def test_stop_strings_cut_the_text(server):
    full = greedy(server, max_tokens=12)
    stop_at = full[len(full) // 2 : len(full) // 2 + 3]
    out = chat(server, temperature=0, max_tokens=12, stop=[stop_at, "\u2603never"])["choices"][0]
    assert out["finish_reason"] == "stop" and out["message"]["content"] == full[: full.find(stop_at)]
    assert greedy(server, max_tokens=12, stop=stop_at) == full[: full.find(stop_at)]  # a bare string works too


def test_chat_logprobs_and_token_ids(server):
    out = chat(server, temperature=0, logprobs=True, top_logprobs=0)
    choice = out["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"]
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["logprob"] <= 0 and entry["top_logprobs"] == [] and entry["bytes"] == list(entry["token"].encode())
    ids = chat(server, temperature=0, logprobs=True, return_tokens_as_token_ids=True)["choices"][0]["logprobs"]
    tokens = [e["token"] for e in ids["content"]]
    assert all(t.startswith("token_id:") for t in tokens)
    decoded = server.backend.tokenizer.decode([int(t.split(":")[1]) for t in tokens], skip_special_tokens=True)
    assert decoded == choice["message"]["content"]
    assert [e["logprob"] for e in ids["content"]] == pytest.approx([e["logprob"] for e in content])


def test_completions_prompts_and_indices(server):
    tok = server.backend.tokenizer
    ids = tok("The river runs")["input_ids"]
    status, _, out = call(server.url, "POST", "/v1/completions", {"prompt": ["The river runs", "A bridge"], "n": 2,
                                                                  "max_tokens": 5, "temperature": 0})  # fmt: skip
    assert status == 200 and out["object"] == "text_completion" and out["id"].startswith("cmpl-")
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert out["choices"][0]["text"] == out["choices"][1]["text"]  # greedy: both samples of prompt 0 agree
    assert out["usage"]["prompt_tokens"] == len(ids) + len(tok("A bridge")["input_ids"])
    by_ids = call(server.url, "POST", "/v1/completions", {"prompt": ids, "max_tokens": 5, "temperature": 0})[2]
    assert by_ids["choices"][0]["text"] == out["choices"][0]["text"]  # text is tokenized as the ids were
    many = call(server.url, "POST", "/v1/completions", {"prompt": [ids, ids[:2]], "max_tokens": 3})[2]
    assert len(many["choices"]) == 2 and many["usage"]["prompt_tokens"] == len(ids) + 2
    assert all(c["logprobs"] is None for c in many["choices"])


@pytest.mark.parametrize("k", [0, 2])
def test_completions_logprobs(server, k):
    body = {"prompt": "The river runs", "max_tokens": 6, "temperature": 0, "logprobs": k}
    choice = call(server.url, "POST", "/v1/completions", body)[2]["choices"][0]
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) >= 1
    assert all(top == {t: v} for t, v, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True))
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    body["return_tokens_as_token_ids"] = True
    tokens = call(server.url, "POST", "/v1/completions", body)[2]["choices"][0]["logprobs"]["tokens"]
    assert all(t.startswith("token_id:") for t in tokens) and len(tokens) == len(lp["tokens"])


# ------------------------------------------------------------------------------------------------------- adapters
def test_lora_load_reload_unload(fresh_server, adapter_dirs):
    srv = fresh_server
    base = greedy(srv)
    status, text = load(srv, "plan", adapter_dirs["alpha"])
    assert (status, text) == (200, "Success: LoRA adapter 'plan' added successfully.")
    models = call(srv.url, "GET", "/v1/models")[2]["data"]
    assert [(m["id"], m["parent"]) for m in models] == [(srv.model_name, None), ("plan", srv.model_name)]
    out_a = greedy(srv, "plan")
    assert out_a != base and greedy(srv, srv.model_name) == base
    assert chat(srv, model="plan")["model"] == "plan"

    status, err = load(srv, "plan", adapter_dirs["beta"])
    assert status == 400 and "load_inplace" in err["error"]["message"]
    assert load(srv, "critic", adapter_dirs["beta"])[0] == 200
    out_b = greedy(srv, "critic")
    assert out_b not in (base, out_a)
    version = call(srv.url, "GET", "/stats")[2]["adapters"]["plan"]
    assert load(srv, "plan", adapter_dirs["beta"], load_inplace=True)[0] == 200
    assert greedy(srv, "plan") == out_b
    assert call(srv.url, "GET", "/stats")[2]["adapters"]["plan"] > version

    status, text = call(srv.url, "POST", "/v1/unload_lora_adapter", {"lora_name": "plan"})[::2]
    assert (status, text) == (200, "Success: LoRA adapter 'plan' removed successfully.")
    status, _, err = call(srv.url, "POST", "/v1/chat/completions", {"model": "plan", "messages": MSG})
    assert status == 404 and err["error"]["type"] == "NotFoundError" and err["error"]["param"] == "model"
    assert call(srv.url, "POST", "/v1/unload_lora_adapter", {"lora_name": "plan"})[0] == 404
    # loaded again under the same name, other weights: no prompt prefix cached for the old weights is reused
    assert load(srv, "plan", adapter_dirs["alpha"])[0] == 200
    assert greedy(srv, "plan") == out_a
    assert call(srv.url, "POST", "/v1/unload_lora_adapter", {"lora_name": "plan"})[0] == 200
    assert load(srv, "plan", adapter_dirs["beta"])[0] == 200
    assert greedy(srv, "plan") == out_b
    for name in ("plan", "critic"):  # with every adapter gone the base model answers as before
        assert call(srv.url, "POST", "/v1/unload_lora_adapter", {"lora_name": name})[0] == 200
    assert greedy(srv) == base and call(srv.url, "GET", "/v1/models")[2]["data"][1:] == []
    assert load(srv, "plan", adapter_dirs["alpha"])[0] == 200
    assert greedy(srv, "plan") == out_a and greedy(srv) == base


def test_lora_load_errors(fresh_server, adapter_dirs, tmp_path):
    srv = fresh_server
    cases = [
        ({"lora_path": str(adapter_dirs["alpha"])}, "lora_name"),
        ({"lora_name": "plan"}, "lora_path"),
        ({"lora_name": "plan", "lora_path": str(tmp_path)}, "adapter_config.json"),
        ({"lora_name": srv.model_name, "lora_path": str(adapter_dirs["alpha"])}, "base model"),
        ({"lora_name": "a.b", "lora_path": str(adapter_dirs["alpha"])}, "letters, digits"),
        ({"lora_name": "ora", "lora_path": str(adapter_dirs["alpha"])}, "'lora_'"),
        ({"lora_name": "plan", "lora_path": str(adapter_dirs["alpha"]), "load_inplace": "yes"}, "true or false"),
    ]
    for body, fragment in cases:
        status, _, err = call(srv.url, "POST", "/v1/load_lora_adapter", body)
        assert status == 400 and fragment in err["error"]["message"], (body, err)
    status, _, err = call(srv.url, "POST", "/v1/unload_lora_adapter", {"lora_name": "ghost"})
    assert status == 404 and "ghost" in err["error"]["message"]
    assert call(srv.url, "GET", "/v1/models")[2]["data"][1:] == []


def test_reload_in_place_does_not_break_inflight_requests(fresh_server, adapter_dirs):
    srv = fresh_server
    assert load(srv, "plan", adapter_dirs["alpha"])[0] == 200
    done = threading.Event()

    def client(i: int) -> list[int]:
        statuses = []
        while not done.is_set() or len(statuses) < 3:
            body = {"model": "plan", "messages": [{"role": "user", "content": f"{i} {LONG}"}], "max_tokens": 6}
            statuses.append(call(srv.url, "POST", "/v1/chat/completions", body, timeout=60)[0])
        return statuses

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(client, i) for i in range(8)]
        for path in (adapter_dirs["beta"], adapter_dirs["alpha"], adapter_dirs["beta"]):
            time.sleep(0.3)
            assert load(srv, "plan", path, load_inplace=True)[0] == 200
        done.set()
        statuses = [s for f in futures for s in f.result(timeout=120)]
    assert statuses and set(statuses) == {200}
    assert call(srv.url, "GET", "/stats")[2]["errors"] == {}


# ------------------------------------------------------------------------------------------------------- bad requests
CHAT_ERRORS = [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "role"),
    ({"messages": [{"role": "user", "content": 5}]}, "content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]}, "only text"),
    ({"n": 0}, "'n'"),
    ({"n": 65}, "'n'"),
    ({"n": "2"}, "integer"),
    ({"temperature": -1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": 10**7}, "context length"),
    ({"stop": 5}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"seed": "x"}, "seed"),
    ({"logprobs": "yes"}, "logprobs"),
    ({"top_logprobs": 2, "logprobs": True}, "not computed"),
    ({"stream": True}, "stream"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
]
COMPLETION_ERRORS = [
    ({}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [[1, "a"]]}, "token ids"),
    ({"prompt": [10**9]}, "token ids"),
    ({"prompt": ""}, "empty"),
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "logprobs": True}, "logprobs"),
    ({"prompt": ["x"] * 20, "n": 64}, "samples"),
]


@pytest.mark.parametrize(
    ("path", "cases"), [("/v1/chat/completions", CHAT_ERRORS), ("/v1/completions", COMPLETION_ERRORS)]
)
def test_bad_fields_get_400_with_a_message(server, path, cases):
    for fields, fragment in cases:
        body = {"messages": MSG, **fields} if path.endswith("chat/completions") and "messages" not in fields else fields
        if fields == {}:
            body = {}
        status, _, err = call(server.url, "POST", path, body)
        assert status == 400, (fields, err)
        error = err["error"]
        assert error["type"] == "BadRequestError" and error["code"] == 400 and fragment in error["message"], error


def test_protocol_errors(server):
    url = server.url
    cases = [
        ("POST", "/v1/chat/completions", b"{not json", 400, "not valid JSON"),
        ("POST", "/v1/chat/completions", b"[1, 2]", 400, "JSON object"),
        ("POST", "/v1/chat/completions", b"\xff\xfe", 400, "not valid JSON"),
        ("GET", "/nope", None, 404, "No route"),
        ("POST", "/v1/nope", b"{}", 404, "No route"),
        ("GET", "/v1/chat/completions", None, 405, "use POST"),
        ("POST", "/v1/models", b"{}", 405, "use GET"),
        ("PUT", "/v1/models", b"{}", 405, "not allowed"),
        ("DELETE", "/health", None, 405, "not allowed"),
    ]
    for method, path, raw, expected, fragment in cases:
        status, headers, err = call(url, method, path, raw=raw)
        assert status == expected and fragment in err["error"]["message"], (method, path, err)
        assert int(headers["content-length"]) > 0
        if expected == 405:
            assert headers["allow"] in ("GET", "POST")
    status, _, err = call(url, "POST", "/v1/chat/completions", {"model": "nope", "messages": MSG})
    assert status == 404 and "'nope'" in err["error"]["message"] and server.model_name in err["error"]["message"]
    # a body over the limit is refused from its Content-Length alone, and the connection is closed
    status, headers, err = call(url, "POST", "/v1/chat/completions", raw=b"{}",
                                headers={"Content-Length": str(MAX_BODY_BYTES + 1)})  # fmt: skip
    assert status == 413 and headers.get("connection") == "close"
    # errors are counted, and the server keeps serving on a kept-alive connection
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    assert call(url, "POST", "/v1/chat/completions", raw=b"nope", conn=conn)[0] == 400
    assert call(url, "GET", "/health", conn=conn)[0] == 200
    conn.close()
    errors = call(url, "GET", "/stats")[2]["errors"]
    assert errors["400"] >= 4 and errors["404"] >= 3 and errors["405"] >= 4 and errors["413"] >= 1


def test_generation_failure_is_a_500_and_the_server_goes_on(server, monkeypatch, caplog):
    def broken(requests):
        raise RuntimeError("decoder on fire")

    monkeypatch.setattr(server.backend, "generate", broken)
    status, _, err = call(server.url, "POST", "/v1/chat/completions", {"messages": MSG, "max_tokens": 2})
    assert (
        status == 500 and err["error"]["type"] == "InternalServerError" and "decoder on fire" in err["error"]["message"]
    )
    assert "decoder on fire" in caplog.text  # logged with its traceback
    monkeypatch.undo()
    assert chat(server, max_tokens=2)["choices"]


# ------------------------------------------------------------------------------------------------------- load
@pytest.mark.timeout(300)
def test_512_concurrent_requests_are_all_answered_and_batched(fresh_server):
    srv = fresh_server
    parts = urlsplit(srv.url)

    def client(i: int) -> list[tuple[int, int]]:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)  # kept alive for its 8 requests
        out = []
        try:
            for j in range(8):
                body = {"messages": [{"role": "user", "content": f"Client {i}, question {j}: {LONG[: 20 + i]}"}],
                        "max_tokens": 8, "temperature": 0 if j % 2 else 1.0, "seed": i}  # fmt: skip
                status, _, resp = call(srv.url, "POST", "/v1/chat/completions", body, conn=conn)
                tokens = resp["usage"]["completion_tokens"] if status == 200 and len(resp["choices"]) == 1 else 0
                out.append((status, tokens))
        finally:
            conn.close()
        return out

    started = time.monotonic()
    with ThreadPoolExecutor(64) as pool:
        results = [r for rs in pool.map(client, range(64), timeout=240) for r in rs]
    elapsed = time.monotonic() - started
    assert len(results) == 512 and all(status == 200 and tokens >= 1 for status, tokens in results)
    stats = call(srv.url, "GET", "/stats")[2]
    assert stats["requests"][srv.model_name] == 512 and stats["errors"] == {}
    assert stats["batcher"]["requests"] == 512
    assert stats["batcher"]["max_rows"] > 1 and stats["batcher"]["mean_rows"] > 1, stats["batcher"]
    assert elapsed < 240


# ------------------------------------------------------------------------------------------------------- CLI
def test_cli_help_and_bad_flags(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0 and "listening on" in capsys.readouterr().out
    assert main(["serve", "--adapter", "plan"]) == 1
    assert "--adapter takes NAME=PATH" in capsys.readouterr().err
    assert main(["serve", "--adapter", f"plan={tmp_path}"]) == 1
    assert "adapter_config.json" in capsys.readouterr().err
    assert main(["serve", "--load", str(tmp_path)]) == 1
    assert "program.json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--dtype", "float64"])
    assert exit_info.value.code == 2


@pytest.mark.timeout(180)
def test_cli_serves_a_saved_programs_adapters_until_sigterm(smollm_tokenizer, adapter_dirs, tmp_path):
    model_dir = tmp_path / "tiny"
    make_tiny_llama(smollm_tokenizer).save_pretrained(model_dir)
    smollm_tokenizer.save_pretrained(model_dir)
    program = tmp_path / "program"  # the layout Program.save writes: two roles sharing one adapter
    shutil.copytree(adapter_dirs["alpha"], program / "adapters" / "plan")
    (program / "program.json").write_text(
        json.dumps({"format_version": 2, "adapters": {"plan": "plan", "rewrite": "plan"}})
    )
    cmd = [sys.executable, "-m", "rolecall.cli", "serve", "--model", str(model_dir), "--port", "0", "--dtype",
           "float32", "--served-model-name", "tiny", "--load", str(program),
           "--adapter", f"critic={adapter_dirs['beta']}"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with open(tmp_path / "stderr.txt", "w+") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=REPO_ROOT, env=env)
        try:
            first = proc.stdout.readline()
            assert first.startswith("rolecall serve: listening on http://127.0.0.1:"), (first, stderr.read())
            assert first.rstrip().endswith("(model tiny; adapters: plan, critic)")
            assert [proc.stdout.readline().strip() for _ in range(2)] == [
                "role plan -> adapter plan",
                "role rewrite -> adapter plan",
            ]
            url = first.split("listening on ")[1].split()[0]
            models = call(url, "GET", "/v1/models")[2]
            assert [m["id"] for m in models["data"]] == ["tiny", "plan", "critic"]
            body = {"model": "plan", "messages": MSG, "max_tokens": 3}
            status, _, out = call(url, "POST", "/v1/chat/completions", body)
            assert status == 200 and out["model"] == "plan"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# ------------------------------------------------------------------------------------------------------- real model
@pytest.mark.slow
def test_served_greedy_text_matches_localm_on_the_embedded_model(embedded_lm):
    srv = start(embedded_lm)
    try:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        served = chat(srv, messages=messages, temperature=0, max_tokens=16)["choices"][0]["message"]["content"]
        direct = embedded_lm.sample(messages, temperature=0, max_tokens=16)[0].text
        assert served == direct and "Paris" in served
    finally:
        srv.shutdown()
        srv.server_close()  # the session's LM keeps its batcher
