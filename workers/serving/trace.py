"""One trace per request: the W3C trace context a request arrives with (`traceparent`), or a
new one, carried through the API, the fair-queue job, the worker, the stream and the ledger
row; each unit of work on the way is a span of it.

- `span_start` opens a span under a parent (a `traceparent` string or a `Trace`). With
  FAIRLANE_TRACING=otlp it is an OpenTelemetry span, sent by the SDK's OTLP/HTTP exporter (to
  OTEL_EXPORTER_OTLP_ENDPOINT); otherwise (the default) only its ids exist, so that the trace
  id still reaches logs, jobs and the ledger at no cost.
- `trace_bind` makes a request's trace the current one for its code (a context variable, so
  asyncio tasks and `asyncio.to_thread`/`sync_to_async` hops inherit it), and
  `TraceLogFilter` puts its ids on every log record (`%(trace_id)s`, `%(request_id)s`).
- A request's timeline, the steps the ops dashboard shows, rides in `Job.timeline`
  as epoch seconds under these keys: received (the API has it), admitted (its budget held),
  queued (put on the fair queue; with `lane` and `position`), taken (by the worker or the
  remote backend in `worker`), submitted (handed to the worker's own engine), first_token,
  last_token. The ledger row's `created_at` is when it was settled.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from django.conf import settings

logger = logging.getLogger(__name__)

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


@dataclass(frozen=True, slots=True)
class Trace:
    """A position in a trace: its id (32 hex digits) and the current span's (16)."""

    trace_id: str
    span_id: str
    flags: str = "01"  # sampled

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"


def trace_parse(header: str | None) -> Trace | None:
    """A W3C `traceparent` header's trace, or None when it is absent or malformed (the spec
    says to start a new trace then, not to refuse the request)."""
    if not header or len(header) > 512:
        return None
    match = _TRACEPARENT.match(header.strip().lower())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if (
        version == "ff"
        or (version == "00" and rest)
        or set(trace_id) == {"0"}
        or set(span_id) == {"0"}
    ):
        return None
    return Trace(trace_id, span_id, flags)


def _new_id(digits: int) -> str:
    """A random trace or span id, as OpenTelemetry's SDK makes them (random.getrandbits: ids
    need to be unique, not secret; a system call for each cost more than the span itself)."""
    while True:
        value = random.getrandbits(digits * 4)
        if value:  # all-zero ids are invalid in W3C trace context
            return f"{value:0{digits}x}"


@dataclass(slots=True)
class RequestTrace:
    """What code working on one request knows of it: its trace, when it arrived, and its
    request id once it has one (the ledger's)."""

    trace: Trace | None
    received: float = 0.0
    request_id: str = ""


_current: ContextVar[RequestTrace | None] = ContextVar("fairlane_trace", default=None)


def trace_current() -> RequestTrace | None:
    return _current.get()


@contextmanager
def trace_bind(
    trace: Trace | None, *, received: float = 0.0, request_id: str = ""
) -> Iterator[RequestTrace]:
    """Make `trace` the current request's (for its logs, the jobs it makes) in this block."""
    current = RequestTrace(trace, received, request_id)
    token = _current.set(current)
    try:
        yield current
    finally:
        _current.reset(token)


def trace_enter(trace: Trace | None, *, received: float = 0.0) -> RequestTrace:
    """Make `trace` current for the rest of this task, unreset: an API request's own task,
    whose view and stream (which outlives the view) both run in it."""
    current = RequestTrace(trace, received)
    _current.set(current)
    return current


def trace_id_of(traceparent: str) -> str:
    trace = trace_parse(traceparent)
    return trace.trace_id if trace is not None else ""


@dataclass(slots=True)
class Span:
    """One unit of a request's work. `trace` is its own position (children name it as their
    parent); `end()` closes it (and exports it, when tracing is on). Idempotent."""

    trace: Trace
    _otel: Any = None  # an OpenTelemetry span, when tracing is on (a lazily imported library)
    _ended: bool = field(default=False)

    def set(self, **attributes: object) -> None:
        if self._otel is not None:
            self._otel.set_attributes({k: v for k, v in attributes.items() if v is not None})

    def fail(self, message: str) -> None:
        if self._otel is not None:
            from opentelemetry.trace import Status, StatusCode

            self._otel.set_status(Status(StatusCode.ERROR, message))

    def end(self) -> None:
        if not self._ended:
            self._ended = True
            if self._otel is not None:
                self._otel.end()


def span_start(
    name: str, *, parent: Trace | str | None = None, kind: str = "internal", **attributes: object
) -> Span:
    """A span named `name` under `parent` (a Trace, a traceparent string, or None for a new
    trace). `kind` is OpenTelemetry's: server, client, consumer, producer or internal."""
    if isinstance(parent, str):
        parent = trace_parse(parent)
    tracer = _tracer()
    if tracer is None:
        trace_id = parent.trace_id if parent is not None else _new_id(32)
        return Span(Trace(trace_id, _new_id(16), parent.flags if parent else "01"))
    from opentelemetry import context
    from opentelemetry import trace as otel

    if parent is not None:
        remote = otel.SpanContext(
            int(parent.trace_id, 16),
            int(parent.span_id, 16),
            is_remote=True,
            trace_flags=otel.TraceFlags(int(parent.flags, 16)),
        )
        ctx = otel.set_span_in_context(otel.NonRecordingSpan(remote))
    else:
        ctx = context.Context()  # a root: not whatever span the SDK thinks is current
    span = tracer.start_span(
        name,
        context=ctx,
        kind=getattr(otel.SpanKind, kind.upper()),
        attributes={k: v for k, v in attributes.items() if v is not None},
    )
    own = span.get_span_context()
    return Span(
        Trace(
            format(own.trace_id, "032x"),
            format(own.span_id, "016x"),
            format(int(own.trace_flags), "02x"),
        ),
        span,
    )


@lru_cache(maxsize=1)
def _provider() -> Any:  # an OpenTelemetry TracerProvider (a lazily imported library)
    """The OpenTelemetry tracer provider when FAIRLANE_TRACING is "otlp" (spans batched to the
    OTLP/HTTP exporter, which reads the standard OTEL_EXPORTER_OTLP_* variables), else None.
    OpenTelemetry's SDK is imported only then: most deployments never load it."""
    if settings.FAIRLANE_TRACING != "otlp":
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # OTEL_SERVICE_NAME, when set, wins over the default name (the SDK reads it).
    provider = TracerProvider(resource=Resource.create({"service.name": "fairlane"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    logger.info("tracing: OpenTelemetry spans are exported over OTLP/HTTP")
    return provider


@lru_cache(maxsize=1)
def _tracer() -> Any:
    provider = _provider()
    return provider.get_tracer("fairlane") if provider is not None else None


class TraceLogFilter(logging.Filter):
    """Adds the current request's `trace_id` and `request_id` ("-" outside a request) to every
    record, for the log format."""

    def filter(self, record: logging.LogRecord) -> bool:
        current = _current.get()
        record.trace_id = current.trace.trace_id if current and current.trace else "-"
        record.request_id = (current.request_id or "-") if current is not None else "-"
        return True
