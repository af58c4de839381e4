"""A model's `vllm serve` child process: started on a free port of 127.0.0.1 with the command
FAIRLANE_VLLM_COMMAND, its output logged as the worker's, watched through `/health`, its load
read from vLLM's own `/metrics`, and stopped with the worker. The kernel stops it too when the
thread that started it ends (PR_SET_PDEATHSIG): a worker killed outright leaves no vLLM behind
holding the GPU.

The child gets a key of its own (`--api-key`, made here, never stored) and an environment
without the platform's secrets; it never downloads (HF_HUB_OFFLINE), reads safetensors only and
reports no usage statistics anywhere.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

logger = logging.getLogger(__name__)

# Environment variables the child must not see: the platform's secrets and connections.
_WITHHELD = {
    "SECRET_KEY",
    "DATABASE_URL",
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "CELERY_RESULT_BACKEND",
    "EMAIL_HOST_PASSWORD",
}
_WITHHELD_SUFFIXES = ("_API_KEY", "_TOKEN", "_PASSWORD", "_SECRET")
PR_SET_PDEATHSIG = 1


class VllmStartFailed(Exception):
    """The child could not be started or never became healthy."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_environment() -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in _WITHHELD
        and not name.startswith("FAIRLANE_")
        and not name.endswith(_WITHHELD_SUFFIXES)
    }
    # vLLM's own advice where its host process has threads (ours does): spawn, never fork.
    env.update(
        VLLM_WORKER_MULTIPROC_METHOD="spawn",
        HF_HUB_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))


_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


class VllmServer:
    """One `vllm serve` process for one model (a new instance per start)."""

    def __init__(self, *, model: str, path: Path, max_model_len: int, max_num_seqs: int) -> None:
        self.model, self.path = model, path
        self.max_model_len, self.max_num_seqs = max_model_len, max_num_seqs
        self.api_key = secrets.token_urlsafe(24)
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.tail: collections.deque[str] = collections.deque(maxlen=40)  # its last lines

    def command(self) -> list[str]:
        return [
            *shlex.split(settings.FAIRLANE_VLLM_COMMAND),
            str(self.path),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--served-model-name",
            self.model,
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--api-key",
            self.api_key,
            "--load-format",
            "safetensors",  # never a pickle (the check refuses them too)
            "--enable-prompt-tokens-details",  # cached prompt tokens in its usage
            *shlex.split(settings.FAIRLANE_VLLM_ARGS),
        ]

    def start(self) -> None:
        """Spawn the child. Call from the thread that lives as long as the child should."""
        command = self.command()
        if shutil.which(command[0]) is None:
            raise VllmStartFailed(
                f"FAIRLANE_VLLM_COMMAND: {command[0]!r} was not found (on a GPU "
                "worker: pip install -r requirements-gpu.txt)"
            )
        logger.info(
            "starting vLLM for %s on port %d: %s",
            self.model,
            self.port,
            shlex.join(command).replace(self.api_key, "***"),
        )
        self.proc = subprocess.Popen(
            command,
            env=child_environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a SIGTERM to the worker's group
            preexec_fn=_die_with_parent if _prctl else None,
        )  # is its drain, not the child's
        threading.Thread(
            target=self._log_output, name=f"vllm-log-{self.model}", daemon=True
        ).start()

    def _log_output(self) -> None:
        if self.proc is None or self.proc.stdout is None:
            return
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.tail.append(line)
            logger.info("[vllm %s] %s", self.model, line)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def exit_code(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def wait_healthy(self, *, timeout: float, stop: threading.Event) -> None:
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            if (code := self.exit_code()) is not None:
                time.sleep(0.2)  # its last lines
                raise VllmStartFailed(
                    f"vLLM exited with code {code} while starting: "
                    + " | ".join(list(self.tail)[-5:])
                )
            if self.is_healthy(timeout=2.0):
                return
            if time.monotonic() > deadline:
                raise VllmStartFailed(
                    f"vLLM did not answer /health within {timeout:.0f} s "
                    "(FAIRLANE_VLLM_START_TIMEOUT_SECONDS)"
                )
            stop.wait(0.25)
        raise VllmStartFailed("the worker is stopping")

    def is_healthy(self, *, timeout: float = 5.0) -> bool:
        try:
            return _get(self.url + "/health", timeout=timeout) is not None
        except OSError:
            return False

    def figures(self) -> dict:
        """Its load, from its own /metrics (raises OSError)."""
        return metrics_parse(_get(self.url + "/metrics", timeout=5.0), model=self.model)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to its process group (vLLM's engine processes too), SIGKILL after timeout."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
                code = self.proc.wait(timeout=wait)
                logger.info("vLLM for %s stopped (exit code %s)", self.model, code)
                return
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                logger.warning("vLLM for %s did not stop in %.0f s; killing it", self.model, wait)


def _get(url: str, *, timeout: float) -> str:
    """A GET of the child's (urllib: these polls stay out of the log, unlike httpx's)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:  # raises on non-2xx
        return response.read().decode()


def metrics_parse(text: str, *, model: str) -> dict:
    """vLLM's figures for one served model, added up over its engines (data parallel)."""
    sums: collections.defaultdict[str, float] = collections.defaultdict(float)
    kv_usage = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model_name", model) != model:
                continue
            if sample.name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
                kv_usage = max(kv_usage, sample.value)  # the fullest engine decides
            else:
                sums[sample.name] += sample.value
    queries = sums["vllm:prefix_cache_queries_total"]
    return {
        "num_running": int(sums["vllm:num_requests_running"]),
        "num_waiting": int(sums["vllm:num_requests_waiting"]),
        "kv_cache_usage": round(kv_usage, 4),
        "num_generated_tokens": int(sums["vllm:generation_tokens_total"]),
        "num_preemptions": int(sums["vllm:num_preemptions_total"]),
        "prefix_hit_rate": sums["vllm:prefix_cache_hits_total"] / queries if queries else 0.0,
    }
