"""/metrics adds up across processes: uvicorn with two workers (prometheus_client's
multiprocess mode, PROMETHEUS_MULTIPROC_DIR emptied when the deployment starts) serves 100
requests and any scrape reports 100; time to first token and time per output token are
histograms of what the clients saw; spend per tenant matches the ledger."""

import re
import sys
import time

import httpx
import openai
import pytest
from django.db.models import Sum

from tenants.models import UsageRecord
from tests.conftest import child_env, wait_for
from tests.servers import Process, free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class Workers(Process):
    """uvicorn --workers 2 on the test database, in the embedded mode."""

    def __init__(self, multiproc_dir, namespace: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = child_env(
            FAIRLANE_ENGINE_MODE="embedded",
            FAIRLANE_QUEUE_NAMESPACE=namespace,
            PROMETHEUS_MULTIPROC_DIR=str(multiproc_dir),
        )
        super().__init__(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "asgi:application",
                "--port",
                str(self.port),
                "--workers",
                "2",
                "--lifespan",
                "off",
                "--no-access-log",
            ],
            env,
            "asgi-workers",
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                if self.proc.poll() is not None:
                    raise RuntimeError(self.output()) from None
                time.sleep(0.3)
        else:
            raise TimeoutError(self.output())


def value(text: str, series: str) -> float:
    """A series' value; a label written `version=*` matches any version."""
    pattern = re.escape(series).replace(re.escape("version=*"), 'version="[^"]*"')
    match = re.search(rf"^{pattern} (\S+)$", text, re.M)
    assert match, f"{series} not in /metrics"
    return float(match.group(1))


def models_requests(url: str, key: str, count: int) -> None:
    """`count` GET /v1/models, each on a new connection (so both workers get some)."""
    for _ in range(count):
        response = httpx.get(
            url + "/v1/models", headers={"Authorization": f"Bearer {key}", "Connection": "close"}
        )
        assert response.status_code == 200


def test_two_workers_serve_100_requests_and_metrics_reports_100(
    tmp_path, key, budget, tenant, namespace
):
    multiproc = tmp_path / "prometheus"
    series = 'fairlane_api_requests_total{endpoint="models",status="200"}'
    first = Workers(multiproc, namespace)
    try:
        models_requests(first.url, key, 30)
        assert value(httpx.get(first.url + "/metrics").text, series) == 30
    finally:
        first.stop()
    server = Workers(
        multiproc, namespace
    )  # a new run of the deployment: the directory starts empty
    try:
        models_requests(server.url, key, 100)
        pids = {p.stem.rsplit("_", 1)[1] for p in multiproc.glob("counter_*.db")}
        assert len(pids) >= 2  # both workers counted requests
        for _ in range(6):  # whichever worker answers the scrape, it adds up all of them
            text = httpx.get(server.url + "/metrics", headers={"Connection": "close"}).text
            assert value(text, series) == 100

        client = openai.OpenAI(api_key=key, base_url=server.url + "/v1", max_retries=0)
        for _ in range(4):
            stream = client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=8,
                temperature=0,
                stream=True,
                extra_body={"min_tokens": 8},
            )
            assert len([c for c in stream if c.choices and c.choices[0].delta.content]) > 1
        text = httpx.get(server.url + "/metrics").text
        labels = '{backend="local",model="tiny",version=*}'
        assert value(text, f"fairlane_time_to_first_token_seconds_count{labels}") == 4
        assert value(text, f"fairlane_time_per_output_token_seconds_count{labels}") == 4
        assert value(text, f"fairlane_time_to_first_token_seconds_sum{labels}") > 0
        spent = UsageRecord.objects.filter(tenant=tenant).aggregate(s=Sum("cost_microcents"))["s"]
        assert spent > 0
        series = f'fairlane_tenant_spend_microcents_total{{tenant="{tenant.slug}"}}'

        def spend_shown():  # each process adds its spend to Redis every 2 s
            text = httpx.get(server.url + "/metrics").text
            return series in text and value(text, series) == spent and text

        text = wait_for(spend_shown, what="the tenant's spend in /metrics")
        assert "fairlane_queue_depth" in text and "fairlane_backend_registry_readable 1.0" in text
    finally:
        server.stop()
