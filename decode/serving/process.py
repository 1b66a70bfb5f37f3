"""A server process of our own on loopback: started on a free port, ready when `/health` answers 200, its log kept
in a file, always reaped (context manager, and a kill if it does not stop when asked). llama-server and vLLM
(decode/serving/llama_server.py, vllm_server.py) are two of them."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

from decode.errors import SpecdraftError


class ServerError(SpecdraftError, RuntimeError):
    """A server is missing, did not start, refused the draft, or failed a request."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerProcess:
    """Subclasses say how to start (`command(port)`, `environment()`) and what to check once ready
    (`check_started()`); `name` is how errors call the server."""

    name = "the server"

    def __init__(self, log_path: Path, ready_timeout_s: float):
        self.log_path, self.ready_timeout_s = Path(log_path), ready_timeout_s
        self.process: Optional[subprocess.Popen] = None
        self.port = 0

    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    def environment(self) -> Optional[dict[str, str]]:
        return None  # the parent's

    def check_started(self) -> None:
        """Raise a ServerError when the server came up without doing what it was asked (e.g. refused the draft)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        self.port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.args = self.command(self.port)
        with self.log_path.open("ab") as log:
            log.write(("$ " + shlex.join(self.args) + "\n").encode())
            self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self.environment(), start_new_session=True)
        try:
            self._wait_until_ready()
            self.check_started()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(f"{self.name} exited with code {self.process.returncode} before it was ready; "
                                  f"its log ({self.log_path}) ends:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass  # not listening yet, or 503 while the models load
            time.sleep(0.2)
        raise ServerError(f"{self.name} was not ready within {self.ready_timeout_s:.0f} s; its log "
                          f"({self.log_path}) ends:\n{self.log_tail()}")

    def stop(self) -> None:
        """Ends the server and every process it started (vLLM runs its engine in child processes)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        try:  # its own session: what it left behind goes too
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _request(self, path: str, body: Optional[dict] = None, timeout_s: float = 600.0) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data,
                                         headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as error:
            raise ServerError(f"{self.name} answered {error.code} to {path}: "
                              f"{error.read().decode(errors='replace')[:300]}") from None
        except OSError as error:
            raise ServerError(f"{self.name} did not answer {path} ({error}); its log ends:\n{self.log_tail()}") \
                from None

    def metrics_text(self) -> str:
        return self._request("/metrics", timeout_s=10).decode()
