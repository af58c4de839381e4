"""The engines this process hosts: one per model, all requests on a model sharing its continuous
batches: our AsyncEngine, or for a model whose runtime is vLLM a managed `vllm serve` child
behind the same interface (workers/vllm/). The embedded mode hosts them in the ASGI process, a
GPU worker in its Celery process."""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from django.conf import settings

from tenants.models import Lane
from workers.artifacts.load import artifact_verify_for_load
from workers.engine import AsyncEngine, FairSharePolicy
from workers.runs import Engine, Runs
from workers.serving.catalog import ModelInfo, model_context_length, model_dir, model_engine_config
from workers.serving.events import Failed
from workers.vllm import VllmCrashed, VllmEngine, VllmStartFailed

logger = logging.getLogger(__name__)


# A model that failed to load is tried again after 1, 2, 4 ... up to this many seconds.
LOAD_RETRY_MAX_SECONDS = 60.0
# A vLLM child that crashes again within this long of its last crash backs off further.
CRASH_MEMORY_SECONDS = 300.0
LOAD_FAILED_MESSAGE = "The model could not be loaded on its worker; retry later."


class ModelLoadFailed(Exception):
    """A model this process could not load (corrupt files, refused, out of memory...); it is
    tried again after a backoff. `retry_in`: seconds until then."""

    def __init__(self, model: str, cause: BaseException, retry_in: float) -> None:
        super().__init__(f"model {model} failed to load: {type(cause).__name__}: {cause}")
        self.model, self.cause, self.retry_in = model, cause, retry_in


def load_failed_event(exc: ModelLoadFailed) -> Failed:
    """The first and only event of a request whose model could not be loaded: retryable, so
    the API tries its next backend; nothing ran, so nothing is settled."""
    return Failed(
        code="backend_unavailable",
        message=LOAD_FAILED_MESSAGE,
        retryable=True,
        retry_after=max(int(exc.retry_in + 0.999), 1),
    )


@dataclass
class _Failure:
    cause: BaseException
    attempts: int
    retry_at: float


def engine_key(info: ModelInfo) -> str:
    """What a hosted engine is known by: the model's name, and its version if it has one."""
    return f"{info.name}@{info.version}" if info.version else info.name


class EngineHost:
    """The engines, by `engine_key`: one per version of each model this process serves. An
    engine no longer wanted (its version was swapped out or rolled back, its model disabled)
    takes no new requests; it is dropped, its memory freed, once the requests on it are done
    (`retire_unwanted`)."""

    def __init__(self, *, node: str, refusals: Callable[..., None]) -> None:
        """`node`: what this process's model loads are recorded under (before "@<host>");
        `refusals(model=, reason=)` counts a load refused by verification."""
        self.node, self.refusals = node, refusals
        self.runs = Runs()  # the requests running on these engines, by request id
        self._engines: dict[str, Engine] = {}
        self._lock = threading.Lock()  # the dicts; never held while a model loads
        self._loading: dict[str, threading.Lock] = {}  # one load of a model at a time
        self._failures: dict[str, _Failure] = {}
        self._crashes: dict[str, tuple[int, float]] = {}  # model -> (crashes in a row, when)
        self._users: dict[str, int] = {}  # requests running on each engine
        self._last_used: dict[str, float] = {}
        self._retiring: dict[str, float] = {}  # engine key -> when it stopped being wanted

    def load(self, info: ModelInfo) -> Engine:
        """`engine()`, remembering failures: a model that failed to load (or whose vLLM child
        crashed) raises ModelLoadFailed at once until its backoff ends, then is tried again
        (1 s, doubling, up to a minute)."""
        key = engine_key(info)
        failure = self._failures.get(key)
        if failure is not None and time.monotonic() < failure.retry_at:
            raise ModelLoadFailed(info.name, failure.cause, failure.retry_at - time.monotonic())
        try:
            engine = self.engine(info)
        except Exception as exc:
            attempts = failure.attempts + 1 if failure else 1
            if isinstance(exc, VllmCrashed):  # restarts that keep crashing back off too
                attempts = self._crash_count(key)
            delay = min(2.0 ** (attempts - 1), LOAD_RETRY_MAX_SECONDS)
            self._failures[key] = _Failure(exc, attempts, time.monotonic() + delay)
            logger.error(
                "model %s failed to load (attempt %d); retrying in %.0f s",
                key,
                attempts,
                delay,
                exc_info=not isinstance(exc, ModelLoadFailed | VllmCrashed | VllmStartFailed),
            )
            raise ModelLoadFailed(info.name, exc, delay) from exc
        if self._failures.pop(key, None) is not None:
            logger.info("model %s loaded after earlier failures", key)
        return engine

    @contextlib.contextmanager
    def using(self, info: ModelInfo) -> Iterator[Engine]:
        """`load` the engine of a request's version and count the request on it while it
        runs, so a retiring engine is not dropped under it."""
        key = engine_key(info)
        while True:
            engine = self.load(info)
            with self._lock:
                if self._engines.get(key) is engine:  # not dropped since it was loaded
                    self._users[key] = self._users.get(key, 0) + 1
                    break
        try:
            yield engine
        finally:
            with self._lock:
                self._users[key] -= 1
                self._last_used[key] = time.monotonic()

    def retire_unwanted(self, wanted: set[str], *, grace: float) -> list[str]:
        """Drop the engines not in `wanted` (engine keys) once no request has run on them for
        `grace` seconds (API processes may still route to them that long), freeing their
        memory; their load failures are forgotten. Returns the keys dropped."""
        now, dropped = time.monotonic(), []
        with self._lock:
            for key in list(self._engines):
                if key in wanted:
                    self._retiring.pop(key, None)
                    continue
                since = self._retiring.setdefault(key, now)
                idle = now - max(since, self._last_used.get(key, 0.0))
                if self._users.get(key, 0) or idle < grace:
                    continue
                dropped.append((key, self._engines.pop(key)))
                self._retiring.pop(key, None)
            for key in [k for k in self._failures if k not in wanted]:
                del self._failures[key]
        keys = [key for key, _ in dropped]
        for key, engine in dropped:
            logger.info("dropping model %s: drained, no longer served here", key)
            engine.shutdown()
        if dropped:
            del dropped, engine  # the last references: its tensors go with them
            _memory_free()
        return keys

    def _crash_count(self, model: str) -> int:  # model: its engine key
        """Crashes of a model's vLLM child in a row: one that ran a while starts again at 1."""
        count, last = self._crashes.get(model, (0, 0.0))
        now = time.monotonic()
        count = count + 1 if now - last < CRASH_MEMORY_SECONDS else 1
        self._crashes[model] = (count, now)
        return count

    def failed(self) -> dict[str, dict]:
        """Models whose last load failed, for the heartbeat: why, attempts, seconds to retry."""
        now = time.monotonic()
        return {
            key.partition("@")[0]: {
                "error": f"{type(f.cause).__name__}: {f.cause}"[:300],
                "attempts": f.attempts,
                "retry_in": round(max(f.retry_at - now, 0), 1),
            }
            for key, f in list(self._failures.items())
        }

    def engine(self, info: ModelInfo) -> Engine:
        """The running engine for a model, loaded on first use. A vLLM child that crashed
        raises its VllmCrashed once (so `load` backs off), then is started again."""
        key = engine_key(info)
        with self._lock:
            engine = self._engines.get(key)
            if engine is not None and engine.is_running:
                return engine
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:
            with self._lock:
                engine = self._engines.get(key)
                if engine is not None and engine.is_running:
                    return engine
                self._engines.pop(key, None)
            if engine is not None:
                engine.shutdown()
                crash = getattr(engine, "crash", None)
                if isinstance(crash, BaseException):
                    raise crash
            engine = self._start(info)
            with self._lock:
                self._engines[key] = engine
            return engine

    def _start(self, info: ModelInfo) -> Engine:
        """Check the model's files, then start its engine (or its vLLM child)."""
        path = model_dir(info.source)
        # raises ModelRefused
        artifact_verify_for_load(
            model=info.name, path=path, node=self.node, count_refusal=self.refusals
        )
        if info.runtime == "vllm":
            logger.info("starting vLLM for model %s from %s", info.name, path)
            return VllmEngine(
                model=info.name,
                path=path,
                max_model_len=model_context_length(info),
                max_num_seqs=settings.FAIRLANE_ENGINE_MAX_NUM_SEQS,
            ).start()
        if info.speculative_draft:  # the draft's weights are loaded too: same check
            artifact_verify_for_load(
                model=info.name,
                path=model_dir(info.speculative_draft),
                node=self.node,
                count_refusal=self.refusals,
            )
        config = model_engine_config(info)
        logger.info("loading model %s from %s", info.name, config.model)
        return AsyncEngine.from_config(config, policy=engine_policy()).start()

    def hosted(self) -> list[str]:
        """The models with an engine running here (a version of them)."""
        with self._lock:
            return list(
                dict.fromkeys(
                    key.partition("@")[0]
                    for key, engine in self._engines.items()
                    if engine.is_running
                )
            )

    def foreground_at(self) -> float:
        """When any engine here last had an interactive sequence beside its bulk lane's
        (monotonic seconds; 0.0: none has)."""
        with self._lock:
            engines = list(self._engines.values())
        return max((engine.foreground_at for engine in engines), default=0.0)

    def hosted_versions(self) -> dict[str, dict[str, dict]]:
        """model -> version label ("" for a model without versions) -> its requests running
        and whether it is draining (no longer served, dropped once they are done)."""
        with self._lock:
            running = {key: engine for key, engine in self._engines.items() if engine.is_running}
            versions: dict[str, dict[str, dict]] = {}
            for key in running:
                name, _, label = key.partition("@")
                versions.setdefault(name, {})[label] = {
                    "running": self._users.get(key, 0),
                    "draining": key in self._retiring,
                }
            return versions

    def stats(self) -> dict[str, dict]:
        """Per model: the engine's load and counters, and what it can do (of the version
        loaded last, where several are)."""
        with self._lock:
            engines = dict(self._engines)
        return {
            key.partition("@")[0]: _figures(engine)
            for key, engine in engines.items()
            if engine.is_running
        }

    def shutdown(self) -> None:
        with self._lock:
            engines, self._engines = self._engines, {}
        for engine in engines.values():
            engine.shutdown()


def engine_policy() -> FairSharePolicy:
    """An engine orders what it runs like the fair queue: by lane, then tenants by weight."""
    return FairSharePolicy(lanes=Lane.values)


def _memory_free() -> None:
    """After an engine is dropped: collect its tensors now, and give CUDA's cache back."""
    gc.collect()
    try:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # freeing is best effort
        logger.warning("could not empty the CUDA cache", exc_info=True)


def _figures(engine: Engine) -> dict:
    if isinstance(engine, VllmEngine):
        return engine.stats()  # vLLM's own /metrics, and its capabilities
    core = engine.engine
    return {
        **engine.stats(),
        "max_model_len": core.max_model_len,
        "device": str(core.device),
        "dtype": str(core.dtype).removeprefix("torch."),
        "max_num_seqs": core.config.max_num_seqs,
        "paged_kv": True,
        "continuous_batching": True,
        "prefix_caching": core.config.is_prefix_caching_enabled,
        "hidden_states": True,
    }
