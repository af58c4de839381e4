"""A model hosted on vLLM, behind our engine's interface (`submit` with a sink, `abort`,
`stats`, `is_running`, `shutdown`): the worker's generation, settlement, cancellation and fair
queue treat it as any engine (workers/run_loops.py, workers/pulling.py).

Each choice of a request is one streamed `POST /v1/completions` to the model's `vllm serve`
child (workers/vllm/server.py) with the prompt as the token ids our tokenizer made (so the
context rule and the prompt count are the registry's), `return_token_ids` (a resumed request
continues from them), the tenant's `cache_salt` (a keyed hash of the tenant and the client's
own salt, as a remote vLLM gets: tenants never share cached prompts) and
`include_usage` (the ledger charges vLLM's own counts). Aborting closes that HTTP stream, which
makes vLLM abort the sequence and free its KV blocks.

A supervising thread starts the child, reads its /health and /metrics every
FAIRLANE_VLLM_HEALTH_SECONDS, and on a crash (the child exited, or /health failed three times
running) stops it and records the crash; the worker's host restarts it with a backoff
(workers/host.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path

import httpx
from django.conf import settings

from tenants.services.tenancy import tenant_cache_salt
from workers.engine import EngineError, EngineStopped, InvalidRequest, RequestOutput, SamplingParams
from workers.vllm.server import VllmServer
from workers.vllm.wire import Progress, refusal, request_body

logger = logging.getLogger(__name__)

HEALTH_FAILURES = 3  # /health failures in a row that count as a crash
KV_FULL = 0.95  # no new sequences while vLLM's KV cache is this full


class VllmCrashed(EngineStopped):
    """The model's vLLM child died or stopped answering; it is restarted after a backoff."""


class VllmEngine:
    def __init__(self, *, model: str, path: Path, max_model_len: int, max_num_seqs: int) -> None:
        self.model, self.max_model_len, self.max_num_seqs = model, max_model_len, max_num_seqs
        self.server = VllmServer(
            model=model, path=path, max_model_len=max_model_len, max_num_seqs=max_num_seqs
        )
        self.crash: VllmCrashed | None = None
        self.figures: dict = {}  # the child's last /metrics
        self._healthy = False
        self._started = threading.Event()
        self._stopping = threading.Event()
        self._start_error: BaseException | None = None
        self._lock = threading.Lock()
        self._in_flight = 0
        self._tasks: dict[str, asyncio.Task] = {}  # on the loop thread only
        self._loop = asyncio.new_event_loop()
        self._client: httpx.AsyncClient | None = None
        self._threads: list[threading.Thread] = []

    # Life ---------------------------------------------------------------------------------

    def start(self) -> VllmEngine:
        """Start the child and wait until it is healthy (raises VllmStartFailed otherwise)."""
        for target, name in ((self._loop.run_forever, "loop"), (self._supervise, "supervisor")):
            thread = threading.Thread(target=target, name=f"vllm-{name}-{self.model}", daemon=True)
            thread.start()
            self._threads.append(thread)
        self._started.wait()
        if self._start_error is not None:
            self.shutdown()
            raise self._start_error
        return self

    def _supervise(self) -> None:
        """The child's parent thread for its whole life (PR_SET_PDEATHSIG is per thread)."""
        try:
            self.server.start()
            self.server.wait_healthy(
                timeout=settings.FAIRLANE_VLLM_START_TIMEOUT_SECONDS, stop=self._stopping
            )
            made = asyncio.run_coroutine_threadsafe(self._client_make(), self._loop)
            self._client = made.result()
            self.figures = self.server.figures()
        except Exception as exc:
            self._start_error = exc
            self._started.set()
            self.server.stop()
            return
        self._healthy = True
        self._started.set()
        logger.info(
            "vLLM for %s is up at %s (pid %s)", self.model, self.server.url, self.server.pid
        )
        self.crash = self._watch()
        self._healthy = False
        if self.crash is not None:
            logger.error("vLLM for %s: %s", self.model, self.crash.message)
        self.server.stop()  # a hung child's streams end here, so their requests end too

    def _watch(self) -> VllmCrashed | None:
        """Until shutdown (None) or a crash: the process is checked every quarter second,
        /health and /metrics every FAIRLANE_VLLM_HEALTH_SECONDS."""
        failures, next_check = 0, time.monotonic() + settings.FAIRLANE_VLLM_HEALTH_SECONDS
        while not self._stopping.wait(0.25):
            if (code := self.server.exit_code()) is not None:
                return VllmCrashed(f"the vLLM server exited with code {code}")
            if time.monotonic() < next_check:
                continue
            next_check = time.monotonic() + settings.FAIRLANE_VLLM_HEALTH_SECONDS
            try:
                self.figures = self.server.figures()
                failures = 0 if self.server.is_healthy() else failures + 1
            except (OSError, ValueError):  # unreachable, or not Prometheus text
                failures += 1
            if failures >= HEALTH_FAILURES:
                return VllmCrashed(f"the vLLM server failed /health {failures} times running")
        return None

    async def _client_make(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.server.url,
            headers={"Authorization": f"Bearer {self.server.api_key}"},
            timeout=httpx.Timeout(10.0, read=float(settings.FAIRLANE_STREAM_IDLE_TIMEOUT_SECONDS)),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )

    @property
    def is_running(self) -> bool:
        return self._healthy and not self._stopping.is_set()

    @property
    def foreground_at(self) -> float:
        """vLLM orders its own batches: no lane yields here (see AsyncEngine.foreground_at)."""
        return 0.0

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop the child; sequences still running (after the drain) are aborted first."""
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._abort_all(), self._loop).result(30)
        self._stopping.set()
        logger.info("stopping vLLM for %s", self.model)
        for thread in self._threads:
            if thread.name.startswith("vllm-supervisor"):
                thread.join(timeout=60)
        if self._client is not None:
            asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)

    async def _abort_all(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # Requests -----------------------------------------------------------------------------

    def submit(
        self,
        prompt: list[int],
        params: SamplingParams | None,
        sink,
        *,
        request_id: str,
        tenant: str,
        lane: str | None = None,
        salt: str | None = None,
        is_embedding: bool = False,
        **_: object,
    ) -> str:
        """Start one sequence on the child; `sink` receives its outputs (RequestOutput deltas,
        then the finished one) or one exception."""
        if is_embedding:
            raise InvalidRequest(
                f"The model '{self.model}' runs on vLLM here, which serves no "
                "embeddings; use another model.",
                param="model",
            )
        if not self.is_running:
            raise EngineStopped("the model's vLLM server is not running")
        # Our engine's salt is "<tenant>:<client's salt>" (or the tenant alone): vLLM gets the
        # same keyed hash a remote vLLM does, never naming the tenant.
        client_salt = salt.split(":", 1)[1] if salt else ""
        cache_salt = tenant_cache_salt(tenant_id=int(tenant), salt=client_salt)
        body = request_body(self.model, prompt, params, salt=cache_salt)
        with self._lock:
            self._in_flight += 1
        self._loop.call_soon_threadsafe(self._begin, request_id, body, sink)
        return request_id

    def abort(self, request_id: str) -> None:
        self._loop.call_soon_threadsafe(self._cancel, request_id)

    def _begin(self, request_id: str, body: dict, sink) -> None:
        if request_id in self._tasks:
            self._release()
            sink(InvalidRequest(f"request {request_id!r} is already running", param="request_id"))
            return
        progress = Progress(request_id)
        task = self._loop.create_task(self._stream(body, progress, sink))
        task.add_done_callback(lambda done: self._end(done, progress, sink))
        self._tasks[request_id] = task

    def _cancel(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()

    def _release(self) -> None:
        with self._lock:
            self._in_flight -= 1

    async def _stream(self, body: dict, progress: Progress, sink) -> RequestOutput:
        """The sequence's deltas to `sink`; returns its finished output."""
        client = self._client
        if client is None:
            raise EngineStopped("The vLLM engine is not started.")
        async with client.stream(
            "POST", "/v1/completions", json=body, headers={"X-Request-Id": progress.request_id}
        ) as response:
            if response.status_code != 200:
                raise refusal(response.status_code, await response.aread())
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                if (output := progress.absorb(json.loads(line[6:]))) is not None:
                    sink(output)
        if progress.finish_reason is None:
            raise EngineStopped("The model's vLLM server ended the stream before the answer.")
        return progress.final()

    def _end(self, task: asyncio.Task, progress: Progress, sink) -> None:
        """Every sequence's last word, also one aborted before its stream began."""
        self._tasks.pop(progress.request_id, None)
        self._release()
        if task.cancelled():  # aborted: its stream was closed, so vLLM aborted it too
            sink(progress.final(reason="abort"))
            return
        exc = task.exception()
        if exc is None:
            sink(task.result())
        elif isinstance(exc, EngineError):
            sink(exc)
        else:
            logger.warning(
                "vLLM stream of %s failed: %s: %s", progress.request_id, type(exc).__name__, exc
            )
            sink(EngineStopped("The model's vLLM server failed while running this request."))

    # Load ---------------------------------------------------------------------------------

    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def free_slots(self) -> int:
        """Sequences to take from the fair queue now: we never give vLLM more than it runs at
        once, so the fair queue, not vLLM's own FCFS queue, decides the order."""
        if not self.is_running or self.figures.get("kv_cache_usage", 0.0) >= KV_FULL:
            return 0
        return self.max_num_seqs - self.in_flight()

    def stats(self) -> dict:
        """vLLM's own figures (its /metrics) and what it can do, for the heartbeat."""
        return {
            **self.figures,
            "runtime": "vllm",
            "in_flight": self.in_flight(),
            "pid": self.server.pid,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "paged_kv": True,
            "continuous_batching": True,
            "prefix_caching": True,
            "hidden_states": False,
        }
