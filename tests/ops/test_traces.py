"""One trace per request, through real processes: a caller's W3C `traceparent` (or a new trace)
is carried by uvicorn, the fair-queue job, the Celery worker and the settlement; the ledger
row keeps the trace id and the request's timeline; the worker's log lines name it; and with
FAIRLANE_TRACING=otlp both processes send OpenTelemetry spans of that one trace to an OTLP/HTTP
collector (a real HTTP server on 127.0.0.1 decoding the protobuf requests)."""

import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from django.contrib.auth.models import User
from django.test import Client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from routing.backend_store import agent_routing_set, backend_model_set, backend_register
from routing.bench.fakes import FakeProvider
from tenants.models import Scope, UsageRecord
from tenants.services.keys import api_key_create
from tenants.services.tenancy import agent_create
from tests.conftest import wait_for
from tests.routing.test_streaming_processes import distributed_env
from tests.servers import AsgiServer, CeleryWorker

pytestmark = pytest.mark.django_db(transaction=True)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = f"00-{TRACE}-00f067aa0ba902b7-01"
STEPS = ["received", "admitted", "queued", "taken", "submitted", "first_token", "last_token"]


class Collector:
    """An OTLP/HTTP trace collector: keeps every span it is sent."""

    def __init__(self) -> None:
        self.spans: list = []
        spans = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of(self, trace_id: str) -> dict[str, list]:
        found: dict[str, list] = {}
        for span in list(self.spans):
            if span.trace_id.hex() == trace_id:
                found.setdefault(span.name, []).append(span)
        return found


@pytest.fixture(scope="module")
def traced(django_db_setup, django_db_blocker):
    collector = Collector()
    env = distributed_env(
        FAIRLANE_TRACING="otlp",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=collector.url,
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    worker = CeleryWorker(env)
    server = AsgiServer(env)
    yield server, worker, collector
    server.stop()
    worker.stop()
    collector.server.shutdown()


def _chat(server, key: str, **extra) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", **extra.pop("headers", {})}
    return httpx.post(
        server.url + "/v1/chat/completions",
        headers=headers,
        timeout=60,
        json={
            "model": extra.pop("model", "tiny"),
            "max_tokens": 6,
            **extra,
            "messages": [{"role": "user", "content": "hello"}],
        },
    )


def test_a_callers_trace_reaches_the_worker_the_ledger_and_the_collector(traced, key):
    server, worker, collector = traced
    response = _chat(server, key, headers={"traceparent": CALLER})
    assert response.status_code == 200, response.text
    assert response.headers["x-fairlane-trace-id"] == TRACE
    request_id = response.headers["x-request-id"]
    record = wait_for(lambda: UsageRecord.objects.filter(request_id=request_id).first())
    assert record.trace_id == TRACE
    # The timeline: every step, in order, each before the settlement.
    line = record.timeline
    times = [line[step] for step in STEPS]
    assert times == sorted(times), line
    assert times[-1] <= record.created_at.timestamp() + 0.001
    assert line["worker"] and line["lane"] == "standard" and line["position"] >= 1
    # The ops dashboard shows it, step by step.
    staff = User.objects.create_user("noc", is_staff=True)
    client = Client()
    client.force_login(staff)
    page = client.get("/ops/requests/", {"q": request_id}).content.decode()
    assert [s.split('"')[0] for s in page.split('data-step="')[1:]] == [*STEPS, "settled"]
    # The worker's log line about it names the trace and the request.
    wait_for(
        lambda: f"[trace={TRACE} request={request_id}]" in worker.output(),
        what="the worker's log line",
    )
    # Spans of one trace from both processes: the API's under the caller's span, the worker's
    # and the settlement's under the API's.
    spans = wait_for(
        lambda: (
            (found := collector.of(TRACE))
            and {"POST /v1/chat/completions", "fairlane.generate", "fairlane.settle"} <= set(found)
            and found
        ),
        what="spans at the collector",
    )
    api = spans["POST /v1/chat/completions"][0]
    assert api.parent_span_id.hex() == "00f067aa0ba902b7"
    assert spans["fairlane.generate"][0].parent_span_id == api.span_id
    assert spans["fairlane.settle"][0].parent_span_id == api.span_id


def test_a_request_without_a_trace_gets_one_and_a_malformed_one_is_replaced(traced, key):
    server, _, collector = traced
    for headers in (
        {},
        {"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"},
        {"traceparent": "garbage"},
    ):
        response = _chat(server, key, headers=headers, stream=True)
        assert response.status_code == 200, response.text
        trace_id = response.headers["x-fairlane-trace-id"]
        assert len(trace_id) == 32 and set(trace_id) != {"0"}
        record = wait_for(
            lambda response=response: UsageRecord.objects.filter(
                request_id=response.headers["x-request-id"]
            ).first()
        )
        assert record.trace_id == trace_id and record.trace_id != TRACE
        # The streamed answer's server span ends with its stream.
        wait_for(
            lambda trace_id=trace_id: "POST /v1/chat/completions" in collector.of(trace_id),
            what="the streamed request's span",
        )


@pytest.mark.parametrize("kind", ["openai_compatible", "openai"])
def test_a_remote_backends_answer_has_its_timeline_and_span(traced, tenant, kind):
    """A vLLM server (or a remote Fairlane) continues the trace under our upstream span; a
    paid provider is sent no trace header."""
    server, _, collector = traced
    fake = FakeProvider("openai", reply_tokens=4).start()
    try:
        backend = backend_register(
            name=f"remote-{uuid.uuid4().hex[:6]}",
            kind=kind,
            base_url=fake.url,
            credential=fake.api_key,
        )
        backend_model_set(backend=backend, model="m", upstream_name="fake-model")
        agent = agent_create(tenant=tenant, name=f"remote-bot-{kind}")
        agent_routing_set(agent=agent, chain=[backend.name])
        key = api_key_create(tenant=tenant, agent=agent, scopes=[Scope.INFERENCE])[1]
        trace = uuid.uuid4().hex
        response = _chat(
            server, key, model="m", headers={"traceparent": f"00-{trace}-1111111111111111-01"}
        )
        sent = dict(fake.last_headers)
    finally:
        fake.stop()
    assert response.status_code == 200, response.text
    record = wait_for(
        lambda: UsageRecord.objects.filter(request_id=response.headers["x-request-id"]).first()
    )
    line = record.timeline
    assert record.trace_id == trace and line["backend"] == backend.name
    assert "queued" not in line and "submitted" not in line  # no fair queue, no engine here
    times = [line[s] for s in ("received", "admitted", "taken", "first_token", "last_token")]
    assert times == sorted(times), line
    spans = wait_for(
        lambda: (found := collector.of(trace)) and "fairlane.upstream" in found and found,
        what="the upstream span",
    )
    upstream = spans["fairlane.upstream"][0]
    assert upstream.parent_span_id == spans["POST /v1/chat/completions"][0].span_id
    if kind == "openai":
        assert "traceparent" not in sent
    else:
        assert sent["traceparent"] == f"00-{trace}-{upstream.span_id.hex()}-01"


def _histogram_count(text: str, name: str, labels: str) -> int:
    for line in text.splitlines():
        if line.startswith(f"{name}_count{{") and labels in line:
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def test_engine_side_times_from_the_worker_add_up_in_the_apis_metrics(traced, key):
    server = traced[0]
    series = [
        ("fairlane_engine_time_to_first_token_seconds", 'model="tiny"'),
        ("fairlane_engine_time_per_output_token_seconds", 'model="tiny"'),
        ("fairlane_queue_wait_seconds", 'lane="standard",model="tiny"'),
    ]

    def counts() -> list[int]:
        text = httpx.get(server.url + "/metrics").text
        return [_histogram_count(text, name, labels) for name, labels in series]

    before = counts()
    for _ in range(3):
        assert _chat(server, key).status_code == 200
    # The worker flushes its observations to Redis every 2 s; the API's scrape reads them. At
    # least 3 more: the module's earlier requests may be flushed in the same window (CI once
    # read `before` ahead of their flush, and the counts passed b + 3 without stopping on it).
    wait_for(
        lambda: all(now >= b + 3 for now, b in zip(counts(), before, strict=True)),
        what="3 more of each",
    )
    text = httpx.get(server.url + "/metrics").text
    assert 'fairlane_engine_time_to_first_token_seconds_bucket{le="+Inf",model="tiny"}' in text
