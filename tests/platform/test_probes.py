"""Liveness, readiness and the metrics endpoint."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT, child_env


@pytest.mark.django_db
def test_healthz_answers_without_touching_the_database(client, django_assert_num_queries):
    with django_assert_num_queries(0):
        response = client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_checks_database_and_redis(client, settings):
    assert settings.REDIS_URL  # make test runs against Redis
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["checks"] == {"database": "ok", "redis": "ok"}


@pytest.mark.django_db
def test_readyz_is_503_with_retry_after_when_redis_is_down(client):
    from routing.runtimes import runtime_build, runtime_using

    # A runtime whose Redis is gone: nothing listens on port 1.
    with runtime_using(runtime_build("embedded", redis_url="redis://127.0.0.1:1/0")):
        response = client.get("/readyz")
    assert response.status_code == 503 and response["Retry-After"] == "5"
    body = response.json()
    assert body["status"] == "unavailable" and body["checks"]["database"] == "ok"
    assert body["checks"]["redis"] != "ok"


@pytest.mark.django_db
def test_metrics_are_exported_and_can_require_a_token(client, settings):
    client.get("/healthz")
    response = client.get("/metrics")
    assert response.status_code == 200
    assert b"django_http_requests_total_by_method_total" in response.content
    settings.FAIRLANE_METRICS_TOKEN = "scrape-me"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me").status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize("mode,loopback_open", [("embedded", True), ("distributed", False)])
def test_without_a_token_metrics_answer_loopback_only_in_the_embedded_mode(mode, loopback_open):
    # Issue 28: /metrics names tenants and their spend; it was open to anyone by default.
    env = {
        **child_env(FAIRLANE_ENGINE_MODE=mode, FAIRLANE_METRICS_TOKEN=""),
        "FAIRLANE_METRICS_LOOPBACK": "",
    }
    script = (
        "import django; django.setup(); from django.test import Client; "
        "print(Client(HTTP_HOST='localhost').get('/metrics').status_code, "
        "Client(HTTP_HOST='localhost', REMOTE_ADDR='192.0.2.1').get('/metrics')"
        ".status_code)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout.split()
    assert out == (["200", "401"] if loopback_open else ["401", "401"])
