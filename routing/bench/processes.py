"""Real processes for tests: an ASGI server (uvicorn) and Celery GPU workers, on free ports,
pointed at the test database."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Process:
    def __init__(self, args: list[str], env: dict, log_name: str, cwd: Path = ROOT) -> None:
        self.log_path = (
            Path(os.environ.get("TMPDIR", "/tmp")) / f"fairlane-{log_name}-{os.getpid()}.log"
        )
        self.log = open(self.log_path, "w")  # noqa: SIM115  (open for the process's life)
        self.proc = subprocess.Popen(
            args,
            cwd=cwd,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text()

    def wait_for(self, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"process exited:\n{self.output()[-4000:]}")
            time.sleep(0.2)
        raise TimeoutError(f"no {text!r} in:\n{self.output()[-4000:]}")

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


class AsgiServer(Process):
    def __init__(self, env: dict, *, workers: int = 1) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        extra = ["--workers", str(workers)] if workers > 1 else []
        # As deployed: X-Forwarded-For is trusted from the proxies named here, none by default
        # (uvicorn's own default trusts 127.0.0.1).
        env = {"FORWARDED_ALLOW_IPS": "", **env}
        super().__init__(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "asgi:application",
                "--port",
                str(self.port),
                "--lifespan",
                "off",
                "--no-access-log",
                *extra,
            ],
            env,
            "asgi",
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                if self.proc.poll() is not None:
                    raise RuntimeError(self.output()) from None
                time.sleep(0.2)
        raise TimeoutError(self.output())


class CeleryWorker(Process):
    def __init__(
        self, env: dict, *, queue: str = "gpu", concurrency: int = 32, name: str = "gpu"
    ) -> None:
        super().__init__(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "celery_app",
                "worker",
                "-Q",
                queue,
                "-P",
                "threads",
                "-c",
                str(concurrency),
                "--without-gossip",
                "--without-mingle",
                "-l",
                "info",
                "-n",
                f"{name}-{free_port()}@%h",
            ],
            env,
            f"worker-{name}",
        )
        self.wait_for("ready.")
