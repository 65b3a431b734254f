"""``rolecall serve``: serve the local LM (and LoRA adapters, such as a compiled program's) over an OpenAI-compatible
HTTP API (:mod:`rolecall.serve`) until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from rolecall.cli_common import add_command, add_common
from rolecall.errors import ConfigError, ModelLoadError
from rolecall.lm.engines import add_engine_argument

__all__ = ["add_serve_parser", "cmd_serve", "parse_adapter_flags", "saved_adapters"]


_SERVE_HELP = "serve the LM and LoRA adapters over an OpenAI-compatible HTTP API"
_SERVE_DESCRIPTION = (
    "Serve a local model, with any LoRA adapters, over an OpenAI-compatible HTTP API:\n"
    "/v1/chat/completions, /v1/completions and /v1/models, vLLM's /v1/load_lora_adapter and\n"
    "/v1/unload_lora_adapter, /health and /stats. A request's `model` picks the base model (its served name) or\n"
    "an adapter (its name). Concurrent requests decode together (continuous batching).\n\n"
    "Once listening, the first line on stdout is\n"
    "  rolecall serve: listening on http://HOST:PORT (model NAME; adapters: A, B)\n"
    "and the server runs until SIGINT / SIGTERM."
)
_SERVE_EPILOG = (
    "examples:\n"
    "  rolecall serve --port 8000\n"
    "  rolecall serve --load runs/opera-sft --port 0          # a compiled program's role adapters\n"
    "  rolecall serve --adapter plan=runs/opera-sft/adapters/plan --served-model-name smollm2\n"
    "  curl -s localhost:8000/v1/chat/completions -H 'Content-Type: application/json' \\\n"
    '    -d \'{"model": "plan", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32}\''
)


def add_serve_parser(sub: Any) -> None:
    """Adds ``rolecall serve`` to the subcommands ``sub``."""
    p = add_command(sub, "serve", _SERVE_HELP, _SERVE_DESCRIPTION, _SERVE_EPILOG)
    p.add_argument("--model", default=None, metavar="NAME_OR_PATH",
                   help="LM name or local model directory (default: the embedded SmolLM2-135M-Instruct)")  # fmt: skip
    p.add_argument("--load", type=Path, default=None, metavar="DIR",
                   help="a saved (compiled) program: serve each of its adapters under its adapter name")  # fmt: skip
    p.add_argument("--adapter", action="append", default=[], metavar="NAME=PATH",
                   help="serve the PEFT adapter in folder PATH as NAME; repeatable")  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on; 0 = any free port (default: %(default)s)")
    p.add_argument("--served-model-name", default=None, metavar="NAME",
                   help="the base model's name in requests (default: the model's short name)")  # fmt: skip
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="weights' dtype; auto: bf16 on native-bf16 hardware (default: %(default)s)")  # fmt: skip
    add_engine_argument(p)
    p.add_argument("--max-batch-rows", type=int, default=32, metavar="N",
                   help="most sample rows decoded together (default: %(default)s)")  # fmt: skip
    add_common(p)
    p.set_defaults(func=cmd_serve)


def parse_adapter_flags(values: list[str]) -> dict[str, Path]:
    """``--adapter NAME=PATH`` values as ``{name: folder}``, each folder checked to hold a PEFT adapter."""
    from rolecall.serve import ADAPTER_NAME

    adapters: dict[str, Path] = {}
    for value in values:
        name, sep, path = value.partition("=")
        name, path = name.strip(), path.strip()
        if not sep or not name or not path:
            raise ConfigError(f"--adapter takes NAME=PATH (e.g. plan=runs/opera-sft/adapters/plan), got {value!r}")
        if not ADAPTER_NAME.fullmatch(name) or name in "lora_":
            raise ConfigError(f"--adapter {value}: NAME must be letters, digits, '_' or '-', not part of 'lora_'")
        if name in adapters:
            raise ConfigError(f"--adapter {name} is given twice; give each adapter name once")
        adapters[name] = _adapter_folder(Path(path).expanduser(), f"--adapter {value}")
    return adapters


def _adapter_folder(path: Path, flag: str) -> Path:
    """``path`` once its config and weight files are checked intact, before any model loads."""
    from rolecall.lm.adapter_files import check_adapter_folder

    try:
        return check_adapter_folder(path)
    except ModelLoadError as err:
        raise ConfigError(f"{flag}: {err}") from None


def saved_adapters(directory: Path) -> tuple[dict[str, str], dict[str, Path]]:
    """The role -> adapter map of a saved program directory, and each adapter's folder."""
    from rolecall.programs.core.saving import adapter_folder, read_payload

    roles: dict[str, str] = dict(read_payload(directory).get("adapters", {}))
    folders: dict[str, Path] = {}
    for role, name in roles.items():
        folder = adapter_folder(directory, role, name)
        folders.setdefault(name, _adapter_folder(folder, f"--load {directory} (role {role})"))
    return roles, folders


def _bind(lm: Any, args: argparse.Namespace) -> Any:
    """The bound server; a taken port or a reserved --served-model-name is a ConfigError."""
    from rolecall.serve import make_server

    try:
        return make_server(lm, host=args.host, port=args.port, served_model_name=args.served_model_name)
    except OSError as err:
        raise ConfigError(f"cannot listen on {args.host}:{args.port} ({err}); pick another --port (0 = any)") from err
    except ValueError as err:
        raise ConfigError(str(err)) from err


def cmd_serve(args: argparse.Namespace) -> int:
    """``rolecall serve``: load the model and adapters, listen, serve until SIGINT / SIGTERM."""
    from rolecall.lm.engines import close_lm, make_lm

    if args.max_batch_rows < 1:
        raise ConfigError(f"--max-batch-rows must be >= 1, got {args.max_batch_rows}")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535 (0 = any free port), got {args.port}")
    adapters = parse_adapter_flags(args.adapter)
    roles: dict[str, str] = {}
    if args.load is not None:
        roles, folders = saved_adapters(args.load)
        clash = sorted(set(folders) & set(adapters))
        if clash:
            raise ConfigError(f"--adapter {clash} clashes with the adapters of --load {args.load}; rename them")
        adapters = {**folders, **adapters}
    lm = make_lm(args.model, engine=args.engine, dtype=args.dtype, max_batch_rows=args.max_batch_rows, cache=False)
    try:
        for name, folder in adapters.items():  # an adapter of another base model: ModelLoadError, one line
            lm.backend.load_adapter(name, folder)
        server = _bind(lm, args)
    except BaseException:
        close_lm(lm)  # nothing will be served: stop the batcher's thread (and a vLLM engine)
        raise

    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    thread = threading.Thread(target=server.serve_forever, name="rolecall-serve", daemon=True)
    thread.start()
    names = ", ".join(lm.backend.adapters) or "none"
    print(f"rolecall serve: listening on {server.url} (model {server.model_name}; adapters: {names})", flush=True)
    for role, name in roles.items():
        print(f"  role {role} -> adapter {name}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.shutdown()
        server.server_close()
        close_lm(lm)
    print("rolecall serve: stopped", file=sys.stderr, flush=True)
    return 0
