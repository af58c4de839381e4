"""Health probes against fake providers that are real HTTP servers on 127.0.0.1: only the free
model list is asked for, failures lead to offline (not routed to), a success brings a backend
back, and the rolling figures the latency policy and the admin read."""

import socket
from datetime import timedelta

import pytest
from django.utils import timezone

from routing.backend_store import backend_model_set, backend_register
from routing.bench.fakes import FakeProvider, server_error
from routing.health import backends_probe, health_record
from routing.models import Backend, Health
from routing.router import Need, registry_get, registry_invalidate, route_plan
from routing.tasks import backends_probe as backends_probe_task

pytestmark = pytest.mark.django_db
KIND = {"openai": "openai", "openrouter": "openrouter", "anthropic": "anthropic"}
CHAT = Need(endpoint="chat", prompt_tokens=20, max_tokens=5)


def probe() -> dict[str, str]:
    """What the beat's probe does, with the distributed runtime an API process has."""
    from routing.runtimes import runtime_installed

    return backends_probe(pool=runtime_installed().pool)


def register(name: str, fake: FakeProvider, *, credential: str | None = None, **fields) -> Backend:
    fields.setdefault("base_url", fake.url)
    backend = backend_register(
        name=name,
        kind=KIND[fake.fmt],
        credential=fake.api_key if credential is None else credential,
        **fields,
    )
    backend_model_set(backend=backend, model="m", upstream_name="fake-model")
    return backend


def closed_port_url() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now: connections are refused
    return f"http://127.0.0.1:{port}"


def routed() -> list[str]:
    registry_invalidate()
    plan = route_plan(registry=registry_get(), agent_id="nobody", model="m", need=CHAT)
    return [r.backend.name for r in plan.routes]


def row(name: str) -> Backend:
    return Backend.objects.get(name=name)


@pytest.mark.parametrize("fmt", ["openai", "openrouter", "anthropic"])
def test_a_reachable_backend_is_live_and_only_its_free_model_list_was_asked(fakes, fmt):
    fake = fakes(fmt)
    fake.set_default(server_error(500))  # completions would fail: the probe never sends one
    register("p", fake)

    assert probe() == {"p": Health.LIVE}
    backend = row("p")
    assert backend.health == Health.LIVE and backend.health_detail == ""
    assert backend.health_ok_at is not None and backend.health_checked_at == backend.health_ok_at
    [[latency_ms, ok]] = backend.probe_samples
    assert ok is True and latency_ms > 0
    assert backend.probe_p50_ms == backend.probe_p95_ms == latency_ms
    assert backend.probe_error_rate == 0
    assert fake.stats["probes"] == 1 and fake.stats["requests"] == 0


def test_a_wrong_credential_fails_the_probe(fakes):
    fake = fakes("openai")
    register("p", fake, credential="sk-not-the-right-one")

    assert probe() == {"p": Health.UNKNOWN}  # never live, not yet offline
    backend = row("p")
    assert "authentication failed" in backend.health_detail
    assert [ok for _, ok in backend.probe_samples] == [False]
    assert backend.probe_error_rate == 1.0 and backend.probe_p95_ms == 0
    assert backend.health_ok_at is None and backend.health_checked_at is not None
    assert fake.stats["probes"] == 1 and fake.stats["requests"] == 0


def test_an_unresolvable_credential_fails_the_probe_without_sending_it(fakes, settings):
    fake, other = fakes("openai"), fakes("anthropic")
    register("env-ref", fake, credential="", credential_ref="env:FAIRLANE_TEST_UNSET_KEY_1234")
    register("ok", other)
    settings.FAIRLANE_HEALTH_OFFLINE_AFTER = 1

    assert probe() == {"env-ref": Health.OFFLINE, "ok": Health.LIVE}
    assert "is not set" in row("env-ref").health_detail
    assert fake.stats["probes"] == 0 and other.stats["probes"] == 1

    settings.FAIRLANE_CREDENTIALS_KEY = "rotated"  # the stored ciphertext no longer opens
    assert probe()["ok"] == Health.OFFLINE
    assert "cannot be decrypted" in row("ok").health_detail
    assert other.stats["probes"] == 1


def test_a_stopped_backend_goes_offline_after_the_failures_in_a_row_and_is_not_routed(
    fakes, settings
):
    settings.FAIRLANE_HEALTH_OFFLINE_AFTER = 3
    down, up = fakes("openai"), fakes("openrouter")
    register("down", down)
    register("up", up)
    probe()
    assert routed() == ["up", "down"]  # OpenRouter before OpenAI in the default order
    down.stop()

    for _ in range(2):  # failed, but its last success is recent: live, routed to
        assert probe() == {"down": Health.LIVE, "up": Health.LIVE}
        assert routed() == ["up", "down"]
    backend = row("down")
    assert [ok for _, ok in backend.probe_samples] == [True, False, False]
    assert backend.probe_error_rate == pytest.approx(2 / 3)
    assert backend.health_detail.startswith("backend_unavailable")

    assert probe() == {"down": Health.OFFLINE, "up": Health.LIVE}
    assert routed() == ["up"]
    assert up.stats["probes"] == 4 and up.stats["requests"] == 0


def test_one_successful_probe_brings_an_offline_backend_back(fakes, settings):
    settings.FAIRLANE_HEALTH_OFFLINE_AFTER = 2
    fake = fakes("anthropic")
    register("flaky", fake, base_url=closed_port_url())
    probe()
    assert probe() == {"flaky": Health.OFFLINE}
    assert routed() == []
    assert fake.stats["probes"] == 0

    backend_register(name="flaky", kind="anthropic", base_url=fake.url)
    assert probe() == {"flaky": Health.LIVE}
    assert routed() == ["flaky"]
    backend = row("flaky")
    assert [ok for _, ok in backend.probe_samples] == [False, False, True]
    assert backend.probe_error_rate == pytest.approx(2 / 3) and backend.health_detail == ""
    assert fake.stats["probes"] == 1


def test_one_backend_with_an_unsendable_credential_does_not_stop_the_others_probes(fakes):
    bad, good = fakes("openai"), fakes("openai")
    register("bad", bad, credential="sk-’pasted-with-a-curly-quote")
    register("good", good)
    assert probe() == {"bad": Health.UNKNOWN, "good": Health.LIVE}
    assert row("bad").probe_error_rate == 1.0 and row("good").health == Health.LIVE


def test_a_disabled_backend_is_not_probed(fakes):
    fake = fakes("openai")
    register("off", fake, is_enabled=False)
    assert probe() == {}
    assert fake.stats["probes"] == 0 and row("off").health == Health.UNKNOWN


def test_the_local_pool_is_live_in_embedded_mode_and_otherwise_by_worker_heartbeats(
    settings, embedded_runtime, distributed_runtime
):
    from workers.serving.registration import model_register

    model_register(name="zz-hosted-by-no-worker", source="preset:tiny")
    backend_register(name="pool", kind="local")
    assert backends_probe(pool=embedded_runtime.pool) == {"pool": Health.LIVE}

    settings.FAIRLANE_HEALTH_OFFLINE_AFTER = 1
    assert backends_probe(pool=distributed_runtime.pool) == {"pool": Health.OFFLINE}
    assert row("pool").health_detail == "no live GPU worker hosts a registered model"


def test_the_celery_task_probes_every_backend(fakes, distributed_runtime, monkeypatch):
    import celery_app

    monkeypatch.setattr(celery_app.app, "runtime", distributed_runtime, raising=False)
    first, second = fakes("openai"), fakes("anthropic")
    register("first", first)
    register("second", second)
    result = backends_probe_task.apply().get()
    assert result == {"first": Health.LIVE, "second": Health.LIVE}
    assert row("first").health == row("second").health == Health.LIVE
    assert first.stats["probes"] == second.stats["probes"] == 1
    assert first.stats["requests"] == second.stats["requests"] == 0


# -- health_record: the rolling figures and stale, at explicit times ---------------------------


def bare(name: str = "b") -> Backend:
    return backend_register(name=name, kind="openai", base_url="http://b.example")


def test_error_rate_and_percentiles_come_from_the_last_twenty_samples():
    backend = bare()
    for latency, ok in [(10, True), (30, True), (500, False), (20, True)]:
        health_record(backend, latency, ok, "" if ok else "timeout: slow")
    backend.refresh_from_db()
    assert backend.probe_error_rate == 0.25
    # Only successful probes have a latency worth ranking by: 10, 20, 30.
    assert backend.probe_p50_ms == 20 and backend.probe_p95_ms == 30

    for _ in range(20):
        health_record(backend, 40, True, "")
    backend.refresh_from_db()
    assert len(backend.probe_samples) == 20 and backend.probe_error_rate == 0
    assert backend.probe_p50_ms == backend.probe_p95_ms == 40


def test_a_failed_probe_long_after_the_last_success_is_stale_then_offline(settings):
    settings.FAIRLANE_HEALTH_STALE_SECONDS = 60
    settings.FAIRLANE_HEALTH_OFFLINE_AFTER = 3
    # The story ends now: its last success is recent when it is routed at the end (staleness
    # follows the clock).
    start = timezone.now() - timedelta(seconds=180)
    backend = bare("s")
    other = bare("t")
    backend_model_set(backend=backend, model="m")
    backend_model_set(backend=other, model="m")
    health_record(other, 5, True, "")
    health_record(backend, 5, True, "", now=start)

    health_record(backend, 5, False, "timeout", now=start + timedelta(seconds=59))
    assert row("s").health == Health.LIVE  # failed, but its last success is recent
    health_record(backend, 5, True, "", now=start + timedelta(seconds=60))
    health_record(backend, 5, False, "timeout", now=start + timedelta(seconds=121))
    assert row("s").health == Health.STALE
    assert routed() == ["t", "s"]  # still routed to, last

    health_record(backend, 5, False, "timeout", now=start + timedelta(seconds=140))
    assert row("s").health == Health.STALE
    health_record(backend, 5, False, "timeout", now=start + timedelta(seconds=160))
    assert row("s").health == Health.OFFLINE
    assert routed() == ["t"]
    health_record(backend, 5, True, "", now=start + timedelta(seconds=180))
    assert row("s").health == Health.LIVE and row("s").health_detail == ""
    assert routed() == ["s", "t"]


def test_the_backends_probe_command_prints_each_backends_health(fakes):
    from io import StringIO

    from django.core.management import call_command

    fake = fakes("openai")
    register("probed", fake)
    out = StringIO()
    call_command("backends_probe", stdout=out)
    assert "probed: live" in out.getvalue() and fake.stats["probes"] == 1


def test_metrics_show_each_backends_health_and_this_processs_circuit(fakes, client):
    from routing.breaker import breakers

    register("shown", fakes("openai"))
    probe()
    for _ in range(10):
        breakers.failure("shown")
    text = client.get("/metrics").content.decode()
    assert 'fairlane_backend_up{backend="shown"} 1.0' in text
    assert 'fairlane_backend_circuit_state{backend="shown"} 2.0' in text


def test_health_goes_stale_with_the_clock_while_the_beat_is_down(
    fakes, settings, client_for, api_key
):
    """No probe runs after the first (the beat stopped): the backend still turns stale once its
    last success is older than FAIRLANE_HEALTH_STALE_SECONDS, in routing, the API and metrics."""
    import time_machine
    from prometheus_client import REGISTRY

    settings.FAIRLANE_HEALTH_STALE_SECONDS = 60
    settings.FAIRLANE_ROUTING_CACHE_SECONDS = 0
    first, second = fakes("openai"), fakes("openrouter")
    register("a-first", first)  # OpenAI: after OpenRouter in the default kind order ...
    register("b-second", second, is_enabled=False)
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        probe()
        Backend.objects.filter(name="b-second").update(is_enabled=True)
    with time_machine.travel(start + timedelta(seconds=30), tick=False):
        registry_invalidate()
        assert registry_get().backends["a-first"].health == Health.LIVE
    with time_machine.travel(start + timedelta(seconds=61), tick=False):
        assert routed() == ["b-second", "a-first"]  # never probed ranks above stale
        assert registry_get().backends["a-first"].health == Health.STALE
        listed = client_for(key=api_key[1]).get("/api/backends/").json()
        assert {b["name"]: b["health"] for b in listed} == {
            "a-first": "stale",
            "b-second": "unknown",
        }
        assert REGISTRY.get_sample_value("fairlane_backend_up", {"backend": "a-first"}) == 0.0
    assert row("a-first").health == Health.LIVE  # what the last probe recorded is kept
