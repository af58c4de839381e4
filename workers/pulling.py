"""How a GPU worker gets work: it takes the next request the fair queue picks whenever its
engine has room (sequence slots and free KV blocks), so work flows to whichever worker can
take it, in the order the fair queue decides, not in the order a broker received it."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings

from tenants.models import UsageRecord
from workers.fairqueue import FairQueue, Taken
from workers.host import Engine, EngineHost, ModelLoadFailed, load_failed_event
from workers.pools import workers_live
from workers.run_loops import run_on_thread
from workers.serving.catalog import ModelInfo
from workers.serving.events import Done, Event, Tokens, TokenUsage
from workers.serving.jobs import Job
from workers.serving.runtime import Runtime
from workers.serving.settlement import generation_settle
from workers.serving.trace import trace_bind, trace_parse
from workers.serving.versions import versions_of
from workers.transport import LostOwnership, RedisStreamEmit, is_cancel_requested, queue_for
from workers.vllm import VllmEngine

logger = logging.getLogger(__name__)

# Output tokens are charged to the tenant's fair-share counter in batches of this many.
CHARGE_EVERY = 16


class ChargingEmit:
    """Streams a request's events to Redis and charges its generated tokens to the tenant's
    virtual token counter as they come (VTC charges output as it is produced)."""

    def __init__(self, stream: RedisStreamEmit, queue: FairQueue, taken: Taken) -> None:
        self.stream, self.queue, self.taken = stream, queue, taken
        self.pending = 0

    def __call__(self, event: Event) -> None:
        self.stream(event)
        if isinstance(event, Tokens):
            self.pending += len(event.token_ids)
        if self.pending >= CHARGE_EVERY or (isinstance(event, Done) and self.pending):
            self.queue.charge(tenant=self.taken.tenant, lane=self.taken.lane, tokens=self.pending)
            self.pending = 0


def run_taken(runtime: Runtime, queue: FairQueue, taken: Taken, *, worker_id: str) -> None:
    """Run one request taken from the queue, then acknowledge it. A request whose earlier
    worker died resumes after the tokens that worker streamed; one that finished but was not
    acknowledged is only acknowledged."""
    job = Job.from_dict(taken.payload)
    job.timeline.update(
        taken=time.time(), worker=worker_id, lane=taken.lane, position=taken.position
    )
    with trace_bind(trace_parse(job.trace), request_id=job.request_id):
        logger.info(
            "taken: %s, %s lane, position %d, waited %d ms",
            job.model["name"],
            taken.lane,
            taken.position,
            taken.waited_ms,
        )
        _run_taken(runtime, queue, taken, job, worker_id=worker_id)


def _run_taken(
    runtime: Runtime, queue: FairQueue, taken: Taken, job: Job, *, worker_id: str
) -> None:
    client = queue.client
    emit = ChargingEmit(RedisStreamEmit(client, job.request_id, owner=worker_id), queue, taken)
    backend = f"worker:{worker_id}"
    try:
        earlier = emit.stream.claim()
        if any(isinstance(event, Done) for event in earlier):
            return
        if earlier:
            job = job.resume_from(earlier)
        if is_cancel_requested(client, job.request_id):
            generation_settle(
                runtime.outbox,
                job,
                TokenUsage(),
                status=UsageRecord.Status.CANCELLED,
                backend=backend,
                latency_ms=0,
                emit=emit,
            )
            return
        host = runtime.engine_host
        try:  # on the job's version of its model, which stays loaded while it runs
            with host.using(job.model_info) as engine:
                run_on_thread(
                    job, engine, emit, backend=backend, outbox=runtime.outbox, runs=host.runs
                )
        except ModelLoadFailed as exc:  # nothing ran: the API falls through, or answers 503
            emit(load_failed_event(exc))
    except LostOwnership:  # its claim lapsed and another worker resumed it: that one settles
        logger.warning("request %s: taken over by another worker; stopped", job.request_id)
    except Exception:  # a worker thread is a process boundary
        logger.exception("request %s failed", job.request_id)
    finally:
        try:
            queue.ack(id=taken.id, worker=worker_id)
        except Exception:  # Redis trouble: the claim lapses, and the next owner sees `done`
            logger.warning("request %s: not acknowledged", job.request_id, exc_info=True)


def engine_free_slots(engine: Engine) -> tuple[int, bool]:
    """Sequences the engine can take now (free slots, or none when its KV blocks run low), and
    whether its memory, not its slots, is what is short. One read of its occupancy: it waits for
    the engine's step to end."""
    if isinstance(engine, VllmEngine):
        return engine.free_slots(), False
    stats = engine.occupancy()
    if stats["kv_blocks_free"] <= stats["kv_blocks_total"] * 0.05:
        return 0, True
    return engine.engine.config.max_num_seqs - stats["num_running"] - stats["num_waiting"], False


class Puller:
    """One thread per hosted model, taking requests into a pool of runner threads. A model
    no longer served here (disabled, or left FAIRLANE_WORKER_MODELS) is pulled until its
    queue is empty, then its thread ends."""

    def __init__(self, runtime: Runtime, worker_id: str, concurrency: int) -> None:
        self.runtime, self.worker_id = runtime, worker_id
        self.host: EngineHost = runtime.engine_host
        self.models: dict[str, ModelInfo] = {}
        self.client = runtime.shared_redis
        self._elsewhere: dict[str, tuple[float, bool]] = {}
        # Runner threads for its slots and the extra ones taken for fairness (see _fair_room).
        self.extra = settings.FAIRLANE_FAIR_EXTRA_SLOTS
        self.pool = ThreadPoolExecutor(
            max_workers=concurrency + self.extra, thread_name_prefix="run"
        )
        self.capacity = concurrency
        # request id -> (queue, queue id, tenant, its weight)
        self.taken: dict[str, tuple[FairQueue, str, str, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: dict[str, threading.Thread] = {}

    def serve(self, models: list[ModelInfo]) -> None:
        """Pull for these models, as the registry has them now (their versions may have
        changed): start a thread for each new one; the others' threads drain and end."""
        with self._lock:
            self.models = {info.name: info for info in models}
            for info in models:
                thread = self._threads.get(info.name)
                if self._stop.is_set() or (thread is not None and thread.is_alive()):
                    continue
                thread = threading.Thread(
                    target=self._loop, args=(info,), daemon=True, name=f"pull-{info.name}"
                )
                self._threads[info.name] = thread
                thread.start()

    def stop(self, drain_timeout: float) -> None:
        """Take nothing more; let what runs finish (the drain), for up to `drain_timeout`
        seconds. Whatever is still running then is resumed elsewhere when its claim lapses."""
        self._stop.set()
        for thread in list(self._threads.values()):
            thread.join(timeout=5)
        deadline = time.monotonic() + drain_timeout
        while self.in_flight() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def in_flight(self) -> int:
        with self._lock:
            return len(self.taken)

    def renew_claims(self) -> None:
        with self._lock:
            by_queue: dict[FairQueue, list[str]] = {}
            for queue, queue_id, _, _ in self.taken.values():
                by_queue.setdefault(queue, []).append(queue_id)
        for queue, ids in by_queue.items():
            lost = queue.renew(worker=self.worker_id, ids=ids)
            if lost:
                logger.warning("lost claims (another worker took them over): %s", lost)

    def _current(self, info: ModelInfo, queue: FairQueue) -> ModelInfo | None:
        """The model as the registry has it now; the last one known while its queue drains
        after it stopped being served here; None when the thread is to end."""
        with self._lock:
            current = self.models.get(info.name)
            if current is None and queue.depth() == 0:
                if self._threads.get(info.name) is threading.current_thread():
                    del self._threads[info.name]
                return None
        return current or info

    def _versions_load(self, info: ModelInfo) -> Engine:
        """Load each version of the model taking traffic (a canary that fails to load does
        not stop its primary); the primary's engine."""
        primary, *others = versions_of(info)
        for version in others:
            try:
                self.host.load(version)
            except ModelLoadFailed:  # logged; its requests get a clean error until it loads
                pass
        return self.host.load(primary)

    def _hosted_elsewhere(self, model: str) -> bool:
        """Whether a live worker hosts the model (heartbeats, read at most once a second)."""
        checked, hosted = self._elsewhere.get(model, (0.0, False))
        if time.monotonic() - checked > 1.0:
            hosted = any(model in beat["models"] for beat in workers_live(self.client))
            self._elsewhere[model] = (time.monotonic(), hosted)
        return hosted

    def _loop(self, info: ModelInfo) -> None:
        queue = queue_for(self.client, info.name)
        while not self._stop.is_set():
            try:
                current = self._current(info, queue)
                if current is None:
                    return
                info = current
                engine = self._versions_load(info)
            except ModelLoadFailed as exc:  # retried after its backoff; meanwhile fail fast
                self._refuse_waiting(queue, info, exc)
                continue
            except Exception:  # Redis trouble: keep pulling once it is back
                logger.exception("pulling from %s failed", info.name)
                self._stop.wait(1.0)
                continue
            try:
                free, memory_short = engine_free_slots(engine)
                free = min(free, self.capacity - self.in_flight())
                exclude: frozenset[str] = frozenset()
                if free <= 0:
                    # (memory, not slots, is what is short: nothing more comes in)
                    over = None if memory_short else self._fair_room(queue, engine)
                    if over is None:  # until a request here ends (or the next look)
                        queue.wait_for_slot(self.worker_id, settings.FAIRLANE_PULL_INTERVAL_SECONDS)
                        continue
                    exclude = over
                # The last free slots wait for realtime requests, so one is always at hand
                # (beyond the slots, any lane of a tenant under its share may come in).
                realtime_only = 0 < free <= settings.FAIRLANE_REALTIME_RESERVED_SLOTS
                taken = queue.dequeue(
                    worker=self.worker_id, realtime_only=realtime_only, exclude=exclude
                )
                if taken is None:  # (what it may take was limited: a freed slot wakes it too)
                    queue.wait_for_work(
                        timeout=settings.FAIRLANE_PULL_INTERVAL_SECONDS,
                        freed_on=self.worker_id if realtime_only or exclude else None,
                    )
                    continue
                weight = float(taken.payload.get("weight") or 1)
                with self._lock:
                    again = taken.payload["request_id"] in self.taken
                    self.taken[taken.payload["request_id"]] = (
                        queue,
                        taken.id,
                        taken.tenant,
                        weight,
                    )
                if again:  # its claim lapsed while it ran here (Redis was slow): it runs on
                    logger.warning(
                        "request %s: claim lapsed and taken back; still running",
                        taken.payload["request_id"],
                    )
                    continue
                self.pool.submit(self._run, queue, taken)
            except Exception:  # Redis trouble: keep pulling once it is back
                logger.exception("pulling from %s failed", info.name)
                self._stop.wait(1.0)

    def _fair_room(self, queue: FairQueue, engine: Engine) -> frozenset[str] | None:
        """With every slot taken: the tenants NOT to take beyond the slots (those holding their
        weighted share of this model's slots here, or more), or None when nothing more may be
        taken (fairness off, a vLLM engine, or the extra slots used). The engine preempts the
        tenant furthest over its share to run what is taken (is_fair_preemption_enabled)."""
        if self.extra <= 0 or isinstance(engine, VllmEngine):
            return None
        slots = min(engine.engine.config.max_num_seqs, self.capacity)
        with self._lock:
            mine = [(t, w) for q, _, t, w in self.taken.values() if q is queue]
        if self.in_flight() >= self.capacity + self.extra or len(mine) >= slots + self.extra:
            return None
        counts = Counter(tenant for tenant, _ in mine)
        weights = dict(mine)
        total = sum(weights.values())
        return frozenset(t for t, n in counts.items() if n >= slots * weights[t] / total)

    def _refuse_waiting(self, queue: FairQueue, info: ModelInfo, exc: ModelLoadFailed) -> None:
        """Until the model's next load attempt: when no live worker hosts it, its queued
        requests get a clean error at once (the API falls through or answers 503) instead of
        waiting for a worker that will never take them."""
        deadline = time.monotonic() + max(exc.retry_in, 0.1)
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                if self._hosted_elsewhere(info.name):
                    self._stop.wait(min(deadline - time.monotonic(), 1.0))
                    continue
                taken = queue.dequeue(worker=self.worker_id)
                if taken is None:
                    queue.wait_for_work(timeout=min(max(deadline - time.monotonic(), 0.05), 1.0))
                    continue
                stream = RedisStreamEmit(self.client, taken.payload["request_id"])
                stream(load_failed_event(exc))
                queue.ack(id=taken.id, worker=self.worker_id)
            except Exception:  # Redis trouble: keep going once it is back
                logger.exception("refusing requests for %s failed", info.name)
                self._stop.wait(1.0)

    def _run(self, queue: FairQueue, taken: Taken) -> None:
        try:
            run_taken(self.runtime, queue, taken, worker_id=self.worker_id)
        finally:
            with self._lock:
                self.taken.pop(taken.payload["request_id"], None)
